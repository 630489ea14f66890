"""Parallel vs autoregressive drafting at matched budgets: ``python -m analyses.parallel_drafters``.

At every root of a source (a synthetic world, or live models) and every verify budget (draft
tokens, root excluded), four deterministic trees are valued exactly (one tree per root:
E[tau + 1] under the setting's rule for deterministic trees, one-hot at T > 0, greedy at T = 0;
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

import sys
from dataclasses import dataclass

import polars as pl

from analyses._categories import by_category, print_by_category, stage_by_category, with_category
from backends.cli import (
    OutputSet,
    ToolParser,
    add_output_flags,
    chart_writer,
    check_flags,
    fail_from,
    int_list,
    parquet_writer,
    print_table,
    progress_bar,
    run_tool,
)
from backends.parallel_draft import RootConditioned
from backends.sources.flags import (
    LatencyConfig,
    SourceConfig,
    make_latency,
    make_source,
    study_config,
    study_out,
    study_parser,
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
    """The study's settings (the command-line flags); source and latency fields as ``SourceConfig``'s."""

    latency: str | None = "specblock-a100"
    budgets: str = "8,16,32,63"
    depth: int = 8
    out: str | None = None
    quiet: bool = False


def parse_args(argv) -> tuple[Config, ToolParser]:
    d = Config()
    parser = study_parser(PROG, __doc__, d)
    parser.add_argument("--budgets", default=d.budgets, help="verify budgets in draft tokens (1..63: Medusa's tree has 63)")
    parser.add_argument("--depth", type=int, default=d.depth, help="DDTree's positions (the parallel drafter's block), 1..64")
    add_output_flags(parser, PROG)
    args = parser.parse_args(argv)
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
    except ValueError as exc:
        fail_from(PROG, exc)
    config = study_config(Config, args)
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
    return config, parser


def builders_at(budget: int, depth: int) -> dict:
    return {
        "eagle2": EAGLE2(budget=budget),
        "static": Static(Medusa(budget=budget).spec),
        "medusa": Medusa(budget=budget),
        "ddtree": DDTree(budget=budget, depth=depth),
    }


def measure(config: Config, source, settings, latency, budgets) -> pl.DataFrame:
    """One row per (setting, root, budget, tree): E, T-hat, tokens."""
    rows = []
    total = sum(source.count(s) for s in settings)
    with progress_bar(total=total, desc="roots", unit="root", quiet=config.quiet) as bar:
        for setting in settings:
            verifier = tree_verifiers.deterministic_rule(setting)
            for root in source.roots(setting):
                tables = {"autoregressive": NodeTable(root.pair, root.context)}
                tables["parallel"] = NodeTable(RootConditioned(root.pair, len(root.context)), root.context)
                for budget in budgets:
                    for name, builder in builders_at(budget, config.depth).items():
                        table = tables[DRAFTERS[name]]
                        value = tree_value(builder, table, verifier, latency, drafting=table.untempered())
                        rows.append(
                            {
                                "setting": setting.name,
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


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    budgets = int_list(config.budgets, "--budgets", minimum=1)
    source, settings = make_source(
        PROG, parser, config, depth=max(8, config.depth), study_refusals={"capture": {"capture": "the trees are built here"}}
    )
    latency = make_latency(PROG, parser, config, source, max(budgets))
    out = study_out(PROG, config, source.slug())
    try:
        per_root = measure(config, source, settings, latency, budgets)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    summary = summarise(per_root)
    categories = by_category(per_root, summarise)
    with OutputSet(out) as outputs:
        outputs.stage("parallel_drafters.parquet", parquet_writer(summary))
        outputs.stage("per_root.parquet", parquet_writer(per_root))
        stage_by_category(outputs, categories)
        graph = chart(summary, f"source: {source.describe()}; latency: {latency.source}")
        for fmt in ("html", "png"):
            outputs.stage(f"throughput.{fmt}", chart_writer(graph, fmt))
        outputs.publish()
    if not config.quiet:
        print(f"Source: {source.describe()}; latency: {latency.source}")
        print_table(
            summary.drop("verifier"), "E[tau+1] (mean over roots, with its standard error), T-hat and throughput by verify budget"
        )
        print_by_category(categories, [c for c in summary.columns if c != "verifier"], "E[tau+1] (SE), T-hat and throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
