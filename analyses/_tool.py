"""What every study shares to behave like a tool: one-line argument errors (exit 2), an output
folder checked up front, atomic writes of parquet, HTML and PNG, a progress bar on stderr."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import polars as pl

from simlab.files import atomic_write, umask as _umask  # noqa: F401 - re-exported for the tools


class ToolParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(prog: str, message: str) -> None:
    """Print ``prog: error: message`` (one line) to stderr and exit with status 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def check_flags(prog: str, checks) -> None:
    """Exit 2 with the message of the first ``(ok, message)`` pair whose ``ok`` is false."""
    for ok, message in checks:
        if not ok:
            fail(prog, message)


def prepare_out(prog: str, out: str) -> Path:
    """Create ``out`` if needed and prove it is writable, or exit 2 with one line."""
    if not str(out).strip():
        fail(prog, "--out: must name a folder, got an empty string")
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        fail(prog, f"--out: cannot write to {out!r} ({exc.strerror or exc})")
    return path


class OutputSet:
    """Stage a study's files and publish them together: nothing is replaced until every file is
    written, so an interrupted run leaves neither half-written files nor a mix of old and new.

    Use ``stage(name, write)`` for each file, then ``publish()``; on an exception or interrupt
    call ``discard()`` (``with OutputSet(out) as outputs:`` does that).
    """

    def __init__(self, folder: Path):
        self.folder = folder
        self.staged: list[tuple[str, Path]] = []

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is not None:
            self.discard()
        return False

    def stage(self, name: str, write) -> None:
        target = self.folder / name
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{target.stem}-", suffix=target.suffix)
        os.close(fd)
        self.staged.append((name, Path(tmp)))
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())

    def publish(self) -> None:
        for name, tmp in self.staged:
            os.replace(tmp, self.folder / name)
        self.staged = []

    def discard(self) -> None:
        for _, tmp in self.staged:
            tmp.unlink(missing_ok=True)
        self.staged = []


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    """Atomic parquet write (same data, same bytes)."""
    atomic_write(path, lambda tmp: parquet_writer(frame)(tmp))


def parquet_writer(frame: pl.DataFrame):
    """A writer ``f(path)`` for ``OutputSet.stage`` (no statistics, so same data gives same bytes)."""
    return lambda tmp: frame.write_parquet(tmp, statistics=False)


def chart_writer(chart, fmt: str):
    """A writer ``f(path)`` for ``OutputSet.stage``: ``"html"`` (self-contained, works offline) or ``"png"``."""
    if fmt == "html":
        return lambda tmp: chart.save(tmp, format="html", inline=True)
    return lambda tmp: chart.save(tmp, format=fmt)


def run_tool(prog: str, body) -> int:
    """Run a study's ``body()``: a KeyboardInterrupt becomes one line on stderr and status 130."""
    try:
        return body()
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted; no partial output was published\n")
        return 130


def print_table(frame: pl.DataFrame, title: str) -> None:
    """Print an aligned table with a title line to stdout."""
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True, fmt_str_lengths=120):
        print(title)
        print(frame)
