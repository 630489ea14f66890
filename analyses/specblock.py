"""SpecBlock measured exactly: ``python -m analyses.specblock``.

At every root of a source and for each sampling setting (default T = 0, verified greedily, and
T = 1, verified by every lab verifier lossless for deterministic children,
``simlab.tree_verifiers.lossless_names``: one-hot, NSS, the greedy-draft rule), at each matched
budget (default 60 and 90 draft tokens) the study builds

* **eagle2**: EAGLE-2's dynamic tree from the plain draft model (depth 7, top-k 10);
* **block_topk**: the block drafter's tree with a fixed ``--fixed-width`` children per slot
  (the ablation without the rank head);
* **rank_guided**: SpecBlock's rank-guided tree (``simlab.specblock.RankGuided``: K = 4, two
  blocks, beam 10, the shipped ``slim_r2`` table, later blocks as the official production path;
  ``--later-blocks cut``: the lab's earlier reading);
* **no_shift**, **no_valid_prefix**: the rank-guided tree from the drafters trained without the
  layer-wise shift or without the valid-prefix mask (real models only);
* **attention_free**: the rank-guided tree from the lab's earlier attention-free drafter (real
  models only);

and reports per builder the exact E[tau + 1], T-hat, throughput (sum E / sum T), the ratio to
eagle2, the drafting share of the step time, acceptance by depth and accepted tokens by
(block, slot).  With ``--backend hf`` the block drafters are the trained ones under
``--drafters`` (default ``<target's folder>/../block_drafter``; ``python -m backends.block_drafter
--variant all``; with ``--pair smollm2`` the pair's cache, ``python -m backends.block_drafter --pair
smollm2``), and the study then serves a **shifted stream** (standard-library source code,
``--stream-prompts`` prompts) with the rank-guided drafter under no adaptation, always heads,
always full, and the cost-aware bandit (``analyses._specblock_serving``), reporting acceptance and
throughput by prompt and the arms chosen.  Synthetic worlds use ``PairBlockDrafter`` (slots from
the pair's q along the greedy chain, a rank head that reports the true class except with
probability ``--rank-noise``): it is not trained, so the training ablations and the stream are
listed as not run, with the reason.

Latency: the plain draft model's forwards and the target's from ``--cost-ratio`` (or a profile,
or measured for live models); the block drafter's forward a constant ``--block-ratio`` of a
one-token target forward (synthetic), or measured (live).  Output under ``--out`` (default
``out/specblock/<source>/``): ``specblock.parquet`` (summary), ``per_root.parquet``,
``by_depth.parquet``, ``by_slot.parquet``, ``stream.parquet`` (live), ``not_run.parquet``,
``throughput.{html,png}`` and (live) ``stream.{html,png}``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import polars as pl

from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.tree_verifiers.base import accepted_lengths, reach_probabilities

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
    parquet_writer,
    print_table,
    progress_bar,
    run_tool,
)
from analyses._block_drafters import TRAINED, drafter_folder, drafters_for
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

PROG = "python -m analyses.specblock"
GPU_PROFILE = "specblock-a100"
"""The latency profile (``simlab.latency_profiles``) on a pretrained pair without --latency: SpecBlock's own published timings (A100): the default on the pretrained pair."""
BUILDERS = ("eagle2", "block_topk", "rank_guided", "no_shift", "no_valid_prefix", "attention_free")
STREAM_FLAGS = (
    "drafters",
    "stream_prompts",
    "stream_tokens",
    "stream_setting",
    "update_steps",
    "kl",
    "adapt_lr",
    "explore",
    "ewma",
    "window",
)
REFUSALS = {
    "capture": {"capture": "SpecBlock builds its own trees; use --backend hf or a synthetic world"},
    "synthetic": {
        **{k: "the stand-in drafter is not trained: the stream and its adaptation need --backend hf" for k in STREAM_FLAGS}
    },
    "hf": {
        "K": "the trained drafter has its own K",
        "rank_noise": "the trained drafter has its own rank head",
        "block_ratio": "the block drafter's forwards are measured",
    },
}
HF_DEFAULTS = {"roots_per_trajectory": 2, "spacing": 8}
"""Defaults that differ with --backend hf (the reference models see at most 64 tokens)."""


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags)."""

    trajectories: int = 6
    settings: str = "0,1"
    cost_ratio: float = 0.07
    per_token: float = 0.002
    block_ratio: float = 0.1
    budgets: str = "60,90"
    K: int = 4
    blocks: int = 2
    beam_width: int = 10
    table: str = "slim_r2"
    later_blocks: str = "official"
    draft_law: str = "raw"
    fixed_width: int = 3
    eagle_depth: int = 7
    eagle_top_k: int = 10
    rank_noise: float = 0.2
    drafters: str | None = None
    stream_prompts: int = 24
    stream_tokens: int = 40
    stream_setting: str = "0"
    update_steps: int = 4
    kl: float = 0.1
    adapt_lr: float = 5e-4
    explore: float = 0.1
    ewma: float = 0.3
    window: int = 3
    out: str | None = None
    quiet: bool = False


def parse_args(argv) -> tuple[Config, ToolParser]:
    d = Config()
    parser = study_parser(PROG, __doc__, d)
    g = parser.add_argument_group("SpecBlock trees")
    g.add_argument("--budgets", default=d.budgets, help="matched budgets (draft tokens after pruning), comma list")
    g.add_argument("--K", type=int, default=d.K, help="slots per block (synthetic; the trained drafter has its own)")
    g.add_argument("--blocks", type=int, default=d.blocks, help="blocks per tree (the evaluation's 2)")
    g.add_argument("--beam-width", type=int, default=d.beam_width, help="slot-0 width of block 1 and seeds per depth")
    g.add_argument("--table", choices=["slim_r2", "class_default"], default=d.table, help="sibling widths per rank class")
    g.add_argument(
        "--later-blocks",
        choices=["official", "cut"],
        default=d.later_blocks,
        help="blocks after the first: the official production path, or the lab's earlier reading (docs/departures.md)",
    )
    add_draft_law_flag(g, d.draft_law)
    g.add_argument("--fixed-width", type=int, default=d.fixed_width, help="children per slot without the rank head")
    g.add_argument("--eagle-depth", type=int, default=d.eagle_depth, help="EAGLE-2's expansion rounds")
    g.add_argument("--eagle-top-k", type=int, default=d.eagle_top_k, help="EAGLE-2's top-k")
    g.add_argument(
        "--block-ratio", type=float, default=d.block_ratio, help="synthetic: block-drafter forward / one-token target forward"
    )
    g.add_argument(
        "--rank-noise", type=float, default=d.rank_noise, help="synthetic: probability the stand-in rank head is wrong"
    )
    s = parser.add_argument_group("shifted stream and adaptation (hf)")
    s.add_argument(
        "--drafters",
        default=d.drafters,
        help="folder of the trained drafters (default <target>/../block_drafter; --pair: the pair's cache)",
    )
    s.add_argument("--stream-prompts", type=int, default=d.stream_prompts, help="standard-library source prompts served in order")
    s.add_argument(
        "--stream-tokens", type=int, default=d.stream_tokens, help="tokens decoded per prompt (fewer at the context limit)"
    )
    s.add_argument("--stream-setting", default=d.stream_setting, help="sampling setting of the stream (T[:top_p[:top_k]])")
    s.add_argument("--update-steps", type=int, default=d.update_steps, help="optimiser steps per update")
    s.add_argument("--kl", type=float, default=d.kl, help="weight of the KL anchor to the pretrained drafter")
    s.add_argument("--adapt-lr", type=float, default=d.adapt_lr, help="learning rate of the updates")
    s.add_argument("--explore", type=float, default=d.explore, help="the bandit's exploration probability")
    s.add_argument("--ewma", type=float, default=d.ewma, help="weight of the newest gain in the bandit's estimates")
    s.add_argument("--window", type=int, default=d.window, help="prompts per rollback window")
    add_output_flags(parser, PROG)
    note_hf_defaults(parser, HF_DEFAULTS)
    args = parser.parse_args(argv)
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, budgets=",".join(map(str, budgets)))
    check_flags(
        PROG,
        [
            (config.K >= 1, f"--K: must be >= 1, got {config.K}"),
            (1 <= config.blocks <= 16, f"--blocks: must lie in 1..16, got {config.blocks}"),
            (config.beam_width >= 1, f"--beam-width: must be >= 1, got {config.beam_width}"),
            (config.fixed_width >= 1, f"--fixed-width: must be >= 1, got {config.fixed_width}"),
            (config.eagle_top_k >= 1, f"--eagle-top-k: must be >= 1, got {config.eagle_top_k}"),
            (config.eagle_depth >= 0, f"--eagle-depth: must be >= 0, got {config.eagle_depth}"),
            (0 < config.block_ratio < float("inf"), f"--block-ratio: must be a finite number > 0, got {config.block_ratio}"),
            (0 <= config.rank_noise <= 1, f"--rank-noise: must lie in [0, 1], got {config.rank_noise}"),
            (config.stream_prompts >= 2, f"--stream-prompts: need >= 2, got {config.stream_prompts}"),
            (config.stream_tokens >= 1, f"--stream-tokens: must be >= 1, got {config.stream_tokens}"),
            (config.update_steps >= 1, f"--update-steps: must be >= 1, got {config.update_steps}"),
            (config.kl >= 0, f"--kl: must be >= 0, got {config.kl}"),
            (0 < config.adapt_lr < 1, f"--adapt-lr: must lie in (0, 1), got {config.adapt_lr}"),
            (0 <= config.explore <= 1, f"--explore: must lie in [0, 1], got {config.explore}"),
            (0 < config.ewma <= 1, f"--ewma: must lie in (0, 1], got {config.ewma}"),
            (config.window >= 1, f"--window: must be >= 1, got {config.window}"),
        ],
    )
    return config, parser


def slots(config: Config) -> int:
    """K: the trained drafter's (its manifest) with real models, else ``--K``."""
    import json

    manifest = drafter_folder(config) / "full" / "manifest.json"
    if config.backend == "hf" and manifest.is_file():
        return int(json.loads(manifest.read_text())["spec"]["K"])
    return config.K


def builders_for(config: Config, budget: int, drafter_of: dict, pair) -> dict:
    from simlab.builders.eagle import EAGLE2
    from simlab.specblock import CLASS_DEFAULT, SLIM_R2, RankGuided

    table = SLIM_R2 if config.table == "slim_r2" else CLASS_DEFAULT
    base = lambda variant: RankGuided(
        drafter_of[variant](pair),
        budget=budget,
        blocks=config.blocks,
        beam_width=config.beam_width,
        table=table,
        later_blocks=config.later_blocks,
    )
    out = {
        "eagle2": EAGLE2(budget=budget, depth=config.eagle_depth, top_k=config.eagle_top_k),
        "block_topk": replace(base("full"), rank_head=False, fixed_width=config.fixed_width),
        "rank_guided": base("full"),
    }
    for name in ("no_shift", "no_valid_prefix", "attention_free"):
        if TRAINED[name] in drafter_of:
            out[name] = base(TRAINED[name])
    return out


def measure(config: Config, source, settings, latency, drafter_of) -> tuple[list, list, list]:
    """(per-root rows, by-depth rows, by-slot rows) over every root, budget, builder and verifier."""
    from simlab import tree_verifiers
    from simlab.builders.cost import DraftCost
    from simlab.trees import NodeTable
    from simlab.engine_metrics import conditional_rates, path_metrics
    from simlab.valuation import value_tree

    budgets = int_list(config.budgets, "--budgets", minimum=1)
    rows, depth_rows, slot_rows = [], [], []
    bar = progress_bar(total=sum(source.count(s) for s in settings), desc="roots", unit="root", quiet=config.quiet)
    for setting in settings:
        for root in source.roots(setting):
            table = NodeTable(root.pair, root.context)
            drafting = drafting_table(table, config.draft_law)
            key = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "context_length": len(root.context)}
            key["category"] = root.category
            for budget in budgets:
                for name, builder in builders_for(config, budget, drafter_of, root.pair).items():
                    tree, origin = builder.build(drafting) if hasattr(builder, "build") else (builder.sample(drafting), None)
                    tree = tree.on(table)
                    cost = tree.cost if tree.cost is not None else DraftCost.of_tree(tree)
                    for v in tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, setting):
                        verifier = tree_verifiers.get(v)
                        value = value_tree(tree, verifier, latency)
                        E, T = value["E"], value["T"]
                        draft = T - latency.target(len(root.context) + cost.verified, 1 + cost.verified)
                        law = verifier.outcome_law(tree)
                        reach = reach_probabilities(accepted_lengths(law, tree.depth()))
                        engine = path_metrics({p: float(x.sum()) for p, x in law.items()}, tree.depth(), table.eos_id)
                        rows.append(
                            {
                                **key,
                                "budget": budget,
                                "builder": name,
                                "verifier": v,
                                "E": E,
                                "accepted": engine.accepted,  # E[tau], the engines' no-bonus convention
                                "T": T,
                                "TPS": E / T,
                                "draft_share": draft / T,
                                "tokens": tree.tokens(),
                                "depth": tree.depth(),
                            }
                        )
                        depth_rows += [
                            {**key, "budget": budget, "builder": name, "verifier": v, "depth": d, "reach": float(r)}
                            | {"conditional": float(c)}  # the papers' rate; reach is vLLM's per-position counter
                            for d, (r, c) in enumerate(zip(reach, conditional_rates(reach)), start=1)
                        ]
                        if origin is not None:
                            counts: dict[tuple[int, int], float] = {}
                            for path, vector in law.items():
                                for d in range(1, len(path) + 1):
                                    counts[origin[path[:d]]] = counts.get(origin[path[:d]], 0.0) + float(vector.sum())
                            slot_rows += [
                                {**key, "budget": budget, "builder": name, "verifier": v, "block": b, "slot": k, "accepted": a}
                                for (b, k), a in sorted(counts.items())
                            ]
            bar.update()
    bar.close()
    return rows, depth_rows, slot_rows


def summarise(per_root: pl.DataFrame) -> pl.DataFrame:
    """Per setting, verifier, budget and builder: roots, mean E and T, throughput (sum E / sum T), the
    ratio to eagle2's throughput, the drafting share of the mean step time, mean tokens and depth."""
    table = per_root.group_by("setting", "verifier", "budget", "builder", maintain_order=True).agg(
        pl.len().alias("roots"),
        pl.col("E").mean(),
        pl.col("accepted").mean(),
        pl.col("T").mean(),
        (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
        (pl.col("draft_share") * pl.col("T")).sum().truediv(pl.col("T").sum()).alias("draft_share"),
        pl.col("tokens").mean(),
        pl.col("depth").mean(),
    )
    ref = table.filter(pl.col("builder") == "eagle2").select("setting", "verifier", "budget", pl.col("TPS").alias("eagle2_TPS"))
    return (
        table.join(ref, on=["setting", "verifier", "budget"])
        .with_columns((pl.col("TPS") / pl.col("eagle2_TPS")).alias("vs_eagle2"))
        .drop("eagle2_TPS")
    )


def run_stream(config: Config, source, latency, drafter_of) -> list[dict]:
    """The shifted stream under every policy (live sources with a trained drafter)."""
    from analyses._specblock_serving import POLICIES, stream
    from backends.block_drafter.adapt import Adapter
    from backends.block_drafter.drafter import TorchBlockDrafter
    from backends.roots import source_code_prompts
    from backends.sources.flags import parse_settings
    from simlab.specblock import CLASS_DEFAULT, SLIM_R2, RankGuided

    try:
        (setting,) = parse_settings(config.stream_setting)
    except ValueError as exc:
        raise ValueError(f"stream_setting: {str(exc).partition(': ')[2]}") from None
    pair = source.pair.with_settings(setting)
    drafter = drafter_of["full"](pair)
    room = pair.max_context or 10**9
    length = room - config.stream_tokens - config.blocks * drafter.K
    if length < 2:
        raise ValueError(
            f"stream_tokens: {config.stream_tokens} tokens and trees of depth {config.blocks * drafter.K} leave "
            f"no room for a prompt in the model's context of {room}"
        )
    try:
        texts = source_code_prompts(config.stream_prompts)
    except ValueError as exc:
        raise ValueError(f"stream_prompts: {str(exc).partition(': ')[2]}") from None
    prompts = [pair.encode(t)[:length] for t in texts]
    budget = max(int_list(config.budgets, "--budgets", minimum=1))
    table = SLIM_R2 if config.table == "slim_r2" else CLASS_DEFAULT
    builder_for = lambda model: RankGuided(
        TorchBlockDrafter(model, pair),
        budget=budget,
        blocks=config.blocks,
        beam_width=config.beam_width,
        table=table,
        later_blocks=config.later_blocks,
    )
    make_adapter = lambda model: Adapter(
        model, pair.target, pair.feature_layers(), kl=config.kl, steps=config.update_steps, learning_rate=config.adapt_lr
    )
    bar = progress_bar(total=len(POLICIES) * len(prompts), desc="stream", unit="prompt", quiet=config.quiet)
    rows = []
    for policy in POLICIES:
        rows += stream(
            policy,
            drafter.model,
            pair,
            prompts,
            make_adapter,
            builder_for,
            latency,
            new_tokens=config.stream_tokens,
            room=room,
            seed=config.seed,
            ewma=config.ewma,
            explore=config.explore,
            window=config.window,
            progress=bar.update,
        )
    bar.close()
    return [{**r, "setting": setting.name, "budget": budget} for r in rows]


def stream_summary(trace: pl.DataFrame) -> pl.DataFrame:
    """Per policy: mean acceptance, serving throughput, net throughput (update seconds charged), arms, roll-backs."""
    out = trace.group_by("policy", maintain_order=True).agg(
        pl.col("acceptance").mean(),
        (pl.col("tokens").sum() / pl.col("serving_seconds").sum()).alias("tokens_per_s"),
        (pl.col("tokens").sum() / (pl.col("serving_seconds").sum() + pl.col("update_seconds").sum())).alias("net_tokens_per_s"),
        (pl.col("arm") == "heads").sum().alias("heads"),
        (pl.col("arm") == "full").sum().alias("full"),
        pl.col("rolled_back").sum().alias("rollbacks"),
    )
    none = out.filter(pl.col("policy") == "none")["net_tokens_per_s"][0]
    return out.with_columns((pl.col("net_tokens_per_s") / none).alias("vs_none"))


def charts(summary: pl.DataFrame, trace: pl.DataFrame | None, subtitle: str, rules: dict[str, str]):
    import altair as alt

    primary = summary.filter(pl.col("verifier") == pl.col("setting").replace_strict(rules, return_dtype=pl.String))
    tps = (
        alt.Chart(primary)
        .mark_bar()
        .encode(
            x=alt.X("builder:N", sort=list(BUILDERS), title=None),
            y=alt.Y("TPS:Q", title="throughput (tokens/s)"),
            color="builder:N",
            column=alt.Column("budget:O", title="budget"),
            row=alt.Row("setting:N", title=None),
            tooltip=["builder", "verifier", "E", "TPS", "vs_eagle2", "draft_share"],
        )
        .properties(
            width=220,
            height=150,
            title=alt.TitleParams(
                "SpecBlock vs EAGLE-2 at matched budgets (exact E / T-hat; greedy at T = 0, one-hot at T > 0)", subtitle=subtitle
            ),
        )
    )
    if trace is None:
        return tps, None
    line = (
        alt.Chart(trace)
        .mark_line(point=True)
        .encode(
            x=alt.X("prompt:Q", title="prompt of the shifted stream"),
            y=alt.Y("throughput:Q", title="throughput (tokens/s)"),
            color="policy:N",
            tooltip=["policy", "prompt", "acceptance", "throughput", "arm", "rolled_back"],
        )
        .properties(
            width=520,
            height=220,
            title=alt.TitleParams(
                "Serving-time adaptation on standard-library source (drafter trained on the docs)", subtitle=subtitle
            ),
        )
    )
    return tps, line


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:

    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    config = with_hf_defaults(config, parser, HF_DEFAULTS)
    depth = max(config.blocks * slots(config), config.eagle_depth + 1)
    source, settings = make_source(
        PROG, parser, config, stream="per_trajectory", grid=False, depth=depth, study_refusals=REFUSALS, quiet=config.quiet
    )
    largest = max(int_list(config.budgets, "--budgets", minimum=1))
    latency = make_latency(PROG, parser, config, source, largest, gpu_profile=GPU_PROFILE)
    try:
        drafter_of, not_run = drafters_for(config)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    if config.backend == "hf" and "block" not in dict(latency.drafters):  # measured, unless the profile gives it (as sweep)
        from backends.block_drafter.drafter import forward_seconds

        latency = latency.with_drafter("block", forward_seconds(drafter_of["full"](source.pair).model))
    else:
        latency = with_drafter_time(latency, "block", config.block_ratio, "block_ratio", parser)
    out = study_out(PROG, config, source.slug())
    try:
        rows, depth_rows, slot_rows = measure(config, source, settings, latency, drafter_of)
        trace_rows = run_stream(config, source, latency, drafter_of) if config.backend == "hf" else None
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    per_root = with_category(pl.DataFrame(rows))
    summary = summarise(per_root)
    categories = by_category(per_root, summarise)
    trace = pl.DataFrame(trace_rows) if trace_rows else None
    not_run_frame = pl.DataFrame(not_run, schema={"builder": pl.String, "reason": pl.String})
    subtitle = f"source: {source.describe()}; latency: {latency.source}; block drafter: " + (
        "measured"
        if config.backend == "hf"
        else f"{config.block_ratio:g} t_p (stand-in: pair q, rank noise {config.rank_noise:g})"
    )
    tps_chart, stream_chart = charts(summary, trace, subtitle, tree_verifiers.deterministic_rules(settings))
    with OutputSet(out) as outputs:
        outputs.stage("specblock.parquet", parquet_writer(summary))
        outputs.stage("per_root.parquet", parquet_writer(per_root))
        outputs.stage("by_depth.parquet", parquet_writer(with_category(pl.DataFrame(depth_rows))))
        outputs.stage("by_slot.parquet", parquet_writer(with_category(pl.DataFrame(slot_rows))))
        stage_by_category(outputs, categories)
        outputs.stage("not_run.parquet", parquet_writer(not_run_frame))
        charts_out = [("throughput", tps_chart)]
        if trace is not None:
            outputs.stage("stream.parquet", parquet_writer(trace))
            charts_out.append(("stream", stream_chart))
        for name, chart in charts_out:
            for fmt in ("html", "png"):
                outputs.stage(f"{name}.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        print(f"Source: {source.describe()}; {per_root['root'].n_unique()} roots per setting; latency: {latency.source}")
        primary = [tree_verifiers.deterministic_rule(s) for s in settings]
        shown = pl.concat(
            [summary.filter((pl.col("setting") == s.name) & (pl.col("verifier") == v)) for s, v in zip(settings, primary)]
        )
        print_table(
            shown.select(
                "setting",
                "verifier",
                "budget",
                "builder",
                "roots",
                "E",
                pl.col("T").mul(1e3).alias("T (ms)"),
                "TPS",
                "vs_eagle2",
                "draft_share",
                "tokens",
                "depth",
            ),
            "Exact E[tau+1], T-hat, throughput (sum E / sum T), drafting share (the other lossless verifiers "
            "of these deterministic trees give the same exact values: specblock.parquet)",
        )
        print_by_category(
            categories,
            ("setting", "verifier", "budget", "builder", "roots", "E", "accepted", "TPS", "vs_eagle2", "draft_share"),
            "Exact E[tau+1] and throughput (sum E / sum T)",
            pl.col("verifier") == pl.col("setting").replace_strict(tree_verifiers.deterministic_rules(settings)),
        )
        if trace is not None:
            print_table(
                stream_summary(trace),
                f"Shifted stream ({config.stream_prompts} standard-library source prompts, "
                f"{trace['setting'][0]}): acceptance (mean exact E[tau+1]) and throughput by policy",
            )
        if len(not_run_frame):
            print_table(not_run_frame, "Not run")
        print(
            f"wrote {out}/specblock.parquet, per_root, by_depth, by_slot, not_run"
            + (", stream" if trace is not None else "")
            + " (.parquet), throughput.html/.png"
            + (", stream.html/.png" if trace is not None else "")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
