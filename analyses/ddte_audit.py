"""The DDTE audit: how much of a published number each public-code convention explains: ``python -m analyses.ddte_audit``.

At every root of a source (default: the synthetic ``depth_profile`` world, V = 32, DDTE's eight
sampling settings) the study labels DDTE's delayed-tree grid (K <= 4, L1, L2 <= 8, ``--samples``
trees per L1, the same trees for every verifier and convention: common random numbers) for
SpecInfer, SpecTr, Khisti and Traversal under

* **exact**: the lab's conventions (one trunk child, rho*, Khisti's guarded tail);
* **per_path**: the trunk children of the authors' public tree code, one edge per path (a trunk
  node lists its drafted child K times: ``Delayed(..., trunk_children="per_path")``), valued as if
  the copies were K i.i.d. draws: **lossy** for SpecInfer, SpecTr and Khisti (their labels are
  computed with ``allow_lossy``), exact for Traversal;
* **four_step**: SpecTr's rho by a four-step search (``SpecTr(rho="four_step")``, lossless);
* **rank**: Khisti's tail resolved by rank (``Khisti(tail="rank")``, lossless);
* **public**: all three together, as the public code runs.

Reported per setting, verifier and convention: the mean label inflation over the grid (E under
the convention minus exact E, per action, paired by tree), the best static action chosen on the
convention's labels with its claimed throughput and its exact one (the value of that choice
under the lab's exact conventions), and the gap to Traversal's exact best static throughput of
the same kind.  Two kinds of static action, labelled in the ``static`` column
(``analyses._selector_data``): ``static_iid``, DDTE's static baseline (plain i.i.d. rollouts,
L1 = 0), and ``static_all_actions``, the lab's option (the best of every delayed action).

The selector's policy under each convention (unless ``--no-selector``): ``docs/derivations/ddte_audit.md``.

Output under ``--out`` (default ``out/ddte_audit/<source>/``): ``ddte_audit.parquet`` (summary),
``labels.parquet`` (every root, action, verifier and convention; with the engines' metrics
``accepted`` = E[tau] and ``unconditional`` = [P(tau >= j)] by the same estimator),
``by_position.parquet`` (per setting, verifier, convention, action and position j: P(tau >= j)
and the papers' conditional rate, as the ratio of its means over roots; ``docs/metrics.md``),
``inflation.{html,png}``, and
with the selector ``selector.parquet`` (per verifier, convention, policy and setting, "all" for
the ratio of totals) and ``selector_roots.parquet`` (each test root's chosen action and values) and ``selector.{html,png}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from analyses._categories import by_category, with_category
from analyses._labels import by_position, feature_record
from analyses._selector_data import choose, feature_arrays, fit_selector, static_choice, value_matrices
from analyses._study import WROTE, ByCategory, Opened, Report, Study, chart_files, live_timing_reason, parse, run_study
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, progress_bar
from analyses._flags import LatencyConfig, SourceConfig, make_latency, make_source, study_config
from analyses._flags import add_latency_flags, add_source_flags
from simlab import tree_verifiers
from simlab.grid import DDTE_AXES, draw_grid, grid_metrics

PROG = "python -m analyses.ddte_audit"
GPU_PROFILE = "specblock-a100"
"""The latency profile (``simlab.latency_profiles``) on a pretrained pair without --latency: the default on the pretrained pair: DDTE publishes no timing (simlab.latency_profiles.UNPUBLISHED), so the closest published A100 verify/draft times (SpecBlock's, an 8B target with an EAGLE-style draft)."""
CONVENTIONS = ("exact", "per_path", "four_step", "rank", "public")
VERIFIERS = ("specinfer", "spectr", "khisti", "traversal")
SELECTOR_VERIFIERS = ("specinfer", "spectr", "khisti")
POLICIES = ("static_iid", "static_all_actions", "selector")
STATIC_POLICIES = ("static_iid", "static_all_actions")  # = analyses._selector_data.STATIC_BASELINES
REFUSALS = {"capture": {"capture": "the audit draws its own grid trees; use --backend hf or a synthetic world"}}
HF_DEFAULTS = {"roots_per_trajectory": 2, "spacing": 8}


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags)."""

    trajectories: int = 4
    roots_per_trajectory: int = 1
    settings: str = "ddte"
    samples: int = 2
    selector: bool = True
    epochs: int = 200
    out: str | None = None
    quiet: bool = False


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags (``--capture`` refused), ``--samples``, ``--no-selector``,
    ``--epochs`` and the output flags."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    for action in parser._actions:  # the shared source flags: say what this study does with --capture
        if action.dest == "capture":
            action.help = f"refused here: {REFUSALS['capture']['capture']}"
    parser.add_argument("--samples", type=int, default=d.samples, help="grid trees per L1 (shared by verifiers and conventions)")
    parser.add_argument(
        "--no-selector", dest="selector", action="store_false", help="skip the selector's policies (they need >= 3 trajectories)"
    )
    parser.add_argument("--epochs", type=int, default=d.epochs, help="selector training epochs (per verifier and convention)")
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The config, or exit 2 with one line (bad ``--samples`` or ``--epochs``; too few trajectories
    for the selector's split)."""
    config = study_config(Config, args)
    check_flags(
        PROG,
        [
            (config.samples >= 1, f"--samples: must be >= 1, got {config.samples}"),
            (config.epochs >= 1, f"--epochs: must be >= 1, got {config.epochs}"),
            (config.selector or "epochs" not in parser.given, "--epochs: trains the selector, which --no-selector skips"),
            (
                not config.selector or config.trajectories >= 3,
                f"--trajectories: the selector's train/validation/test split needs >= 3, got {config.trajectories} "
                "(or pass --no-selector)",
            ),
        ],
    )
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv`` (with the live-model defaults)."""
    return parse(STUDY, argv)


def convention(verifier: str, name: str):
    """(tree verifier, trunk_children) of ``verifier`` under convention ``name``; None where the
    convention does not touch that verifier (its labels are the exact ones)."""
    options = {}
    if name in ("four_step", "public") and verifier == "spectr":
        options["rho"] = "four_step"
    if name in ("rank", "public") and verifier == "khisti":
        options["tail"] = "rank"
    trunk = "per_path" if name in ("per_path", "public") else "shared"
    if name != "exact" and not options and trunk == "shared":
        return None
    return tree_verifiers.get(verifier, allow_lossy=trunk == "per_path", **options), trunk


def root_values(config: Config, setting, root, latency) -> tuple[list[dict], dict | None]:
    """One root's label rows (every verifier, convention and grid action, on trees drawn from
    ``default_rng([seed, root id])``) and, with ``config.selector``, its feature record
    (``analyses._labels.feature_record``), else None."""
    table, axes = root.table(), DDTE_AXES
    drafts = draw_grid(
        table,
        K_max=axes.width,
        L1_values=axes.L1_values,
        L2_max=axes.depth,
        samples=config.samples,
        rng=np.random.default_rng([config.seed, root.root]),
    )
    rows, times = [], {}
    keys = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "category": root.category}
    for v in VERIFIERS:
        for name in CONVENTIONS:
            chosen = convention(v, name)
            if chosen is None:
                continue
            verifier, trunk = chosen
            grid = grid_metrics(table, drafts, verifier, K_values=axes.K_values, L2_values=axes.L2_values, trunk_children=trunk)
            for action, metrics in grid.items():
                if action not in times:
                    times[action] = latency.delayed_time(*action, len(root.context))
                rows.append(
                    {
                        **keys,
                        "verifier": v,
                        "convention": name,
                        "K": action[0],
                        "L1": action[1],
                        "L2": action[2],
                        "E": metrics.E.mean,
                        "T": times[action],
                        "accepted": metrics.accepted,
                        "unconditional": metrics.unconditional.tolist(),
                    }
                )
    return rows, feature_record(root, setting, latency) if config.selector else None


def label(config: Config, source, settings, latency) -> tuple[list[dict], list[dict]]:
    """(one row per root, setting, verifier, convention and grid action; with ``config.selector``
    one feature record per root, ``simlab.selector.features.root_features``, else [])."""
    rows, records = [], []
    bar = progress_bar(total=sum(source.count(s) for s in settings), desc="roots", unit="root", quiet=config.quiet)
    for setting in settings:
        for root in source.roots(setting):
            own, record = root_values(config, setting, root, latency)
            rows.extend(own)
            records.extend([record] if record is not None else [])
            bar.update()
    bar.close()
    return rows, records


def with_exact(labels: pl.DataFrame) -> pl.DataFrame:
    """Every (convention, verifier, root, action) with its label ``E`` under the convention (the
    exact one where the convention does not touch the verifier) and ``E_exact``."""
    key = ["setting", "trajectory", "root", "verifier", "K", "L1", "L2"]
    exact = labels.filter(pl.col("convention") == "exact")
    filled = []
    for name in CONVENTIONS:
        own = labels.filter(pl.col("convention") == name).drop("convention")
        missing = exact.drop("convention").join(own.select(key), on=key, how="anti")
        filled.append(pl.concat([own, missing]).with_columns(pl.lit(name).alias("convention")))
    return pl.concat(filled).join(exact.select(*key, pl.col("E").alias("E_exact")), on=key)


def summarise(labels: pl.DataFrame) -> pl.DataFrame:
    """Per setting, verifier, convention and kind of static action (``static``: ``static_iid``, the
    i.i.d. rollouts with L1 = 0, DDTE's baseline; ``static_all_actions``, every delayed action): mean
    inflation, the best static action of that kind on the convention's labels, its claimed and exact
    throughput, and the gap to Traversal's exact best of the same kind."""
    full = with_exact(labels)
    inflation = full.group_by("setting", "verifier", "convention").agg(
        (pl.col("E") - pl.col("E_exact")).mean().alias("inflation"),
        (pl.col("E") - pl.col("E_exact")).max().alias("max_inflation"),
    )
    per_action = full.group_by("setting", "verifier", "convention", "K", "L1", "L2").agg(
        (pl.col("E").sum() / pl.col("T").sum()).alias("claimed_TPS"),
        (pl.col("E_exact").sum() / pl.col("T").sum()).alias("exact_TPS"),
    )
    kinds = {"static_iid": pl.col("L1") == 0, "static_all_actions": pl.lit(True)}
    best = pl.concat(
        [
            per_action.filter(pool)
            .sort("claimed_TPS", "K", "L1", "L2", descending=[True, False, False, False])
            .group_by("setting", "verifier", "convention", maintain_order=True)
            .first()
            .with_columns(pl.lit(kind).alias("static"))
            for kind, pool in kinds.items()
        ]
    )
    traversal = best.filter((pl.col("verifier") == "traversal") & (pl.col("convention") == "exact")).select(
        "setting", "static", pl.col("exact_TPS").alias("traversal_TPS")
    )
    out = (
        best.join(inflation, on=["setting", "verifier", "convention"])
        .join(traversal, on=["setting", "static"])
        .with_columns(
            (pl.col("claimed_TPS") / pl.col("traversal_TPS") - 1).alias("claimed_vs_traversal"),
            (pl.col("exact_TPS") / pl.col("traversal_TPS") - 1).alias("exact_vs_traversal"),
        )
    )
    return out.select(
        "setting",
        "verifier",
        "convention",
        "static",
        "inflation",
        "max_inflation",
        "K",
        "L1",
        "L2",
        "claimed_TPS",
        "exact_TPS",
        "claimed_vs_traversal",
        "exact_vs_traversal",
    ).sort("setting", "verifier", "convention", "static")


def select(config: Config, labels: pl.DataFrame, records: list[dict]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The static and selector policies of each OT-based verifier under each convention that
    touches it (and ``exact``), on the test roots: (summary per verifier, convention, policy and
    setting, with ``all`` for the ratio of totals; per test root and policy).

    The selector is trained on the convention's labels (``analyses._selector_data.fit_selector``,
    ``config.epochs``, seeded by ``config.seed``); ``claimed`` values a policy's choices by the
    convention's labels, ``exact`` by the exact labels of the same trees.  Traversal's exact
    ``static_iid`` policy (chosen on the training roots) is the reference of both ratios.

    Raises:
        ValueError: fewer than 3 trajectories (no test or validation roots).
    """
    from simlab.selector.train import TrainConfig, split_by_trajectory

    roots, arrays = feature_arrays(records)
    if roots["trajectory"].n_unique() < 3:
        raise ValueError(
            f"trajectories: the selector's split needs >= 3 trajectories, the source has {roots['trajectory'].n_unique()}"
        )
    split = split_by_trajectory(roots["trajectory"].to_list(), config.seed)
    settings, test = roots["setting"].to_numpy(), np.flatnonzero(split == "test")
    full = with_exact(labels)
    actions = sorted(set(zip(labels["K"].to_list(), labels["L1"].to_list(), labels["L2"].to_list())))
    trav = value_matrices(full.filter(pl.col("convention") == "exact"), "traversal", roots, actions, ("E", "T"))
    statics = lambda values: {kind: static_choice(values, settings, split == "train", actions, kind) for kind in STATIC_POLICIES}
    per_root = []

    def record(verifier, name, policy, picks, claimed, exact, T):
        for i, r in enumerate(test):
            K, L1, L2 = actions[picks[i]]
            per_root.append(
                {
                    "verifier": verifier,
                    "convention": name,
                    "policy": policy,
                    "setting": settings[r],
                    "trajectory": int(roots["trajectory"][int(r)]),
                    "root": int(roots["root"][int(r)]),
                    "K": K,
                    "L1": L1,
                    "L2": L2,
                    "E_claimed": float(claimed[i]),
                    "E_exact": float(exact[i]),
                    "T": float(T[i]),
                }
            )

    for kind, static in statics(trav).items():
        picks = np.array([static[str(settings[r])] for r in test])
        record("traversal", "exact", kind, picks, trav["E"][test, picks], trav["E"][test, picks], trav["T"][test, picks])
    bar = progress_bar(
        total=sum(name == "exact" or convention(v, name) is not None for v in SELECTOR_VERIFIERS for name in CONVENTIONS),
        desc="selectors",
        unit="selector",
        quiet=config.quiet,
    )
    for v in SELECTOR_VERIFIERS:
        for name in CONVENTIONS:
            if name != "exact" and convention(v, name) is None:
                continue  # its labels are the exact ones: the same selector
            values = value_matrices(full.filter(pl.col("convention") == name), v, roots, actions, ("E", "E_exact", "T"))
            model, _, _ = fit_selector(roots, arrays, values, split, TrainConfig(config.epochs, seed=config.seed), actions)
            picked = {kind: np.array([static[str(settings[r])] for r in test]) for kind, static in statics(values).items()}
            for policy, picks in (*picked.items(), ("selector", choose(model, roots, arrays, test))):
                record(v, name, policy, picks, *(values[c][test, picks] for c in ("E", "E_exact", "T")))
            bar.update()
    bar.close()
    per_root = pl.DataFrame(per_root)
    groups = ["verifier", "convention", "policy"]
    totals = [
        pl.len().alias("roots"),
        pl.col("E_claimed").mean(),
        pl.col("E_exact").mean(),
        (pl.col("E_claimed").sum() / pl.col("T").sum()).alias("claimed_TPS"),
        (pl.col("E_exact").sum() / pl.col("T").sum()).alias("exact_TPS"),
    ]
    table = pl.concat(
        [
            per_root.group_by(*groups, "setting").agg(*totals),
            per_root.group_by(*groups).agg(*totals).with_columns(pl.lit("all").alias("setting")),
        ],
        how="diagonal",
    )
    reference = table.filter((pl.col("verifier") == "traversal") & (pl.col("policy") == "static_iid")).select(
        "setting", pl.col("exact_TPS").alias("traversal_TPS")
    )
    table = (
        table.join(reference, on="setting")
        .with_columns(
            (pl.col("claimed_TPS") / pl.col("traversal_TPS") - 1).alias("claimed_vs_traversal"),
            (pl.col("exact_TPS") / pl.col("traversal_TPS") - 1).alias("exact_vs_traversal"),
        )
        .drop("traversal_TPS")
    )
    return table.sort("setting", "verifier", "convention", "policy"), per_root


def selector_chart(table: pl.DataFrame, subtitle: str):
    """Held-out throughput vs Traversal's exact static policy, claimed and exact, per verifier,
    convention and policy (all settings)."""
    import altair as alt

    data = (
        table.filter((pl.col("setting") == "all") & (pl.col("verifier") != "traversal"))
        .unpivot(
            index=["verifier", "convention", "policy"],
            on=["claimed_vs_traversal", "exact_vs_traversal"],
            variable_name="valued",
            value_name="vs_traversal",
        )
        .with_columns(pl.col("valued").str.replace("_vs_traversal", ""))
    )
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("convention:N", sort=list(CONVENTIONS), title=None),
            xOffset="valued:N",
            y=alt.Y("vs_traversal:Q", title="vs Traversal", axis=alt.Axis(format="%")),
            color=alt.Color("valued:N", title="valued"),
            row=alt.Row("policy:N", title=None),
            column=alt.Column("verifier:N", title=None),
            tooltip=list(data.columns),
        )
        .properties(
            width=160,
            height=150,
            title=alt.TitleParams(
                "Static and selector policies on held-out roots, as each convention claims them and exactly", subtitle=subtitle
            ),
        )
    )


def selector_view(table: pl.DataFrame) -> pl.DataFrame:
    """The printed form of ``select``'s summary: one row per verifier and convention (setting "all")."""
    rows = []
    for (verifier, name), group in table.filter(pl.col("setting") == "all").group_by(
        "verifier", "convention", maintain_order=True
    ):
        by = {r["policy"]: r for r in group.iter_rows(named=True)}
        row = {"verifier": verifier, "convention": name}
        for policy in POLICIES if verifier != "traversal" else STATIC_POLICIES:
            r = by[policy]
            row |= {
                f"{policy} E": r["E_exact"],
                f"{policy} claimed": f"{r['claimed_vs_traversal'] + 0.0:+.1%}",
                f"{policy} exact": f"{r['exact_vs_traversal'] + 0.0:+.1%}",
            }  # + 0.0: no "-0.0%"
        rows.append(row)
    order = {name: i for i, name in enumerate(CONVENTIONS)}
    return pl.DataFrame(rows).sort(pl.col("verifier"), pl.col("convention").replace_strict(order, return_dtype=pl.Int64))


def open_roots(config: Config, parser: ToolParser, say) -> Opened:
    """The source (per-trajectory streams, trees drawn here: ``--capture`` refused) and latency model
    (``GPU_PROFILE`` on a pretrained pair without ``--latency``)."""
    source, settings = make_source(
        PROG, parser, config, stream="per_trajectory", grid=False, depth=16, study_refusals=REFUSALS, quiet=config.quiet
    )
    return Opened(source, settings, make_latency(PROG, parser, config, source, 40, gpu_profile=GPU_PROFILE))


def values(config: Config, opened: Opened, say) -> tuple[pl.DataFrame, list[dict]]:
    """(labels with their categories, feature records) of every root in one process (``label``)."""
    rows, records = label(config, opened.source, opened.settings, opened.latency)
    return with_category(pl.DataFrame(rows)), records


def value_root(config: Config, opened: Opened, task) -> dict:
    """One root's ``root_values`` (its trees seeded by (seed, root id) alone): ``{"rows", "record"}``."""
    rows, record = root_values(config, task.setting, task.root, opened.latency)
    return {"rows": rows, "record": record}


def merge(config: Config, opened: Opened, payloads) -> tuple[pl.DataFrame, list[dict]]:
    """``values``'s pair from every root's payload in task order."""
    rows = [row for payload in payloads for row in payload["rows"]]
    return with_category(pl.DataFrame(rows)), [p["record"] for p in payloads if p["record"] is not None]


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: live models timed on each rank's machine."""
    return live_timing_reason(config, parser)


def inflation_chart(overall: pl.DataFrame, subtitle: str):
    """Mean label inflation (static_iid rows of ``overall``): one bar per verifier and convention."""
    import altair as alt

    return (
        alt.Chart(overall.filter(pl.col("static") == "static_iid"))
        .mark_bar()
        .encode(
            x=alt.X("convention:N", sort=list(CONVENTIONS), title=None),
            y=alt.Y("inflation:Q", title="mean label inflation (tokens)"),
            color="convention:N",
            column=alt.Column("verifier:N", title=None),
            tooltip=list(overall.columns),
        )
        .properties(
            width=140,
            height=180,
            title=alt.TitleParams(
                "Label inflation of the public-code conventions over DDTE's grid (mean over settings)", subtitle=subtitle
            ),
        )
    )


def run(config: Config, opened: Opened, labelled: tuple[pl.DataFrame, list[dict]], say) -> Report:
    """The summary, labels, per-position rates, inflation chart and, with the selector, its policies.

    Raises:
        ValueError: ``trajectories: ...`` with the selector and fewer than 3 trajectories (``select``).
    """
    labels, records = labelled
    selected = select(config, labels, records) if config.selector else None
    summary = summarise(labels)
    categories = by_category(labels, summarise)
    overall = (
        summary.group_by("verifier", "convention", "static", maintain_order=True)
        .agg(
            pl.col("inflation").mean(),
            pl.col("max_inflation").max(),
            pl.col("claimed_vs_traversal").mean(),
            pl.col("exact_vs_traversal").mean(),
        )
        .sort("verifier", "convention", "static")
    )
    subtitle = f"source: {opened.source.describe()}; latency: {opened.latency.source}"
    outputs = {
        "ddte_audit.parquet": summary,
        "labels.parquet": labels,
        "by_position.parquet": by_position(labels, ["setting", "verifier", "convention", "K", "L1", "L2"]),
        **chart_files("inflation", inflation_chart(overall, subtitle), chart_writer),
    }
    printed = [
        f"Source: {opened.source.describe()}; {labels['root'].n_unique()} roots per setting; latency: {opened.latency.source}",
        (
            overall,
            "Mean over settings: label inflation, and the best static action's throughput vs Traversal's "
            "(claimed under the convention, exact for the same action)",
        ),
        ByCategory(
            categories,
            ("setting", "verifier", "convention", "static", "inflation", "claimed_vs_traversal", "exact_vs_traversal"),
            "Label inflation and the best static action's throughput vs Traversal's",
        ),
    ]
    if selected is not None:
        outputs |= {"selector.parquet": selected[0], "selector_roots.parquet": selected[1]}
        outputs |= chart_files("selector", selector_chart(selected[0], subtitle), chart_writer)
        printed.append(
            (
                selector_view(selected[0]),
                f"Held-out roots ({selected[1].filter(pl.col('verifier') == 'traversal').height}, "
                "all settings): E[tau+1] (exact) and throughput vs Traversal's exact static_iid policy, as the convention "
                "claims it and exactly",
            )
        )
    return Report(outputs, categories, (*printed, WROTE))


STUDY = Study(PROG, __doc__, Config, flags, config_of, open_roots, value_root, merge, run, values, HF_DEFAULTS, (), {}, shardable)


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
