"""Every tree builder with every lossless verifier at matched budgets: ``python -m analyses.compare_builders``.

For each source (a synthetic world, or live models) and each sampling setting (default T = 0
and DDTE's eight), the roots are split by trajectory: the builders that need fitting
(``analyses._builder_roster``: the best static delayed tree and i.i.d. rollouts, Sequoia's
acceptance vector, TreeGraft's learned scheduler) are fitted on the training trajectories and
every builder is valued on the held-out ones, at each verify budget (default 16, 32, 63, 90
draft tokens, root excluded, counted as distinct tree nodes for every builder), with every
verifier declared lossless for its drafting law:

* deterministic trees (EAGLE-2, TreeGraft, SpecBlock): one tree per root, exact E[tau + 1];
* sampled trees (i.i.d., delayed, NDE, Sequoia, greedy draft): ``--samples`` trees per root drawn
  from a seed shared by every verifier (paired), each valued exactly: the mean is an unbiased
  estimate of E[tau + 1] with its standard error.

Reported per setting, budget, builder and verifier: E[tau + 1] (its standard error over the roots
clustered by prompt, and the sampled trees' Monte Carlo standard error given the roots), T-hat,
throughput (sum E / sum T over roots), the ratio to the baseline (``--baseline``, default EAGLE-2
with one-hot at a sampled target, greedy at a greedy one: T = 0 or top-k = 1) and the paired
differences to it by root of E and of the root's throughput E / T-hat, each with its standard error
clustered by prompt (``simlab.stats``); acceptance by depth (P(tau >= d)); and for the OT
verifiers on i.i.d. trees the mean gap to the per-node optimum alpha*(p, q, k) by depth.  A builder that cannot run is listed with its
reason.  Where the roots lie at several places along the replies (live roots: ``offset``, tokens
past the prompt's end), the summary is also given per place.  Output under ``--out`` (default
``out/compare_builders/<source>/``): ``compare_builders.parquet`` (summary), ``per_root.parquet``,
``by_depth.parquet``, ``node_gaps.parquet``, ``not_run.parquet``, ``by_offset.parquet`` (several
places only), ``throughput.{html,png}``, ``acceptance_by_depth.{html,png}``.

The roots are valued in two stages kept in parts under ``--out`` (``sharded``): ``fit``, then
``compare``; a killed run rerun with the same flags and inputs resumes from them (a one-process
run removes them once merged), and under ``torchrun`` each rank values its share of both stages.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from simlab import tree_verifiers
from simlab import verifiers as node_verifiers
from simlab.engine_metrics import conditional_rates
from simlab.stats import grouped_mean_se
from simlab.valuation import tree_value

from analyses import _builder_roster as roster_module
from analyses._categories import by_category, with_category
from analyses._study import (
    ByCategory,
    Opened,
    Report,
    chart_files,
    declared,
    json_plain,
    lab_code_digest,
    live_timing_reason,
    merge_parts,
    parse,
    part_path,
    run_key,
    run_study,
    sampled_tasks,
    shard_wait,
    value_share,
)
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, int_list, name_list
from analyses._flags import (
    LatencyConfig,
    SourceConfig,
    add_draft_law_flag,
    add_latency_flags,
    add_source_flags,
    make_latency,
    make_source,
    study_config,
    with_drafter_time,
)
from simlab.trees import drafting_table

PROG = "python -m analyses.compare_builders"
GPU_PROFILE = "specblock-a100"
"""The latency profile (``simlab.latency_profiles``) on a pretrained pair without --latency: the default on the pretrained pair: SpecBlock's published A100 verify and draft times (an 8B target with an EAGLE-3 draft, the closest published setting to the builders compared; TreeGraft's n-gram step from --small-ratio)."""
REFUSALS = {
    "capture": {"capture": "the builders build their own trees; use --backend hf or a synthetic world"},
    "synthetic": {"drafters": "the synthetic stand-in block drafter is not trained; --drafters needs --backend hf"},
    "hf": {"rank_noise": "the trained drafter has its own rank head", "block_ratio": "the block drafter's forwards are measured"},
}
HF_DEFAULTS = {"roots_per_trajectory": 2, "spacing": 8}
NOT_IN_ALL = ("optimal",)
"""Left out of ``--verifiers all``: the OT optimum as a tree verifier solves an LP over every child
tuple (it exceeds the LP's size limit beyond a few children); its per-node value alpha* is the
reference of the node-gap table instead."""
NOT_BY_DEFAULT = ("khisti", "ot_walk", "ot_exact")
"""Left out of the default verifier list (``--verifiers all`` includes them): Khisti's LP per node
takes a third of the default run's time, and the OT walk's and the curtain's per-node preparations
(Newton solves over V) are of the same order; the node-gap table and ``--verifiers all`` measure them."""


def verifier_names(text: str) -> tuple[str, ...]:
    """``--verifiers``: ``default`` (every registered tree verifier but ``NOT_IN_ALL`` and
    ``NOT_BY_DEFAULT``), ``all`` (all but ``NOT_IN_ALL``) or a comma list of names.

    Raises:
        ValueError: ``--verifiers: ...`` for an unknown or repeated name.
    """
    if text in ("all", "default"):
        left_out = NOT_IN_ALL + (NOT_BY_DEFAULT if text == "default" else ())
        return tuple(v for v in tree_verifiers.names() if v not in left_out)
    return tuple(name_list(text, "--verifiers", tree_verifiers.names()))


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags): ``budgets`` a tuple of ints, ``builders`` and
    ``verifiers`` tuples of names (a string given in code is read once, as the flags are:
    ``ValueError`` naming the flag)."""

    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 12
    settings: str = "0,ddte"
    budgets: tuple[int, ...] = (16, 32, 63, 90)
    builders: tuple[str, ...] = roster_module.NAMES
    verifiers: tuple[str, ...] = ()
    samples: int = 4
    grid_samples: int = 2
    test_share: float = 0.5
    baseline: str = "eagle2"
    selector: str | None = None
    drafters: str | None = None
    small_ratio: float = 0.011
    block_ratio: float = 0.1
    rank_noise: float = 0.2
    epochs: int = 100
    draft_law: str = "raw"
    out: str | None = None
    quiet: bool = False

    def __post_init__(self):
        if isinstance(self.budgets, str):
            object.__setattr__(self, "budgets", int_list(self.budgets, "--budgets", minimum=1))
        if isinstance(self.builders, str):
            object.__setattr__(self, "builders", name_list(self.builders, "--builders", roster_module.NAMES))
        if isinstance(self.verifiers, str) or not self.verifiers:
            object.__setattr__(self, "verifiers", verifier_names(self.verifiers or "default"))


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, the comparison's flags and the output flags."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    g = parser.add_argument_group("comparison")
    g.add_argument(
        "--budgets", default=",".join(map(str, d.budgets)), help="matched verify budgets (draft tokens, root excluded)"
    )
    g.add_argument("--builders", default=",".join(d.builders), help=f"comma list of {', '.join(roster_module.NAMES)}")
    g.add_argument(
        "--verifiers",
        default="default",
        help="comma list of tree verifiers, default (all but optimal and khisti) or all (all but optimal); each builder gets those lossless for it",
    )
    g.add_argument("--samples", type=int, default=d.samples, help="sampled trees per root for builders with sampled children")
    g.add_argument("--grid-samples", type=int, default=d.grid_samples, help="trees per L1 for the static delayed choice")
    g.add_argument("--test-share", type=float, default=d.test_share, help="share of trajectories held out for the comparison")
    g.add_argument(
        "--baseline", choices=roster_module.NAMES, default=d.baseline, help="the builder of the ratios and paired differences"
    )
    g.add_argument("--selector", default=d.selector, help="a train_selector run folder (the NDE builder)")
    g.add_argument(
        "--drafters",
        default=d.drafters,
        help="hf: trained block drafters (default <target>/../block_drafter; --pair: the pair's cache)",
    )
    g.add_argument("--small-ratio", type=float, default=d.small_ratio, help="TreeGraft's n-gram step / one-token target forward")
    g.add_argument(
        "--block-ratio", type=float, default=d.block_ratio, help="synthetic: block-drafter forward / one-token target forward"
    )
    g.add_argument("--rank-noise", type=float, default=d.rank_noise, help="synthetic: the stand-in rank head's error probability")
    g.add_argument("--epochs", type=int, default=d.epochs, help="TreeGraft scheduler's training epochs")
    add_draft_law_flag(g, d.draft_law)
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (lists as tuples), or exit 2 with one line."""
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
        builders = name_list(args.builders, "--builders", roster_module.NAMES)
        verifiers = verifier_names(args.verifiers)
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, budgets=budgets, builders=builders, verifiers=verifiers)
    check_flags(
        PROG,
        [
            (config.trajectories >= 2, f"--trajectories: need >= 2 (fit and compare), got {config.trajectories}"),
            (0 < config.test_share < 1, f"--test-share: must lie in (0, 1), got {config.test_share}"),
            (config.samples >= 2, f"--samples: need >= 2 (a standard error), got {config.samples}"),
            (config.grid_samples >= 1, f"--grid-samples: must be >= 1, got {config.grid_samples}"),
            (config.epochs >= 1, f"--epochs: must be >= 1, got {config.epochs}"),
            (0 < config.small_ratio < float("inf"), f"--small-ratio: must be a finite number > 0, got {config.small_ratio}"),
            (0 < config.block_ratio < float("inf"), f"--block-ratio: must be a finite number > 0, got {config.block_ratio}"),
            (0 <= config.rank_noise <= 1, f"--rank-noise: must lie in [0, 1], got {config.rank_noise}"),
            (config.baseline in builders, f"--baseline: {config.baseline} is not among --builders ({','.join(builders)})"),
            (
                config.selector is None or (Path(config.selector) / "run.json").is_file(),
                f"--selector: {config.selector!r} is not a train_selector run (no run.json)",
            ),
        ],
    )
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def split(trajectories, share: float, seed: int) -> set[int]:
    """The held-out trajectories (a seeded permutation; at least one, never all)."""
    unique = sorted(set(trajectories))
    order = np.random.default_rng(seed).permutation(len(unique))
    held = min(len(unique) - 1, max(1, int(round(share * len(unique)))))
    return {unique[i] for i in order[:held]}


def nde_entry(config: Config, roster):
    """{verifier: choose(root, setting, budget) -> Delayed} from a train_selector run."""
    import io

    import torch

    from simlab.latency import LatencyModel
    from simlab.selector.features import SCALARS, root_features
    from simlab.selector.model import Selector
    from simlab.builders import Delayed

    run = Path(config.selector)
    meta = json.loads((run / "run.json").read_text())
    actions = [tuple(a) for a in meta["actions"]]
    latency = LatencyModel.load(run / "latency.json")
    out = {}
    for v in meta["verifiers"]:
        model = Selector.from_checkpoint(
            torch.load(io.BytesIO((run / f"selector-{v}.pt").read_bytes()), weights_only=False)
        ).eval()

        def choose(root, setting, budget, model=model):
            h, scalars = root_features(root.pair, root.context, setting, latency)
            with torch.no_grad():
                logits = model(
                    *(torch.from_numpy(h[k])[None] for k in ("h_p_prev", "h_q_prev", "h_q_root")),
                    torch.tensor([[scalars[s] for s in SCALARS]], dtype=torch.float32),
                )[0].numpy()
            allowed = [i for i, (K, L1, L2) in enumerate(actions) if L1 + K * L2 <= budget]
            return Delayed(*actions[max(allowed, key=lambda i: logits[i])]) if allowed else None

        out[v] = choose
    return out


def fit_share(config: Config, roster, root, setting) -> dict:
    """One training root's share of every fit its builders need, from one table of that root, as
    JSON-able values (so a part holds it, ``analyses._study``): ``static`` (the static grid's
    ``[verifier, [K, L1, L2], E[tau+1] estimate, T-hat in seconds]`` rows,
    ``_builder_roster.static_statistics``), ``sequoia`` (the root's acceptance vector, 8 floats) and
    ``treegraft`` (budget -> [features (n, 17), margins (n,)] of TreeGraft's scheduler), each only
    where a builder of ``config.builders`` needs it."""
    builders = set(config.builders)
    table = root.table()  # one table per root: every fit's nodes fetched once
    share = {}
    if builders & {"iid", "delayed"}:
        usable = [v for v in tree_verifiers.lossless_names(roster_module.LAWS["delayed"], setting) if v in config.verifiers]
        stats = roster_module.static_statistics(roster, root, table, usable, config.grid_samples, config.seed)
        share["static"] = [[v, list(action), E, T] for v, actions in stats.items() for action, (E, T) in actions.items()]
    if "sequoia" in builders:
        share["sequoia"] = roster_module.sequoia_vector(root, config.seed, table).tolist()
    if "treegraft_learned" in builders:
        rule = tree_verifiers.deterministic_rule(setting)
        share["treegraft"] = {}
        for budget in roster.budgets:
            z, margin = roster.treegraft.examples(root, table, budget, rule)
            share["treegraft"][str(budget)] = [[x.tolist() for x in z], list(margin)]
    return share


def choose(config: Config, roster, setting, shares: list[dict]) -> None:
    """The fits of one setting from its training roots' ``fit_share`` values, summed in root order:
    the static choices (sum E / sum T-hat), Sequoia's tree (the mean vector) and TreeGraft's
    scheduler per budget (trained on every root's examples), into ``roster``."""
    builders = set(config.builders)
    if builders & {"iid", "delayed"}:
        totals = {}
        for share in shares:
            mine = {}
            for v, action, E, T in share["static"]:
                mine.setdefault(v, {})[tuple(action)] = (E, T)
            totals = roster_module.add_statistics(totals, mine)
        roster_module.choose_static(roster, totals, setting)
    if "sequoia" in builders and shares:
        roster_module.choose_sequoia(roster, [np.array(share["sequoia"]) for share in shares], setting)
    if "treegraft_learned" in builders:
        for budget in roster.budgets:
            X = [z for share in shares for z in share["treegraft"][str(budget)][0]]
            y = [m for share in shares for m in share["treegraft"][str(budget)][1]]
            roster.treegraft.train(setting, budget, X, y)


def value(builder, table, verifier: str, latency, samples: int, seed, draft_law: str = "raw") -> dict | None:
    """``simlab.valuation.tree_value`` with the study's draft law (deterministic trees ranked on
    ``drafting_table(table, draft_law)``) and ``samples`` trees from ``seed`` (sampled builders)."""
    deterministic = getattr(builder, "deterministic", False)
    return tree_value(
        builder,
        table,
        verifier,
        latency,
        drafting=drafting_table(table, draft_law) if deterministic else None,
        samples=samples,
        rng=None if deterministic else np.random.default_rng(seed),
    )


def node_gaps(trees, verifier: str) -> dict[int, list[float]]:
    """alpha*(p, q, k) - alpha_verifier(p, q, k) at every node with children, by depth (i.i.d. trees)."""
    from simlab import verifiers
    from simlab.otlp import optimal_acceptance

    node, out = verifiers.get(verifier), {}
    for tree in trees:
        for path, kids in tree.children.items():
            if kids:
                p, q = tree.table.p(path), tree.table.q(path)
                out.setdefault(len(path), []).append(optimal_acceptance(p, q, len(kids)) - node.acceptance_rate(p, q, len(kids)))
    return out


def measure_root(config: Config, roster, root, setting) -> tuple[list, list, list, dict]:
    """One held-out root's rows: every builder with every verifier lossless for it at every budget
    (``value``): (per-root rows, per-depth rows, node-gap rows, {(builder, setting, budget,
    verifier): why it did not run})."""
    rows, depth_rows, gap_rows, missing = [], [], [], {}
    table = root.table()
    key = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "context_length": len(root.context)}
    key["category"] = root.category
    key["offset"] = root.offset  # tokens past the prompt's end (live roots), else None
    for budget in config.budgets:
        for name in config.builders:
            for v in roster_module.verifiers_for(name, setting, config.verifiers):
                builder = roster.builder(name, root, setting, budget, v, table)
                if builder is None:
                    missing[(name, setting.name, budget, v)] = f"no {name} tree for {v} at this budget"
                    continue
                seed = [config.seed, root.root, budget, roster_module.NAMES.index(name)]  # shared by the verifiers: paired
                try:
                    out = value(builder, table, v, roster.latency, config.samples, seed, config.draft_law)
                except ValueError as exc:  # a builder that cannot draft here (e.g. k children w/o replacement from a one-hot q)
                    missing[(name, setting.name, budget, v)] = str(exc)
                    continue
                if out is None:
                    missing[(name, setting.name, budget, v)] = f"{v} is not lossless on a {name} tree drawn here"
                    continue
                action = getattr(builder, "shape", None) or builder
                rows.append(
                    {
                        **key,
                        "context": list(root.context),
                        "budget": budget,
                        "builder": name,
                        "verifier": v,
                        "E": out["E"],
                        "accepted": out["accepted"],  # E[tau], the engines' no-bonus convention
                        "se": out["se"],
                        "T": out["T"],
                        "tokens": out["tokens"],
                        "sampled": not getattr(builder, "deterministic", False),
                        "action": _describe(action),
                    }
                )
                depth_rows += [
                    {**key, "budget": budget, "builder": name, "verifier": v, "depth": d + 1, "reach": float(r)}
                    | {"conditional": float(c)}  # the papers' rate; reach is vLLM's per-position counter
                    for d, (r, c) in enumerate(zip(out["reach"], conditional_rates(out["reach"])))
                ]
                if name in ("iid", "delayed", "nde") and v in node_verifiers.ot_based():
                    gap_rows += [
                        {**key, "budget": budget, "builder": name, "verifier": v, "depth": d, "gap": float(np.mean(g))}
                        | {"nodes": len(g)}
                        for d, g in sorted(node_gaps(out["trees"], v).items())
                    ]
    return rows, depth_rows, gap_rows, missing


def _describe(builder) -> str:
    for attrs in (("K", "L1", "L2"), ("budget", "depth", "top_k"), ("schedule",), ("budget",)):
        if all(hasattr(builder, a) for a in attrs):
            return type(builder).__name__ + "(" + ", ".join(f"{a}={getattr(builder, a)}" for a in attrs) + ")"
    return type(builder).__name__


def summarise(per_root: pl.DataFrame, baseline: str, rules: dict[str, str]) -> pl.DataFrame:
    """Per setting, budget, builder and verifier: roots, E with its standard error over the roots
    clustered by prompt (``E_se``, CR1: roots along one reply share its prompt) and the Monte Carlo
    standard error of the sampled trees given the roots (``E_mc_se``; 0 for deterministic trees), T,
    throughput, the ratio to the baseline's throughput and the paired mean differences to the
    baseline by root, each with its standard error clustered by prompt: of E (``paired_dE``,
    ``paired_dE_se``) and of the root's throughput E / T-hat in tokens/s (``paired_dTPS``,
    ``paired_dTPS_se``)."""
    table = per_root.group_by("setting", "budget", "builder", "verifier", maintain_order=True).agg(
        pl.len().alias("roots"),
        pl.col("E").mean(),
        pl.col("accepted").mean(),
        (pl.col("se").pow(2).sum().sqrt() / pl.len()).alias("E_mc_se"),
        pl.col("E").alias("_E"),
        pl.col("trajectory").alias("_trajectory"),
        pl.col("T").mean(),
        (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
        pl.col("tokens").mean(),
        pl.col("sampled").first(),
    )
    base_rows = per_root.filter(
        (pl.col("builder") == baseline) & (pl.col("verifier") == pl.col("setting").replace_strict(rules, return_dtype=pl.String))
    )
    table = table.with_columns(
        pl.Series("E_se", grouped_mean_se(table["_E"].to_list(), table["_trajectory"].to_list()), dtype=pl.Float64)
    ).drop("_E", "_trajectory")
    base = base_rows.select(
        "setting", "budget", "root", pl.col("E").alias("E_base"), (pl.col("E") / pl.col("T")).alias("TPS_base")
    )
    paired = (
        per_root.join(base, on=["setting", "budget", "root"])
        .with_columns(
            (pl.col("E") - pl.col("E_base")).alias("_dE"), (pl.col("E") / pl.col("T") - pl.col("TPS_base")).alias("_dTPS")
        )
        .group_by("setting", "budget", "builder", "verifier", maintain_order=True)
        .agg(
            pl.col("_dE").mean().alias("paired_dE"),
            pl.col("_dTPS").mean().alias("paired_dTPS"),
            pl.col("_dE"),
            pl.col("_dTPS"),
            pl.col("trajectory").alias("_trajectory"),
        )
    )
    clusters = paired["_trajectory"].to_list()
    paired = paired.with_columns(
        pl.Series("paired_dE_se", grouped_mean_se(paired["_dE"].to_list(), clusters), dtype=pl.Float64),
        pl.Series("paired_dTPS_se", grouped_mean_se(paired["_dTPS"].to_list(), clusters), dtype=pl.Float64),
    ).select("setting", "budget", "builder", "verifier", "paired_dE", "paired_dE_se", "paired_dTPS", "paired_dTPS_se")
    ref = table.join(
        base_rows.group_by("setting", "budget").agg((pl.col("E").sum() / pl.col("T").sum()).alias("TPS_base")),
        on=["setting", "budget"],
        how="left",
    )
    return (
        ref.with_columns((pl.col("TPS") / pl.col("TPS_base")).alias("vs_baseline"))
        .drop("TPS_base")
        .join(paired, on=["setting", "budget", "builder", "verifier"], how="left")
    )


def baseline_notes(summary: pl.DataFrame, baseline: str, verifiers, rules: dict[str, str]) -> pl.DataFrame:
    """``summary`` with ``baseline_note``: why ``vs_baseline`` and ``paired_dE`` are empty on a row
    (null where they are not): the baseline pairing (``baseline`` with greedy at a greedy target (T = 0 or top-k = 1), one-hot at
    T > 0) is not among ``verifiers``, or it did not run there."""

    def why(setting: str) -> str:
        v = rules[setting]
        if v not in verifiers:
            return f"the baseline {baseline} with {v} was not run: {v} is not among --verifiers"
        return f"the baseline {baseline} with {v} did not run here (see Not run)"

    notes = [
        None if ratio is not None else why(setting) for setting, ratio in summary.select("setting", "vs_baseline").iter_rows()
    ]
    return summary.with_columns(pl.Series("baseline_note", notes, dtype=pl.String))


def unpaired_builders(builders, settings, verifiers) -> list[dict]:
    """A not-run row (builder, setting, reason) for every builder with no verifier among
    ``verifiers`` that is lossless for its drafting law in a setting: listed, never silently dropped."""
    rows = []
    for name in builders:
        for setting in settings:
            if not roster_module.verifiers_for(name, setting, verifiers):
                lossless = roster_module.verifiers_for(name, setting, tree_verifiers.names())
                rows.append(
                    {
                        "builder": name,
                        "setting": setting.name,
                        "budget": None,
                        "reason": f"no verifier among --verifiers is lossless for its trees (lossless: {', '.join(lossless)})",
                    }
                )
    return rows


def best_pairings(summary: pl.DataFrame, rules: dict[str, str]) -> pl.DataFrame:
    """Each builder's highest-throughput verifier per setting and budget (exact ties, as every lossless
    verifier of a deterministic tree gives: greedy at a greedy target (T = 0 or top-k = 1), one-hot
    otherwise, then by name)."""
    primary = pl.col("setting").replace_strict(rules, return_dtype=pl.String)
    ranked = summary.with_columns(pl.col("TPS").round(12).alias("_tps"), (pl.col("verifier") != primary).alias("_other"))
    return (
        ranked.sort(["_tps", "_other", "verifier"], descending=[True, False, False])
        .group_by("setting", "budget", "builder", maintain_order=True)
        .first()
        .drop("_tps", "_other")
    )


def charts(summary: pl.DataFrame, by_depth: pl.DataFrame, subtitle: str, rules: dict[str, str]):
    import altair as alt

    best = best_pairings(summary, rules)
    tps = (
        alt.Chart(best)
        .mark_line(point=True)
        .encode(
            x=alt.X("budget:Q", title="verify budget (draft tokens)"),
            y=alt.Y("TPS:Q", title="throughput (tokens/s)"),
            color="builder:N",
            facet=alt.Facet("setting:N", columns=3, title=None),
            tooltip=["builder", "verifier", "budget", "E", "TPS", "vs_baseline"],
        )
        .properties(
            width=220,
            height=150,
            title=alt.TitleParams("Throughput vs budget, each builder with its best lossless verifier", subtitle=subtitle),
        )
    )
    top = int(by_depth["budget"].max())
    reach = (
        by_depth.filter(pl.col("budget") == top).group_by("setting", "builder", "verifier", "depth").agg(pl.col("reach").mean())
    )
    keep = best.filter(pl.col("budget") == top).select("setting", "builder", "verifier")
    acc = (
        alt.Chart(reach.join(keep, on=["setting", "builder", "verifier"]))
        .mark_line(point=True)
        .encode(
            x=alt.X("depth:Q"),
            y=alt.Y("reach:Q", title="P(tau >= depth)"),
            color="builder:N",
            facet=alt.Facet("setting:N", columns=3, title=None),
            tooltip=["builder", "verifier", "depth", "reach"],
        )
        .properties(
            width=220,
            height=150,
            title=alt.TitleParams(f"Acceptance by depth at budget {top} (best verifier per builder)", subtitle=subtitle),
        )
    )
    return tps, acc


@dataclass(frozen=True)
class Rostered(Opened):
    """``Opened`` with the study's ``roster`` (``analyses._builder_roster.Roster``, ``roster_for``)."""

    roster: object = None


def open_source(config: Config, parser: ToolParser, say) -> Rostered:
    """The source the flags name (per-trajectory streams; never a capture), the latency model
    (``GPU_PROFILE`` on a pretrained pair without ``--latency``) with TreeGraft's ``small`` drafter
    (``--small-ratio``), and the roster (``roster_for``: it times SpecBlock's block drafter)."""
    source, settings = make_source(
        PROG, parser, config, stream="per_trajectory", grid=False, depth=9, study_refusals=REFUSALS, quiet=config.quiet
    )
    latency = make_latency(PROG, parser, config, source, max(config.budgets), gpu_profile=GPU_PROFILE)
    latency = with_drafter_time(latency, "small", config.small_ratio, "small_ratio", parser)
    opened = Rostered(source, settings, latency)
    return replace(opened, roster=roster_for(config, opened, parser))


def roster_for(config: Config, opened: Opened, parser: ToolParser) -> roster_module.Roster:
    """The roster at the study's budgets: SpecBlock's block drafter (its forward measured on the
    live models unless the profile gives it, else ``--block-ratio``), the NDE selectors, and a
    not-run row for each builder that cannot run or has no lossless verifier among ``--verifiers``."""
    from analyses._block_drafters import DrafterConfig, drafters_for

    roster = roster_module.Roster(config.budgets, opened.latency, config.draft_law)
    if {"treegraft_learned", "treegraft_best"} & set(config.builders):
        roster.treegraft = roster_module.TreeGraftEntry(roster, config.epochs, config.seed)
    if "specblock" in config.builders:
        sb = DrafterConfig(
            backend=config.backend,
            target=config.target,
            pair=config.pair,
            K=4,
            rank_noise=config.rank_noise,
            seed=config.seed,
            drafters=config.drafters,
        )
        measure_block = config.backend == "hf" and "block" not in dict(opened.latency.drafters)  # unless the profile gives it
        try:
            drafter_of, missing = drafters_for(sb)
            roster.block_drafter = drafter_of["full"]
            if measure_block:
                from backends.block_drafter.drafter import forward_seconds

                seconds = forward_seconds(drafter_of["full"](opened.source.pair).model)
                roster.latency = roster.latency.with_drafter("block", seconds)
        except ValueError as exc:
            roster.not_run.append({"builder": "specblock", "setting": "all", "budget": None, "reason": str(exc)})
        if not measure_block:
            roster.latency = with_drafter_time(roster.latency, "block", config.block_ratio, "block_ratio", parser)
    if "nde" in config.builders:
        if config.selector is None:
            why = "needs --selector RUN (a folder of python -m analyses.train_selector on this source)"
            roster.not_run.append({"builder": "nde", "setting": "all", "budget": None, "reason": why})
        else:
            roster.selectors = nde_entry(config, roster)
    listed = {r["builder"] for r in roster.not_run}
    roster.not_run += unpaired_builders([b for b in config.builders if b not in listed], opened.settings, config.verifiers)
    return roster


@dataclass(frozen=True)
class Measured:
    """What ``values`` measures: the per-root, per-depth and node-gap rows, the not-run rows and
    the held-out trajectories."""

    rows: list
    depth_rows: list
    gap_rows: list
    not_run: list
    test: set


def values(config: Config, opened: Rostered, say) -> Measured:
    """The one-process run: ``sharded`` as rank 0 of 1 (its two parts under ``<out>/parts/`` make a
    killed run resumable: a rerun with the same flags, inputs and code values only the roots not
    yet in them); the parts are removed once the run has merged them."""
    measured = sharded(config, opened, 0, 1, say)
    for stage in ("fit", "compare"):
        part_path(opened.out, 0, 1, stage).unlink(missing_ok=True)
    if not any(part_path(opened.out, 0, 1).parent.iterdir()):
        part_path(opened.out, 0, 1).parent.rmdir()
    return measured


def sharded(config: Config, opened: Rostered, rank: int, world: int, say) -> Measured | None:
    """Split the roots by trajectory (``split``), then two stages, each a part per rank
    (``analyses._study.value_share``; rank R takes the roots with index i % W == R): ``fit`` (each
    training root's ``fit_share``), after which every rank reads every rank's fit part and makes
    the same choices (``choose``); then ``compare`` (each held-out root's ``measure_root``), which
    rank 0 merges into ``Measured`` (exit 2 when no builder could run).  Other ranks return None.

    The parts' keys (``analyses._study.run_key``, computed once) hold, beyond the flags and the
    code: the held-out trajectories and ``inputs_digest`` (the latency model as valued, the live
    models' fingerprints, the selector run's files), and the compare stage's also the digest of
    every training root's fit share, so a held-out root's rows are reused only under the same fit."""
    placed = sampled_tasks(opened, "placing roots", config)  # a live source continues each prompt to its roots
    test = split([t.root.trajectory for t in placed], config.test_share, config.seed)
    wait, code = shard_wait() if world > 1 else 0.0, lab_code_digest()
    depends = json.dumps({"test": sorted(test), "inputs": inputs_digest(config, opened)})
    fitting = replace(STUDY, value_root=partial(_fit_root, test=test), merge=_fit_merge)
    key = run_key(fitting, config, world, "fit", depends, code)
    value_share(fitting, config, opened, rank, world, say, stage="fit", key=key)
    fitted = merge_parts(fitting, config, opened, world, wait, say, stage="fit", key=key)
    comparing = replace(STUDY, value_root=partial(_compare_root, test=test), merge=partial(_compare_merge, test=test))
    key = run_key(comparing, config, world, "compare", depends + fitted, code)
    value_share(comparing, config, opened, rank, world, say, stage="compare", key=key)
    if rank != 0:
        if not config.quiet:
            print(f"wrote part {part_path(opened.out, rank, world, 'compare')} (rank 0 merges)")
        return None
    return merge_parts(comparing, config, opened, world, wait, say, stage="compare", key=key)


def inputs_digest(config: Config, opened: Rostered) -> str:
    """sha256 (hex) of what the values depend on that the flags name but do not hold: the latency
    model as valued (the roster's, with the drafters it times: a profile file's content, a probe's
    measurement), the live models' fingerprints (``backends.capture.model_fingerprints``: about 1 s
    per 0.5 GB of weights) and the files of the ``--selector`` run."""
    from types import SimpleNamespace

    parts = [repr(opened.roster.latency)]
    if config.backend == "hf":
        from backends.capture import model_fingerprints

        models = SimpleNamespace(pair=config.pair, draft=config.draft, target=config.target)
        parts.append(json.dumps(model_fingerprints(models), sort_keys=True))
    if config.selector is not None:
        for path in sorted(Path(config.selector).iterdir()):
            if path.is_file():
                parts.append(f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _fit_root(config: Config, opened: Rostered, task, test: set) -> dict | None:
    """The fit stage's value of one root: a training root's ``fit_share`` with its setting's index;
    None for a held-out root."""
    if task.root.trajectory in test:
        return None
    return {"setting": task.setting_index, **fit_share(config, opened.roster, task.root, task.setting)}


def _fit_merge(config: Config, opened: Rostered, payloads: list) -> str:
    """``choose`` per setting from the training roots' shares in root order (into the roster); the
    sha256 (hex) of every root's fit payload, in root order (the compare stage's key holds it)."""
    for i, setting in enumerate(opened.settings):
        choose(config, opened.roster, setting, [p for p in payloads if p is not None and p["setting"] == i])
    return hashlib.sha256(json.dumps(payloads, default=json_plain).encode()).hexdigest()


def _compare_root(config: Config, opened: Rostered, task, test: set) -> dict | None:
    """The compare stage's value of one root: a held-out root's ``measure_root`` rows; None for a
    training root."""
    if task.root.trajectory not in test:
        return None
    rows, depth_rows, gap_rows, missing = measure_root(config, opened.roster, task.root, task.setting)
    return {"rows": rows, "depth_rows": depth_rows, "gap_rows": gap_rows, "missing": [[*k, why] for k, why in missing.items()]}


def _compare_merge(config: Config, opened: Rostered, payloads: list, test: set) -> Measured:
    """The held-out roots' rows in root order, the not-run rows; exit 2 when no builder could run."""
    roster, mine = opened.roster, [p for p in payloads if p is not None]
    rows = [r for p in mine for r in p["rows"]]
    missing = {tuple(m[:4]): m[4] for p in mine for m in p["missing"]}
    everywhere = {r["builder"] for r in roster.not_run if r["setting"] == "all"}
    not_run = list(roster.not_run)
    for (name, setting, budget, v), reason in sorted(missing.items()):
        if name not in everywhere:
            not_run.append({"builder": name, "setting": setting, "budget": budget, "verifier": v, "reason": reason})
    if not rows:
        reasons = "; ".join(dict.fromkeys(f"{r['builder']}: {r['reason']}" for r in not_run))
        fail(PROG, f"--builders: no builder could run on this source ({reasons})")
    depth_rows = [r for p in mine for r in p["depth_rows"]]
    return Measured(rows, depth_rows, [r for p in mine for r in p["gap_rows"]], not_run, test)


GAP_SCHEMA = {
    "setting": pl.String,
    "trajectory": pl.Int64,
    "root": pl.Int64,
    "context_length": pl.Int64,
    "category": pl.String,
    "offset": pl.Int64,
    "budget": pl.Int64,
    "builder": pl.String,
    "verifier": pl.String,
    "depth": pl.Int64,
    "gap": pl.Float64,
    "nodes": pl.Int64,
}
NOT_RUN_SCHEMA = {"builder": pl.String, "setting": pl.String, "budget": pl.Int64, "verifier": pl.String, "reason": pl.String}


def run(config: Config, opened: Opened, measured: Measured, say) -> Report:
    """The summary, per-root, per-depth, node-gap and not-run frames, the charts and the tables;
    a note on stderr where the baseline's ratios are empty."""
    source, latency, verifiers = opened.source, opened.latency, config.verifiers
    per_root = with_category(pl.DataFrame(measured.rows)).with_columns(pl.col("offset").cast(pl.Int64))
    rules = tree_verifiers.deterministic_rules(opened.settings)
    noted = lambda part: baseline_notes(summarise(part, config.baseline, rules), config.baseline, verifiers, rules)
    summary = noted(per_root)
    categories = by_category(per_root, noted)
    offsets = by_offset(per_root, noted)
    for note, where in (
        summary.filter(pl.col("baseline_note").is_not_null())
        .group_by("baseline_note", maintain_order=True)
        .agg(pl.col("setting").unique(maintain_order=True).str.join(" "))
        .iter_rows()
    ):
        print(f"{PROG}: note: vs_baseline and paired_dE are empty at {where}: {note}", file=sys.stderr)
    by_depth = with_category(pl.DataFrame(measured.depth_rows)).with_columns(pl.col("offset").cast(pl.Int64))
    gaps = pl.DataFrame(measured.gap_rows, schema=GAP_SCHEMA)
    not_run = pl.DataFrame([{"verifier": "all", **r} for r in measured.not_run], schema=NOT_RUN_SCHEMA)
    subtitle = f"source: {source.describe()}; latency: {latency.source}; {len(measured.test)} held-out trajectories"
    tps_chart, acc_chart = charts(summary, by_depth, subtitle, rules)
    outputs = {
        "compare_builders.parquet": summary,
        "per_root.parquet": per_root,
        "by_depth.parquet": by_depth,
        "node_gaps.parquet": gaps,
        "not_run.parquet": not_run,
        **({} if offsets is None else {"by_offset.parquet": offsets}),
        **chart_files("throughput", tps_chart, chart_writer),
        **chart_files("acceptance_by_depth", acc_chart, chart_writer),
    }
    printed = tables(config, source, latency, summary, per_root, categories, gaps, not_run, rules, offsets)
    return Report(outputs, categories, printed)


def by_offset(per_root: pl.DataFrame, summarise) -> pl.DataFrame | None:
    """``summarise`` of the roots at each place along the reply (``offset``: tokens past the prompt's
    end), stacked with ``offset`` first; None unless every root has one and there are two or more."""
    if "offset" not in per_root.columns or per_root["offset"].null_count() or per_root["offset"].n_unique() < 2:
        return None
    blocks = [
        summarise(per_root.filter(pl.col("offset") == o)).select(pl.lit(o, dtype=pl.Int64).alias("offset"), pl.all())
        for o in sorted(per_root["offset"].unique().to_list())
    ]
    return pl.concat(blocks, how="diagonal_relaxed")


def tables(config: Config, source, latency, summary, per_root, categories, gaps, not_run, rules, offsets=None) -> tuple:
    """The printed lines and tables (``analyses._study.Report.printed`` items)."""
    best = best_pairings(summary, rules).sort("setting", "budget", "TPS", descending=[False, False, True])
    shown = best.select(
        "setting",
        "budget",
        "builder",
        "verifier",
        "E",
        "E_se",
        pl.col("T").mul(1e3).alias("T (ms)"),
        "TPS",
        "vs_baseline",
        "paired_dE",
        "paired_dE_se",
        "paired_dTPS",
        "paired_dTPS_se",
        "tokens",
    )
    items: list = [
        f"Source: {source.describe()}; {per_root['root'].n_unique()} held-out roots per setting; latency: {latency.source}",
        (
            shown,
            f"Each builder with its best lossless verifier (ratios and paired differences vs {config.baseline} with "
            "greedy at T = 0 or top-k = 1, one-hot otherwise; every pairing: compare_builders.parquet)",
        ),
        ByCategory(
            categories,
            ("setting", "budget", "builder", "verifier", "roots", "E", "E_se", "TPS", "vs_baseline", "paired_dE", "paired_dE_se"),
            "Every pairing's E[tau+1] (SE) and throughput",
        ),
    ]
    if offsets is not None:
        placed = best_pairings(summary, rules).select("setting", "budget", "builder", "verifier")
        items.append(
            (
                offsets.join(placed, on=["setting", "budget", "builder", "verifier"], how="semi")
                .select(
                    "offset",
                    "setting",
                    "budget",
                    "builder",
                    "verifier",
                    "roots",
                    "E",
                    "E_se",
                    "TPS",
                    "vs_baseline",
                    "paired_dTPS",
                    "paired_dTPS_se",
                )
                .sort("setting", "budget", "offset", "TPS", descending=[False, False, False, True]),
                "By place along the reply (offset: tokens past the prompt's end), each builder's best verifier overall: by_offset.parquet",
            )
        )
    if gaps.height:
        items.append(
            (
                gaps.group_by("builder", "verifier", "depth")
                .agg(pl.col("gap").mean())
                .sort("depth")
                .pivot(on="depth", index=["builder", "verifier"], values="gap")
                .sort("builder", "verifier"),
                "Mean gap alpha* - alpha to the per-node optimum, by node depth (columns; OT verifiers on i.i.d. trees, all settings and budgets)",
            )
        )
    if not_run.height:
        grouped = not_run.group_by("builder", "reason", maintain_order=True).agg(
            pl.col("setting").unique().sort().str.join(" ").alias("settings"),
            pl.col("budget").unique().sort().cast(pl.String).str.join(" ").alias("budgets"),
            pl.col("verifier").unique().sort().str.join(" ").alias("verifiers"),
        )
        items.append((grouped, "Not run"))
    return tuple(items)


def shardable(config: Config, opened: Opened | None, parser: ToolParser) -> str | None:
    """Why the ranks' values would differ from one process's: live models timed on each rank's
    machine (``live_timing_reason``), or SpecBlock's block drafter timed there (a live source whose
    latency profile does not give its time); else None."""
    if reason := live_timing_reason(config, parser):
        return reason
    roster = getattr(opened, "roster", None)
    if roster is not None and "specblock" in config.builders and config.backend == "hf" and roster.block_drafter is not None:
        if "block" not in dict(opened.latency.drafters):
            return "each rank would time SpecBlock's block drafter itself; give its time in the --latency profile"
    return None


STUDY = declared(globals(), error_flags={"k": "--verifiers"})


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
