"""A content hash of a table, robust to the last bits of libm and polars versions.

Floats are written with 10 significant digits, every other value as text, column by column
with names and dtypes: two tables hash equal iff they agree to 1e-10 relative (to the rare
rounding boundary), which pins an output across machines of the same kind without depending
on the parquet writer's metadata.
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
            digest.update("\n".join(f"{v:.10g}" if v is not None else "null" for v in column.to_list()).encode())
        else:
            digest.update("\n".join(str(v) for v in column.to_list()).encode())
        digest.update(b"\n")
    return digest.hexdigest()
