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

With ``--backend hf`` (or ``--pair``) the run records p and q first (``backends.capture --full``,
in process: ``backends.sources.recorded``) into ``<out>/capture-<settings hash>`` and replays
them, and keeps each analysed root's rows there (``analyses._root_cache``): a rerun of an
interrupted run resumes both the capture and the analysis, and publishes the tables an
uninterrupted run would, byte for byte.

``--draws root`` seeds each root's tree and child samples by (seed, root id) alone
(``root_rngs``) instead of continuing one generator from root to root (the default, ``shared``):
other numbers, but a root's rows depend on that root only, so the run can be shared among
processes (``WORLD_SIZE`` > 1, ``analyses._study``), which the default refuses.

Reading it: at k = 1 every verifier but NSS accepts with probability 1 - TV; the gap between
alpha* and a verifier is what a better OTLP solver could still win at that depth; the
multi-draft gain alpha(k=K) - alpha(k=1) says how much extra drafts help there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analyses import _root_cache
from analyses._categories import by_category
from analyses._root_cache import RootCache
from backends.sources import replay
from analyses._study import ByCategory, Opened, Report, chart_files, declared, parse, run_study
from backends.cli import ToolParser, add_output_flags, chart_writer, check_flags, fail, name_list, progress_bar
from backends.sources.recorded import RecordedSource, RecordedTrees
from analyses._flags import SourceConfig, add_source_flags, make_source, study_config
from simlab import engine_metrics, tree_verifiers
from simlab.builders import named_shape
from simlab.measures import ACCEPTANCE_METHODS, measurable, node_acceptance, node_divergences
from simlab.sampling import Stream, seeded_rng
from simlab.trees import DraftTree

PROG = "python -m analyses.divergence_by_depth"
SHAPES = ("iid", "chain", "delayed")
REFUSALS = {
    "capture": {flag: "the trees come from the capture" for flag in ("depth", "shape", "width", "trunk")},
    "hf": {"trajectories": "a live run captures every prompt of --prompts; pass a shorter prompt file"},
}
DRAWS = ("shared", "root")
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
    draws: str = "shared"
    out: str | None = None
    quiet: bool = False


def flags(parser: ToolParser, d: Config) -> None:
    """The source flags (one setting), the tree and acceptance flags, ``--draws`` and the output flags."""
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
        help=f"acceptance methods (comma-separated) of {', '.join(measurable())}; optimal_wor (alpha* drafting without "
        "replacement, the bound of rrs_wor) costs about 0.25 s per node and k at V = 49,152",
    )
    parser.add_argument(
        "--engine-metrics",
        default="",
        help="tree verifiers (comma-separated) whose engine metrics on each root's tree go to engine_metrics.parquet",
    )
    parser.add_argument(
        "--draws",
        choices=DRAWS,
        default=d.draws,
        help="shared: the trees and child samples continue one generator from root to root (a synthetic world's "
        "walk, else default_rng(seed)); root: each root's own generators, seeded by (seed, root id), so the "
        "roots can be shared among processes (WORLD_SIZE > 1)",
    )
    add_output_flags(parser, PROG)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--methods`` and ``--engine-metrics`` as tuples of names), or exit 2 with one line."""
    try:
        metrics = name_list(args.engine_metrics, "--engine-metrics", tree_verifiers.names()) if args.engine_metrics else ()
        methods = name_list(args.methods, "--methods", measurable())
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
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


ANALYSIS_FIELDS = ("seed", "k", "child_samples", "methods", "engine_metrics", "draws")
"""The settings the node rows of a captured tree depend on (with the capture itself): the key of
the per-root results a live run keeps under its capture (``analyses._root_cache``)."""


def measure(config: Config, source, setting, resume: Path | None = None) -> tuple[pl.DataFrame, dict]:
    """(one row per tree node: root, path, depth, number of children, divergences and acceptance
    rates, and the root's ``category`` and ``offset`` (target tokens between the prompt's end and
    the root: 0 at the chat template's end; ``backends.sources.base.Root``) when some root has one; verifier -> the ``EngineMetrics`` of each root's tree, for ``config.engine_metrics``).

    Trees: the captured one (a capture), else ``--shape`` drawn with the root's generator (the
    shared walk of a synthetic source) or one seeded by (seed, 1, root id), the capture tool's.
    The khisti / rrs_wor child samples use the same generator, or ``default_rng(seed)``.  With
    ``--draws root`` every root draws from its own generators instead (``root_rngs``).

    ``resume``: the capture folder ``source`` replays (a live run's own); each root's rows are kept
    there (``analyses._root_cache.RootCache``, keyed by ``ANALYSIS_FIELDS`` and the code) and a
    verified entry is reused, so a rerun after an interruption resumes and returns the same frame.
    """
    shape, k_values = named_shape(config.shape, config.width, config.depth, config.trunk), range(1, config.k + 1)
    fallback = np.random.default_rng(config.seed)
    cache = None
    if resume is not None:
        settings = {name: getattr(config, name) for name in ANALYSIS_FIELDS}
        cache = RootCache(resume, settings, code=(__file__, _root_cache.__file__, replay.__file__))
    roots = source.roots(setting)
    reused, records = 0, []
    bar = progress_bar(roots, total=source.count(setting), desc="roots analysed", unit="root", quiet=config.quiet)
    for root in bar:
        tree_rng, rng = root_rngs(config, root) if config.draws == "root" else (None, root.rng or fallback)
        before = rng.bit_generator.state
        kept = cache is not None and root.rng is None and root.tree is not None  # a captured tree
        hit = cache.get(root.root, before) if kept else None
        if hit is not None:
            (payload, after), reused = hit, reused + 1
            rng.bit_generator.state = after
            bar.set_postfix_str(f"{reused} from an earlier run", refresh=False)
        else:
            payload = _root_payload(config, root, shape, k_values, rng, tree_rng)
            if kept:
                cache.put(root.root, before, rng.bit_generator.state, payload)
        records.append(root_record(root, payload))
    return assemble(config, records)


def root_rngs(config: Config, root) -> tuple[np.random.Generator, np.random.Generator]:
    """``--draws root``: (the root's tree generator ``seeded_rng(seed, Stream.TREE, root id)``, its
    child-sample generator ``seeded_rng(seed, Stream.TREE, root id, 1)``): a root's rows depend on
    that root alone."""
    return seeded_rng(config.seed, Stream.TREE, root.root), seeded_rng(config.seed, Stream.TREE, root.root, 1)


def root_record(root, payload: dict) -> dict:
    """A root's payload with its ``category`` and ``offset`` (``assemble``'s input; JSON-able)."""
    return {**payload, "category": root.category, "offset": root.offset}


def assemble(config: Config, records) -> tuple[pl.DataFrame, dict]:
    """(nodes, verifier -> ``EngineMetrics`` per root) of the roots' ``root_record`` s in order."""
    rows, metrics = [], {name: [] for name in config.engine_metrics}
    categories, offsets = [], []  # each row's root's category and offset: a column only when some root has one
    for record in records:
        rows.extend(record["rows"])
        categories.extend([record["category"]] * len(record["rows"]))
        offsets.extend([record["offset"]] * len(record["rows"]))
        for name in config.engine_metrics:
            metrics[name].append(_engine_metrics(record["metrics"][name]))
    nodes = pl.DataFrame(rows)
    if any(c is not None for c in categories):
        nodes = nodes.with_columns(pl.Series("category", categories, dtype=pl.String))
    if any(o is not None for o in offsets):
        nodes = nodes.with_columns(pl.Series("offset", offsets, dtype=pl.Int64))
    return nodes, metrics


def _root_payload(config: Config, root, shape, k_values, rng, tree_rng=None) -> dict:
    """One root's node rows and its tree's engine metrics (as plain dicts: ``RootCache`` keeps them);
    ``tree_rng``: the generator of a drawn tree (None: the root's own, else (seed, 1, root id)'s)."""
    table = root.table()
    if root.tree is not None:
        tree = DraftTree(table, root.tree).fill()
    else:
        tree = shape.sample(table, tree_rng or root.rng or seeded_rng(config.seed, Stream.TREE, root.root))
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


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The source of one setting, as the flags name it (``make_source``); with ``--backend hf`` (or
    ``--pair``) the live pair recorded on the study's trees into ``<out>/capture-<hash>`` and
    replayed (``record``: ``backends.sources.recorded``), whose output folder the run writes to."""
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
        record=RecordedTrees(config.shape, config.width, config.depth, config.trunk),
    )
    return Opened(source, settings, None, source.out if isinstance(source, RecordedSource) else None)


def _live(config: Config) -> bool:
    return config.backend == "hf" and not config.capture


def values(config: Config, opened: Opened, say) -> tuple[pl.DataFrame, dict]:
    """(nodes, engine metrics) of every root in one process (``measure``; a live run resumes from its capture)."""
    return measure(config, opened.source, opened.settings[0], Path(opened.source.folders[0]) if _live(config) else None)


def value_root(config: Config, opened: Opened, task) -> dict:
    """One root's ``root_record`` drawn from its own generators (``--draws root``: ``root_rngs``)."""
    shape = named_shape(config.shape, config.width, config.depth, config.trunk)
    tree_rng, rng = root_rngs(config, task.root)
    return root_record(task.root, _root_payload(config, task.root, shape, range(1, config.k + 1), rng, tree_rng))


def merge(config: Config, opened: Opened, records) -> tuple[pl.DataFrame, dict]:
    """(nodes, engine metrics) of every root's record in order (``assemble``)."""
    return assemble(config, records)


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why this run cannot be shared among processes, or None."""
    if _live(config):
        return "a live run captures first: run python -m backends.capture under torchrun, then this study over --capture"
    if config.draws != "root":
        return "--draws shared continues one generator from root to root; pass --draws root"
    return None


def report(config: Config, opened: Opened, measured, say) -> Report:
    """The per-depth table, the node rows, the by-category table, the engine metrics, the charts and the tables."""
    nodes, metrics = measured
    source, (setting,) = opened.source, opened.settings
    table = aggregate(nodes, config.k, config.methods)
    categories = by_category(nodes, lambda part: aggregate(part, config.k, config.methods))
    described = f"{source.describe()}, {setting.name}, {source.count(setting)} roots"
    div_chart, acc_chart = charts(table, config.k, config.methods, f"source: {described}; trees: {_trees(config, source)}")
    outputs = {
        "divergence_by_depth.parquet": table,
        "nodes.parquet": nodes,
        **chart_files("divergence_by_depth", div_chart, chart_writer),
        **chart_files("acceptance_by_depth", acc_chart, chart_writer),
    }
    if config.engine_metrics:
        outputs["engine_metrics.parquet"] = engine_table(metrics)
    k = config.k
    shown = table.select(
        "depth", "nodes", "l1_mean", "tv_mean", "tv_q25", "tv_q50", "tv_q75", "kl_pq_mean", "kl_qp_mean", "h_p_mean", "h_q_mean"
    )
    printed = [
        (shown, f"Divergence by depth ({described}, trees: {_trees(config, source)})"),
        (
            table.select(
                "depth",
                (1 - pl.col("tv_mean")).alias("k=1: 1-TV"),
                *([pl.col("alpha_nss_k1_mean").alias("k=1: nss")] if "nss" in config.methods else []),
                *[pl.col(f"alpha_{m}_k{k}_mean").alias(m) for m in config.methods],
            ),
            f"Acceptance by depth at k = {k} children (optimal = alpha*"
            + ("; optimal_wor = alpha* drafting without replacement" if "optimal_wor" in config.methods else "")
            + "); at k = 1 every verifier but nss accepts 1 - TV",
        ),
        (
            table.select("depth", *[pl.col(f"gain_{m}").alias(m) for m in config.methods]),
            f"Multi-draft gain alpha(k={k}) - alpha(k=1) by depth",
        ),
        ByCategory(
            categories,
            ("depth", "nodes", "tv_mean", "kl_pq_mean", *[f"alpha_{m}_k{k}_mean" for m in config.methods]),
            f"Divergence and acceptance (k = {k}) by depth",
        ),
    ]
    if config.engine_metrics:
        printed.append(
            (engine_table(metrics).select("verifier", "accept_length", "accepted", "chain", "roots"), "Engine metrics")
        )
    return Report(outputs, categories, tuple(printed))


def _trees(config: Config, source) -> str:
    if source.name == "capture":
        stored = source.stored
        return f"captured {stored.shape} (width {stored.width}, depth {stored.depth})"
    return f"{config.shape} (width {config.width}, depth {config.depth}{f', trunk {config.trunk}' if config.shape == 'delayed' else ''})"


STUDY = declared(
    globals(),
    run=report,
    # a verifier refused on the trees is one of --engine-metrics (the study's only verifiers)
    error_flags={"prompts": "--prompts", "capture": "--capture", "verifier": "--engine-metrics"},
)


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
