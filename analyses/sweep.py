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
import sys
from dataclasses import dataclass

import polars as pl

from analyses import _engine_configs as engines
from analyses._categories import by_category, print_by_category, stage_by_category
from analyses._engine_valuation import not_run_table, prepare_drafters, summarise, value_roots
from backends.cli import (
    OutputSet,
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
    make_latency,
    make_source,
    study_config,
    study_out,
    study_parser,
)
from simlab.sampling import SamplingSettings

PROG = "python -m analyses.sweep"


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The sweep's settings (the command-line flags)."""

    vocab: int = 32
    trajectories: int = 2
    roots_per_trajectory: int = 2
    spacing: int = 8
    settings: str = "0,1"
    config: str | None = None
    eagle_total_tokens: str = "8,16,32,60"
    eagle_depths: str = "3,5,7"
    eagle_top_ks: str = "1,4,10"
    chain_lengths: str = "1,2,3,4,5"
    sequoia_budgets: str = "8,16,32"
    treegraft_budgets: str = "16,32"
    specblock_budgets: str = "16,32"
    modes: str = ",".join(engines.MODES)
    samples: int = 4
    small_ratio: float = 0.011
    block_ratio: float = 0.1
    rank_noise: float = 0.2
    drafters: str | None = None
    draft_law: str = "raw"
    fill: bool = False
    out: str | None = None
    quiet: bool = False


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


def parse_args(argv):
    d = Config()
    parser = study_parser(PROG, __doc__, d)
    g = parser.add_argument_group("configurations")
    g.add_argument(
        "--config",
        default=d.config,
        help='JSON file of engine settings, e.g. [{"engine": "eagle", "total_token": 60, "depth": 7, "top_k": 10}, '
        '{"engine": "vllm", "num_speculative_tokens": 3}, {"engine": "sglang", "speculative_num_steps": 5, '
        '"speculative_eagle_topk": 8, "speculative_num_draft_tokens": 32}, {"engine": "sequoia", "budget": 32}] '
        "(instead of the grid flags)",
    )
    g.add_argument("--eagle-total-tokens", default=d.eagle_total_tokens, help="EAGLE total_token values (root included)")
    g.add_argument("--eagle-depths", default=d.eagle_depths, help="EAGLE depth values (expansion rounds)")
    g.add_argument("--eagle-top-ks", default=d.eagle_top_ks, help="EAGLE top_k values")
    g.add_argument("--chain-lengths", default=d.chain_lengths, help="vLLM num_speculative_tokens values (top-1 chains)")
    g.add_argument("--sequoia-budgets", default=d.sequoia_budgets, help="Sequoia budgets (draft tokens; empty: none)")
    g.add_argument("--treegraft-budgets", default=d.treegraft_budgets, help="TreeGraft budgets (empty: none)")
    g.add_argument("--specblock-budgets", default=d.specblock_budgets, help="SpecBlock budgets (empty: none)")
    g.add_argument("--modes", default=d.modes, help=f"verifier modes: comma list of {', '.join(engines.MODES)}")
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
    args = parser.parse_args(argv)
    try:
        modes = name_list(args.modes, "--modes", engines.MODES)
        if args.config is not None:
            given = [f for f in GRID_FLAGS if f in parser.given]
            if given:
                raise ValueError(f"{parser.flag(given[0])}: --config lists the configurations; drop one of the two")
            try:
                configs = engines.read_configs(args.config)
            except ValueError as exc:
                raise ValueError(f"--{exc}") from None
        else:
            lists = {
                f: int_list(getattr(args, f), parser.flag(f), minimum=MINIMUM.get(f, 1)) if getattr(args, f) else ()
                for f in GRID_FLAGS
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
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, modes=",".join(modes))
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
    return config, parser, configs


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


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    config, parser, configs = parse_args(sys.argv[1:] if argv is None else argv)
    unrunnable = [{"config": c.label, "setting": "all", "mode": "all", "reason": c.unrunnable} for c in configs if c.unrunnable]
    configs = [c for c in configs if not c.unrunnable]
    if not configs:
        fail(PROG, f"--eagle-total-tokens: no configuration the engines can run: {unrunnable[0]['reason']}")
    depth = max(c.levels or 9 for c in configs)  # 9: the levels of a builder without a fixed bound
    source, settings = make_source(
        PROG, parser, config, grid=False, depth=depth, quiet=config.quiet, study_honours={"capture": {"device"}}
    )
    capture = bool(config.capture)
    if capture and config.draft_law == "raw" and any(s != SamplingSettings() for s in settings):
        fail(
            PROG,
            "--draft-law: a capture holds q under its own setting only, not the drafters' untempered law; "
            "use --draft-law setting, or a capture at T = 1",
        )
    latency = make_latency(PROG, parser, config, source, max(c.budget for c in configs))
    latency, made, cannot = prepare_drafters(PROG, config, configs, source, latency, {n for n, _ in latency.drafters})
    not_run = unrunnable + cannot
    out = study_out(PROG, config, source.slug())
    try:
        roots = {s: list(source.roots(s)) for s in settings}
        with progress_bar(total=sum(map(len, roots.values())), desc="roots", unit="root", quiet=config.quiet) as bar:
            rows, valued, filled = value_roots(PROG, configs, roots, config, latency, made, bar, source)
            not_run += valued
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    not_run = not_run_table(PROG, config, rows, not_run, filled)
    summary, per_root, positions = summarise(rows)
    categories = by_category(rows, lambda part: summarise(part)[0])
    subtitle = f"source: {source.describe()}; latency: {latency.source}"
    with OutputSet(out) as outputs:
        for name, frame in (("sweep", summary), ("per_root", per_root), ("by_position", positions), ("not_run", not_run)):
            outputs.stage(f"{name}.parquet", parquet_writer(frame))
        stage_by_category(outputs, categories)
        for fmt in ("html", "png"):
            outputs.stage(f"throughput.{fmt}", chart_writer(chart(summary, subtitle), fmt))
        outputs.publish()
    if not config.quiet:
        print(f"Source: {source.describe()}; latency: {latency.source}")
        print_table(
            summary.select(
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
            ),
            "Engine configurations by predicted throughput (accept_length = E[tau+1]; _eos: EOS truncation; "
            "chain = SpecForge's simulated_acc_len; cond_d: the papers' per-position rate; all columns: sweep.parquet)",
        )
        print_by_category(
            categories,
            ("setting", "config", "mode", "roots", "accept_length", "accepted", "chain", "E_se", "T", "TPS"),
            "Engine configurations",
        )
        if not_run.height:
            print_table(
                not_run.group_by("reason", maintain_order=True).agg(
                    pl.col("mode").unique().sort().str.join(" ").alias("modes"),
                    pl.col("config").unique(maintain_order=True).str.join("; ").str.slice(0, 90).alias("configs"),
                ),
                "Not run (every row: not_run.parquet)",
            )
        print(f"wrote {out}/sweep.parquet, per_root, by_position, not_run (.parquet), throughput.html/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
