"""A content hash of a table, robust to the last bits of libm and polars versions.

Floats are written with 10 significant digits, and those below 1e-13 in magnitude as 0 (a
standard error of a column that is constant up to rounding is rounding noise, not a result);
every other value as text, column by column with names and dtypes: two tables hash equal iff
they agree to 1e-10 relative or 1e-13 absolute (to the rare rounding boundary), which pins an
output across machines of the same kind without depending on the parquet writer's metadata.
"""

from __future__ import annotations

import hashlib

import polars as pl


def content_hash(frame: pl.DataFrame) -> str:
    digest = hashlib.sha256()
    for name in frame.columns:
        column = frame[name]
        digest.update(f"{name}:{column.dtype}\n".encode())
        if column.dtype.is_float():
            digest.update("\n".join(_float(v) for v in column.to_list()).encode())
        else:
            digest.update("\n".join(str(v) for v in column.to_list()).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def _float(value: float | None) -> str:
    if value is None:
        return "null"
    return "0" if abs(value) < NOISE else f"{value:.10g}"


NOISE = 1e-13
