"""Many engine configurations at once, acceptance under the engines' names: ``python -m analyses.sweep``.

For a source (a synthetic world, live models, or a capture replayed) and each sampling setting,
every engine configuration (``analyses._engine_configs``: EAGLE-2/3's (total_token, depth,
top_k) grid, vLLM/SGLang chains, Sequoia, TreeGraft and SpecBlock budgets, or a ``--config``
JSON file written as the engines write their settings; each valued as its engine runs it, a
setting the engine resets shown with its written value, one it cannot run refused) is valued at
every root under each of its verifier modes (strict exact-match, one-hot, probabilistic) that is
lossless for its drafting law (``analyses._engine_valuation``, shared with ``analyses.serve_estimate``):

* deterministic trees (EAGLE, the chains, TreeGraft, SpecBlock): one tree per root, exact;
* sampled trees (Sequoia): ``--samples`` trees per root, the mean of their exact values
  (unbiased) with its standard error.

Reported per configuration and mode (``simlab.engine_metrics``, the table in ``docs/metrics.md``):
``accept_length`` E[tau+1] (Spec-Bench, vLLM, SGLang, EAGLE), ``accepted`` E[tau], SpecForge's
``chain`` (``simulated_acc_len``), each also with EOS truncation (``_eos``; the lab's block
efficiency ``E``), the per-position rates (unconditional, vLLM's counters; conditional, the
papers'), T-hat under the latency model (``--latency NAME``: a published profile) and the
predicted throughput sum E / sum T over the roots, sorted by throughput.  Deterministic trees
rank by the drafters' untempered law (``--draft-law raw``, as EAGLE's code) and are valued on the
setting's p.  A capture is replayed without any model call: a configuration whose tree needs a
node the capture lacks is listed in ``not_run`` with that node.

Output under ``--out`` (default ``out/sweep/<source>/``): ``sweep.parquet`` (summary),
``per_root.parquet``, ``by_position.parquet``, ``not_run.parquet``, ``throughput.{html,png}``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import polars as pl

from analyses import _engine_configs as engines
from analyses import _engine_valuation as valuation
from analyses._categories import by_category
from analyses._engine_valuation import (
    not_run_table,
    prepare_drafters,
    refuse_raw_draft_law_on_capture,
    summarise,
    value_roots,
)
from analyses._study import ByCategory, Opened, Report, chart_files, declared, live_timing_reason, parse, run_study
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, int_list, name_list, progress_bar
from analyses._flags import (
    LatencyConfig,
    SourceConfig,
    add_draft_law_flag,
    add_latency_flags,
    add_source_flags,
    make_latency,
    make_source,
    study_config,
)
from simlab.trees import drafting_table
from simlab.engine_metrics import EngineMetrics

PROG = "python -m analyses.sweep"


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The sweep's settings (the command-line flags): the grid flags as tuples of ints, ``modes`` as
    a tuple of names, and ``configs``, the engine configurations they (or ``--config``) name
    (``analyses._engine_configs.EngineConfig``, those the engines cannot run included)."""

    vocab: int = 32
    trajectories: int = 2
    roots_per_trajectory: int = 2
    spacing: int = 8
    settings: str = "0,1"
    config: str | None = None
    eagle_total_tokens: tuple[int, ...] = (8, 16, 32, 60)
    eagle_depths: tuple[int, ...] = (3, 5, 7)
    eagle_top_ks: tuple[int, ...] = (1, 4, 10)
    chain_lengths: tuple[int, ...] = (1, 2, 3, 4, 5)
    sequoia_budgets: tuple[int, ...] = (8, 16, 32)
    treegraft_budgets: tuple[int, ...] = (16, 32)
    specblock_budgets: tuple[int, ...] = (16, 32)
    modes: tuple[str, ...] = engines.MODES
    samples: int = 4
    small_ratio: float = 0.011
    block_ratio: float = 0.1
    rank_noise: float = 0.2
    drafters: str | None = None
    draft_law: str = "raw"
    fill: bool = False
    out: str | None = None
    quiet: bool = False
    configs: tuple = ()


GRID_FLAGS = (
    "eagle_total_tokens",
    "eagle_depths",
    "eagle_top_ks",
    "chain_lengths",
    "sequoia_budgets",
    "treegraft_budgets",
    "specblock_budgets",
)

GRID_KEYS = {
    ("eagle", "total_token"): "eagle_total_tokens",
    ("eagle", "depth"): "eagle_depths",
    ("eagle", "top_k"): "eagle_top_ks",
    ("vllm", "num_speculative_tokens"): "chain_lengths",
    ("sequoia", "budget"): "sequoia_budgets",
    ("treegraft", "budget"): "treegraft_budgets",
    ("specblock", "budget"): "specblock_budgets",
}
"""The grid flag each (engine, key) of ``engines.grid_configs`` takes its values from."""

MINIMUM = {"eagle_total_tokens": 2, "eagle_depths": 0}
"""The least value of each grid flag (EAGLE's total_token counts the root); the others: 1."""


def flags(parser: ToolParser, d: Config) -> None:
    """The source and latency flags, the configuration flags (``--config`` or the grid), the
    valuation flags and the output flags."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    g = parser.add_argument_group("configurations")
    g.add_argument(
        "--config",
        default=d.config,
        help='JSON file of engine settings, e.g. [{"engine": "eagle", "total_token": 60, "depth": 7, "top_k": 10}, '
        '{"engine": "vllm", "num_speculative_tokens": 3}, {"engine": "sglang", "speculative_num_steps": 5, '
        '"speculative_eagle_topk": 8, "speculative_num_draft_tokens": 32}, {"engine": "sequoia", "budget": 32}] '
        "(instead of the grid flags)",
    )
    for field, help in (
        ("eagle_total_tokens", "EAGLE total_token values (root included)"),
        ("eagle_depths", "EAGLE depth values (expansion rounds)"),
        ("eagle_top_ks", "EAGLE top_k values"),
        ("chain_lengths", "vLLM num_speculative_tokens values (top-1 chains)"),
        ("sequoia_budgets", "Sequoia budgets (draft tokens; empty: none)"),
        ("treegraft_budgets", "TreeGraft budgets (empty: none)"),
        ("specblock_budgets", "SpecBlock budgets (empty: none)"),
    ):
        g.add_argument("--" + field.replace("_", "-"), default=",".join(map(str, getattr(d, field))), help=help)
    g.add_argument("--modes", default=",".join(d.modes), help=f"verifier modes: comma list of {', '.join(engines.MODES)}")
    g.add_argument("--samples", type=int, default=d.samples, help="trees per root for sampled builders (Sequoia)")
    g.add_argument("--small-ratio", type=float, default=d.small_ratio, help="TreeGraft's n-gram step / one-token target forward")
    g.add_argument("--block-ratio", type=float, default=d.block_ratio, help="synthetic: block-drafter forward / target forward")
    g.add_argument("--rank-noise", type=float, default=d.rank_noise, help="synthetic: the stand-in rank head's error probability")
    g.add_argument("--drafters", default=d.drafters, help="hf: trained block drafters (default <target>/../block_drafter)")
    add_draft_law_flag(g, d.draft_law)
    g.add_argument(
        "--fill",
        action="store_true",
        help="with --capture: evaluate the nodes a capture lacks with the capture's own models (opened on first "
        "need, on --device); without it a replay calls no model and lists such configurations as not run",
    )
    add_output_flags(parser, PROG)


def _configurations(args, parser: ToolParser, modes) -> tuple[dict, list]:
    """(the grid flags as tuples of ints, the configurations): ``--config``'s entries, else the grid's.

    Raises:
        ValueError: naming the flag (a grid flag beside ``--config``, a bad list or entry).
    """
    if args.config is not None:
        given = [f for f in GRID_FLAGS if f in parser.given]
        if given:
            raise ValueError(f"{parser.flag(given[0])}: --config lists the configurations; drop one of the two")
        try:
            return {}, engines.read_configs(args.config)
        except ValueError as exc:
            raise ValueError(f"--{exc}") from None
    lists = {
        f: int_list(getattr(args, f), parser.flag(f), minimum=MINIMUM.get(f, 1)) if getattr(args, f) else () for f in GRID_FLAGS
    }
    configs = engines.grid_configs(
        (lists["eagle_total_tokens"], lists["eagle_depths"], lists["eagle_top_ks"]),
        lists["chain_lengths"],
        lists["sequoia_budgets"],
        lists["treegraft_budgets"],
        lists["specblock_budgets"],
        modes,
        {key: parser.flag(f) for key, f in GRID_KEYS.items()},
    )
    return lists, configs


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (lists as tuples, the configurations built once), or exit 2 with one line."""
    try:
        modes = name_list(args.modes, "--modes", engines.MODES)
        lists, configs = _configurations(args, parser, modes)
    except ValueError as exc:
        fail(PROG, str(exc))
    defaults = {f: getattr(Config(), f) for f in GRID_FLAGS}
    config = study_config(Config, args, **{**defaults, **lists}, modes=modes, configs=tuple(configs))
    check_flags(
        PROG,
        [
            (bool(configs), "--eagle-total-tokens: no configuration to sweep"),
            (config.samples >= 2, f"--samples: need >= 2 (a standard error), got {config.samples}"),
            (0 < config.small_ratio < math.inf, f"--small-ratio: must be a finite number > 0, got {config.small_ratio}"),
            (0 < config.block_ratio < math.inf, f"--block-ratio: must be a finite number > 0, got {config.block_ratio}"),
            (0 <= config.rank_noise <= 1, f"--rank-noise: must lie in [0, 1], got {config.rank_noise}"),
            (not config.fill or bool(config.capture), "--fill: fills the nodes a capture lacks; it needs --capture"),
            (
                config.drafters is None or config.backend == "hf",
                "--drafters: trained block drafters run on the live models; it needs --backend hf",
            ),
        ],
    )
    runnable = [c for c in configs if not c.unrunnable]
    if not runnable:
        fail(PROG, f"--eagle-total-tokens: no configuration the engines can run: {configs[0].unrunnable}")
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def chart(summary: pl.DataFrame, subtitle: str):
    import altair as alt

    return (
        alt.Chart(summary.with_columns((pl.col("config") + " / " + pl.col("mode")).alias("configuration")))
        .mark_bar()
        .encode(
            x=alt.X("TPS:Q", title="predicted throughput (tokens per second; per target forward with a ratio profile)"),
            y=alt.Y("configuration:N", sort="-x", title=None, axis=alt.Axis(labelLimit=420)),
            color="engine:N",
            facet=alt.Facet("setting:N", columns=2, title=None),
            tooltip=["config", "mode", "verifier", "accept_length", "accept_length_eos", "chain", "T", "TPS"],
        )
        .resolve_scale(y="independent")
        .properties(width=320, title=alt.TitleParams("Engine configurations by predicted throughput", subtitle=subtitle))
    )


@dataclass(frozen=True)
class Swept(Opened):
    """``Opened`` with what ``open_source`` readies beside the source: ``configs``, the
    configurations the engines can run; ``not_run``, the not-run rows so far (the engines'
    refusals, the drafters that cannot run); ``made``, the ``analyses._engine_valuation.Builders``;
    ``timed_block``: whether SpecBlock's block drafter was timed on this machine (``prepare_drafters``)."""

    configs: tuple = ()
    not_run: tuple = ()
    made: object = None
    timed_block: bool = False


def open_source(config: Config, parser: ToolParser, say) -> Swept:
    """The source (a capture replays; ``--draft-law raw`` refused on a capture at T != 1), the
    latency model with the configurations' extra drafters (``prepare_drafters``)."""
    unrunnable = [
        {"config": c.label, "setting": "all", "mode": "all", "reason": c.unrunnable} for c in config.configs if c.unrunnable
    ]
    configs = tuple(c for c in config.configs if not c.unrunnable)
    depth = max(c.levels or 9 for c in configs)  # 9: the levels of a builder without a fixed bound
    source, settings = make_source(
        PROG, parser, config, grid=False, depth=depth, quiet=config.quiet, study_honours={"capture": {"device"}}
    )
    refuse_raw_draft_law_on_capture(PROG, config, settings)
    latency = make_latency(PROG, parser, config, source, max(c.budget for c in configs))
    named = {n for n, _ in latency.drafters}
    latency, made, cannot = prepare_drafters(PROG, config, configs, source, latency, named)
    timed = config.backend == "hf" and "block" not in named and made.block_drafter is not None
    return Swept(source, settings, latency, configs=configs, not_run=tuple(unrunnable + cannot), made=made, timed_block=timed)


def values(config: Config, opened: Swept, say) -> tuple[list, pl.DataFrame]:
    """(per-root rows, the not-run table) of every configuration at every root (``value_roots``)."""
    roots = {s: list(opened.source.roots(s)) for s in opened.settings}
    with progress_bar(total=sum(map(len, roots.values())), desc="roots", unit="root", quiet=config.quiet) as bar:
        rows, valued, filled = value_roots(
            PROG, list(opened.configs), roots, config, opened.latency, opened.made, bar, opened.source
        )
    return rows, not_run_table(PROG, config, rows, [*opened.not_run, *valued], filled)


def value_root(config: Config, opened: Swept, task) -> dict:
    """One root's rows and not-run rows: every configuration valued there (seeded by its label
    alone, as ``value_roots``); no fit and no filled model, so they depend on that root alone."""
    root, setting = task.root, task.setting
    table = root.table()
    tables = (table, drafting_table(table, config.draft_law))
    rows, not_run = [], []
    for c in opened.configs:
        builder = opened.made.get(c, root, setting)
        if builder is None:
            continue
        seed = zlib.crc32(c.label.encode())
        got, missing = valuation.value_root(c, builder, root, setting, seed, config, opened.latency, bool(config.capture), tables)
        rows += got
        not_run += [{"config": c.label, "setting": setting.name, "mode": m, "reason": why} for m, why in missing.items()]
    return {"rows": [{k: _plain_metrics(v) for k, v in row.items()} for row in rows], "not_run": not_run}


METRICS = ("_plain", "_eos")
"""The row fields that hold a ``simlab.engine_metrics.EngineMetrics`` (a part holds its fields)."""


def _plain_metrics(value):
    """An ``EngineMetrics`` as its fields (arrays as lists, read back bit for bit); anything else as is."""
    return {**vars(value), "extra": dict(value.extra)} if isinstance(value, EngineMetrics) else value


def _metrics_row(row: dict) -> dict:
    """A part's row with its ``EngineMetrics`` rebuilt (``_plain_metrics`` inverted; float64 arrays)."""
    rebuilt = {}
    for name in METRICS:
        if name in row:
            fields = row[name]
            arrays = {k: np.asarray(fields[k], dtype=np.float64) for k in ("unconditional", "conditional")}
            rebuilt[name] = EngineMetrics(**{**fields, **arrays})
    return {**row, **rebuilt}


def merge(config: Config, opened: Swept, payloads) -> tuple[list, pl.DataFrame]:
    """(rows, not-run table) of every root's payload in order, as ``values`` gives them."""
    rows = [_metrics_row(row) for p in payloads for row in p["rows"]]
    valued = [row for p in payloads for row in p["not_run"]]
    return rows, not_run_table(PROG, config, rows, [*opened.not_run, *valued], [])


def shardable(config: Config, opened: Swept, parser: ToolParser) -> str | None:
    """Why this sweep cannot be shared among processes: Sequoia is fitted on every root of a
    setting; ``--fill`` opens the capture's models once per setting; live models or SpecBlock's
    block drafter timed on each rank's machine (``analyses._study.live_timing_reason``)."""
    if config.fill:
        return "--fill opens the capture's models for the nodes it lacks in one process"
    if opened is not None and any(c.engine == "sequoia" for c in opened.configs):
        return (
            "Sequoia's acceptance vector is fitted on every root of a setting; pass --sequoia-budgets '' or a --config without it"
        )
    if opened is not None and opened.timed_block:
        return "each rank would time SpecBlock's block drafter itself; pass --latency with a profile that gives it"
    return live_timing_reason(config, parser)


def run(config: Config, opened: Swept, valued, say) -> Report:
    """The summary, the per-root rows, the per-position rates, the not-run table, the chart and the tables."""
    rows, not_run = valued
    source, latency = opened.source, opened.latency
    summary, per_root, positions = summarise(rows)
    categories = by_category(rows, lambda part: summarise(part)[0])
    subtitle = f"source: {source.describe()}; latency: {latency.source}"
    outputs = {
        "sweep.parquet": summary,
        "per_root.parquet": per_root,
        "by_position.parquet": positions,
        "not_run.parquet": not_run,
        **chart_files("throughput", chart(summary, subtitle), chart_writer),
    }
    shown = summary.select(
        "setting",
        "config",
        "mode",
        "accept_length",
        "accept_length_eos",
        "accepted",
        "chain",
        "E_se",
        *[c for c in ("cond_1", "cond_2", "cond_3") if c in summary.columns],
        "tokens",
        "T",
        "TPS",
    )
    printed = [
        f"Source: {source.describe()}; latency: {latency.source}",
        (
            shown,
            "Engine configurations by predicted throughput (accept_length = E[tau+1]; _eos: EOS truncation; "
            "chain = SpecForge's simulated_acc_len; cond_d: the papers' per-position rate; all columns: sweep.parquet)",
        ),
        ByCategory(
            categories,
            ("setting", "config", "mode", "roots", "accept_length", "accepted", "chain", "E_se", "T", "TPS"),
            "Engine configurations",
        ),
    ]
    if not_run.height:
        grouped = not_run.group_by("reason", maintain_order=True).agg(
            pl.col("mode").unique().sort().str.join(" ").alias("modes"),
            pl.col("config").unique(maintain_order=True).str.join("; ").str.slice(0, 90).alias("configs"),
        )
        printed.append((grouped, "Not run (every row: not_run.parquet)"))
    return Report(outputs, categories, tuple(printed))


STUDY = declared(globals())


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
