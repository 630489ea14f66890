"""The lab's typed errors: ``ValueError`` subclasses that carry the argument they are about.

Every refusal of the lab is one line ``"<argument>: <detail>"`` (``"vocab: must be >= 2, got 1"``)
and a ``ValueError``; a tool maps the argument onto its flag (``backends.cli.flag_message``:
``"--vocab: must be >= 2, got 1"``) and exits 2 with that line.  The classes here keep both
halves as attributes, so a caller that routes on the argument reads ``exc.argument`` instead of
matching the message's text:

* ``ArgumentError(argument, detail)``: a bad value of the argument ``argument``;
* ``CaptureError(detail)``: a capture folder that cannot be read or resumed as asked (the argument
  ``capture``: a missing, damaged or mixed folder; ``backends.capture_store``).

``argument_of(exc)`` is the one reader of an error's argument: the attribute of a typed error, and
for a plain ``ValueError`` of the core (most raise sites still build the line themselves) the
``"<name>: "`` prefix of its first line, the lab's message convention.

Raised by: ``backends.capture_store``, ``backends.capture``, ``backends.sources.replay``.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
"""What an argument name looks like (``vocab``, ``top_k``, ``--top-k``, ``RANK``, ``settings.json``)."""


class ArgumentError(ValueError):
    """A bad value of one named argument; ``str(exc)`` is ``"<argument>: <detail>"`` (one line
    where ``detail`` is one line).

    Args:
        argument: the argument's name as the raising function spells it (``"top_k"``,
            ``"capture"``); a non-empty string.
        detail: what is wrong and what to do, without the argument's name.

    Attributes:
        argument, detail: as given.

    Raises:
        TypeError: ``argument`` or ``detail`` not a string, or ``argument`` empty.
    """

    def __init__(self, argument: str, detail: str):
        if not isinstance(argument, str) or not argument or not isinstance(detail, str):
            raise TypeError(f"ArgumentError needs a non-empty argument name and a detail string, got {argument!r}, {detail!r}")
        self.argument = argument
        self.detail = detail
        super().__init__(f"{argument}: {detail}")

    def __reduce__(self):  # pickles (multiprocessing, pytest-xdist) with both attributes
        return (_rebuild, (type(self), self.argument, self.detail))

    def renamed(self, argument: str) -> ArgumentError:
        """The same error about ``argument`` (a caller's name for the value it passed on)."""
        return ArgumentError(argument, self.detail)


def _rebuild(cls, argument: str, detail: str):
    error = ValueError.__new__(cls)
    ArgumentError.__init__(error, argument, detail)
    return error


class CaptureError(ArgumentError):
    """A capture folder that cannot be read, replayed or resumed as asked (the argument ``capture``):
    not a capture folder, a damaged file, shards of two captures, a capture lacking what is asked of
    it.  ``str(exc)`` is ``"capture: <detail>"``.

    Args:
        detail: what is wrong with which folder or file, and what to do.
    """

    def __init__(self, detail: str):
        super().__init__("capture", detail)

    def __reduce__(self):
        return (_rebuild_capture, (type(self), self.detail))


def _rebuild_capture(cls, detail: str):
    error = ValueError.__new__(cls)
    CaptureError.__init__(error, detail)
    return error


def argument_of(exc: BaseException) -> tuple[str | None, str]:
    """``(argument, detail)`` of an error: ``exc.argument`` and ``exc.detail`` of an ``ArgumentError``;
    for another exception its first line split at the first ``": "`` where what precedes it is a name
    (the lab's ``"<name>: <detail>"`` convention); else ``(None, first line)``.

    Args:
        exc: any exception.

    Returns:
        (the argument's name or None, the detail: one line).
    """
    if isinstance(exc, ArgumentError):
        return exc.argument, exc.detail.splitlines()[0] if exc.detail else ""
    first = str(exc).splitlines()[0] if str(exc) else ""
    name, sep, rest = first.partition(": ")
    if sep and _NAME.fullmatch(name):
        return name, rest
    return None, first


__all__ = ["ArgumentError", "CaptureError", "argument_of"]
