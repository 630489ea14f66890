"""Divergence and acceptance by draft-tree depth: ``python -m analyses.divergence_by_depth``.

Roots sit at fixed spacing along a target-sampled trajectory.  At each root a draft tree is
drawn (default: i.i.d. rollouts); at every node the study measures the divergence of the draft
from the target (L1, TV, KL both ways, entropies) and, for k = 1..K children drawn i.i.d. from
q, the acceptance rate of each node verifier and the optimum alpha* (``simlab.measures``).
Rows are aggregated by depth (tokens below the root).  Output, under ``--out``:
``divergence_by_depth.parquet`` (one row per depth), ``nodes.parquet`` (one row per node),
``divergence_by_depth.{html,png}`` and ``acceptance_by_depth.{html,png}``.

Reading it: at k = 1 every verifier but NSS accepts with probability 1 - TV; the gap between
alpha* and a verifier is what a better OTLP solver could still win at that depth; the
multi-draft gain alpha(k=K) - alpha(k=1) says how much extra drafts help there.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import polars as pl
from tqdm import tqdm

from analyses._tool import check_flags, OutputSet, ToolParser, chart_writer, fail, parquet_writer, prepare_out, print_table, run_tool
from backends.synthetic import WORLDS, SamplingSettings, make_world
from simlab.pairs import rooted, target_trajectory
from simlab.measures import ACCEPTANCE_METHODS, node_acceptance, node_divergences
from simlab.shapes import named_shape
from simlab.trees import NodeTable

PROG = "python -m analyses.divergence_by_depth"


@dataclass(frozen=True)
class Config:
    """The study's settings (the command-line flags)."""

    backend: str = "synthetic"
    target: str | None = None
    draft: str | None = None
    prompts: str | None = None
    roots_per_prompt: int = 2
    capture: str | None = None
    world: str = "depth_profile"
    vocab: int = 64
    roots: int = 24
    spacing: int = 16
    depth: int = 8
    shape: str = "iid"
    width: int = 4
    trunk: int = 2
    k: int = 4
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    child_samples: int = 32
    seed: int = 0
    out: str = "out/divergence_by_depth"
    quiet: bool = False


def parse_args(argv) -> Config:
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["synthetic", "hf"], default="synthetic",
                        help="where p and q come from: a synthetic world, or two Hugging Face models (--target, --draft)")
    parser.add_argument("--target", default=None, help="hf backend: target model folder or hub id")
    parser.add_argument("--draft", default=None, help="hf backend: draft model folder or hub id")
    parser.add_argument("--prompts", default=None, help="hf backend: prompt file (default: the shipped reference prompts)")
    parser.add_argument("--roots-per-prompt", type=int, default=2, help="hf backend: roots along each prompt's continuation")
    parser.add_argument("--capture", default=None, help="read p and q from a capture folder (made with --full) instead")
    parser.add_argument("--world", default="depth_profile", help=f"synthetic world: {', '.join(WORLDS)}")
    parser.add_argument("--vocab", type=int, default=64, help="vocabulary size V (2..50000)")
    parser.add_argument("--roots", type=int, default=24, help="number of roots along the target trajectory")
    parser.add_argument("--spacing", type=int, default=16, help="tokens between consecutive roots")
    parser.add_argument("--depth", type=int, default=8, help="draft-tree depth in tokens (>= 1)")
    parser.add_argument("--shape", choices=["iid", "chain", "delayed"], default="iid", help="draft-tree shape")
    parser.add_argument("--width", type=int, default=4, help="K: rollouts (iid) or branches (delayed)")
    parser.add_argument("--trunk", type=int, default=2, help="L1 of a delayed tree (L2 = depth - L1)")
    parser.add_argument("--k", type=int, default=4, help="acceptance is reported for k = 1..K children")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (>= 0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus threshold in (0, 1]")
    parser.add_argument("--top-k", type=int, default=None, help="top-k truncation (>= 1)")
    parser.add_argument("--child-samples", type=int, default=32,
                        help="sampled child tuples per node for verifiers without a closed form (khisti, rrs_wor)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the world and of every draw")
    parser.add_argument("--out", default="out/divergence_by_depth", help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    args = parser.parse_args(argv)
    config = Config(**{k: v for k, v in vars(args).items()})
    checks = [
        (config.world in WORLDS, f"--world: unknown world {config.world!r}; choose one of {', '.join(WORLDS)}"),
        (config.backend != "hf" or config.capture or (config.target and config.draft), "--backend hf: needs --target and --draft"),
        (config.roots_per_prompt >= 1, f"--roots-per-prompt: must be >= 1, got {config.roots_per_prompt}"),
        (2 <= config.vocab <= 50_000, f"--vocab: must lie in [2, 50000], got {config.vocab}"),
        (config.roots >= 1, f"--roots: must be >= 1, got {config.roots}"),
        (config.spacing >= 1, f"--spacing: must be >= 1, got {config.spacing}"),
        (1 <= config.depth <= 64, f"--depth: must lie in [1, 64], got {config.depth}"),
        (1 <= config.width <= 16, f"--width: must lie in [1, 16], got {config.width}"),
        (config.roots <= 100_000, f"--roots: at most 100000, got {config.roots}"),
        (config.seed >= 0, f"--seed: must be >= 0, got {config.seed}"),
        (config.shape != "delayed" or 0 <= config.trunk < config.depth, f"--trunk: must lie in [0, depth), got {config.trunk}"),
        (1 <= config.k <= 8, f"--k: must lie in [1, 8], got {config.k}"),
        (config.child_samples >= 1, f"--child-samples: must be >= 1, got {config.child_samples}"),
        (np.isfinite(config.temperature) and config.temperature >= 0, f"--temperature: must be >= 0, got {config.temperature}"),
        (config.top_p is None or 0 < config.top_p <= 1, f"--top-p: must lie in (0, 1], got {config.top_p}"),
        (config.top_k is None or config.top_k >= 1, f"--top-k: must be >= 1, got {config.top_k}"),
    ]
    check_flags(PROG, checks)
    return config


def measure(config: Config) -> pl.DataFrame:
    """One row per tree node: root, path, depth, divergences and acceptance rates."""
    settings = SamplingSettings(config.temperature, config.top_k, config.top_p)
    world = make_world(config.world, vocab=config.vocab, seed=config.seed, settings=settings)
    rng = np.random.default_rng(config.seed)
    trajectory = target_trajectory(world, config.spacing * (config.roots + 1), rng)
    shape, k_values = named_shape(config.shape, config.width, config.depth, config.trunk), range(1, config.k + 1)
    rows = []
    for root in tqdm(range(config.roots), desc="roots", unit="root", file=sys.stderr, disable=config.quiet):
        context = tuple(trajectory[: config.spacing * (root + 1)])
        pair = rooted(world, len(context))
        table = NodeTable(pair, context)
        tree = shape.sample(table, rng)
        for path in tree.nodes():
            p, q = table.p(path), table.q(path)
            rows.append(node_rows(root, path, len(tree.child_list(path)), p, q, k_values, rng, config.child_samples))
    return pl.DataFrame(rows)


def node_rows(root: int, path: tuple[int, ...], children: int, p, q, k_values, rng, child_samples: int) -> dict:
    return {"root": root, "path": " ".join(map(str, path)), "depth": len(path), "children": children,
            **node_divergences(p, q), **node_acceptance(p, q, k_values, rng, child_samples)}


def measure_capture(folder: str, config: Config) -> pl.DataFrame:
    """Node rows from a ``--full`` capture (p and q replayed from the stored logits)."""
    from backends.capture import CapturedPair, read_capture

    pair = CapturedPair(folder)
    table = read_capture(folder)
    rng = np.random.default_rng(config.seed)
    rows = []
    records = table.select("root", "root_context", "path", "children").iter_rows()
    for root, context, path, children in tqdm(list(records), desc="nodes", unit="node", file=sys.stderr, disable=config.quiet):
        p, q = pair.distributions([tuple(context) + tuple(path)])
        rows.append(node_rows(root, tuple(path), children, p[0], q[0], range(1, config.k + 1), rng, config.child_samples))
    return pl.DataFrame(rows)


def capture_live(config: Config, out) -> str:
    """Run ``backends.capture`` (with --full) for the hf backend; returns the capture folder."""
    from pathlib import Path

    from backends.capture import CaptureSettings, run

    prompts = config.prompts or str(Path(__file__).resolve().parent.parent / "backends" / "prompts" / "reference_prompts.txt")
    settings = CaptureSettings(config.target, config.draft, prompts, config.roots_per_prompt, config.spacing, config.shape,
                               config.width, config.depth, config.trunk, config.temperature, config.top_p, config.top_k,
                               full=True, seed=config.seed)
    import hashlib
    import json
    from dataclasses import asdict

    digest = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()[:10]
    folder = out / f"capture-{digest}"  # one folder per setting: reruns resume, other settings never collide
    folder.mkdir(exist_ok=True)
    run(settings, folder, quiet=config.quiet)
    return str(folder)


def aggregate(nodes: pl.DataFrame, k_max: int) -> pl.DataFrame:
    """One row per depth: counts, divergence summaries, mean acceptance with standard errors, gains."""
    exprs = [pl.len().alias("nodes")]
    for col in ("l1", "tv"):
        exprs += [pl.col(col).mean().alias(f"{col}_mean"), pl.col(col).std().alias(f"{col}_sd")]
        exprs += [pl.col(col).quantile(q, "linear").alias(f"{col}_q{int(q * 100)}") for q in (0.25, 0.5, 0.75)]
    exprs += [pl.col(c).mean().alias(f"{c}_mean") for c in ("kl_pq", "kl_qp", "h_p", "h_q")]
    for method in ACCEPTANCE_METHODS:
        for k in range(1, k_max + 1):
            col = f"alpha_{method}_k{k}"
            valid = pl.col(col).is_not_nan()
            exprs += [pl.col(col).filter(valid).mean().alias(f"{col}_mean"),
                      (pl.col(col).filter(valid).std() / valid.sum().sqrt()).alias(f"{col}_se")]
    table = nodes.group_by("depth").agg(exprs).sort("depth")
    gains = [(pl.col(f"alpha_{m}_k{k_max}_mean") - pl.col(f"alpha_{m}_k1_mean")).alias(f"gain_{m}") for m in ACCEPTANCE_METHODS]
    return table.with_columns(gains)


def long_acceptance(table: pl.DataFrame, k_max: int) -> pl.DataFrame:
    parts = []
    for method in ACCEPTANCE_METHODS:
        for k in range(1, k_max + 1):
            mean, se = pl.col(f"alpha_{method}_k{k}_mean"), pl.col(f"alpha_{method}_k{k}_se").fill_null(0.0)
            parts.append(table.select("depth", pl.lit(method).alias("verifier"), pl.lit(f"k={k}").alias("k"),
                                      mean.alias("alpha"), (mean - 1.96 * se).alias("lo"), (mean + 1.96 * se).alias("hi")))
    return pl.concat(parts)


def charts(table: pl.DataFrame, k_max: int):
    """(divergence chart, acceptance chart) with 95% bands (altair is imported here, not at start-up)."""
    import altair as alt

    divergence = table.select(
        "depth", "nodes",
        pl.col("tv_mean").alias("mean"),
        (pl.col("tv_mean") - 1.96 * pl.col("tv_sd").fill_null(0.0) / pl.col("nodes").sqrt()).alias("lo"),
        (pl.col("tv_mean") + 1.96 * pl.col("tv_sd").fill_null(0.0) / pl.col("nodes").sqrt()).alias("hi"),
        pl.col("tv_q25"), pl.col("tv_q75"),
    )
    base = alt.Chart(divergence).encode(x=alt.X("depth:Q", title="draft-tree depth (tokens below the root)", axis=alt.Axis(tickMinStep=1)))
    div_chart = (
        base.mark_area(opacity=0.15).encode(y="tv_q25:Q", y2="tv_q75:Q")
        + base.mark_area(opacity=0.35).encode(y=alt.Y("lo:Q", title="TV(p, q)"), y2="hi:Q")
        + base.mark_line(point=True).encode(y="mean:Q", tooltip=["depth", "nodes", "mean"])
    ).properties(title="Draft-target divergence by depth (mean, 95% band; light: quartiles)", width=480, height=300)
    acc = long_acceptance(table, k_max)
    acc_base = alt.Chart(acc).encode(x=alt.X("depth:Q", title="draft-tree depth", axis=alt.Axis(tickMinStep=1)), color=alt.Color("verifier:N"))
    acc_chart = (
        acc_base.mark_area(opacity=0.2).encode(y=alt.Y("lo:Q", title="acceptance rate", scale=alt.Scale(zero=False)), y2="hi:Q")
        + acc_base.mark_line(point=True).encode(y="alpha:Q", tooltip=["depth", "verifier", "k", "alpha"])
    ).properties(width=260, height=220).facet(column=alt.Column("k:N", title=None)).properties(
        title="Acceptance by depth for k i.i.d. children (mean, 95% band)").configure_legend(symbolOpacity=1)
    return div_chart, acc_chart


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    out = prepare_out(PROG, config.out)
    try:
        if config.capture:
            nodes = measure_capture(config.capture, config)
        elif config.backend == "hf":
            nodes = measure_capture(capture_live(config, out), config)
        else:
            nodes = measure(config)
    except ValueError as exc:
        fail(PROG, str(exc).splitlines()[0])
    table = aggregate(nodes, config.k)
    div_chart, acc_chart = charts(table, config.k)
    with OutputSet(out) as outputs:
        outputs.stage("divergence_by_depth.parquet", parquet_writer(table))
        outputs.stage("nodes.parquet", parquet_writer(nodes))
        for name, chart in (("divergence_by_depth", div_chart), ("acceptance_by_depth", acc_chart)):
            for fmt in ("html", "png"):
                outputs.stage(f"{name}.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        shown = table.select("depth", "nodes", "l1_mean", "tv_mean", "tv_q25", "tv_q50", "tv_q75", "kl_pq_mean", "kl_qp_mean", "h_p_mean", "h_q_mean")
        source = (f"capture {config.capture}" if config.capture else f"{config.target} / {config.draft}" if config.backend == "hf"
                  else f"{config.world}, V={config.vocab}, {config.roots} roots")
        print_table(shown, f"Divergence by depth ({source}, shape {config.shape})")
        k = config.k
        print_table(table.select("depth", (1 - pl.col("tv_mean")).alias("k=1: 1-TV"), pl.col("alpha_nss_k1_mean").alias("k=1: nss"),
                                 *[pl.col(f"alpha_{m}_k{k}_mean").alias(m) for m in ACCEPTANCE_METHODS]),
                    f"Acceptance by depth at k = {k} children (optimal = alpha*); at k = 1 every verifier but nss accepts 1 - TV")
        print_table(table.select("depth", *[pl.col(f"gain_{m}").alias(m) for m in ACCEPTANCE_METHODS]),
                    f"Multi-draft gain alpha(k={k}) - alpha(k=1) by depth")
        print(f"wrote {out}/divergence_by_depth.parquet, nodes.parquet, divergence_by_depth.html/.png, acceptance_by_depth.html/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
