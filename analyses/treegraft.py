"""TreeGraft measured exactly: ``python -m analyses.treegraft``.

At every root of a source (default: the synthetic ``repetitive`` world, where a context n-gram
drafter is strong exactly where the mid drafter is weak; ``--backend hf``: the reference pair's
draft as the mid drafter, on the shipped repetitive prompts) and for each sampling setting
(default T = 0, verified greedily, and T = 1, verified by every lab verifier lossless for
deterministic children, ``simlab.tree_verifiers.lossless_names``: one-hot, NSS, the
greedy-draft rule), the study builds TreeGraft's tree (``simlab.treegraft``;
budget 63, D = 5, top-k 10, lookback 5, N = 5) under

* **all-small** (n-gram only), **all-mid**, **fixed** [1, 0, 1, 0, 1];
* **best**: the exact best of the 2^D schedules at that root (each tree's exact E[tau + 1]
  divided by its T-hat);
* **learned**: TreeGraft's scheduler g_psi (17 features, MLP 17-64-32-1) trained on the margins
  of the training roots (a split by trajectory), evaluated on the others;
* the paper's ablations with the fixed schedule: **no expanded positions** (the graft pool is
  the frontier), **destructive** grafting, **CSD-style** sequence-level drafting;

(trees ranked by the drafters' untempered law, ``--draft-law raw``, as TreeGraft's code does, and
valued under the setting) and reports E[tau + 1], T-hat and throughput per policy (test roots), the ratios to all-small
and all-mid, the share of graft positions taken from earlier depths and the mean graft pool, the
share of builds the official stops (empty frontier, layer-1 fallback, node cap) end before the
last layer, and the learned scheduler's agreement with the best schedule and its regret.  The
builder follows the official code's rules; ``--rules lab`` (or departure names) restores the lab's
earlier ones (``simlab.treegraft.rules``, ``docs/departures.md``).  Latency: the mid
drafter's and the target's forwards from ``--cost-ratio`` (or a profile, or measured for live
models), the n-gram step a constant ``--small-ratio`` of a target forward.  Output under
``--out`` (default ``out/treegraft/<source>/``): ``treegraft.parquet`` (summary over the test
roots), ``treegraft_every_root.parquet`` (the policies other than learned over every root),
``per_root.parquet`` (every root, policy and verifier), ``schedules.parquet`` (every schedule of
every root and verifier, with the policy rows' columns), ``throughput.{html,png}`` and ``schedules.{html,png}``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import polars as pl

from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.engine_metrics import tree_metrics
from simlab.treegraft.rules import DEPARTURES, Rules

from analyses._categories import by_category, with_category
from analyses._throughput_bars import throughput_bars
from analyses._study import ByCategory, Opened, Report, chart_files, declared, flag_value, live_timing_reason, parse
from analyses._study import run_study, titled
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, int_list, progress_bar
from backends.roots import SHIPPED_PROMPTS
from backends.tree_cache import node_table
from analyses._flags import LatencyConfig, SourceConfig, add_draft_law_flag, add_source_flags, add_latency_flags
from simlab.trees import drafting_table
from analyses._flags import make_latency, make_source, note_hf_defaults, study_config, with_hf_defaults

PROG = "python -m analyses.treegraft"
GPU_PROFILE = "treegraft-a100"
"""The latency profile (``simlab.latency_profiles``) on a pretrained pair without --latency: TreeGraft's own published timings (2 x A100): the default on the pretrained pair."""
REPETITIVE_PROMPTS = str(SHIPPED_PROMPTS.parent / "repetitive_prompts.txt")
POLICIES = ("all_small", "all_mid", "fixed", "learned", "best", "no_expanded_positions", "destructive", "sequence_level")
REFUSALS = {"capture": {"capture": "TreeGraft builds its own trees; use --backend hf or a synthetic world"}}
HF_DEFAULTS = {"roots_per_trajectory": 2, "spacing": 8}
"""Defaults that differ with --backend hf (the reference models see at most 64 tokens)."""
DRAFTERS = (("small", "small_ratio", "small_ratio"),)
"""The drafter the study times beside the models (``Study.drafters``): the n-gram step, ``--small-ratio`` of a target forward."""


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags; ``fixed``: the fixed schedule, one 0/1 per layer)."""

    world: str = "repetitive"
    vocab: int = 64
    trajectories: int = 12
    roots_per_trajectory: int = 3
    spacing: int = 12
    settings: str = "0,1"
    prompts: str | None = None
    cost_ratio: float = 0.3
    per_token: float = 0.002
    small_ratio: float = 0.011
    budget: int = 63
    depth: int = 5
    top_k: int = 10
    lookback: int = 5
    ngram: int = 5
    scoring: str = "code"
    rules: str = "official"
    fixed: tuple[int, ...] = (1, 0, 1, 0, 1)
    draft_law: str = "raw"
    epochs: int = 300
    test_share: float = 0.34
    out: str | None = None
    quiet: bool = False


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, the TreeGraft group and ``--out``/``--quiet``."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    group = parser.add_argument_group("TreeGraft")
    group.add_argument("--small-ratio", type=float, default=d.small_ratio, help="n-gram step time / one-token target forward")
    group.add_argument("--budget", type=int, default=d.budget, help="draft tokens after pruning (B_ver)")
    group.add_argument("--depth", type=int, default=d.depth, help="layers D (the learned scheduler needs D <= 5)")
    group.add_argument("--top-k", type=int, default=d.top_k, help="frontier size and proposals per node")
    group.add_argument("--lookback", type=int, default=d.lookback, help="depths below the frontier in the graft pool")
    group.add_argument("--ngram", type=int, default=d.ngram, help="N, the longest suffix the n-gram drafter matches")
    group.add_argument(
        "--scoring",
        choices=["code", "clean"],
        default=d.scoring,
        help="n-gram scores: the official code's prompt cache, or the target's true probabilities",
    )
    group.add_argument(
        "--rules",
        default=d.rules,
        help="'official' (the official code's rules), 'lab' (the lab's earlier ones), or comma-separated "
        "departures: " + ", ".join(DEPARTURES),
    )
    group.add_argument(
        "--fixed", default=",".join(map(str, d.fixed)), help="the fixed schedule (and the ablations'), one 0/1 per layer"
    )
    add_draft_law_flag(group, d.draft_law)
    group.add_argument("--epochs", type=int, default=d.epochs, help="training epochs of the learned scheduler")
    group.add_argument("--test-share", type=float, default=d.test_share, help="share of trajectories held out for evaluation")
    add_output_flags(parser, PROG)
    note_hf_defaults(parser, {"prompts": "backends/prompts/repetitive_prompts.txt"})  # the rest: Study.hf_defaults


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--fixed`` as a tuple of ints, the shipped repetitive prompts with
    ``--backend hf``), or exit 2 with one line."""
    fixed = flag_value(PROG, int_list, args.fixed, "--fixed", minimum=0, repeats=True)  # a schedule: one 0/1 per layer
    config = study_config(Config, args, fixed=fixed)
    try:
        Rules.parse(config.rules)
    except ValueError as exc:
        fail(PROG, "--" + str(exc))
    shown = ",".join(map(str, fixed))
    check_flags(
        PROG,
        [
            (config.depth >= 1, f"--depth: must be >= 1, got {config.depth}"),
            (config.ngram >= 1, f"--ngram: must be >= 1, got {config.ngram}"),
            (config.epochs >= 1, f"--epochs: must be >= 1, got {config.epochs}"),
            (set(fixed) <= {0, 1}, f"--fixed: one 0 or 1 per layer, got {shown}"),
            (config.trajectories >= 2, f"--trajectories: need >= 2 (train and test), got {config.trajectories}"),
            (0 < config.test_share < 1, f"--test-share: must lie in (0, 1), got {config.test_share}"),
            (config.depth <= 5, f"--depth: the learned scheduler's features hold 5 layers; got {config.depth}"),
            (0 < config.small_ratio < float("inf"), f"--small-ratio: must be a finite number > 0, got {config.small_ratio}"),
            (
                len(fixed) == config.depth,
                f"--fixed: needs {config.depth} entries (one per layer), got {len(fixed)}"
                if "fixed" in parser.given
                else f"--depth: {config.depth} layers need a --fixed schedule of {config.depth} entries "
                f"(one 0 or 1 per layer; the default has {len(fixed)})",
            ),
        ],
    )
    return with_hf_defaults(config, parser, {"prompts": REPETITIVE_PROMPTS})


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv`` (the live-model defaults applied)."""
    return parse(STUDY, argv)


def builders_for(config: Config, prompt_length: int | None):
    """The builder of every fixed policy (the schedule of ``best`` and ``learned`` is chosen per root)."""
    from simlab.treegraft import NGramDrafter, TreeGraft

    base = TreeGraft(
        schedule=config.fixed,
        budget=config.budget,
        depth=config.depth,
        top_k=config.top_k,
        lookback=config.lookback,
        ngram=NGramDrafter(config.ngram, config.scoring),
        cached=prompt_length,
        rules=config.rules,
    )
    return base, {
        "all_small": replace(base, schedule=(0,) * config.depth),
        "all_mid": replace(base, schedule=(1,) * config.depth),
        "fixed": base,
        "no_expanded_positions": replace(base, pool="frontier"),
        "destructive": replace(base, grafting="destructive"),
        "sequence_level": replace(base, mode="sequence"),
    }


def measure(config: Config, source, settings, latency):
    """(per-root rows, schedule rows, margins by setting) over every root."""
    rows, schedule_rows, training = [], [], {}
    total = sum(source.count(s) for s in settings)
    bar = progress_bar(total=total, desc="roots", unit="root", quiet=config.quiet)
    for setting in settings:
        for root in source.roots(setting):
            mine = measure_root(config, setting, root, latency)
            rows += mine["rows"]
            schedule_rows += mine["schedules"]
            training.setdefault(setting.name, []).extend(mine["training"])
            bar.update()
    bar.close()
    return rows, schedule_rows, training


def _key(setting, root) -> dict:
    key = {"setting": setting.name, "trajectory": root.trajectory, "root": root.root, "context_length": len(root.context)}
    key["category"] = root.category
    key["offset"] = root.offset  # tokens past the prompt's end (live roots), else None
    return key


def measure_root(config: Config, setting, root, latency) -> dict:
    """One root's values: ``rows`` (every fixed policy and ``best`` under every lossless verifier),
    ``schedules`` (every schedule's exact value) and ``training`` (the scheduler's margins under the
    first verifier: ``z`` float64 (17,), ``y``, ``prefix``); they depend on this root alone."""
    from simlab.treegraft.schedules import best, evaluate_schedules, margins

    verifiers = tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, setting)
    rows, schedule_rows, training = [], [], []
    base, fixed = builders_for(config, root.prompt_length)
    table = node_table(root.pair, root.context, config.evaluation)
    drafting = drafting_table(table, config.draft_law)
    prompt = root.prompt_length if root.prompt_length is not None else len(root.context)
    key = _key(setting, root)
    for v in verifiers:
        values = evaluate_schedules(base, drafting, v, latency, verify_table=table)
        top = best(values)
        for s, value in values.items():
            schedule_rows.append({**key, **_row(None, v, value, s), "best": s == top})
        rows.append({**key, **_row("best", v, values[top], top)})
        for name, builder in fixed.items():
            if builder.mode == "tree" and builder.pool == "window" and builder.grafting == "non_destructive":
                value = values[builder.schedule]
            else:
                value = _value(builder, drafting, table, v, latency)
            rows.append({**key, **_row(name, v, value, builder.schedule)})
        if v == verifiers[0]:
            training += [
                {**key, "z": z, "y": y, "prefix": prefix} for z, y, prefix in margins(base, drafting, values, latency, prompt)
            ]
    return {"rows": rows, "schedules": schedule_rows, "training": training}


def _value(builder, drafting, table, verifier, latency) -> dict:
    """The builder's tree built on ``drafting``, valued on ``table`` (``--draft-law``; ``simlab.valuation``)."""
    from simlab.valuation import value_tree

    state = builder.start(builder.prepare(drafting))
    for call in builder.schedule:
        state.step(bool(call))
    tree = state.finish().on(table)
    return {**value_tree(tree, verifier, latency), "state": state, "tree": tree}


def _row(policy: str | None, verifier: str, value: dict, schedule) -> dict:
    """A policy's row (a schedule's when ``policy`` is None: no ``policy`` column)."""
    state = value["state"]
    return ({} if policy is None else {"policy": policy}) | {
        "verifier": verifier,
        "schedule": "".join(map(str, schedule)),
        "E": value["E"],
        "accepted": tree_metrics(value["tree"], tree_verifiers.get(verifier)).accepted,  # E[tau], no bonus
        "T": value["T"],
        "TPS": value["TPS"],
        "tokens": value["tokens"],
        "graft_positions": state.graft_positions,
        "graft_from_earlier": state.graft_from_earlier,
        "pool_size": float(np.mean(state.pool_sizes)) if state.pool_sizes else None,
        "stop": state.stop or "",
        "layers_run": state.ran,
        "early_stop": state.stopped_early,
    }


def split(trajectories: list[int], share: float, seed: int) -> set[int]:
    """The held-out trajectories (a seeded permutation; at least one)."""
    unique = sorted(set(trajectories))
    order = np.random.default_rng(seed).permutation(len(unique))
    held = max(1, int(round(share * len(unique))))
    return {unique[i] for i in order[:held]}


def learn(config: Config, settings, training, schedule_rows: list[dict], test: set[int]) -> tuple[list[dict], list[dict]]:
    """Train g_psi per setting on the training roots' margins and add its policy on the test roots:
    its schedule read from the features ``measure`` stored at every prefix
    (``Scheduler.schedule_from``) and valued by that schedule's row (every schedule of the fixed
    builder was valued at every root), so no root is built twice.  Returns (rows, facts)."""
    from simlab.treegraft.schedules import train

    valued = {(r["setting"], r["trajectory"], r["root"], r["verifier"], r["schedule"]): r for r in schedule_rows}
    out, facts = [], []
    for setting in settings:
        examples = training.get(setting.name, [])
        fit = [e for e in examples if e["trajectory"] not in test]
        if len(fit) < 2:
            raise ValueError("trajectories: too few training roots for the scheduler; raise --trajectories")
        scheduler, losses = train(
            np.array([e["z"] for e in fit]), np.array([e["y"] for e in fit]), epochs=config.epochs, seed=config.seed
        )
        held: dict[tuple[int, int], dict] = {}
        for e in examples:
            if e["trajectory"] in test:
                held.setdefault((e["trajectory"], e["root"]), {})[e["prefix"]] = e["z"]
        for (trajectory, root), at in held.items():
            schedule = "".join(map(str, scheduler.schedule_from(at, config.depth)))
            for v in tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, setting):
                row = valued[(setting.name, trajectory, root, v, schedule)]
                out.append({**{k: x for k, x in row.items() if k != "best"}, "policy": "learned"})
        facts.append({"setting": setting.name, "training examples": len(fit), "final training loss": losses[-1]})
    return out, facts


def summarise(rows: pl.DataFrame) -> pl.DataFrame:
    """Per setting, verifier and policy over ``rows`` (per_root rows: the test roots', or every
    root's for the policies the split does not touch): mean E, throughput (sum E / sum T), ratios,
    graft statistics, and (learned) agreement with the best schedule and mean regret."""
    table = rows.group_by("setting", "verifier", "policy", maintain_order=True).agg(
        pl.len().alias("roots"),
        pl.col("E").mean(),
        pl.col("accepted").mean(),
        pl.col("T").mean(),
        (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
        pl.col("tokens").mean(),
        (pl.col("graft_from_earlier").sum() / pl.col("graft_positions").sum()).alias("graft_from_earlier_share"),
        pl.col("pool_size").mean().alias("mean_pool"),
        pl.col("early_stop").mean().alias("early_stop_share"),
    )
    ref = table.filter(pl.col("policy").is_in(["all_small", "all_mid"])).pivot(
        on="policy", index=["setting", "verifier"], values="TPS"
    )
    table = (
        table.join(ref, on=["setting", "verifier"])
        .with_columns(
            (pl.col("TPS") / pl.col("all_small")).alias("vs_all_small"), (pl.col("TPS") / pl.col("all_mid")).alias("vs_all_mid")
        )
        .drop("all_small", "all_mid")
    )
    key = ["setting", "verifier", "trajectory", "root"]
    best = rows.filter(pl.col("policy") == "best").select(
        *key, pl.col("schedule").alias("best_schedule"), pl.col("TPS").alias("best_TPS")
    )
    learned = (
        rows.filter(pl.col("policy") == "learned")
        .join(best, on=key)
        .group_by("setting", "verifier")
        .agg(
            (pl.col("schedule") == pl.col("best_schedule")).mean().alias("agreement"),
            ((pl.col("best_TPS") - pl.col("TPS")) / pl.col("best_TPS")).mean().alias("regret"),
        )
    )
    return table.join(learned.with_columns(pl.lit("learned").alias("policy")), on=["setting", "verifier", "policy"], how="left")


def charts(summary: pl.DataFrame, schedules: pl.DataFrame, subtitle: str, rules: dict[str, str]):
    import altair as alt

    tps = throughput_bars(
        summary, "policy", POLICIES, "setting:N", "verifier:N", ["policy", "E", "TPS", "vs_all_small", "vs_all_mid"]
    )
    tps = titled(tps, 260, 160, "TreeGraft policies on the test roots (exact E / T-hat)", subtitle)
    primary = pl.col("setting").replace_strict(rules, return_dtype=pl.String)
    best = (
        schedules.filter(pl.col("best") & (pl.col("verifier") == primary))
        .group_by("setting", "schedule", maintain_order=True)
        .len("roots")
    )
    sched = (
        alt.Chart(best)
        .mark_bar()
        .encode(
            x=alt.X("schedule:N", sort="-y"),
            y=alt.Y("roots:Q", title="roots (all, training and test)"),
            column=alt.Column("setting:N", title=None),
        )
    )
    title = "How often each schedule is the exact best (1 = call the mid drafter; greedy at T = 0, one-hot at T > 0)"
    return tps, titled(sched, 300, 160, title, subtitle)


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The source (per-trajectory streams, trees of depth ``depth + ngram``) and the latency model
    (TreeGraft's published profile on a pretrained pair without ``--latency``)."""
    source, settings = make_source(
        PROG,
        parser,
        config,
        stream="per_trajectory",
        grid=False,
        depth=config.depth + config.ngram,
        study_refusals=REFUSALS,
        quiet=config.quiet,
    )
    return Opened(source, settings, make_latency(PROG, parser, config, source, config.budget, gpu_profile=GPU_PROFILE))


def values(config: Config, opened: Opened, say):
    """Every root's values in one process (``measure``)."""
    return measure(config, opened.source, opened.settings, opened.latency)


def value_root(config: Config, opened: Opened, task) -> dict:
    """One root's values (``measure_root``), for a sharded run."""
    return measure_root(config, task.setting, task.root, opened.latency)


def merge(config: Config, opened: Opened, payloads):
    """``measure``'s three values from every root's payload in task order (the margins' features as
    float64 arrays, their prefixes as tuples)."""
    rows, schedule_rows, training = [], [], {}
    for payload in payloads:
        rows += payload["rows"]
        schedule_rows += payload["schedules"]
        for e in payload["training"]:
            training.setdefault(e["setting"], []).append(
                {**e, "z": np.asarray(e["z"], dtype=np.float64), "prefix": tuple(e["prefix"])}
            )
    return rows, schedule_rows, training


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: live models timed on each rank's machine."""
    return live_timing_reason(config, parser)


def run(config: Config, opened: Opened, measured, say) -> Report:
    """The learned scheduler on the test roots, the summary, the per-root and schedule frames, the charts and the tables."""
    source, settings, latency = opened.source, opened.settings, opened.latency
    rows, schedule_rows, training = measured
    test = split([r["trajectory"] for r in rows], config.test_share, config.seed)
    learned, facts = learn(config, settings, training, schedule_rows, test)
    per_root = with_category(pl.DataFrame(rows + learned)).with_columns(
        pl.col("trajectory").is_in(sorted(test)).alias("test"), pl.col("offset").cast(pl.Int64)
    )
    schedules = with_category(pl.DataFrame(schedule_rows)).with_columns(pl.col("offset").cast(pl.Int64))
    summary = summarise(per_root.filter(pl.col("test")))
    every_root = summarise(per_root.filter(pl.col("policy") != "learned"))  # no policy here depends on the split
    categories = by_category(per_root.filter(pl.col("test")), summarise)  # the summary is over the test roots
    rules = Rules.parse(config.rules).name
    subtitle = f"source: {source.describe()}; latency: {latency.source}; small step {config.small_ratio:g} t_p; rules: {rules}"
    tps_chart, sched_chart = charts(summary, schedules, subtitle, tree_verifiers.deterministic_rules(settings))
    outputs = {
        "treegraft.parquet": summary,
        "treegraft_every_root.parquet": every_root,
        "per_root.parquet": per_root,
        "schedules.parquet": schedules,
        **chart_files("throughput", tps_chart, chart_writer),
        **chart_files("schedules", sched_chart, chart_writer),
    }
    primary = [tree_verifiers.deterministic_rule(s) for s in settings]
    under_primary = lambda frame: pl.concat(
        [frame.filter((pl.col("setting") == s.name) & (pl.col("verifier") == v)) for s, v in zip(settings, primary)]
    )
    shown = under_primary(summary)
    throughput_columns = ("setting", "verifier", "policy", "roots", "E", pl.col("T").mul(1e3).alias("T (ms)"), "TPS")
    throughput_columns += ("vs_all_small", "vs_all_mid", "tokens")
    printed = (
        f"Source: {source.describe()}; {per_root.filter(pl.col('test'))['root'].n_unique()} test roots per setting; latency: {latency.source}; "
        f"rules: {rules}; context {per_root['context_length'].min()}-{per_root['context_length'].max()} tokens",
        (
            shown.select(
                *throughput_columns,
                "graft_from_earlier_share",
                "mean_pool",
                "early_stop_share",
                "agreement",
                "regret",
            ),
            "TreeGraft on the test roots: exact E[tau+1], T-hat, throughput (sum E / sum T) and ratios "
            "(every other lossless verifier of these deterministic trees gives the same exact values: treegraft.parquet)",
        ),
        (
            under_primary(every_root).select(*throughput_columns),
            "The policies the split does not touch, over every root (training and test): treegraft_every_root.parquet",
        ),
        ByCategory(
            categories,
            (
                "setting",
                "verifier",
                "policy",
                "roots",
                "E",
                "accepted",
                "TPS",
                "vs_all_small",
                "vs_all_mid",
                "agreement",
                "regret",
            ),
            "TreeGraft on the test roots: exact E[tau+1] and throughput",
            pl.col("verifier") == pl.col("setting").replace_strict(tree_verifiers.deterministic_rules(settings)),
        ),
        (pl.DataFrame(facts), "Learned scheduler (g_psi, trained on the other trajectories' exact margins)"),
    )
    return Report(outputs, categories, printed)


STUDY = declared(globals(), drafters=DRAFTERS)


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
