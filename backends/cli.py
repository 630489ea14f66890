"""The command-line kit of every tool (the studies under ``analyses/`` and the backend tools
``backends.capture``, ``backends.latency_probe``, ``backends.reference_pair``).

What makes a tool behave like one:

* ``ToolParser``: ``--help`` shows every default; an argument error is one line on stderr and
  exit status 2; abbreviations are off, and ``parser.given`` holds the flags (dests) written
  on the command line, so a flag a source cannot honour is refused, never ignored;
* ``fail_from(prog, exc, parser)``: a ``ValueError`` of the core (``"vocab: must be ..."``; a
  ``simlab.errors.ArgumentError`` carries the name as ``exc.argument``) becomes the flag's error
  (``"--vocab: must be ..."``), so a range is checked once, where it is defined;
* ``prepare_out``: the output folder is created and proved writable up front, and the staging
  files an interrupted (even SIGKILLed) run left there are removed;
* ``OutputSet``: every file of a run is staged and published together (atomic renames), and the
  files an earlier run published there that this run does not write are removed with the publish;
* ``progress`` / ``slow_step``: one line on stderr for a step that is (``progress``) or turns out
  to be (``slow_step``: after 2 s) silent for longer than a few seconds, such as loading models;
* ``progress_bar``: every tool's progress bar; ``fail`` and ``run_tool`` (interrupted) close
  the open bars before their line, so it never shares the bar's line nor is followed by a redraw;
* ``shard_environment`` / ``shard_device``: a ``torchrun`` process's RANK, WORLD_SIZE and LOCAL_RANK,
  and the GPU its models open on with ``--device auto`` or ``cuda`` (``cuda:LOCAL_RANK`` modulo the visible GPUs), read alike by the
  capture (``backends.capture``) and the sharded studies (``analyses._study``, ``analyses._flags``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import weakref
from pathlib import Path

import polars as pl
from tqdm import tqdm

from simlab.errors import argument_of
from simlab.files import atomic_write, remove_stale_staging, staging_file, umask

SLOW_STEP_SECONDS = 2.0
"""A step silent for longer than this announces itself on stderr (``slow_step``)."""


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help of every flag that has one to show (not where the help already says
    its default, not None or empty, not a switch's own True/False); the description keeps its line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "(default" in text or action.default in (None, (), []) or isinstance(action.default, bool) or action.nargs == 0:
            return text
        return super()._get_help_string(action)


class ToolParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2.

    After ``parse_args(argv)``, ``given`` is the set of dests of the flags written in ``argv``.
    """

    def __init__(self, *args, **kwargs):
        if kwargs.get("description"):
            kwargs["description"] = kwargs["description"].replace("``", "")  # docstrings' literals, as plain text
        kwargs.setdefault("formatter_class", _Formatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: set[str] = set()

    def error(self, message):  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message.splitlines()[0] if message else 'bad arguments'}\n")

    def parse_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        parsed = super().parse_args(argv, namespace)
        words = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
        self.given = {action.dest for action in self._actions if words & set(action.option_strings)}
        return parsed

    def flag(self, dest: str) -> str:
        """The flag that sets ``dest`` (``"K_max"`` -> ``"--K-max"``), or ``dest`` itself."""
        for action in self._actions:
            if action.dest == dest and action.option_strings:
                return max(action.option_strings, key=len)
        return dest


def add_output_flags(parser: "ToolParser", prog: str, folder: str = "<source>") -> None:
    """``--out`` (default ``out/<study>/<folder>``, the study named by ``prog``'s module; ``folder``
    as the help shows it: the source's name unless the study says otherwise) and ``--quiet``: the
    flags every study ends with."""
    study = prog.rsplit(".", 1)[-1]
    parser.add_argument("--out", default=None, help=f"output folder (default: out/{study}/{folder})")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


_OPEN_BARS: "weakref.WeakSet[tqdm]" = weakref.WeakSet()


def progress_bar(
    iterable=None, *, total: int | None = None, desc: str, unit: str = "it", quiet: bool = False, initial: int = 0
) -> tqdm:
    """A tool's progress bar on stderr (a ``tqdm``; disabled by ``quiet``; ``initial``: the items
    already done, as a resumed run counts them), registered so that ``close_bars`` closes it before
    an error or interrupt line.  Use it as the context manager ``with progress_bar(...) as bar:`` or
    close it when done."""
    bar = tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, disable=quiet, initial=initial)
    _OPEN_BARS.add(bar)
    return bar


def close_bars() -> None:
    """Close every open ``progress_bar`` (its last state stays on its own line), so that the line
    printed next starts a line of its own and no bar is redrawn after it."""
    for bar in list(_OPEN_BARS):
        bar.close()
        _OPEN_BARS.discard(bar)


def fail(prog: str, message: str) -> None:
    """Print ``prog: error: message`` (one line) to stderr and exit with status 2 (open progress
    bars closed first)."""
    close_bars()
    sys.stderr.write(f"{prog}: error: {message.splitlines()[0] if message else 'failed'}\n")
    raise SystemExit(2)


def flag_message(error: str | BaseException, parser: ToolParser | None, aliases: dict[str, str] | None = None) -> str:
    """One line naming the flag: the argument of ``error`` (``simlab.errors.argument_of``: an
    ``ArgumentError``'s ``argument`` attribute, else the ``"name: "`` of a core message, the text
    ``str(error)`` where ``error`` is a string) mapped onto the flag that sets it, as
    ``"--flag: detail"``, when it is a key of ``aliases`` (a core argument name mapped onto a
    flag) or a dest of ``parser``; an error about no flag comes back as its first line, unchanged."""
    argument, detail = argument_of(error if isinstance(error, BaseException) else ValueError(error))
    if argument is None:
        return detail
    if aliases and argument in aliases:
        return f"{aliases[argument]}: {detail}"
    if parser is not None and any(a.dest == argument and a.option_strings for a in parser._actions):
        return f"{parser.flag(argument)}: {detail}"
    return f"{argument}: {detail}"


def fail_from(prog: str, exc: Exception, parser: ToolParser | None = None, aliases: dict[str, str] | None = None) -> None:
    """``fail`` with ``flag_message(exc, parser, aliases)``: the error's argument mapped onto its flag."""
    fail(prog, flag_message(exc, parser, aliases))


def check_flags(prog: str, checks) -> None:
    """Exit 2 with the message of the first ``(ok, message)`` pair whose ``ok`` is false."""
    for ok, message in checks:
        if not ok:
            fail(prog, message)


def _no_repeats(values: tuple, text: str, flag: str) -> None:
    """Refuse a value listed twice: each value of a list flag is one configuration, and a repeat
    would copy its rows (more roots, a standard error too small by sqrt(2))."""
    seen = set()
    for value in values:
        if value in seen:
            shown = value if isinstance(value, int) else f"{value:g}"
            raise ValueError(f"{flag}: {shown} appears twice in {text!r}; name each value once")
        seen.add(value)


def _split(text: str, flag: str, convert, what: str) -> tuple:
    """``text`` split at commas, each part through ``convert`` (``int`` or ``float``).

    Raises:
        ValueError: ``"<flag>: expected comma-separated <what>, ..."`` for an empty list or a part
            ``convert`` refuses.
    """
    parts = [x.strip() for x in str(text).split(",")]
    if not any(parts):
        raise ValueError(f"{flag}: expected comma-separated {what}, got an empty list")
    try:
        return tuple(convert(x) for x in parts)
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated {what}, got {text!r}") from None


def int_list(text: str, flag: str, minimum: int | None = None, repeats: bool = False) -> tuple[int, ...]:
    """Comma-separated integers (``"1,2,4"``) for ``flag``, each value once unless ``repeats``
    (a sequence such as a per-layer schedule ``"1,0,1"``, where a value may recur).

    Raises:
        ValueError: ``"<flag>: ..."`` for an empty list, a non-integer, a value below ``minimum``,
            or (without ``repeats``) a value listed twice (``"3,3"``, ``"3,03"``).
    """
    values = _split(text, flag, int, "integers")
    if minimum is not None and min(values) < minimum:
        raise ValueError(f"{flag}: every value must be >= {minimum}, got {text!r}")
    if not repeats:
        _no_repeats(values, text, flag)
    return values


def float_list(text: str, flag: str, low: float, high: float) -> tuple[float, ...]:
    """Comma-separated numbers in [low, high] for ``flag``, each value once.

    Raises:
        ValueError: ``"<flag>: ..."`` for an empty list, a non-number, a value out of range (NaN
            included), or a value listed twice (``"0.3,0.3"``, ``"0.3,3e-1"``).
    """
    values = _split(text, flag, float, "numbers")
    if not all(low <= v <= high for v in values):  # NaN fails too
        raise ValueError(f"{flag}: every value must be in [{low:g}, {high:g}], got {text!r}")
    _no_repeats(values, text, flag)
    return values


def name_list(text: str, flag: str, known) -> tuple[str, ...]:
    """Comma-separated names, each one of ``known``, each once.

    Raises:
        ValueError: ``"<flag>: ..."`` for an empty list, an empty entry (``"a,,b"``), an unknown or
            a repeated name.
    """
    entries = [x.strip() for x in str(text).split(",")]
    names = tuple(x for x in entries if x)
    known = list(known)
    if not names:
        raise ValueError(f"{flag}: name at least one of {', '.join(known)}")
    if len(names) != len(entries):
        raise ValueError(f"{flag}: an empty entry in {text!r}")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{flag}: a name appears twice in {text!r}")
    return names


def shard_environment(environ) -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) of a ``torchrun`` process from ``environ`` (defaults 0, 1, 0).

    Raises:
        ValueError: ``"RANK: ..."`` (or the other name) for a value that is not an integer, a
            WORLD_SIZE below 1, a negative rank, a RANK outside 0..WORLD_SIZE - 1, or a WORLD_SIZE
            above 1 without a RANK.
    """

    def number(name: str, default: int, minimum: int) -> int:
        text = environ.get(name)
        if text is None:
            return default
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"{name}: must be an integer, got {text!r}") from None
        if value < minimum:
            raise ValueError(f"{name}: must be >= {minimum}, got {value}")
        return value

    world, rank, local = number("WORLD_SIZE", 1, 1), number("RANK", 0, 0), number("LOCAL_RANK", 0, 0)
    if world > 1 and environ.get("RANK") is None:
        raise ValueError(f"RANK: not set, but WORLD_SIZE is {world}; set RANK for each process (torchrun sets both)")
    if rank >= world:
        raise ValueError(f"RANK: {rank} is not a rank of WORLD_SIZE {world} (ranks 0 to {world - 1})")
    return rank, world, local


def shard_device(device: str, world: int, local: int) -> str:
    """The device a process of a ``world``-process run (``shard_environment``) opens its models on:
    ``"auto"`` with ``world`` > 1 is ``"cuda:<local mod n>"`` (the process's own GPU: ``LOCAL_RANK``
    modulo the ``n`` GPUs the process sees, so a launcher that shows each rank only its own GPU
    through ``CUDA_VISIBLE_DEVICES`` gives ``cuda:0``) where CUDA is usable (``simlab.checks.check_device``), else ``"cpu"``; ``"cuda"`` with ``world``
    > 1 is ``"cuda:<local mod n>"`` too (where CUDA is not usable it is kept, and refused where the models
    open); any other ``device`` (``cpu``, ``cuda:N``), and any device of a one-process run, is
    returned as given (checked where the models open).

    Args:
        device: the ``--device`` value (``auto``, ``cpu``, ``cuda``, ``cuda:N``), a string.
        world, local: ``WORLD_SIZE`` and ``LOCAL_RANK``, as ``shard_environment`` returns them.
    """
    from simlab.checks import check_device

    if world > 1 and device in ("auto", "cuda"):
        if check_device("auto", "device") == "cuda":
            import torch

            return f"cuda:{local % max(1, torch.cuda.device_count())}"
        return "cpu" if device == "auto" else device
    return device


def prepare_out(prog: str, out: str) -> Path:
    """Create ``out`` if needed, prove it is writable, and remove the staging files that
    interrupted runs left there; or exit 2 with one line."""
    if not str(out).strip():
        fail(prog, "--out: must name a folder, got an empty string")
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
        remove_stale_staging(path)
    except OSError as exc:
        fail(prog, f"--out: cannot write to {out!r} ({exc.strerror or exc})")
    return path


def progress(prog: str, message: str, quiet: bool = False) -> None:
    """One progress line on stderr (``prog: message``), unless ``quiet``."""
    if not quiet:
        print(f"{prog}: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def slow_step(prog: str, message: str, quiet: bool = False, after: float = SLOW_STEP_SECONDS):
    """Run the ``with`` block; if it is still running after ``after`` seconds, print one progress
    line (``prog: message...``) on stderr.  Fast steps stay silent, so an argument error that
    surfaces inside a fast step is still the only line a tool prints."""
    if quiet:
        yield
        return
    timer = threading.Timer(after, progress, (prog, f"{message}..."))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


PUBLISHED = ".simlab-published.json"
"""The file in which ``OutputSet.publish`` lists the files it wrote in its folder with their SHA-256
(JSON: ``{"files": {name: digest}}``), so that the next publish there removes the ones it does not
write and nobody changed since."""


class OutputSet:
    """Stage a study's files and publish them together: nothing is replaced until every file is
    written, so an interrupted run leaves neither half-written files nor a mix of old and new;
    and after ``publish`` the folder holds this run's files only, beside files the lab did not write.

    Use ``stage(name, write)`` for each file, then ``publish()``; on an exception or interrupt
    call ``discard()`` (``with OutputSet(out) as outputs:`` does that).  Staging files a SIGKILL
    leaves behind are removed by the next ``prepare_out`` of that folder.

    What a publish removes: the files the folder's previous publish wrote (listed in its
    ``PUBLISHED`` file) that this run does not write and that still hold what the lab wrote (their
    SHA-256).  Nothing else: a file the lab did not write (a user's own, even one named as a study's
    file) is never listed, a listed file the user has since changed is kept, and in a folder written
    before the list existed nothing is removed until a publish has listed its files.
    A folder is one study's (two studies given one ``--out`` remove each other's files, as the
    second run's folder holds only what it wrote).  The list is written before the renames with the
    files to remove in it, and rewritten after they are removed, so a run killed in between leaves
    them listed and the next publish removes them.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.staged: list[tuple[str, Path]] = []

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self.discard()
        return False

    def stage(self, name: str, write) -> None:
        tmp = staging_file(self.folder, name)
        self.staged.append((name, tmp))
        write(str(tmp))
        os.chmod(tmp, 0o666 & ~umask())

    def publish(self) -> None:
        """Replace the folder's files by the staged ones and remove the stale ones (class docstring).

        Raises:
            OutputError: a staged file's name is a folder there (checked before anything is replaced).
        """
        names = [name for name, _ in self.staged]
        for name in names:
            path = self.folder / name
            if path.is_dir() and not path.is_symlink():
                raise OutputError(f"--out: {str(path)!r} is a folder, where this run writes a file; move it away and rerun")
        listed = published_digests(self.folder)
        stale = {n: d for n, d in listed.items() if n not in names}
        digests = {name: _digest(tmp) for name, tmp in self.staged}
        _list_published(self.folder, {**digests, **stale})
        for name, tmp in self.staged:
            os.replace(tmp, self.folder / name)
        for name, digest in stale.items():
            path = self.folder / name
            if (path.is_symlink() or path.is_file()) and (digest is None or _digest(path) == digest):
                path.unlink(missing_ok=True)  # a file changed since the lab wrote it is the user's now: kept
        _list_published(self.folder, digests)
        self.staged = []

    def discard(self) -> None:
        for _, tmp in self.staged:
            tmp.unlink(missing_ok=True)
        self.staged = []


def published(folder: Path) -> list[str]:
    """The names of the files the last ``OutputSet.publish`` in ``folder`` wrote (its
    ``PUBLISHED`` list); empty where there is none or it does not read as one.  Only plain
    names of files in ``folder`` itself are returned (no path, no hidden staging or list file)."""
    return list(published_digests(folder))


def published_digests(folder: Path) -> dict[str, str | None]:
    """``published`` with the SHA-256 each file had when it was published (None for a list written
    before the digests): a publish removes a stale file only while it still has that digest."""
    try:
        files = json.loads((Path(folder) / PUBLISHED).read_text())["files"]
    except (OSError, ValueError, TypeError, KeyError):
        return {}
    if isinstance(files, list):
        files = dict.fromkeys(files)
    if not isinstance(files, dict):
        return {}
    return {
        n: d if isinstance(d, str) else None
        for n, d in files.items()
        if isinstance(n, str) and n not in ("", ".", "..") and Path(n).name == n and not n.startswith(".")
    }


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _list_published(folder: Path, files: dict[str, str | None]) -> None:
    atomic_write(Path(folder) / PUBLISHED, lambda tmp: Path(tmp).write_text(json.dumps({"files": files}, indent=1) + "\n"))


class OutputError(ValueError):
    """A study's output folder cannot take this run's files (``OutputSet.publish``); ``run_tool``
    prints it as one line and exits 2, nothing replaced."""


def write_parquet(frame: pl.DataFrame, path: Path, metadata: dict[str, str] | None = None) -> None:
    """Atomic parquet write (same data, same bytes), with optional key-value ``metadata``."""
    atomic_write(path, parquet_writer(frame, metadata))


def parquet_writer(frame: pl.DataFrame, metadata: dict[str, str] | None = None):
    """A writer ``f(path)`` for ``OutputSet.stage`` (no statistics, so same data gives same bytes;
    ``metadata``: key-value pairs stored in the file's footer)."""
    return lambda tmp: frame.write_parquet(tmp, statistics=False, metadata=metadata)


def chart_writer(chart, fmt: str):
    """A writer ``f(path)`` for ``OutputSet.stage``: ``"html"`` (self-contained, works offline) or ``"png"``."""
    if fmt == "html":
        return lambda tmp: chart.save(tmp, format="html", inline=True)
    return lambda tmp: chart.save(tmp, format=fmt)


def run_tool(prog: str, body) -> int:
    """Run a tool's ``body()``: a KeyboardInterrupt becomes one line on stderr (after the open
    progress bars are closed) and status 130, an ``OutputError`` one line and status 2."""
    try:
        return body()
    except KeyboardInterrupt:
        close_bars()
        sys.stderr.write(f"{prog}: interrupted; no partial output was published\n")
        return 130
    except OutputError as exc:
        close_bars()
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return 2


def print_table(frame: pl.DataFrame, title: str) -> None:
    """Print an aligned table with a title line to stdout."""
    with pl.Config(
        tbl_rows=-1,
        tbl_cols=-1,
        tbl_width_chars=250,
        float_precision=3,
        tbl_hide_dataframe_shape=True,
        tbl_hide_column_data_types=True,
        fmt_str_lengths=120,
    ):
        print(title)
        print(frame)


__all__ = [
    "OutputError",
    "OutputSet",
    "PUBLISHED",
    "ToolParser",
    "atomic_write",
    "chart_writer",
    "check_flags",
    "close_bars",
    "fail",
    "fail_from",
    "flag_message",
    "float_list",
    "int_list",
    "name_list",
    "parquet_writer",
    "prepare_out",
    "print_table",
    "progress",
    "progress_bar",
    "published",
    "run_tool",
    "slow_step",
    "write_parquet",
]
