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

Reported per setting, budget, builder and verifier: E[tau + 1] (and its standard error), T-hat,
throughput (sum E / sum T over roots), the ratio to the baseline (``--baseline``, default EAGLE-2
with one-hot at T > 0, greedy at T = 0) and the paired difference of E by root with its standard
error; acceptance by depth (P(tau >= d)); and for the OT verifiers on i.i.d. trees the mean gap
to the per-node optimum alpha*(p, q, k) by depth.  A builder that cannot run is listed with its
reason.  Output under ``--out`` (default ``out/compare_builders/<source>/``): ``compare_builders.parquet``
(summary), ``per_root.parquet``, ``by_depth.parquet``, ``node_gaps.parquet``, ``not_run.parquet``,
``throughput.{html,png}``, ``acceptance_by_depth.{html,png}``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from simlab import tree_verifiers
from simlab import verifiers as node_verifiers
from simlab.engine_metrics import conditional_rates
from simlab.valuation import tree_value

from analyses import _builder_roster as roster_module
from analyses._categories import by_category, print_by_category, stage_by_category, with_category
from backends.cli import (
    OutputSet,
    ToolParser,
    add_output_flags,
    chart_writer,
    check_flags,
    fail,
    fail_from,
    int_list,
    name_list,
    parquet_writer,
    print_table,
    progress_bar,
    run_tool,
)
from backends.sources.flags import (
    LatencyConfig,
    SourceConfig,
    add_draft_law_flag,
    drafting_table,
    make_latency,
    with_drafter_time,
    make_source,
    note_hf_defaults,
    study_config,
    study_out,
    study_parser,
    with_hf_defaults,
)

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


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags)."""

    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 12
    settings: str = "0,ddte"
    budgets: str = "16,32,63,90"
    builders: str = ",".join(roster_module.NAMES)
    verifiers: str = "default"
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


def parse_args(argv) -> tuple[Config, ToolParser]:
    d = Config()
    parser = study_parser(PROG, __doc__, d)
    g = parser.add_argument_group("comparison")
    g.add_argument("--budgets", default=d.budgets, help="matched verify budgets (draft tokens, root excluded)")
    g.add_argument("--builders", default=d.builders, help=f"comma list of {', '.join(roster_module.NAMES)}")
    g.add_argument(
        "--verifiers",
        default=d.verifiers,
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
    note_hf_defaults(parser, HF_DEFAULTS)
    args = parser.parse_args(argv)
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
        builders = name_list(args.builders, "--builders", roster_module.NAMES)
        if args.verifiers in ("all", "default"):
            left_out = NOT_IN_ALL + (NOT_BY_DEFAULT if args.verifiers == "default" else ())
            verifiers = [v for v in tree_verifiers.names() if v not in left_out]
        else:
            verifiers = list(name_list(args.verifiers, "--verifiers", tree_verifiers.names()))
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(
        Config, args, budgets=",".join(map(str, budgets)), builders=",".join(builders), verifiers=",".join(verifiers)
    )
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
            (config.baseline in builders, f"--baseline: {config.baseline} is not among --builders ({config.builders})"),
            (
                config.selector is None or (Path(config.selector) / "run.json").is_file(),
                f"--selector: {config.selector!r} is not a train_selector run (no run.json)",
            ),
        ],
    )
    return config, parser


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


def fit(config: Config, roster, train_roots: dict, verifiers, builders, source, bar) -> None:
    """Fit every builder that needs it on the training roots (per setting)."""

    if builders & {"treegraft_learned", "treegraft_best"}:
        roster.treegraft = roster_module.TreeGraftEntry(roster, config.epochs, config.seed)
    for setting, roots in train_roots.items():
        if builders & {"iid", "delayed"}:
            usable = [v for v in tree_verifiers.lossless_names(roster_module.LAWS["delayed"], setting) if v in verifiers]
            roster_module.fit_static(roster, roots, setting, usable, config.grid_samples, config.seed)
        if "sequoia" in builders:
            roster_module.fit_sequoia(roster, roots, setting, config.seed)
        if "treegraft_learned" in builders:
            roster.treegraft.fit(roots, setting, tree_verifiers.deterministic_rule(setting))
        bar.update(len(roots))


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


def measure(config: Config, roster, test_roots: dict, verifiers, builders, bar):
    from simlab.trees import NodeTable

    budgets = int_list(config.budgets, "--budgets", minimum=1)
    rows, depth_rows, gap_rows, missing = [], [], [], {}
    for setting, roots in test_roots.items():
        for root in roots:
            table = NodeTable(root.pair, root.context)
            key = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "context_length": len(root.context)}
            key["category"] = root.category
            for budget in budgets:
                for name in builders:
                    for v in roster_module.verifiers_for(name, setting, verifiers):
                        builder = roster.builder(name, root, setting, budget, v, table)
                        if builder is None:
                            missing[(name, setting.name, budget, v)] = f"no {name} tree for {v} at this budget"
                            continue
                        seed = [
                            config.seed,
                            root.root,
                            budget,
                            roster_module.NAMES.index(name),
                        ]  # shared by the verifiers: paired
                        try:
                            out = value(builder, table, v, roster.latency, config.samples, seed, config.draft_law)
                        except (
                            ValueError
                        ) as exc:  # a builder that cannot draft here (e.g. k children w/o replacement from a one-hot q)
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
                                {
                                    **key,
                                    "budget": budget,
                                    "builder": name,
                                    "verifier": v,
                                    "depth": d,
                                    "gap": float(np.mean(g)),
                                    "nodes": len(g),
                                }
                                for d, g in sorted(node_gaps(out["trees"], v).items())
                            ]
            bar.update()
    return rows, depth_rows, gap_rows, missing


def _describe(builder) -> str:
    for attrs in (("K", "L1", "L2"), ("budget", "depth", "top_k"), ("schedule",), ("budget",)):
        if all(hasattr(builder, a) for a in attrs):
            return type(builder).__name__ + "(" + ", ".join(f"{a}={getattr(builder, a)}" for a in attrs) + ")"
    return type(builder).__name__


def summarise(per_root: pl.DataFrame, baseline: str, rules: dict[str, str]) -> pl.DataFrame:
    """Per setting, budget, builder and verifier: roots, E, its standard error, T, throughput, the
    ratio to the baseline's throughput and the paired mean difference of E by root (with its SE)."""
    table = per_root.group_by("setting", "budget", "builder", "verifier", maintain_order=True).agg(
        pl.len().alias("roots"),
        pl.col("E").mean(),
        pl.col("accepted").mean(),
        (pl.col("se").pow(2).sum().sqrt() / pl.len()).alias("E_se"),
        pl.col("T").mean(),
        (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
        pl.col("tokens").mean(),
        pl.col("sampled").first(),
    )
    base_rows = per_root.filter(
        (pl.col("builder") == baseline) & (pl.col("verifier") == pl.col("setting").replace_strict(rules, return_dtype=pl.String))
    )
    base = base_rows.select("setting", "budget", "root", pl.col("E").alias("E_base"), pl.col("se").alias("se_base"))
    paired = (
        per_root.join(base, on=["setting", "budget", "root"])
        .with_columns((pl.col("E") - pl.col("E_base")).alias("diff"))
        .group_by("setting", "budget", "builder", "verifier")
        .agg(pl.col("diff").mean().alias("paired_dE"), (pl.col("diff").std(ddof=1) / pl.len().sqrt()).alias("paired_dE_se"))
    )
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
    (null where they are not): the baseline pairing (``baseline`` with greedy at T = 0, one-hot at
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
    verifier of a deterministic tree gives: greedy at T = 0, one-hot at T > 0, then by name)."""
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


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    from analyses._block_drafters import DrafterConfig, drafters_for

    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    config = with_hf_defaults(config, parser, HF_DEFAULTS)
    builders = list(name_list(config.builders, "--builders", roster_module.NAMES))
    verifiers = list(name_list(config.verifiers, "--verifiers", tree_verifiers.names()))
    source, settings = make_source(
        PROG, parser, config, stream="per_trajectory", grid=False, depth=9, study_refusals=REFUSALS, quiet=config.quiet
    )
    budgets = int_list(config.budgets, "--budgets", minimum=1)
    latency = make_latency(PROG, parser, config, source, max(budgets), gpu_profile=GPU_PROFILE)
    latency = with_drafter_time(latency, "small", config.small_ratio, "small_ratio", parser)
    roster = roster_module.Roster(budgets, latency, config.draft_law)
    if "specblock" in builders:
        sb = DrafterConfig(
            backend=config.backend,
            target=config.target,
            pair=config.pair,
            K=4,
            rank_noise=config.rank_noise,
            seed=config.seed,
            drafters=config.drafters,
        )
        measure_block = config.backend == "hf" and "block" not in dict(
            latency.drafters
        )  # measured, unless the profile gives it (as sweep)
        try:
            drafter_of, missing = drafters_for(sb)
            roster.block_drafter = drafter_of["full"]
            if measure_block:
                from backends.block_drafter.drafter import forward_seconds

                roster.latency = latency = latency.with_drafter("block", forward_seconds(drafter_of["full"](source.pair).model))
        except ValueError as exc:
            roster.not_run.append({"builder": "specblock", "setting": "all", "budget": None, "reason": str(exc)})
        if not measure_block:
            roster.latency = latency = with_drafter_time(latency, "block", config.block_ratio, "block_ratio", parser)
    if "nde" in builders:
        if config.selector is None:
            roster.not_run.append(
                {
                    "builder": "nde",
                    "setting": "all",
                    "budget": None,
                    "reason": "needs --selector RUN (a folder of python -m analyses.train_selector on this source)",
                }
            )
        else:
            roster.selectors = nde_entry(config, roster)
    listed = {r["builder"] for r in roster.not_run}
    roster.not_run += unpaired_builders([b for b in builders if b not in listed], settings, verifiers)
    out = study_out(PROG, config, source.slug())
    try:
        roots = {s: list(source.roots(s)) for s in settings}
        test = split([r.trajectory for rs in roots.values() for r in rs], config.test_share, config.seed)
        train_roots = {s: [r for r in rs if r.trajectory not in test] for s, rs in roots.items()}
        test_roots = {s: [r for r in rs if r.trajectory in test] for s, rs in roots.items()}
        with progress_bar(
            total=sum(len(r) for r in roots.values()), desc="roots (fit, then compare)", unit="root", quiet=config.quiet
        ) as bar:
            fit(config, roster, train_roots, verifiers, set(builders), source, bar)
            rows, depth_rows, gap_rows, missing = measure(config, roster, test_roots, verifiers, builders, bar)
    except ValueError as exc:
        fail_from(PROG, exc, parser, {"k": "--verifiers"})
    everywhere = {r["builder"] for r in roster.not_run if r["setting"] == "all"}
    for (name, setting, budget, v), reason in sorted(missing.items()):
        if name not in everywhere:
            roster.not_run.append({"builder": name, "setting": setting, "budget": budget, "verifier": v, "reason": reason})
    if not rows:
        reasons = "; ".join(dict.fromkeys(f"{r['builder']}: {r['reason']}" for r in roster.not_run))
        fail(PROG, f"--builders: no builder could run on this source ({reasons})")
    per_root = with_category(pl.DataFrame(rows))
    rules = tree_verifiers.deterministic_rules(settings)
    summary = baseline_notes(summarise(per_root, config.baseline, rules), config.baseline, verifiers, rules)
    categories = by_category(
        per_root, lambda part: baseline_notes(summarise(part, config.baseline, rules), config.baseline, verifiers, rules)
    )
    for note, where in (
        summary.filter(pl.col("baseline_note").is_not_null())
        .group_by("baseline_note", maintain_order=True)
        .agg(pl.col("setting").unique(maintain_order=True).str.join(" "))
        .iter_rows()
    ):
        print(f"{PROG}: note: vs_baseline and paired_dE are empty at {where}: {note}", file=sys.stderr)
    by_depth, gaps = (
        with_category(pl.DataFrame(depth_rows)),
        pl.DataFrame(
            gap_rows,
            schema={
                "setting": pl.String,
                "trajectory": pl.Int64,
                "root": pl.Int64,
                "context_length": pl.Int64,
                "category": pl.String,
                "budget": pl.Int64,
                "builder": pl.String,
                "verifier": pl.String,
                "depth": pl.Int64,
                "gap": pl.Float64,
                "nodes": pl.Int64,
            },
        ),
    )
    not_run = pl.DataFrame(
        [{"verifier": "all", **r} for r in roster.not_run],
        schema={"builder": pl.String, "setting": pl.String, "budget": pl.Int64, "verifier": pl.String, "reason": pl.String},
    )
    subtitle = f"source: {source.describe()}; latency: {latency.source}; {len(test)} held-out trajectories"
    tps_chart, acc_chart = charts(summary, by_depth, subtitle, rules)
    with OutputSet(out) as outputs:
        for name, frame in (
            ("compare_builders", summary),
            ("per_root", per_root),
            ("by_depth", by_depth),
            ("node_gaps", gaps),
            ("not_run", not_run),
        ):
            outputs.stage(f"{name}.parquet", parquet_writer(frame))
        stage_by_category(outputs, categories)
        for name, chart in (("throughput", tps_chart), ("acceptance_by_depth", acc_chart)):
            for fmt in ("html", "png"):
                outputs.stage(f"{name}.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        print(f"Source: {source.describe()}; {per_root['root'].n_unique()} held-out roots per setting; latency: {latency.source}")
        best = best_pairings(summary, rules).sort("setting", "budget", "TPS", descending=[False, False, True])
        print_table(
            best.select(
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
                "tokens",
            ),
            f"Each builder with its best lossless verifier (ratios and paired differences vs {config.baseline} with "
            "greedy at T = 0, one-hot at T > 0; every pairing: compare_builders.parquet)",
        )
        print_by_category(
            categories,
            ("setting", "budget", "builder", "verifier", "roots", "E", "E_se", "TPS", "vs_baseline", "paired_dE", "paired_dE_se"),
            "Every pairing's E[tau+1] (SE) and throughput",
        )
        if gaps.height:
            print_table(
                gaps.group_by("builder", "verifier", "depth")
                .agg(pl.col("gap").mean())
                .sort("depth")
                .pivot(on="depth", index=["builder", "verifier"], values="gap")
                .sort("builder", "verifier"),
                "Mean gap alpha* - alpha to the per-node optimum, by node depth (columns; OT verifiers on i.i.d. trees, all settings and budgets)",
            )
        if not_run.height:
            print_table(
                not_run.group_by("builder", "reason", maintain_order=True).agg(
                    pl.col("setting").unique().sort().str.join(" ").alias("settings"),
                    pl.col("budget").unique().sort().cast(pl.String).str.join(" ").alias("budgets"),
                    pl.col("verifier").unique().sort().str.join(" ").alias("verifiers"),
                ),
                "Not run",
            )
        print(
            f"wrote {out}/compare_builders.parquet, per_root, by_depth, node_gaps, not_run (.parquet), throughput.html/.png, "
            "acceptance_by_depth.html/.png"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
