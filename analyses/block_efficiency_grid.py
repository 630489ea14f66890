"""Block efficiency over delayed-tree actions: ``python -m analyses.block_efficiency_grid``.

For roots along a target trajectory of a synthetic world, E[tau + 1] (tokens per verification
step) of every delayed tree (K, L1, L2) of a grid, for each chosen tree verifier.  ``--method
exact`` enumerates every tree (tiny vocabularies only); ``mc`` uses DDTE's unbiased estimator
(``--samples`` sampled trees per action, each tree serving every L2 cut-off); ``auto`` tries
exact and falls back to mc.  Values are averaged over roots, with the standard error across
roots.  Output under ``--out``: ``block_efficiency_grid.parquet`` (one row per verifier and
action), ``block_efficiency_grid.{html,png}`` (a heatmap per verifier and K), and the best
static configuration per verifier printed as a table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import polars as pl
from tqdm import tqdm

from analyses._tool import check_flags, OutputSet, ToolParser, chart_writer, fail, parquet_writer, prepare_out, print_table, run_tool
from backends.synthetic import WORLDS, SamplingSettings, make_world
from simlab import tree_verifiers
from simlab.pairs import rooted, target_trajectory
from simlab.efficiency import action_grid_block_efficiency, expected_block_efficiency
from simlab.shapes import Delayed

PROG = "python -m analyses.block_efficiency_grid"


@dataclass(frozen=True)
class Config:
    world: str = "depth_profile"
    vocab: int = 16
    verifiers: tuple[str, ...] = ("specinfer", "spectr", "traversal", "bv")
    K: tuple[int, ...] = (1, 2, 3, 4)
    L1_max: int = 4
    L2_max: int = 4
    method: str = "mc"
    samples: int = 8
    roots: int = 6
    spacing: int = 16
    temperature: float = 1.0
    top_p: float | None = None
    seed: int = 0
    out: str = "out/block_efficiency_grid"
    quiet: bool = False


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def parse_args(argv) -> Config:
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", default="depth_profile", help=f"synthetic world: {', '.join(WORLDS)}")
    parser.add_argument("--vocab", type=int, default=16, help="vocabulary size V")
    parser.add_argument("--verifiers", default="specinfer,spectr,traversal,bv", help="comma-separated tree verifiers")
    parser.add_argument("--K", default="1,2,3,4", help="comma-separated numbers of branches")
    parser.add_argument("--L1-max", type=int, default=4, help="largest trunk length")
    parser.add_argument("--L2-max", type=int, default=4, help="largest branch length")
    parser.add_argument("--method", choices=["auto", "exact", "mc"], default="mc", help="outer expectation over trees")
    parser.add_argument("--samples", type=int, default=8, help="sampled trees per action (mc)")
    parser.add_argument("--roots", type=int, default=6, help="roots along the target trajectory")
    parser.add_argument("--spacing", type=int, default=16, help="tokens between roots")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (>= 0)")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus threshold in (0, 1]")
    parser.add_argument("--seed", type=int, default=0, help="seed")
    parser.add_argument("--out", default="out/block_efficiency_grid", help="output folder")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    args = parser.parse_args(argv)
    try:
        ks, verifier_names = _ints(args.K), tuple(v.strip() for v in args.verifiers.split(",") if v.strip())
    except ValueError:
        fail(PROG, f"--K: expected comma-separated integers, got {args.K!r}")
    config = Config(args.world, args.vocab, verifier_names, ks, args.L1_max, args.L2_max, args.method, args.samples,
                    args.roots, args.spacing, args.temperature, args.top_p, args.seed, args.out, args.quiet)
    checks = [
        (config.world in WORLDS, f"--world: unknown world {config.world!r}; choose one of {', '.join(WORLDS)}"),
        (2 <= config.vocab <= 50_000, f"--vocab: must lie in [2, 50000], got {config.vocab}"),
        (bool(config.verifiers), "--verifiers: name at least one verifier"),
        (all(v in tree_verifiers.names() for v in config.verifiers),
         f"--verifiers: unknown verifier in {','.join(config.verifiers)}; choose from {', '.join(tree_verifiers.names())}"),
        ("rrs_wor" not in config.verifiers, "--verifiers: rrs_wor needs siblings drafted without replacement; the grid drafts i.i.d."),
        (bool(config.K) and min(config.K) >= 1, f"--K: every K must be >= 1, got {config.K}"),
        (config.L1_max >= 0 and config.L2_max >= 0, "--L1-max, --L2-max: must be >= 0"),
        (config.samples >= 2, f"--samples: must be >= 2 (for a standard error), got {config.samples}"),
        (1 <= config.roots <= 10_000, f"--roots: must lie in [1, 10000], got {config.roots}"),
        (config.seed >= 0, f"--seed: must be >= 0, got {config.seed}"),
        (max(config.K) <= 16 and config.L1_max <= 32 and config.L2_max <= 32, "--K, --L1-max, --L2-max: at most 16, 32, 32"),
        (np.isfinite(config.temperature) and config.temperature >= 0, f"--temperature: must be >= 0, got {config.temperature}"),
        (config.top_p is None or 0 < config.top_p <= 1, f"--top-p: must lie in (0, 1], got {config.top_p}"),
    ]
    check_flags(PROG, checks)
    return config


def estimate(config: Config) -> pl.DataFrame:
    """One row per (verifier, K, L1, L2): E[tau + 1] averaged over roots, standard error across roots."""
    world = make_world(config.world, vocab=config.vocab, seed=config.seed,
                       settings=SamplingSettings(config.temperature, None, config.top_p))
    rng = np.random.default_rng(config.seed)
    trajectory = target_trajectory(world, config.spacing * (config.roots + 1), rng)
    L1s, L2s = tuple(range(config.L1_max + 1)), tuple(range(config.L2_max + 1))
    rows = []
    jobs = [(v, r) for v in config.verifiers for r in range(config.roots)]
    for name, root in tqdm(jobs, desc="verifier x root", file=sys.stderr, disable=config.quiet):
        context = tuple(trajectory[: config.spacing * (root + 1)])
        pair = rooted(world, len(context))
        grid, method = None, config.method
        if method in ("exact", "auto"):
            try:
                grid = {(K, L1, L2): expected_block_efficiency(pair, context, Delayed(K, L1, L2), name)
                        for K in config.K for L1 in L1s for L2 in L2s}
                method = "exact"
            except ValueError as exc:
                if config.method == "exact":
                    fail(PROG, f"--method exact: {exc}")
                method = "mc"
        if grid is None:
            grid = action_grid_block_efficiency(pair, context, name, K_values=config.K, L1_values=L1s, L2_values=L2s,
                                                samples=config.samples, seed=config.seed + 1000 * root)
        rows.extend({"verifier": name, "root": root, "K": K, "L1": L1, "L2": L2, "method": method, "value": e.mean}
                    for (K, L1, L2), e in grid.items())
    per_root = pl.DataFrame(rows)
    return (per_root.group_by("verifier", "K", "L1", "L2")
            .agg(pl.col("value").mean().alias("block_efficiency"),
                 (pl.col("value").std() / pl.len().sqrt()).alias("stderr"),
                 pl.col("method").first(), pl.len().alias("roots"))
            .sort("verifier", "K", "L1", "L2"))


def best_per_verifier(table: pl.DataFrame) -> pl.DataFrame:
    return (table.sort("block_efficiency", descending=True).group_by("verifier", maintain_order=True).first()
            .select("verifier", "K", "L1", "L2", "block_efficiency", "stderr", "method").sort("block_efficiency", descending=True))


def heatmap(table: pl.DataFrame):
    """A heatmap of E[tau+1] over (L1, L2), one panel per verifier and K."""
    import altair as alt

    return alt.Chart(table).mark_rect().encode(
        x=alt.X("L2:O", title="L2 (branch length)"),
        y=alt.Y("L1:O", title="L1 (trunk length)", sort="descending"),
        color=alt.Color("block_efficiency:Q", title="E[tau+1]", scale=alt.Scale(scheme="viridis")),
        tooltip=["verifier", "K", "L1", "L2", "block_efficiency", "stderr"],
    ).properties(width=140, height=140).facet(row=alt.Row("verifier:N"), column=alt.Column("K:O", title="K (branches)")).properties(
        title="Expected block efficiency E[tau+1] (tokens per step) of delayed trees")


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    config = parse_args(sys.argv[1:] if argv is None else argv)
    out = prepare_out(PROG, config.out)
    table = estimate(config)
    chart = heatmap(table)
    with OutputSet(out) as outputs:
        outputs.stage("block_efficiency_grid.parquet", parquet_writer(table))
        for fmt in ("html", "png"):
            outputs.stage(f"block_efficiency_grid.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        print_table(best_per_verifier(table), f"Best static delayed tree per verifier ({config.world}, V={config.vocab}, {config.roots} roots)")
        print(f"wrote {out}/block_efficiency_grid.parquet, block_efficiency_grid.html/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
