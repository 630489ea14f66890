"""Verification strategies under matched settings: ``python -m analyses.compare_verifiers``.

For each sampling setting (default: DDTE's eight) and each tree verifier, every delayed-tree
action a = (K, L1, L2) of the grid {1..4} x {0..8}^2 is valued at every root
(``analyses._labels``: E[tau + 1] by DDTE's unbiased estimator over sampled trees, the same
trees for every verifier, and T-hat(a) from the latency model), and the study picks, per
setting and verifier, the best **static** configuration (one action for all roots):

* ``iid_E`` / ``iid_TPS``: the best i.i.d. tree (L1 = 0: K rollouts of L tokens, K in 1..4,
  L in 0..8) for block efficiency / for throughput (DDTE Tables 2-3): DDTE's static baseline,
  ``static = "static_iid"`` in the output (the ratios' reference);
* ``delayed_E`` / ``delayed_TPS``: the best delayed tree (K, L1, L2) over the whole grid (324
  actions on DDTE's grid): the lab's ``static = "static_all_actions"`` (``docs/departures.md``).

Throughput of a static action = mean E over roots / mean T-hat over roots (tokens per second:
tokens emitted over time spent, one step per root).  The action is chosen on half of the tree
draws and its reported E and throughput are measured on the other half, so maxima are not
inflated by noise; standard errors are across roots clustered by prompt (``trajectory``: roots
placed along one prompt's reply share it; ``simlab.stats``, CR1), with the plain per-root ones
beside them (``*_se_root``, roots taken as independent; equal when each prompt holds one root).
``--method exact`` enumerates every tree of every action instead (tiny vocabularies and grids: E
exact at each root).  Naive (``naive_chain``) and BV verify one
path and are valued at K = 1 only.  Latency: ``--cost-ratio c`` (t_q = c t_p, synthetic; t_p
= 1 s, so throughput is in tokens per target forward), a measured profile ``--latency FILE``,
or, for ``--backend hf``, a warm-up microbenchmark of the two models on this machine.

Output under ``--out``: ``compare_verifiers.parquet`` (the chosen configurations),
``grid.parquet`` (every action, aggregated over roots, with ``accepted`` = E[tau] beside E =
E[tau + 1]), ``by_position.parquet`` (every action and draft position j: ``unconditional`` =
P(tau >= j), vLLM's per-position counter, and ``conditional``, the papers' rate, as the ratio of
the means over roots; ``docs/metrics.md``), ``labels.parquet`` (every root and action),
``latency.json``, and the charts ``throughput.{html,png}`` and ``block_efficiency.{html,png}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyses._grid_study import GridStudyConfig, add_grid_study_flags, check_grid_study_flags, grid_source
from analyses._categories import by_category, with_category
from analyses._labels import DDTE_VERIFIERS, by_position, grid_of, label_all, label_root
from analyses._study import WROTE, ByCategory, Opened, Report, chart_files, declared, live_timing_reason, parse, run_study
from backends.cli import ToolParser, chart_writer, fail, name_list
from analyses._flags import study_config
from simlab import tree_verifiers
from simlab.stats import clustered_se, grouped_mean_se
from simlab.latency import LatencyModel

PROG = "python -m analyses.compare_verifiers"
DEFAULT_VERIFIERS = tuple(v for v in DDTE_VERIFIERS if v != "khisti")
CHOICES = {
    "iid_E": (True, "E_select"),
    "iid_TPS": (True, "TPS_select"),
    "delayed_E": (False, "E_select"),
    "delayed_TPS": (False, "TPS_select"),
}


@dataclass(frozen=True)
class Config(GridStudyConfig):
    """The study's settings (the command-line flags)."""

    verifiers: tuple[str, ...] = DEFAULT_VERIFIERS
    baseline: str = "traversal"
    out: str | None = None


def flags(parser: ToolParser, d: Config) -> None:
    """The grid study's flags, then ``--verifiers``, ``--baseline`` and ``--out``."""
    add_grid_study_flags(parser, d)
    parser.add_argument(
        "--verifiers",
        default=",".join(DEFAULT_VERIFIERS),
        help=f"comma-separated tree verifiers (khisti is slow): {', '.join(tree_verifiers.names())}",
    )
    parser.add_argument("--baseline", default=d.baseline, help="verifier whose throughput the ratios divide by")
    parser.add_argument("--out", default=None, help="output folder (default: out/compare_verifiers/<source>)")


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--verifiers`` as a tuple of names), or exit 2 with one line."""
    try:
        verifiers = name_list(args.verifiers, "--verifiers", tree_verifiers.names())
    except ValueError as exc:
        fail(PROG, str(exc))
    check_grid_study_flags(
        PROG,
        args,
        [
            (
                "rrs_wor" not in verifiers,
                "--verifiers: rrs_wor needs siblings drafted without replacement; the grid draws i.i.d. branches",
            ),
            (args.baseline in verifiers, f"--baseline: {args.baseline!r} must be one of the --verifiers"),
            (
                not (lossy := [v for v in verifiers if not tree_verifiers.get(v).lossless_for]),
                f"--verifiers: {', '.join(lossy)} declared lossy (lossless for no drafting law); the study compares"
                " lossless rules (their price: python -m analyses.lossy_rules)",
            ),
        ],
    )
    return study_config(Config, args, verifiers=verifiers)


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def aggregate(labels: pl.DataFrame) -> pl.DataFrame:
    """One row per (setting, verifier, action): means over roots (E, E_select, E_holdout, T and
    ``accepted`` = E[tau] over all draws), standard errors of E and E_holdout clustered by prompt
    (``trajectory``; ``E_se``, ``E_holdout_se``) and across roots taken as independent
    (``E_se_root``, ``E_holdout_se_root``), ``roots`` and ``trajectories`` (prompts) counted, and
    throughputs (tokens per second) = mean E / mean T with standard errors se(E) / mean T."""
    n = pl.len()
    se = lambda col: (pl.col(col).std() / n.sqrt()).fill_null(float("nan"))
    table = labels.group_by("setting", "verifier", "K", "L1", "L2", "tokens", maintain_order=True).agg(
        pl.col("E").mean(),
        se("E").alias("E_se_root"),
        pl.col("E_select").mean(),
        pl.col("E_holdout").mean(),
        se("E_holdout").alias("E_holdout_se_root"),
        pl.col("T").mean(),
        pl.col("accepted").mean(),
        n.alias("roots"),
        pl.col("trajectory").n_unique().alias("trajectories"),
        pl.col("E").alias("_E"),
        pl.col("E_holdout").alias("_E_holdout"),
        pl.col("trajectory").alias("_trajectory"),
    )
    table = table.with_columns(
        pl.Series("E_se", grouped_mean_se(table["_E"].to_list(), table["_trajectory"].to_list()), dtype=pl.Float64),
        pl.Series(
            "E_holdout_se", grouped_mean_se(table["_E_holdout"].to_list(), table["_trajectory"].to_list()), dtype=pl.Float64
        ),
    ).drop("_E", "_E_holdout", "_trajectory")
    return table.with_columns(
        (pl.col("E") / pl.col("T")).alias("TPS"),
        (pl.col("E_select") / pl.col("T")).alias("TPS_select"),
        (pl.col("E_holdout") / pl.col("T")).alias("TPS_holdout"),
        (pl.col("E_holdout_se") / pl.col("T")).alias("TPS_holdout_se"),
        (pl.col("E_holdout_se_root") / pl.col("T")).alias("TPS_holdout_se_root"),
    )


TIE = 1e-12
"""Criteria within this relative distance of the best are ties: the smallest action (K, L1, L2) wins,
so a choice never hinges on the last bits of a sum (two actions that draw the same trees, for
example, agree only to rounding)."""


def choose(grid: pl.DataFrame, baseline: str) -> pl.DataFrame:
    """The best static action per (setting, verifier, choice), reported on the held-out draws,
    with throughput ratios to the baseline verifier's ``iid_TPS`` choice of the same setting.
    Ties (within ``TIE``) go to the smallest (K, L1, L2)."""
    parts = []
    for choice, (iid_only, criterion) in CHOICES.items():
        pool = grid.filter(pl.col("L1") == 0) if iid_only else grid
        top = pl.col(criterion).max().over("setting", "verifier")
        best = (
            pool.filter(pl.col(criterion) >= top - TIE * top.abs())
            .sort(["setting", "verifier", "K", "L1", "L2"])
            .group_by("setting", "verifier", maintain_order=True)
            .first()
        )
        parts.append(
            best.with_columns(
                pl.lit(choice).alias("choice"), pl.lit("static_iid" if iid_only else "static_all_actions").alias("static")
            )
        )
    chosen = pl.concat(parts)
    base = chosen.filter((pl.col("verifier") == baseline) & (pl.col("choice") == "iid_TPS")).select(
        "setting", pl.col("TPS_holdout").alias("baseline_TPS")
    )
    return (
        chosen.join(base, on="setting", how="left")
        .with_columns((pl.col("TPS_holdout") / pl.col("baseline_TPS")).alias("TPS_ratio"))
        .select(
            "setting",
            "verifier",
            "choice",
            "static",
            "K",
            "L1",
            "L2",
            "tokens",
            pl.col("E_holdout").alias("E"),
            pl.col("E_holdout_se").alias("E_se"),
            "T",
            pl.col("TPS_holdout").alias("TPS"),
            pl.col("TPS_holdout_se").alias("TPS_se"),
            "TPS_ratio",
            "roots",
            "trajectories",
            pl.col("E_holdout_se_root").alias("E_se_root"),
            pl.col("TPS_holdout_se_root").alias("TPS_se_root"),
        )
    )


def _paired_rows(labels: pl.DataFrame, chosen: pl.DataFrame, left: tuple[str, str], right: tuple[str, str]) -> pl.DataFrame:
    """One row per root held by both sides: setting, trajectory, root, E_l, T_l, E_r, T_r and
    d = E_l / mean T_l - E_r / mean T_r (means over the setting's roots; ``paired_difference``)."""

    def side(verifier, choice, tag):
        pick = chosen.filter((pl.col("verifier") == verifier) & (pl.col("choice") == choice)).select("setting", "K", "L1", "L2")
        rows = labels.filter(pl.col("verifier") == verifier).join(pick, on=["setting", "K", "L1", "L2"])
        return rows.select("setting", "trajectory", "root", pl.col("E_holdout").alias(f"E_{tag}"), pl.col("T").alias(f"T_{tag}"))

    both = side(*left, "l").join(side(*right, "r"), on=["setting", "trajectory", "root"])
    return both.with_columns(
        (pl.col("E_l") / pl.col("T_l").mean().over("setting") - pl.col("E_r") / pl.col("T_r").mean().over("setting")).alias("d")
    )


def average_difference_se(labels: pl.DataFrame, chosen: pl.DataFrame, left: tuple[str, str], right: tuple[str, str]) -> float:
    """The standard error of the mean over settings of ``paired_difference``'s ``diff``, clustered
    by prompt across the settings (``trajectory``: every setting holds the same prompts, so the
    settings' differences are not independent): ``simlab.stats.clustered_se`` (CR1) of the
    influence (d_i - diff_s) / (n_s S) of root i of setting s (n_s roots, S settings); NaN with one
    prompt or no root."""
    both = _paired_rows(labels, chosen, left, right)
    if both.height == 0:
        return float("nan")
    settings = both["setting"].n_unique()
    psi = both.select(((pl.col("d") - pl.col("d").mean().over("setting")) / (pl.len().over("setting") * settings)).alias("psi"))
    return clustered_se(psi["psi"].to_list(), both["trajectory"].to_list())


def paired_difference(labels: pl.DataFrame, chosen: pl.DataFrame, left: tuple[str, str], right: tuple[str, str]) -> pl.DataFrame:
    """Per setting: TPS(left) - TPS(right) on the held-out draws and its paired standard errors.

    ``left`` and ``right`` are (verifier, choice).  With T fixed by the action and the context,
    TPS = mean E / mean T, so the difference ``diff`` is the mean over roots of d_i = E_left,i /
    mean T_left - E_right,i / mean T_right.  Its standard error ``se`` is clustered by prompt
    (``trajectory``: ``simlab.stats.clustered_mean_se`` of d, CR1; NaN with one prompt);
    ``se_root`` = sd(d) / sqrt(roots) takes the roots as independent (equal to ``se`` when each
    prompt holds one root).  Pairing by root (same contexts, same sampled trees) removes the
    between-root variance both sides share.  Columns: setting, diff, se, se_root, roots,
    trajectories.
    """

    both = _paired_rows(labels, chosen, left, right)
    table = both.group_by("setting", maintain_order=True).agg(
        pl.col("d").mean().alias("diff"),
        (pl.col("d").std() / pl.len().sqrt()).fill_null(float("nan")).alias("se_root"),
        pl.len().alias("roots"),
        pl.col("trajectory").n_unique().alias("trajectories"),
        pl.col("d").alias("_d"),
        pl.col("trajectory").alias("_trajectory"),
    )
    se = pl.Series("se", grouped_mean_se(table["_d"].to_list(), table["_trajectory"].to_list()), dtype=pl.Float64)
    return table.with_columns(se).select("setting", "diff", "se", "se_root", "roots", "trajectories")


def difference_table(labels, chosen, pairs, settings: list[str]) -> pl.DataFrame:
    """One row per (name, left, right): the paired difference by setting with its standard error
    clustered by prompt (``paired_difference``'s ``se``) and its mean over settings (standard
    error clustered by prompt across the settings: ``average_difference_se``)."""
    rows = []
    for name, left, right in pairs:
        diff = paired_difference(labels, chosen, left, right)
        by = {r["setting"]: r for r in diff.iter_rows(named=True)}
        row = {"comparison": name}
        for s in settings:
            row[s] = f"{by[s]['diff']:+.3f} ± {by[s]['se']:.3f}" if s in by else ""
        mean = float(np.mean([by[s]["diff"] for s in by])) if by else float("nan")
        se = average_difference_se(labels, chosen, left, right)
        row["average"] = f"{mean:+.3f} ± {se:.3f}"
        rows.append(row)
    return pl.DataFrame(rows)


def wide(chosen: pl.DataFrame, choice: str, value: str, settings: list[str], verifiers) -> pl.DataFrame:
    """Paper layout: one row per verifier (DDTE names), one column per setting, then the average."""
    part = chosen.filter(pl.col("choice") == choice)
    rows = []
    for v in verifiers:
        values = {s: part.filter((pl.col("verifier") == v) & (pl.col("setting") == s))[value].to_list() for s in settings}
        row = {"verifier": tree_verifiers.paper_name(v), **{s: (vals[0] if vals else None) for s, vals in values.items()}}
        present = [x for x in row.values() if isinstance(x, float)]
        row["average"] = float(np.mean(present)) if present else None
        rows.append(row)
    return pl.DataFrame(rows).sort("average", nulls_last=True)


def charts(chosen: pl.DataFrame, order: list[str], subtitle: str):
    """(throughput chart, block-efficiency chart): bars per verifier, i.i.d. vs delayed, per setting;
    ``subtitle`` names the source and the latency model."""
    import altair as alt

    data = chosen.filter(pl.col("choice").is_in(["iid_TPS", "delayed_TPS", "iid_E", "delayed_E"])).with_columns(
        pl.col("verifier").replace_strict(tree_verifiers.paper_names(), default=pl.col("verifier")).alias("method"),
        pl.when(pl.col("choice").str.starts_with("iid"))
        .then(pl.lit("static i.i.d."))
        .otherwise(pl.lit("static delayed"))
        .alias("tree"),
        (pl.col("TPS") - 1.96 * pl.col("TPS_se").fill_nan(0.0)).alias("TPS_lo"),
        (pl.col("TPS") + 1.96 * pl.col("TPS_se").fill_nan(0.0)).alias("TPS_hi"),
        (pl.col("E") - 1.96 * pl.col("E_se").fill_nan(0.0)).alias("E_lo"),
        (pl.col("E") + 1.96 * pl.col("E_se").fill_nan(0.0)).alias("E_hi"),
        pl.format("K={} L1={} L2={}", "K", "L1", "L2").alias("action"),
    )
    out = []
    for metric, choice_suffix, title in (
        ("TPS", "_TPS", "throughput (tokens/s)"),
        ("E", "_E", "block efficiency E[tau+1] (tokens/step)"),
    ):
        part = data.filter(pl.col("choice").str.ends_with(choice_suffix))
        base = alt.Chart(part).encode(
            x=alt.X("method:N", title=None, sort="-y"), xOffset="tree:N", color=alt.Color("tree:N", title="best static tree")
        )
        chart = (
            (
                base.mark_bar().encode(
                    y=alt.Y(f"{metric}:Q", title=title), tooltip=["method", "tree", "action", metric, f"{metric}_se"]
                )
                + base.mark_rule(color="black").encode(y=f"{metric}_lo:Q", y2=f"{metric}_hi:Q")
            )
            .properties(width=230, height=180)
            .facet(facet=alt.Facet("setting:N", title=None, sort=order), columns=4)
            .properties(
                title=alt.TitleParams(
                    f"Best static configuration per verifier and setting: {title} (held-out draws, 95% bars, SE clustered by prompt)",
                    subtitle=subtitle,
                )
            )
        )
        out.append(chart)
    return out


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The grid study's source, settings and latency model (``analyses._grid_study.grid_source``)."""
    return Opened(*grid_source(PROG, parser, config))


def value_root(config: Config, opened: Opened, task) -> list[dict]:
    """One root's labels (``analyses._labels.label_root``): seeded by (seed, setting index,
    trajectory, root) alone."""
    return label_root(task.root, config.verifiers, grid_of(config), opened.latency, seed=config.seed, key=task.setting_index)


def merge(config: Config, opened: Opened, payloads) -> pl.DataFrame:
    """The labels frame of every root's rows in order, as ``label_all`` builds it."""
    return with_category(pl.DataFrame([row for rows in payloads for row in rows]))


def values(config: Config, opened: Opened, say) -> pl.DataFrame:
    """Every root's labels in one process (settings of a synthetic world in ``--jobs`` workers)."""
    labels, _ = label_all(
        opened.source,
        opened.settings,
        config.verifiers,
        grid_of(config),
        opened.latency,
        seed=config.seed,
        jobs=config.jobs,
        quiet=config.quiet,
    )
    return labels


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: live models timed on each rank's machine."""
    return live_timing_reason(config, parser)


def run(config: Config, opened: Opened, labels: pl.DataFrame, say) -> Report:
    """The chosen configurations, the grid, the per-position rates, the labels, the charts and the tables."""
    source, latency, settings = opened.source, opened.latency, [s.name for s in opened.settings]
    grid = aggregate(labels)
    chosen = choose(grid, config.baseline)
    categories = by_category(labels, lambda part: choose(aggregate(part), config.baseline))
    tps_chart, e_chart = charts(chosen, settings, f"source: {source.describe()}; latency: {latency.source}")
    outputs = {
        "compare_verifiers.parquet": chosen,
        "grid.parquet": grid,
        "by_position.parquet": by_position(labels, ["setting", "verifier", "K", "L1", "L2"]),
        "labels.parquet": labels,
        "latency.json": lambda tmp: latency.save(tmp),
        **chart_files("throughput", tps_chart, chart_writer),
        **chart_files("block_efficiency", e_chart, chart_writer),
    }
    printed = (
        *tables(config, source, latency, chosen, labels, settings),
        WROTE,
        ByCategory(
            categories,
            ("setting", "verifier", "choice", "K", "L1", "L2", "E", "E_se", "TPS", "TPS_se", "TPS_ratio", "roots"),
            "Best static configurations for throughput (held-out E[tau+1] and throughput; SE clustered by prompt)",
            pl.col("choice").str.ends_with("_TPS"),
        ),
    )
    return Report(outputs, categories, printed)


def tables(
    config: Config, source, latency: LatencyModel, chosen: pl.DataFrame, labels: pl.DataFrame, settings: list[str]
) -> list:
    """The printed lines and paper-layout tables (``analyses._study.Report.printed`` items)."""
    roots, prompts = int(chosen["roots"].max()), int(chosen["trajectories"].max())
    items: list = [
        f"Source: {source.describe()}; {roots} roots over {prompts} prompts per setting; standard errors clustered by"
        f" prompt; latency: {latency.source}"
    ]
    items.append(
        (
            wide(chosen, "iid_E", "E", settings, config.verifiers),
            "Block efficiency E[tau+1] (tokens per step), best static i.i.d. tree for E (cf. DDTE Table 2)",
        )
    )
    items.append(
        (
            wide(chosen, "iid_TPS", "TPS", settings, config.verifiers),
            "Throughput (tokens/s), best static i.i.d. tree for throughput (cf. DDTE Table 3)",
        )
    )
    items.append(
        (
            wide(chosen, "iid_TPS", "TPS_ratio", settings, config.verifiers),
            f"Throughput ratio to {tree_verifiers.paper_name(config.baseline)} (best static i.i.d. trees)",
        )
    )
    items.append(
        (
            wide(chosen, "delayed_TPS", "TPS", settings, config.verifiers),
            "Throughput (tokens/s), best static delayed tree (K, L1, L2) for throughput",
        )
    )
    base = tree_verifiers.paper_name(config.baseline)
    versus = [
        (f"{base} - {tree_verifiers.paper_name(v)}", (config.baseline, "iid_TPS"), (v, "iid_TPS"))
        for v in config.verifiers
        if v != config.baseline
    ]
    items.append(
        (
            difference_table(labels, chosen, versus, settings),
            "Throughput difference (tokens/s) on best static i.i.d. trees, paired by root and tree draw"
            " (± standard error clustered by prompt)",
        )
    )
    delayed = [
        (tree_verifiers.paper_name(v), (v, "delayed_TPS"), (v, "iid_TPS"))
        for v in config.verifiers
        if not tree_verifiers.get(v).single_path
    ]
    items.append(
        (
            difference_table(labels, chosen, delayed, settings),
            "Delayed minus i.i.d.: throughput gain (tokens/s) of the best static delayed tree, paired"
            " (± standard error clustered by prompt)",
        )
    )
    gains = []
    for v in config.verifiers:
        part = chosen.filter(pl.col("verifier") == v)
        iid, delayed = (part.filter(pl.col("choice") == c)["TPS"].mean() for c in ("iid_TPS", "delayed_TPS"))
        actions = part.filter(pl.col("choice") == "delayed_TPS").select(pl.format("({},{},{})", "K", "L1", "L2"))[:, 0].to_list()
        gains.append(
            {
                "verifier": tree_verifiers.paper_name(v),
                "iid TPS": iid,
                "delayed TPS": delayed,
                "delayed / iid": delayed / iid,
                "delayed actions by setting": " ".join(actions),
            }
        )
    items.append(
        (
            pl.DataFrame(gains),
            "Delayed expansion: average throughput of the best static delayed vs i.i.d. tree (ratio of averages)",
        )
    )
    chain = [tree_verifiers.paper_name(v) for v in config.verifiers if tree_verifiers.get(v).single_path]
    if chain:
        items.append(f"({', '.join(chain)} verify one path: valued at K = 1 only.)")
    return items


STUDY = declared(globals())


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
