"""Parallel vs autoregressive drafting at matched budgets: ``python -m analyses.parallel_drafters``.

At every root of a source (a synthetic world, or live models) and every verify budget (draft
tokens, root excluded), four deterministic trees are valued exactly (one tree per root:
E[tau + 1] under the setting's rule for deterministic trees, one-hot at a sampled target, greedy at a greedy one (T = 0 or top-k = 1);
NSS, DDTree's own rule, gives the same value on deterministic trees):

* autoregressive draft (the source's pair, q(. | prefix)): ``eagle2`` (EAGLE-2 at the budget,
  depth 7, top-k 10: one draft forward per level) and ``static`` (Medusa's ``mc_sim_7b_63``
  topology, its first ``budget`` paths, children ranked by q(. | prefix): EAGLE-1's static tree,
  one draft forward per level);
* parallel draft (the same pair's root-conditioned stand-in, ``backends.parallel_draft``: q at a
  node of depth d is the draft after the root and its own greedy chain of d tokens): ``medusa``
  (the same topology over the position rows) and ``ddtree`` (DDTree's best-first tree,
  ``--depth`` positions): one draft forward per tree.

So ``static`` vs ``medusa`` isolates the drafting model on one topology, and ``eagle2`` vs
``ddtree`` compares each drafter's own dynamic tree.  T-hat per step comes from ``--latency``
(default the published ``specblock-a100`` profile); throughput = sum E / sum T-hat over roots.
Output under ``--out``: ``parallel_drafters.parquet`` (summary), ``per_root.parquet``,
``throughput.{html,png}``.  Trees are ranked by the drafters' untempered law and valued under the
setting (``NodeTable.untempered``, as ``analyses.compare_builders``).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from analyses._categories import by_category, with_category
from analyses._study import ByCategory, Opened, Report, chart_files, declared, live_timing_reason, parse, run_study
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, int_list, progress_bar
from backends.parallel_draft import RootConditioned
from analyses._flags import (
    LatencyConfig,
    SourceConfig,
    add_latency_flags,
    add_source_flags,
    make_latency,
    make_source,
    study_config,
)
from simlab import builders, tree_verifiers
from simlab.builders import DDTree, EAGLE2, Medusa, Static
from simlab.trees import NodeTable
from simlab.valuation import tree_value

PROG = "python -m analyses.parallel_drafters"
TREES = ("eagle2", "static", "medusa", "ddtree")
"""The registered builders (``simlab.builders``) the study values, in its order."""
DRAFTERS = {name: "parallel" if builders.parallel_draft(name) else "autoregressive" for name in TREES}
"""Each tree's drafting model, as its builder declares it (``parallel_draft`` on the class)."""


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags); source and latency fields as ``SourceConfig``'s.
    ``budgets``: verify budgets in draft tokens (a tuple of ints; a string given in code is read
    once by ``backends.cli.int_list``, which raises ``ValueError`` naming ``--budgets``)."""

    latency: str | None = "specblock-a100"
    budgets: tuple[int, ...] = (8, 16, 32, 63)
    depth: int = 8
    out: str | None = None
    quiet: bool = False

    def __post_init__(self):
        if isinstance(self.budgets, str):
            object.__setattr__(self, "budgets", int_list(self.budgets, "--budgets", minimum=1))


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, ``--budgets``, ``--depth`` and the output flags."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    parser.add_argument(
        "--budgets",
        default=",".join(map(str, d.budgets)),
        help="verify budgets in draft tokens (1..63: Medusa's tree has 63)",
    )
    parser.add_argument("--depth", type=int, default=d.depth, help="DDTree's positions (the parallel drafter's block), 1..64")
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--budgets`` as a tuple of ints), or exit 2 with one line."""
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, budgets=budgets)
    check_flags(
        PROG,
        [
            (max(budgets) <= 63, f"--budgets: at most 63 (Medusa's mc_sim_7b_63 tree), got {max(budgets)}"),
            (1 <= config.depth <= 64, f"--depth: must lie in [1, 64], got {config.depth}"),
            (
                config.world != "parallel",
                "--world: the study builds the parallel stand-in of the world itself; give an autoregressive world",
            ),
        ],
    )
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def builders_at(budget: int, depth: int) -> dict:
    return {
        "eagle2": EAGLE2(budget=budget),
        "static": Static(Medusa(budget=budget).spec),
        "medusa": Medusa(budget=budget),
        "ddtree": DDTree(budget=budget, depth=depth),
    }


def root_rows(config: Config, latency, setting_name: str, verifier: str, root) -> list[dict]:
    """One root's rows: every budget and tree of ``builders_at``, valued exactly
    (``simlab.valuation.tree_value``, ranked by the drafters' untempered law) on the tree's drafter's table."""
    tables = {"autoregressive": root.table()}
    tables["parallel"] = NodeTable(RootConditioned(root.pair, len(root.context)), root.context)
    rows = []
    for budget in config.budgets:
        for name, builder in builders_at(budget, config.depth).items():
            table = tables[DRAFTERS[name]]
            value = tree_value(builder, table, verifier, latency, drafting=table.untempered())
            rows.append(
                {
                    "setting": setting_name,
                    "verifier": verifier,
                    "trajectory": root.trajectory,
                    "root": root.root,
                    "category": root.category,
                    "budget": budget,
                    "tree": name,
                    "drafter": DRAFTERS[name],
                    "E": value.E,
                    "T": value.T,
                    "tokens": value.tokens,
                    "draft_forwards": len(value.trees[0].cost.forwards),
                }
            )
    return rows


def measure(config: Config, source, settings, latency) -> pl.DataFrame:
    """One row per (setting, root, budget, tree): E, T-hat, tokens (``root_rows``), with a progress bar."""
    rows = []
    total = sum(source.count(s) for s in settings)
    with progress_bar(total=total, desc="roots", unit="root", quiet=config.quiet) as bar:
        for setting in settings:
            verifier = tree_verifiers.deterministic_rule(setting)
            for root in source.roots(setting):
                rows += root_rows(config, latency, setting.name, verifier, root)
                bar.update(1)
    return with_category(pl.DataFrame(rows))


def summarise(per_root: pl.DataFrame) -> pl.DataFrame:
    """Per (setting, budget, tree): mean E, its standard error over roots, mean T-hat, throughput
    (sum E / sum T), mean tokens and draft forwards."""
    return (
        per_root.group_by("setting", "verifier", "budget", "tree", "drafter", maintain_order=True)
        .agg(
            pl.len().alias("roots"),
            pl.col("E").mean().alias("E"),
            (pl.col("E").std() / pl.len().sqrt()).alias("E_se"),
            pl.col("T").mean().alias("T"),
            (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
            pl.col("tokens").mean().alias("tokens"),
            pl.col("draft_forwards").mean().alias("draft_forwards"),
        )
        .sort("setting", "budget", "tree")
    )


def chart(summary: pl.DataFrame, subtitle: str):
    import altair as alt

    return (
        alt.Chart(summary)
        .mark_line(point=True)
        .encode(
            x=alt.X("budget:Q", title="verify budget (draft tokens)"),
            y=alt.Y("TPS:Q", title="throughput (tokens per unit of the latency profile)"),
            color=alt.Color("tree:N"),
            strokeDash=alt.StrokeDash("drafter:N"),
        )
        .facet(column=alt.Column("setting:N"))
        .properties(title=alt.TitleParams("Parallel vs autoregressive drafting at matched budgets", subtitle=subtitle))
    )


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The source the flags name (never a capture: the trees are built here) and the latency model."""
    source, settings = make_source(
        PROG, parser, config, depth=max(8, config.depth), study_refusals={"capture": {"capture": "the trees are built here"}}
    )
    return Opened(source, settings, make_latency(PROG, parser, config, source, max(config.budgets)))


def values(config: Config, opened: Opened, say) -> pl.DataFrame:
    """Every root's rows in one process (``measure``)."""
    return measure(config, opened.source, opened.settings, opened.latency)


def value_root(config: Config, opened: Opened, task) -> list[dict]:
    """One root's rows (``root_rows``): deterministic trees, so they depend on that root alone."""
    setting = task.setting
    return root_rows(config, opened.latency, setting.name, tree_verifiers.deterministic_rule(setting), task.root)


def merge(config: Config, opened: Opened, payloads) -> pl.DataFrame:
    """The per-root frame of every root's rows in order, as ``measure`` builds it."""
    return with_category(pl.DataFrame([row for rows in payloads for row in rows]))


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: live models timed on each rank's machine."""
    return live_timing_reason(config, parser)


def run(config: Config, opened: Opened, per_root: pl.DataFrame, say) -> Report:
    """The summary, the per-root rows, the by-category table, the chart and the printed tables."""
    source, latency = opened.source, opened.latency
    summary = summarise(per_root)
    categories = by_category(per_root, summarise)
    graph = chart(summary, f"source: {source.describe()}; latency: {latency.source}")
    outputs = {
        "parallel_drafters.parquet": summary,
        "per_root.parquet": per_root,
        **chart_files("throughput", graph, chart_writer),
    }
    printed = (
        f"Source: {source.describe()}; latency: {latency.source}",
        (summary.drop("verifier"), "E[tau+1] (mean over roots, with its standard error), T-hat and throughput by verify budget"),
        ByCategory(categories, tuple(c for c in summary.columns if c != "verifier"), "E[tau+1] (SE), T-hat and throughput"),
    )
    return Report(outputs, categories, printed)


STUDY = declared(globals())


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
