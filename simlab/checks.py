"""Argument checks shared by the whole lab: one helper decides each kind of argument.

Every check returns the value in its canonical type and raises ``ValueError`` whose message
starts with the argument's name (``"k: ..."``), so tools can map it onto their flags.

* ``check_int``: integers are Python ``int`` or NumPy integers (``np.int64(4)`` is 4);
  ``bool``, floats (even ``4.0``) and strings are refused;
* ``check_bool``: a flag is ``True`` or ``False`` (a Python or NumPy bool); 0, 1, strings and
  ``None`` are refused rather than read by their truth value;
* ``check_generator``: a ``numpy.random.Generator`` (never a seed, never ``None``);
* ``check_seed``: an integer seed in [0, 2**63 - 1] (what NumPy and torch both accept);
* ``check_token_ids``: a sequence of integer token ids in [0, V);
* ``check_in_range``: a real number in an interval such as (0, 1] or [0, 1) (probabilities,
  learning rates, weights);
* ``check_real_array``: an array-like of real numbers as float64 (complex, strings, dates, ``None``,
  masked entries and non-numbers refused, never cast);
* ``check_choice``: a name registered in a registry (``simlab.verifiers``, ``simlab.tree_verifiers``);
* ``check_device``: a torch device name (``auto``, ``cpu``, ``cuda``, ``cuda:N``), one rule
  wherever the lab takes one (torch is imported only when a name is checked).
"""

from __future__ import annotations

import numpy as np

MAX_SEED = 2**63 - 1


def check_int(value, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an ``int``, within [minimum, maximum] where given.

    Raises:
        ValueError: ``"<name>: must be an integer ..."`` for a bool, float, string or other
            non-integer, or a value outside the range.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: must be an integer{_range(minimum, maximum)}, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name}: must be an integer{_range(minimum, maximum)}, got {value}")
    return value


def check_bool(value, name: str) -> bool:
    """``value`` as a ``bool``: only ``True``, ``False`` and NumPy bools are flags.

    Raises:
        ValueError: ``"<name>: must be True or False ..."`` for anything else (``0``, ``1``,
            ``"no"``, ``None``: their truth value would silently pick a setting).
    """
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}: must be True or False, got {value!r}")
    return bool(value)


def _range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    if maximum is not None:
        return f" <= {maximum}"
    return ""


def check_in_range(
    value, name: str, low: float = 0.0, high: float = 1.0, *, low_open: bool = False, high_open: bool = False
) -> float:
    """``value`` as a ``float`` in the interval from ``low`` to ``high``, each end closed unless
    ``low_open`` / ``high_open`` (e.g. ``check_in_range(a, "alpha", low_open=True)``: a in (0, 1]).

    Raises:
        ValueError: ``"<name>: must lie in (0, 1], got ..."`` for a bool, a non-number, NaN, or a
            value outside the interval.
    """
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}: must lie in {interval}, got {value!r}")
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):  # NaN fails both
        raise ValueError(f"{name}: must lie in {interval}, got {value!r}")
    return float(value)


def check_real_array(x, name: str) -> np.ndarray:
    """``x`` as a float64 ndarray (any shape), refusing what a cast would silently change.

    Raises:
        ValueError: ``"<name>: ..."`` for complex input (a cast drops the imaginary part),
            strings or bytes, also inside object arrays (a cast parses them), ``None``, alone or
            inside a list or object array (a cast makes it NaN), a polars Series with nulls (its
            cast makes them NaN), a ``numpy.ma.MaskedArray`` with masked entries, alone or inside
            a list (a cast drops the mask and keeps the hidden values), dates and times
            (a cast counts their ticks), and anything NumPy cannot turn into float64 (objects,
            ragged lists, integers beyond float64's range, a torch tensor that requires grad).
    """
    if _masked(x):
        raise ValueError(
            f"{name}: a masked array with masked entries (a cast would drop the mask); pass x.filled(value) or x.compressed()"
        )
    nulls = getattr(x, "null_count", None)  # a polars Series: its to-NumPy cast turns a null into NaN
    if callable(nulls) and not isinstance(x, np.ndarray) and nulls() > 0:
        raise ValueError(f"{name}: not a numeric array (got {nulls()} null values, which a cast would turn into NaN)")
    try:
        raw = np.asarray(x)
        refusal = _cast_refusal(raw)
        arr = None if refusal else np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:  # RuntimeError: torch's refusals
        raise ValueError(f"{name}: not a numeric array ({exc})") from None
    if refusal:
        raise ValueError(f"{name}: {refusal}")
    return arr


def _masked(x) -> bool:
    """True for a masked array with masked entries, or a list or tuple holding one (a cast drops the mask)."""
    if isinstance(x, np.ma.MaskedArray):
        return bool(np.ma.is_masked(x))
    return isinstance(x, (list, tuple)) and any(_masked(item) for item in x if isinstance(item, (np.ma.MaskedArray, list, tuple)))


def _cast_refusal(raw: np.ndarray) -> str | None:
    """Why a cast of ``raw`` to float64 would silently change it (the message after the name), or None."""
    kind = raw.dtype.kind
    if kind == "c":
        return "must be real, got a complex array"
    if kind in "USVMm":
        return f"not a numeric array (got {raw.dtype} values)"
    if kind == "O":
        for value in raw.flat:
            if value is None:
                return "not a numeric array (got None, which a cast would turn into NaN)"
            if isinstance(value, (str, bytes)):
                return f"not a numeric array (got {raw.dtype} values)"
    return None


def check_choice(value, name: str, choices, what: str) -> str:
    """``value`` itself, if it is a string among ``choices`` (a registry's names, in their order).

    Raises:
        ValueError: ``"<name>: unknown <what> <value>; choose one of ..."`` for any other value,
            a non-string (a list, ``None``) included.
    """
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: unknown {what} {value!r}; choose one of {', '.join(choices)}")
    return value


def check_device(device, name: str = "device") -> str:
    """A torch device name, resolved: ``"auto"`` is ``"cuda"`` where a CUDA device is usable, else
    ``"cpu"``; ``"cpu"``, ``"cuda"`` and ``"cuda:N"`` are returned as given when usable here.

    Raises:
        ValueError: ``"<name>: ..."`` for a non-string, a name torch does not parse, a device type
            other than cpu and cuda, or a CUDA device this machine does not have.
    """
    if not isinstance(device, str):
        raise ValueError(f"{name}: must be a device name (auto, cpu, cuda or cuda:N), got {device!r}")
    if device == "cpu":
        return device
    import torch  # deferred: importing simlab.checks (or checking "cpu") never loads torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name}: unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: {device!r} is not a device the lab runs on; use auto, cpu, cuda or cuda:N")
    if parsed.type == "cuda" and not (torch.cuda.is_available() and (parsed.index or 0) < torch.cuda.device_count()):
        raise ValueError(f"{name}: {device!r} asked for, but this torch build has no such usable CUDA device")
    return device


def check_seed(seed, name: str = "seed") -> int:
    """A seed: an integer in [0, 2**63 - 1].

    Raises:
        ValueError: not an integer, negative, or above 2**63 - 1.
    """
    return check_int(seed, name, 0, MAX_SEED)


def check_generator(rng, name: str = "rng") -> np.random.Generator:
    """``rng`` itself, if it is a ``numpy.random.Generator``.

    Raises:
        ValueError: anything else (an int seed, ``None``, a legacy ``RandomState``).
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{name}: must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def check_token_ids(ids, vocab_size: int, name: str = "context") -> tuple[int, ...]:
    """A sequence of integer token ids in [0, V), returned as a tuple of ints.

    Raises:
        ValueError: not a sequence (or a string), a non-integer id (floats are not
            truncated, bools are refused), or an id outside [0, V) (``-1`` included).
    """
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{name}: must be a sequence of integer token ids, got {ids!r}")
    out = tuple(ids)
    if all(type(t) is int for t in out):  # plain ints (bools are not): no conversion needed
        if out and (min(out) < 0 or max(out) >= vocab_size):
            bad = next(t for t in out if not 0 <= t < vocab_size)
            raise ValueError(f"{name}: token id {bad} is outside [0, {vocab_size})")
        return out
    if any(isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) for t in out):
        bad = next(t for t in out if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)))
        raise ValueError(f"{name}: token ids must be integers, got {bad!r}")
    if out and (min(out) < 0 or max(out) >= vocab_size):
        bad = next(int(t) for t in out if not 0 <= t < vocab_size)
        raise ValueError(f"{name}: token id {bad} is outside [0, {vocab_size})")
    return tuple(int(t) for t in out)
