"""Block efficiency over delayed-tree actions: ``python -m analyses.block_efficiency_grid``.

For the roots of any source (``backends.sources``; default: 6 roots along one seeded walk of the
synthetic world ``depth_profile``, V = 16), E[tau + 1] (tokens per verification step) of every
delayed tree (K, L1, L2) of a grid, for each chosen tree verifier.  ``--method exact`` enumerates
every tree (tiny vocabularies only); ``mc`` uses DDTE's unbiased estimator (``--samples`` sampled
trees per action, each tree serving every L2 cut-off; a grid capture brings its own trees);
``auto`` tries exact and falls back to mc.  Values are averaged over roots, with the standard
error across roots.  Output under ``--out`` (default ``out/block_efficiency_grid/<source>/``):
``block_efficiency_grid.parquet`` (one row per verifier and action; ``accepted`` = E[tau] beside
E[tau + 1]), ``by_position.parquet`` (per verifier, action and draft position j: P(tau >= j),
vLLM's per-position counter, and the papers' conditional rate as the ratio of its means over
roots; ``docs/metrics.md``), ``block_efficiency_grid.{html,png}`` (a heatmap per verifier and
K), and the best static configuration per verifier printed as a table.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyses._categories import by_category, with_category
from analyses._labels import by_position
from analyses._study import WROTE, ByCategory, Opened, Report, chart_files, declared, parse, run_study, tasks
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, int_list, name_list, progress_bar
from analyses._flags import SourceConfig, add_source_flags, make_source, study_config
from simlab import tree_verifiers
from simlab.builders import Delayed
from simlab.efficiency import expected_block_efficiency
from simlab.engine_metrics import expected_positions
from simlab.grid import GridAxes, GridMetrics, action_grid_metrics, grid_metrics

PROG = "python -m analyses.block_efficiency_grid"
METHODS = ("auto", "exact", "mc")
_EXACT = ("--method exact enumerates the trees of synthetic worlds only", ("mc",))
REFUSALS = {"capture": {"samples": "a capture brings its own trees", "method": _EXACT}, "hf": {"method": _EXACT}}
"""The flags a source cannot honour (``analyses._flags.check_honoured``)."""


@dataclass(frozen=True)
class Config(SourceConfig):
    """The study's settings (the command-line flags); the source fields are ``SourceConfig``'s."""

    vocab: int = 16
    trajectories: int = 1
    roots_per_trajectory: int = 6
    verifiers: tuple[str, ...] = ("specinfer", "spectr", "traversal", "bv")
    K: tuple[int, ...] = (1, 2, 3, 4)
    L1_max: int = 4
    L2_max: int = 4
    method: str = "mc"
    samples: int = 8
    out: str | None = None
    quiet: bool = False

    def axes(self) -> GridAxes:
        """The grid's axes: ``K`` x {0..L1_max} x {0..L2_max}."""
        return GridAxes(tuple(self.K), tuple(range(self.L1_max + 1)), tuple(range(self.L2_max + 1)))


def flags(parser: ToolParser, d: Config) -> None:
    """The source flags (one setting), ``--verifiers``, ``--K``, ``--L1-max``, ``--L2-max``,
    ``--method``, ``--samples``, ``--out`` and ``--quiet``."""
    add_source_flags(parser, d, many_settings=False)
    parser.add_argument(
        "--verifiers", default=",".join(d.verifiers), help=f"comma-separated tree verifiers: {', '.join(tree_verifiers.names())}"
    )
    parser.add_argument("--K", default=",".join(map(str, d.K)), help="comma-separated numbers of branches")
    parser.add_argument("--L1-max", type=int, default=d.L1_max, help="largest trunk length")
    parser.add_argument("--L2-max", type=int, default=d.L2_max, help="largest branch length")
    parser.add_argument("--method", choices=METHODS, default=d.method, help="outer expectation over trees")
    parser.add_argument("--samples", type=int, default=d.samples, help="sampled trees per action (mc)")
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--K`` a tuple of ints, ``--verifiers`` of names), or exit 2 with one line."""
    try:
        ks = int_list(args.K, "--K", minimum=1)
        verifiers = name_list(args.verifiers, "--verifiers", tree_verifiers.names())
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, verifiers=verifiers, K=ks)
    check_flags(
        PROG,
        [
            (
                "rrs_wor" not in config.verifiers,
                "--verifiers: rrs_wor needs siblings drafted without replacement; the grid drafts i.i.d.",
            ),
            (config.L1_max >= 0 and config.L2_max >= 0, "--L1-max, --L2-max: must be >= 0"),
            (len(set(config.K)) == len(config.K), f"--K: must be distinct, got {','.join(map(str, config.K))}"),
            (config.samples >= 2, f"--samples: must be >= 2 (for a standard error), got {config.samples}"),
            (
                config.trajectories * config.roots_per_trajectory <= 10_000,
                f"--trajectories x --roots-per-trajectory: at most 10000 roots, got {config.trajectories * config.roots_per_trajectory}",
            ),
            (max(config.K) <= 16 and config.L1_max <= 32 and config.L2_max <= 32, "--K, --L1-max, --L2-max: at most 16, 32, 32"),
        ],
    )
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The source and its one setting (``analyses._flags.make_source``); no latency model."""
    source, settings = make_source(
        PROG,
        parser,
        config,
        stream="shared",
        grid=True,
        depth=config.L1_max + config.L2_max,
        max_settings=1,
        study_refusals=REFUSALS,
        quiet=config.quiet,
    )
    return Opened(source, tuple(settings))


def root_grid(config: Config, root, name: str, index: int) -> tuple[dict, str]:
    """({(K, L1, L2): ``simlab.grid.GridMetrics``}, method) of verifier ``name`` at ``root``, the
    root's ``index``-th of the run: the capture's own trees, else exact enumeration (``exact``, or
    ``auto`` where it succeeds), else mc (seeded by ``seed + 1000 index``)."""
    axes = config.axes()
    L1s, L2s = axes.L1_values, axes.L2_values
    if root.drafts is not None:
        drafts = [d for d in root.drafts if d.L1 in L1s]
        return grid_metrics(root.table(), drafts, name, K_values=config.K, L2_values=L2s), "mc"
    if config.method in ("exact", "auto"):
        try:
            table = root.table()
            grid = {
                (K, L1, L2): GridMetrics(
                    expected_block_efficiency(root.pair, root.context, Delayed(K, L1, L2), name),
                    *expected_positions(table, Delayed(K, L1, L2), tree_verifiers.get(name)),
                )
                for K in config.K
                for L1 in L1s
                for L2 in L2s
            }
            return grid, "exact"
        except ValueError as exc:
            if config.method == "exact":
                raise ValueError(f"method: exact: {exc}") from None
    grid = action_grid_metrics(
        root.pair,
        root.context,
        name,
        K_values=config.K,
        L1_values=L1s,
        L2_values=L2s,
        samples=config.samples,
        seed=config.seed + 1000 * index,
    )
    return grid, "mc"


def value_root(config: Config, opened: Opened, task) -> list[dict]:
    """One root's rows, one per verifier and action (``root_grid``): E[tau + 1] (``value``),
    ``accepted`` = E[tau], the per-position ``unconditional`` P(tau >= j), the method, the category."""
    rows = []
    for name in config.verifiers:
        grid, method = root_grid(config, task.root, name, task.index)
        rows.extend(
            {
                **dict(verifier=name, root=task.index, K=K, L1=L1, L2=L2, method=method, value=m.E.mean, accepted=m.accepted),
                "unconditional": m.unconditional.tolist(),
                "category": task.root.category,
            }
            for (K, L1, L2), m in grid.items()
        )
    return rows


def merge(config: Config, opened: Opened, payloads) -> pl.DataFrame:
    """The per-root rows of every root, verifier by verifier (each in root order), with each root's ``category``."""
    return with_category(
        pl.DataFrame([row for v in config.verifiers for rows in payloads for row in rows if row["verifier"] == v])
    )


def values(config: Config, opened: Opened, say) -> pl.DataFrame:
    """``merge`` of ``value_root`` over every root in one process (a progress bar unless ``--quiet``)."""
    roots = list(tasks(opened))
    return merge(config, opened, [value_root(config, opened, t) for t in progress_bar(roots, desc="root", quiet=config.quiet)])


def summarise(per_root: pl.DataFrame) -> pl.DataFrame:
    """One row per (verifier, K, L1, L2) of ``estimate``'s per-root rows: E[tau + 1]
    (``block_efficiency``) and ``accepted`` averaged over roots, the standard error across roots."""
    return (
        per_root.group_by("verifier", "K", "L1", "L2")
        .agg(
            pl.col("value").mean().alias("block_efficiency"),
            (pl.col("value").std() / pl.len().sqrt()).alias("stderr"),
            pl.col("accepted").mean(),
            pl.col("method").first(),
            pl.len().alias("roots"),
        )
        .sort("verifier", "K", "L1", "L2")
    )


def best_per_verifier(table: pl.DataFrame) -> pl.DataFrame:
    return (
        table.sort("block_efficiency", descending=True)
        .group_by("verifier", maintain_order=True)
        .first()
        .select("verifier", "K", "L1", "L2", "block_efficiency", "stderr", "accepted", "method")
        .sort("block_efficiency", descending=True)
    )


def heatmap(table: pl.DataFrame, subtitle: str):
    """A heatmap of E[tau+1] over (L1, L2), one panel per verifier and K; ``subtitle`` names the source."""
    import altair as alt

    return (
        alt.Chart(table)
        .mark_rect()
        .encode(
            x=alt.X("L2:O", title="L2 (branch length)"),
            y=alt.Y("L1:O", title="L1 (trunk length)", sort="descending"),
            color=alt.Color("block_efficiency:Q", title="E[tau+1]", scale=alt.Scale(scheme="viridis")),
            tooltip=["verifier", "K", "L1", "L2", "block_efficiency", "stderr"],
        )
        .properties(width=140, height=140)
        .facet(row=alt.Row("verifier:N"), column=alt.Column("K:O", title="K (branches)"))
        .properties(
            title=alt.TitleParams("Expected block efficiency E[tau+1] (tokens per step) of delayed trees", subtitle=subtitle)
        )
    )


def run(config: Config, opened: Opened, per_root: pl.DataFrame, say) -> Report:
    """``block_efficiency_grid.parquet`` (``summarise``), ``by_position.parquet``, the heatmap, the
    by-category table, and the best static delayed tree per verifier."""
    (setting,) = opened.settings
    table = summarise(per_root)
    positions = by_position(per_root, ["verifier", "K", "L1", "L2"]).sort("verifier", "K", "L1", "L2", "position")
    described = f"{opened.source.describe()}, {setting.name}, {opened.source.count(setting)} roots"
    outputs = {
        "block_efficiency_grid.parquet": table,
        "by_position.parquet": positions,
        **chart_files("block_efficiency_grid", heatmap(table, f"source: {described}"), chart_writer),
    }
    printed = (
        (best_per_verifier(table), f"Best static delayed tree per verifier ({described})"),
        ByCategory(
            by_category(per_root, lambda part: best_per_verifier(summarise(part))),
            ("verifier", "K", "L1", "L2", "block_efficiency", "stderr", "accepted"),
            "Best static delayed tree per verifier",
        ),
        WROTE,
    )
    return Report(outputs, by_category(per_root, summarise), printed)


STUDY = declared(globals())


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
