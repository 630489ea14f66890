"""What every study shares to behave like a tool: one-line argument errors (exit 2), an output
folder checked up front, atomic writes of parquet, HTML and PNG, a progress bar on stderr."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import polars as pl


class ToolParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2."""

    def error(self, message):  # noqa: D401 - argparse hook
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(prog: str, message: str) -> None:
    """Print ``prog: error: message`` (one line) to stderr and exit with status 2."""
    sys.stderr.write(f"{prog}: error: {message}\n")
    raise SystemExit(2)


def prepare_out(prog: str, out: str) -> Path:
    """Create ``out`` if needed and prove it is writable, or exit 2 with one line."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        fail(prog, f"--out: cannot write to {out!r} ({exc.strerror or exc})")
    return path


def _atomic(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` to a temporary file beside ``path``, then rename it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(frame: pl.DataFrame, path: Path) -> None:
    """Atomic parquet write (same data, same bytes)."""
    _atomic(path, lambda tmp: frame.write_parquet(tmp, statistics=False))


def save_chart(chart, path: Path) -> None:
    """Atomic altair save; the format follows the suffix (.html, or .png through vl-convert)."""
    _atomic(path, lambda tmp: chart.save(tmp, format=path.suffix.lstrip(".")))


def print_table(frame: pl.DataFrame, title: str) -> None:
    """Print an aligned table with a title line to stdout."""
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=250, float_precision=3,
                   tbl_hide_dataframe_shape=True, tbl_hide_column_data_types=True):
        print(title)
        print(frame)
