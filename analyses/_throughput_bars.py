"""Throughput bars: one bar per policy or builder, faceted in a grid (``analyses.treegraft``, ``analyses.specblock``).

A helper of the studies, not a study: ``throughput_bars`` is the altair bar chart both studies draw
of their summary's ``TPS`` column (tokens per second), before ``analyses._study.titled``.
"""

from __future__ import annotations


def throughput_bars(data, by: str, order, column: str, row: str, tooltip, column_title: str | None = None):
    """An altair bar chart of ``data``'s ``TPS`` (tokens/s): x and colour the nominal field ``by``
    in ``order`` (a sequence of its values), faceted by ``column`` (an altair shorthand, e.g.
    ``"setting:N"``, headed ``column_title``) and ``row``, with ``tooltip`` (column names)."""
    import altair as alt

    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X(f"{by}:N", sort=list(order), title=None),
            y=alt.Y("TPS:Q", title="throughput (tokens/s)"),
            color=f"{by}:N",
            column=alt.Column(column, title=column_title),
            row=alt.Row(row, title=None),
            tooltip=list(tooltip),
        )
    )
