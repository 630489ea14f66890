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

from dataclasses import dataclass, replace

import polars as pl

from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.tree_verifiers.base import accepted_lengths, reach_probabilities

from analyses._block_drafters import TRAINED, drafter_folder, drafters_for
from analyses._categories import by_category, with_category
from analyses._throughput_bars import throughput_bars
from analyses._study import ByCategory, Opened, Report, chart_files, declared, flag_value, live_timing_reason, parse
from analyses._study import run_study, titled
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, int_list, progress_bar
from analyses._flags import LatencyConfig, SourceConfig, add_draft_law_flag, add_latency_flags, add_source_flags
from simlab.trees import drafting_table
from analyses._flags import make_latency, make_source, study_config, with_drafter_time

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
    budgets: tuple[int, ...] = (60, 90)
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

    def __post_init__(self):
        if isinstance(self.budgets, str):  # a config built in code with a list as written: parsed once, here
            object.__setattr__(self, "budgets", int_list(self.budgets, "--budgets", minimum=1))


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, the SpecBlock trees' group, the stream's group and ``--out``/``--quiet``."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    g = parser.add_argument_group("SpecBlock trees")
    g.add_argument(
        "--budgets", default=",".join(map(str, d.budgets)), help="matched budgets (draft tokens after pruning), comma list"
    )
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


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--budgets`` as a tuple of ints), or exit 2 with one line."""
    config = study_config(Config, args, budgets=flag_value(PROG, int_list, args.budgets, "--budgets", minimum=1))
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
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv`` (the live-model defaults applied)."""
    return parse(STUDY, argv)


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
    rows, depth_rows, slot_rows = [], [], []
    bar = progress_bar(total=sum(source.count(s) for s in settings), desc="roots", unit="root", quiet=config.quiet)
    for setting in settings:
        for root in source.roots(setting):
            mine = measure_root(config, setting, root, latency, drafter_of)
            rows += mine["rows"]
            depth_rows += mine["by_depth"]
            slot_rows += mine["by_slot"]
            bar.update()
    bar.close()
    return rows, depth_rows, slot_rows


def measure_root(config: Config, setting, root, latency, drafter_of) -> dict:
    """One root's ``rows``, ``by_depth`` and ``by_slot`` rows over every budget, builder and
    lossless verifier; they depend on this root alone (the stand-in drafter is seeded by ``--seed``)."""
    from simlab.builders.cost import DraftCost
    from simlab.engine_metrics import conditional_rates, path_metrics
    from simlab.valuation import value_tree

    rows, depth_rows, slot_rows = [], [], []
    table = root.table()
    drafting = drafting_table(table, config.draft_law)
    key = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "context_length": len(root.context)}
    key["category"] = root.category
    for budget in config.budgets:
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
                mine = {**key, "budget": budget, "builder": name, "verifier": v}
                rows.append(
                    {
                        **mine,
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
                    {**mine, "depth": d, "reach": float(r)}
                    | {"conditional": float(c)}  # the papers' rate; reach is vLLM's per-position counter
                    for d, (r, c) in enumerate(zip(reach, conditional_rates(reach)), start=1)
                ]
                if origin is not None:
                    slot_rows += [{**mine, "block": b, "slot": k, "accepted": a} for (b, k), a in _by_slot(law, origin)]
    return {"rows": rows, "by_depth": depth_rows, "by_slot": slot_rows}


def _by_slot(law: dict, origin: dict) -> list:
    """((block, slot), accepted tokens) in order: the probability mass of the accepted paths' tokens by their origin."""
    counts: dict[tuple[int, int], float] = {}
    for path, vector in law.items():
        for d in range(1, len(path) + 1):
            counts[origin[path[:d]]] = counts.get(origin[path[:d]], 0.0) + float(vector.sum())
    return sorted(counts.items())


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
    from simlab.sampling import parse_settings
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
    budget = max(config.budgets)
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
    tooltip = ["builder", "verifier", "E", "TPS", "vs_eagle2", "draft_share"]
    tps = throughput_bars(primary, "builder", BUILDERS, "budget:O", "setting:N", tooltip, column_title="budget")
    tps = titled(
        tps,
        220,
        150,
        "SpecBlock vs EAGLE-2 at matched budgets (exact E / T-hat; greedy at T = 0 or top-k = 1, one-hot otherwise)",
        subtitle,
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
    )
    return tps, titled(
        line, 520, 220, "Serving-time adaptation on standard-library source (drafter trained on the docs)", subtitle
    )


@dataclass(frozen=True)
class Drafted(Opened):
    """``Opened`` with the block drafters: ``drafter_of`` (variant -> factory(pair),
    ``analyses._block_drafters.drafters_for``), the builders not run, and whether the block
    drafter's forward was measured on this machine."""

    drafter_of: dict = None
    not_run: tuple = ()
    block_measured: bool = False


def open_source(config: Config, parser: ToolParser, say) -> Drafted:
    """The source (trees as deep as the block drafter's or EAGLE-2's), the latency model with the
    block drafter's forward (measured for live models unless the profile gives it, else
    ``--block-ratio``) and the block drafters."""
    depth = max(config.blocks * slots(config), config.eagle_depth + 1)
    source, settings = make_source(
        PROG, parser, config, stream="per_trajectory", grid=False, depth=depth, study_refusals=REFUSALS, quiet=config.quiet
    )
    latency = make_latency(PROG, parser, config, source, max(config.budgets), gpu_profile=GPU_PROFILE)
    drafter_of, not_run = drafters_for(config)
    measured = config.backend == "hf" and "block" not in dict(latency.drafters)  # unless the profile gives it (as sweep)
    if measured:
        from backends.block_drafter.drafter import forward_seconds

        latency = latency.with_drafter("block", forward_seconds(drafter_of["full"](source.pair).model))
    else:
        latency = with_drafter_time(latency, "block", config.block_ratio, "block_ratio", parser)
    return Drafted(source, settings, latency, drafter_of=drafter_of, not_run=tuple(not_run), block_measured=measured)


def values(config: Config, opened: Drafted, say):
    """Every root's rows in one process (``measure``)."""
    return measure(config, opened.source, opened.settings, opened.latency, opened.drafter_of)


def value_root(config: Config, opened: Drafted, task) -> dict:
    """One root's rows (``measure_root``), for a sharded run."""
    return measure_root(config, task.setting, task.root, opened.latency, opened.drafter_of)


def merge(config: Config, opened: Drafted, payloads):
    """``measure``'s three lists from every root's payload in task order."""
    return tuple([row for payload in payloads for row in payload[part]] for part in ("rows", "by_depth", "by_slot"))


def shardable(config: Config, opened: Drafted, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: live models or the block drafter timed on each rank's machine."""
    if opened is not None and opened.block_measured:
        return "each rank would time the block drafter itself; pass --latency FILE with a 'block' drafter time"
    return live_timing_reason(config, parser)


def run(config: Config, opened: Drafted, measured, say) -> Report:
    """The stream (live models), the summary, the per-root, by-depth and by-slot frames, the charts and the tables."""
    source, settings, latency = opened.source, opened.settings, opened.latency
    rows, depth_rows, slot_rows = measured
    trace_rows = run_stream(config, source, latency, opened.drafter_of) if config.backend == "hf" else None
    per_root = with_category(pl.DataFrame(rows))
    summary = summarise(per_root)
    categories = by_category(per_root, summarise)
    trace = pl.DataFrame(trace_rows) if trace_rows else None
    not_run_frame = pl.DataFrame(list(opened.not_run), schema={"builder": pl.String, "reason": pl.String})
    subtitle = f"source: {source.describe()}; latency: {latency.source}; block drafter: " + (
        "measured"
        if config.backend == "hf"
        else f"{config.block_ratio:g} t_p (stand-in: pair q, rank noise {config.rank_noise:g})"
    )
    tps_chart, stream_chart = charts(summary, trace, subtitle, tree_verifiers.deterministic_rules(settings))
    outputs = {
        "specblock.parquet": summary,
        "per_root.parquet": per_root,
        "by_depth.parquet": with_category(pl.DataFrame(depth_rows)),
        "by_slot.parquet": with_category(pl.DataFrame(slot_rows)),
        "not_run.parquet": not_run_frame,
        **({"stream.parquet": trace} if trace is not None else {}),
        **chart_files("throughput", tps_chart, chart_writer),
        **(chart_files("stream", stream_chart, chart_writer) if trace is not None else {}),
    }
    return Report(outputs, categories, tables(config, opened, summary, per_root, categories, trace, not_run_frame))


def tables(config: Config, opened: Drafted, summary, per_root, categories, trace, not_run_frame) -> tuple:
    """The printed lines and tables (``analyses._study.Report.printed`` items)."""
    source, settings, latency = opened.source, opened.settings, opened.latency
    primary = [tree_verifiers.deterministic_rule(s) for s in settings]
    shown = pl.concat(
        [summary.filter((pl.col("setting") == s.name) & (pl.col("verifier") == v)) for s, v in zip(settings, primary)]
    )
    items = [
        f"Source: {source.describe()}; {per_root['root'].n_unique()} roots per setting; latency: {latency.source}",
        (
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
        ),
        ByCategory(
            categories,
            ("setting", "verifier", "budget", "builder", "roots", "E", "accepted", "TPS", "vs_eagle2", "draft_share"),
            "Exact E[tau+1] and throughput (sum E / sum T)",
            pl.col("verifier") == pl.col("setting").replace_strict(tree_verifiers.deterministic_rules(settings)),
        ),
    ]
    if trace is not None:
        items.append(
            (
                stream_summary(trace),
                f"Shifted stream ({config.stream_prompts} standard-library source prompts, "
                f"{trace['setting'][0]}): acceptance (mean exact E[tau+1]) and throughput by policy",
            )
        )
    return (*items, *([(not_run_frame, "Not run")] if len(not_run_frame) else []))


STUDY = declared(globals())


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
