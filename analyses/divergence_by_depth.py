"""Divergence and acceptance by draft-tree depth: ``python -m analyses.divergence_by_depth``.

Roots come from any source (``backends.sources``; default: 24 roots along one seeded walk of
the synthetic world ``depth_profile``).  At each root a draft tree is drawn (default: i.i.d.
rollouts; a capture brings its own trees); at every node the study measures the divergence of
the draft from the target (L1, TV, KL both ways, entropies) and, for k = 1..K children drawn
i.i.d. from q, the acceptance rate of each node verifier and the optimum alpha*
(``simlab.measures``).  Rows are aggregated by depth (tokens below the root).  Output, under
``--out`` (default ``out/divergence_by_depth/<source>/``): ``divergence_by_depth.parquet`` (one
row per depth), ``nodes.parquet`` (one row per node), ``divergence_by_depth.{html,png}`` and
``acceptance_by_depth.{html,png}``.

``--engine-metrics VERIFIERS`` (off by default) also values each root's drawn tree with those
tree verifiers, exactly (``simlab.engine_metrics.tree_metrics``, EOS-truncated where the pair has
an EOS), and writes ``engine_metrics.parquet``: one row per verifier, the engines' metrics over the
roots as their counters add them (``aggregate``: accept_length, accepted, chain, uncond_d,
cond_d; ``docs/metrics.md``).  The per-depth ``alpha`` columns are node-level rates averaged over
the drafted nodes with equal weight, not the papers' conditional rate ``cond_d`` (which weights
each node by the probability that verification reaches it).

With ``--backend hf`` (or ``--pair``) the run captures p and q first (``backends.capture --full``)
into ``<out>/capture-<settings hash>``, and keeps each analysed root's rows there
(``analyses._root_cache``): a rerun of an interrupted run resumes both the capture and the
analysis, and publishes the tables an uninterrupted run would, byte for byte.

Reading it: at k = 1 every verifier but NSS accepts with probability 1 - TV; the gap between
alpha* and a verifier is what a better OTLP solver could still win at that depth; the
multi-draft gain alpha(k=K) - alpha(k=1) says how much extra drafts help there.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl

from backends.capture import run
from backends.capture_store import CaptureSettings
from analyses import _root_cache
from analyses._categories import by_category, print_by_category, stage_by_category
from analyses._root_cache import RootCache
from backends.sources import replay
from backends.cli import (
    OutputSet,
    ToolParser,
    add_output_flags,
    chart_writer,
    check_flags,
    fail,
    fail_from,
    name_list,
    parquet_writer,
    print_table,
    progress,
    progress_bar,
    run_tool,
)
from backends.pretrained import parse_draft
from backends.roots import SHIPPED_PROMPTS
from backends.sources import CaptureSource
from backends.sources.flags import (
    SourceConfig,
    add_source_flags,
    check_honoured,
    make_source,
    note_hf_defaults,
    parse_settings,
    study_config,
    study_out,
)
from simlab import engine_metrics, tree_verifiers
from simlab.builders import named_shape
from simlab.measures import ACCEPTANCE_METHODS, MEASURABLE, node_acceptance, node_divergences
from simlab.sampling import Stream, seeded_rng
from simlab.trees import DraftTree, NodeTable

PROG = "python -m analyses.divergence_by_depth"
SHAPES = ("iid", "chain", "delayed")
REFUSALS = {
    "capture": {flag: "the trees come from the capture" for flag in ("depth", "shape", "width", "trunk")},
    "hf": {"trajectories": "a live run captures every prompt of --prompts; pass a shorter prompt file"},
}
HF_DEFAULTS = {"roots_per_trajectory": 2}
"""Defaults that differ with --backend hf (the reference models see at most 64 tokens)."""


@dataclass(frozen=True)
class Config(SourceConfig):
    """The study's settings (the command-line flags); the source fields are ``SourceConfig``'s."""

    vocab: int = 64
    trajectories: int = 1
    roots_per_trajectory: int = 24
    depth: int = 8
    shape: str = "iid"
    width: int = 4
    trunk: int = 2
    k: int = 4
    child_samples: int = 32
    methods: tuple[str, ...] = ACCEPTANCE_METHODS
    engine_metrics: tuple[str, ...] = ()
    out: str | None = None
    quiet: bool = False


def parse_args(argv) -> tuple[Config, ToolParser]:
    d = Config()
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_source_flags(parser, d, many_settings=False)
    parser.add_argument("--depth", type=int, default=d.depth, help="draft-tree depth in tokens (1..64)")
    parser.add_argument("--shape", choices=SHAPES, default=d.shape, help="draft-tree shape")
    parser.add_argument("--width", type=int, default=d.width, help="K: rollouts (iid) or branches (delayed), 1..16")
    parser.add_argument("--trunk", type=int, default=d.trunk, help="L1 of a delayed tree (L2 = depth - L1)")
    parser.add_argument("--k", type=int, default=d.k, help="acceptance is reported for k = 1..K children (1..8)")
    parser.add_argument(
        "--child-samples",
        type=int,
        default=d.child_samples,
        help="sampled child tuples per node for verifiers without a closed form (khisti, rrs_wor)",
    )
    parser.add_argument(
        "--methods",
        default=",".join(d.methods),
        help=f"acceptance methods (comma-separated) of {', '.join(MEASURABLE)}; optimal_wor (alpha* drafting without "
        "replacement, the bound of rrs_wor) costs about 0.25 s per node and k at V = 49,152",
    )
    parser.add_argument(
        "--engine-metrics",
        default="",
        help="tree verifiers (comma-separated) whose engine metrics on each root's tree go to engine_metrics.parquet",
    )
    add_output_flags(parser, PROG)
    note_hf_defaults(parser, HF_DEFAULTS)
    args = parser.parse_args(argv)
    try:
        metrics = name_list(args.engine_metrics, "--engine-metrics", tree_verifiers.names()) if args.engine_metrics else ()
        methods = name_list(args.methods, "--methods", MEASURABLE)
    except ValueError as exc:
        fail(PROG, str(exc))
    config = study_config(Config, args, engine_metrics=metrics, methods=methods)
    check_flags(
        PROG,
        [
            (1 <= config.depth <= 64, f"--depth: must lie in [1, 64], got {config.depth}"),
            (1 <= config.width <= 16, f"--width: must lie in [1, 16], got {config.width}"),
            (
                config.trajectories * config.roots_per_trajectory <= 100_000,
                f"--trajectories x --roots-per-trajectory: at most 100000 roots, got {config.trajectories * config.roots_per_trajectory}",
            ),
            (
                config.shape != "delayed" or 0 <= config.trunk < config.depth,
                f"--trunk: must lie in [0, depth), got {config.trunk}",
            ),
            ("trunk" not in parser.given or config.shape == "delayed", "--trunk: only --shape delayed has a trunk"),
            (1 <= config.k <= 8, f"--k: must lie in [1, 8], got {config.k}"),
            (config.child_samples >= 1, f"--child-samples: must be >= 1, got {config.child_samples}"),
        ],
    )
    return config, parser


ANALYSIS_FIELDS = ("seed", "k", "child_samples", "methods", "engine_metrics")
"""The settings the node rows of a captured tree depend on (with the capture itself): the key of
the per-root results a live run keeps under its capture (``analyses._root_cache``)."""


def measure(config: Config, source, setting, resume: Path | None = None) -> tuple[pl.DataFrame, dict]:
    """(one row per tree node: root, path, depth, number of children, divergences and acceptance
    rates, and the root's ``category`` and ``offset`` (target tokens between the prompt's end and
    the root: 0 at the chat template's end; ``backends.sources.base.Root``) when some root has one; verifier -> the ``EngineMetrics`` of each root's tree, for ``config.engine_metrics``).

    Trees: the captured one (a capture), else ``--shape`` drawn with the root's generator (the
    shared walk of a synthetic source) or one seeded by (seed, 1, root id), the capture tool's.
    The khisti / rrs_wor child samples use the same generator, or ``default_rng(seed)``.

    ``resume``: the capture folder ``source`` replays (a live run's own); each root's rows are kept
    there (``analyses._root_cache.RootCache``, keyed by ``ANALYSIS_FIELDS`` and the code) and a
    verified entry is reused, so a rerun after an interruption resumes and returns the same frame.
    """
    shape, k_values = named_shape(config.shape, config.width, config.depth, config.trunk), range(1, config.k + 1)
    fallback = np.random.default_rng(config.seed)
    rows, metrics = [], {name: [] for name in config.engine_metrics}
    categories = []  # each row's root's category: a column only when some root has one
    offsets = []  # each row's root's offset into the target's reply (0: the template's end): likewise
    cache = None
    if resume is not None:
        settings = {name: getattr(config, name) for name in ANALYSIS_FIELDS}
        cache = RootCache(resume, settings, code=(__file__, _root_cache.__file__, replay.__file__))
    roots = source.roots(setting)
    reused = 0
    bar = progress_bar(roots, total=source.count(setting), desc="roots analysed", unit="root", quiet=config.quiet)
    for root in bar:
        before = fallback.bit_generator.state
        kept = cache is not None and root.rng is None and root.tree is not None  # a captured tree, the shared generator
        hit = cache.get(root.root, before) if kept else None
        if hit is not None:
            (payload, after), reused = hit, reused + 1
            fallback.bit_generator.state = after
            bar.set_postfix_str(f"{reused} from an earlier run", refresh=False)
        else:
            payload = _root_payload(config, root, shape, k_values, root.rng or fallback)
            if kept:
                cache.put(root.root, before, fallback.bit_generator.state, payload)
        rows.extend(payload["rows"])
        categories.extend([root.category] * len(payload["rows"]))
        offsets.extend([root.offset] * len(payload["rows"]))
        for name in config.engine_metrics:
            metrics[name].append(_engine_metrics(payload["metrics"][name]))
    nodes = pl.DataFrame(rows)
    if any(c is not None for c in categories):
        nodes = nodes.with_columns(pl.Series("category", categories, dtype=pl.String))
    if any(o is not None for o in offsets):
        nodes = nodes.with_columns(pl.Series("offset", offsets, dtype=pl.Int64))
    return nodes, metrics


def _root_payload(config: Config, root, shape, k_values, rng) -> dict:
    """One root's node rows and its tree's engine metrics (as plain dicts: ``RootCache`` keeps them)."""
    table = NodeTable(root.pair, root.context)
    if root.tree is not None:
        tree = DraftTree(table, root.tree).fill()
    else:
        tree = shape.sample(table, root.rng or seeded_rng(config.seed, Stream.TREE, root.root))
    metrics = {  # exact, no randomness drawn
        name: asdict(engine_metrics.tree_metrics(tree, tree_verifiers.get(name))) for name in config.engine_metrics
    }
    rows = [
        node_rows(
            root.root,
            path,
            len(tree.child_list(path)),
            table.p(path),
            table.q(path),
            k_values,
            rng,
            config.child_samples,
            config.methods,
        )
        for path in tree.nodes()
    ]
    return {"rows": rows, "metrics": metrics}


def _engine_metrics(fields: dict) -> engine_metrics.EngineMetrics:
    """An ``EngineMetrics`` from its fields (arrays as float64, as ``tree_metrics`` returns them)."""
    arrays = {name: np.asarray(fields[name], dtype=np.float64) for name in ("unconditional", "conditional")}
    return engine_metrics.EngineMetrics(**{**fields, **arrays})


def engine_table(metrics: dict) -> pl.DataFrame:
    """One row per verifier: its roots' ``EngineMetrics`` aggregated as the engines' counters add
    them (``simlab.engine_metrics.aggregate``), as columns (``EngineMetrics.row``) and ``roots``."""
    return pl.DataFrame(
        [{"verifier": name, **engine_metrics.aggregate(ms).row(), "roots": len(ms)} for name, ms in metrics.items() if ms]
    )


def node_rows(root: int, path: tuple[int, ...], children: int, p, q, k_values, rng, child_samples: int, methods) -> dict:
    return {
        "root": root,
        "path": " ".join(map(str, path)),
        "depth": len(path),
        "children": children,
        **node_divergences(p, q),
        **node_acceptance(p, q, k_values, rng, child_samples, methods),
    }


def capture_live(config: Config, setting, out: Path, quiet: bool) -> str:
    """Run ``backends.capture`` (with --full) for the hf backend into ``<out>/capture-<hash>``
    (one folder per capture setting: reruns resume, other settings never collide); returns it."""
    target, draft = ("", parse_draft(config.draft, config.pair)) if config.pair else (config.target, config.draft)
    settings = CaptureSettings(
        target,
        draft,
        config.prompts or str(SHIPPED_PROMPTS),
        config.roots_per_trajectory,
        config.spacing,
        config.shape,
        config.width,
        config.depth,
        config.trunk,
        setting.temperature,
        setting.top_p,
        setting.top_k,
        dtype=config.dtype,
        full=True,
        seed=config.seed,
        pair=config.pair or "",
    )
    digest = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()[:10]
    folder = out / f"capture-{digest}"
    folder.mkdir(exist_ok=True)
    run(settings, folder, device=config.device, quiet=quiet)
    return str(folder)


def aggregate(nodes: pl.DataFrame, k_max: int, methods=ACCEPTANCE_METHODS) -> pl.DataFrame:
    """One row per depth: counts, divergence summaries, mean acceptance (of ``methods``) with standard errors, gains."""
    exprs = [pl.len().alias("nodes")]
    for col in ("l1", "tv"):
        exprs += [pl.col(col).mean().alias(f"{col}_mean"), pl.col(col).std().alias(f"{col}_sd")]
        exprs += [pl.col(col).quantile(q, "linear").alias(f"{col}_q{int(q * 100)}") for q in (0.25, 0.5, 0.75)]
    exprs += [pl.col(c).mean().alias(f"{c}_mean") for c in ("kl_pq", "kl_qp", "h_p", "h_q")]
    for method in methods:
        for k in range(1, k_max + 1):
            col = f"alpha_{method}_k{k}"
            valid = pl.col(col).is_not_nan()
            exprs += [
                pl.col(col).filter(valid).mean().alias(f"{col}_mean"),
                (pl.col(col).filter(valid).std() / valid.sum().sqrt()).alias(f"{col}_se"),
            ]
    table = nodes.group_by("depth").agg(exprs).sort("depth")
    gains = [(pl.col(f"alpha_{m}_k{k_max}_mean") - pl.col(f"alpha_{m}_k1_mean")).alias(f"gain_{m}") for m in methods]
    return table.with_columns(gains)


def long_acceptance(table: pl.DataFrame, k_max: int, methods) -> pl.DataFrame:
    parts = []
    for method in methods:
        for k in range(1, k_max + 1):
            mean, se = pl.col(f"alpha_{method}_k{k}_mean"), pl.col(f"alpha_{method}_k{k}_se").fill_null(0.0)
            parts.append(
                table.select(
                    "depth",
                    pl.lit(method).alias("verifier"),
                    pl.lit(f"k={k}").alias("k"),
                    mean.alias("alpha"),
                    (mean - 1.96 * se).alias("lo"),
                    (mean + 1.96 * se).alias("hi"),
                )
            )
    return pl.concat(parts)


def charts(table: pl.DataFrame, k_max: int, methods, subtitle: str):
    """(divergence chart, acceptance chart) with 95% bands; ``subtitle`` names the source and setting
    (altair is imported here, not at start-up)."""
    import altair as alt

    divergence = table.select(
        "depth",
        "nodes",
        pl.col("tv_mean").alias("mean"),
        (pl.col("tv_mean") - 1.96 * pl.col("tv_sd").fill_null(0.0) / pl.col("nodes").sqrt()).alias("lo"),
        (pl.col("tv_mean") + 1.96 * pl.col("tv_sd").fill_null(0.0) / pl.col("nodes").sqrt()).alias("hi"),
        pl.col("tv_q25"),
        pl.col("tv_q75"),
    )
    base = alt.Chart(divergence).encode(
        x=alt.X("depth:Q", title="draft-tree depth (tokens below the root)", axis=alt.Axis(tickMinStep=1))
    )
    div_chart = (
        base.mark_area(opacity=0.15).encode(y="tv_q25:Q", y2="tv_q75:Q")
        + base.mark_area(opacity=0.35).encode(y=alt.Y("lo:Q", title="TV(p, q)"), y2="hi:Q")
        + base.mark_line(point=True).encode(y="mean:Q", tooltip=["depth", "nodes", "mean"])
    ).properties(
        title=alt.TitleParams("Draft-target divergence by depth (mean, 95% band; light: quartiles)", subtitle=subtitle),
        width=480,
        height=300,
    )
    acc = long_acceptance(table, k_max, methods)
    acc_base = alt.Chart(acc).encode(
        x=alt.X("depth:Q", title="draft-tree depth", axis=alt.Axis(tickMinStep=1)), color=alt.Color("verifier:N")
    )
    acc_chart = (
        (
            acc_base.mark_area(opacity=0.2).encode(
                y=alt.Y("lo:Q", title="acceptance rate", scale=alt.Scale(zero=False)), y2="hi:Q"
            )
            + acc_base.mark_line(point=True).encode(y="alpha:Q", tooltip=["depth", "verifier", "k", "alpha"])
        )
        .properties(width=260, height=220)
        .facet(column=alt.Column("k:N", title=None))
        .properties(title=alt.TitleParams("Acceptance by depth for k i.i.d. children (mean, 95% band)", subtitle=subtitle))
        .configure_legend(symbolOpacity=1)
    )
    return div_chart, acc_chart


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    live = config.backend == "hf" and not config.capture
    if live:
        config = replace(config, **{k: v for k, v in HF_DEFAULTS.items() if k not in parser.given})
    log = lambda message: progress(PROG, message, config.quiet)
    try:
        if live:
            check_honoured(PROG, parser, config, REFUSALS)
            (setting,) = _one_setting(parse_settings(config.settings), parser)
            models = (
                f"{config.pair}-{config.draft or 'default'}"
                if config.pair
                else f"{Path(config.target).name}-{Path(config.draft).name}"
            )
            out = study_out(PROG, config, f"hf-{models}")
            log(f"capturing p and q on the draft trees of every root into {out}/capture-*")
            capture = capture_live(config, setting, out, config.quiet)
            source = CaptureSource((capture,), grid=False)
        else:
            source, settings = make_source(
                PROG,
                parser,
                config,
                stream="shared",
                grid=False,
                depth=config.depth,
                max_settings=1,
                study_refusals=REFUSALS,
                quiet=config.quiet,
            )
            (setting,) = settings
            out = study_out(PROG, config, source.slug())
        nodes, metrics = measure(config, source, setting, Path(capture) if live else None)
    except ValueError as exc:
        # a verifier refused on the trees is one of --engine-metrics (the study's only verifiers)
        fail_from(PROG, exc, parser, {"prompts": "--prompts", "capture": "--capture", "verifier": "--engine-metrics"})
    table = aggregate(nodes, config.k, config.methods)
    categories = by_category(nodes, lambda part: aggregate(part, config.k, config.methods))
    described = f"{source.describe()}, {setting.name}, {source.count(setting)} roots"
    div_chart, acc_chart = charts(table, config.k, config.methods, f"source: {described}; trees: {_trees(config, source)}")
    with OutputSet(out) as outputs:
        outputs.stage("divergence_by_depth.parquet", parquet_writer(table))
        outputs.stage("nodes.parquet", parquet_writer(nodes))
        stage_by_category(outputs, categories)
        if config.engine_metrics:
            outputs.stage("engine_metrics.parquet", parquet_writer(engine_table(metrics)))
        for name, chart in (("divergence_by_depth", div_chart), ("acceptance_by_depth", acc_chart)):
            for fmt in ("html", "png"):
                outputs.stage(f"{name}.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        shown = table.select(
            "depth",
            "nodes",
            "l1_mean",
            "tv_mean",
            "tv_q25",
            "tv_q50",
            "tv_q75",
            "kl_pq_mean",
            "kl_qp_mean",
            "h_p_mean",
            "h_q_mean",
        )
        print_table(shown, f"Divergence by depth ({described}, trees: {_trees(config, source)})")
        k = config.k
        print_table(
            table.select(
                "depth",
                (1 - pl.col("tv_mean")).alias("k=1: 1-TV"),
                *([pl.col("alpha_nss_k1_mean").alias("k=1: nss")] if "nss" in config.methods else []),
                *[pl.col(f"alpha_{m}_k{k}_mean").alias(m) for m in config.methods],
            ),
            f"Acceptance by depth at k = {k} children (optimal = alpha*"
            + ("; optimal_wor = alpha* drafting without replacement" if "optimal_wor" in config.methods else "")
            + "); at k = 1 every verifier but nss accepts 1 - TV",
        )
        print_table(
            table.select("depth", *[pl.col(f"gain_{m}").alias(m) for m in config.methods]),
            f"Multi-draft gain alpha(k={k}) - alpha(k=1) by depth",
        )
        print_by_category(
            categories,
            ("depth", "nodes", "tv_mean", "kl_pq_mean", *[f"alpha_{m}_k{k}_mean" for m in config.methods]),
            f"Divergence and acceptance (k = {k}) by depth",
        )
        if config.engine_metrics:
            print_table(engine_table(metrics).select("verifier", "accept_length", "accepted", "chain", "roots"), "Engine metrics")
        print(
            f"wrote {out}/divergence_by_depth.parquet, nodes.parquet, divergence_by_depth.html/.png, acceptance_by_depth.html/.png"
            + (", engine_metrics.parquet" if config.engine_metrics else "")
        )
    return 0


def _one_setting(settings, parser):
    if len(settings) != 1:
        fail(PROG, f"--settings: this study takes 1 sampling setting at a time, got {len(settings)}")
    return settings


def _trees(config: Config, source) -> str:
    if source.name == "capture":
        stored = source.stored
        return f"captured {stored.shape} (width {stored.width}, depth {stored.depth})"
    return f"{config.shape} (width {config.width}, depth {config.depth}{f', trunk {config.trunk}' if config.shape == 'delayed' else ''})"


if __name__ == "__main__":
    raise SystemExit(main())
