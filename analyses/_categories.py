"""Reporting by workload category: every study's summary per prompt category, beside the overall.

A root carries its prompt's category (``backends.sources.base.Root.category``: a prompt file's
``category`` field, e.g. ``"maths"``; None when the prompt has none).  Studies put it in every
per-root row as the String column ``category`` (``with_category``) and, when at least one root
has one, recompute their own summary on each category's rows (``by_category``): the same
estimator restricted to that category's roots, so a category row's mean and standard error are
exactly the overall computation on a subset.  The frame stacks one block per category (in order
of first appearance; roots without one form the block ``(none)``) and the overall block
``(all)``, written as ``by_category.parquet`` and printed as a table (``stage_by_category``).
Without categories nothing is added: no table, and no file (one an earlier publish wrote in the
output folder is removed when the study publishes: ``backends.cli.OutputSet``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import polars as pl

from backends.cli import parquet_writer, print_table
from backends.prompt_sets import RESERVED_CATEGORIES

OVERALL, UNCATEGORISED = RESERVED_CATEGORIES
"""The ``category`` of the overall block of ``by_category`` and of its block of roots whose
prompt has no category (beside categorised ones): names a prompt file may not use."""


def with_category(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with its ``category`` column as String (an all-None column is built as Null);
    unchanged when there is no such column."""
    if "category" in frame.columns and frame.schema["category"] != pl.String:
        return frame.with_columns(pl.col("category").cast(pl.String))
    return frame


def by_category(per_root, summarise: Callable) -> pl.DataFrame | None:
    """``summarise`` of each category's rows and of all rows, stacked with ``category`` first.

    Args:
        per_root: a study's per-root rows: a polars DataFrame with a ``category`` column (String
            or Null), or a list of dicts with a ``category`` key.
        summarise: the study's summary of such rows (the one it writes as its main parquet):
            rows -> polars DataFrame.

    Returns:
        a polars DataFrame: the blocks of every category (first appearance order; ``(none)`` for
        rows without one), then ``(all)``; or None when no row has a category.

    Raises:
        ValueError: a row's category is ``(all)`` or ``(none)`` (the names of blocks).
    """
    if isinstance(per_root, pl.DataFrame):
        names = per_root["category"].to_list() if "category" in per_root.columns else []
    else:
        names = [row.get("category") for row in per_root]
    if all(name is None for name in names):
        return None
    if reserved := {OVERALL, UNCATEGORISED} & set(names):
        raise ValueError(
            f"category: {sorted(reserved)[0]!r} names a block of the by-category table; rename the prompts' category"
        )
    names = [UNCATEGORISED if name is None else name for name in names]
    blocks = []
    for name in dict.fromkeys(names):
        keep = [n == name for n in names]
        part = (
            per_root.filter(pl.Series(keep)) if isinstance(per_root, pl.DataFrame) else [r for r, k in zip(per_root, keep) if k]
        )
        blocks.append(_labelled(summarise(part), name))
    blocks.append(_labelled(summarise(per_root), OVERALL))
    return pl.concat(blocks, how="diagonal_relaxed")


def _labelled(summary: pl.DataFrame, name: str) -> pl.DataFrame:
    return summary.select(pl.lit(name, dtype=pl.String).alias("category"), pl.exclude("category"))


def stage_by_category(outputs, table: pl.DataFrame | None) -> None:
    """Stage ``by_category.parquet`` in ``outputs`` (``backends.cli.OutputSet``) when ``table`` is
    not None (else the publish removes one an earlier publish in the folder wrote)."""
    if table is not None:
        outputs.stage("by_category.parquet", parquet_writer(table))


def print_by_category(table: pl.DataFrame | None, columns: Sequence, title: str, where: pl.Expr | None = None) -> None:
    """Print ``table``'s ``category`` and ``columns`` (names or expressions), on the rows ``where``
    holds (all rows: None), when ``table`` is not None."""
    if table is not None:
        shown = table.filter(where) if where is not None else table
        print_table(shown.select("category", *columns), f"{title}, by category (every row: by_category.parquet)")
