"""SpecTr-GBV as released, valued exactly: ``python -m analyses.spectr_gbv``.

For each world (``simlab.pairs.MarkovPair.random`` of ``--vocab`` tokens, one per ``--seeds`` seed
and ``--closeness`` value; the round at context (0,)) and each (K, L) of ``--ks`` x ``--gammas``:
the exact E[tau + 1] of the released round (``simlab.spectr_gbv``, junemily/SpecTr-GBV@e399f44
``src/engine.py``; K = 1 is the code's "gbv", after Sun et al.'s greedy block verification but uncapped: lossy), Block
Verification's E[tau + 1] on one block of L tokens (``bv``: the optimum of lossless single-draft
block verifiers), 1 + the lab's bound on lossless verifiers of K i.i.d. blocks
(``simlab.spectr_gbv.prefix_bound``), 1 + the per-prefix mass the code's acceptances are built
from (``code_prefix_mass``, read from the code), the exact TV of L + 1
tokens (one round continued by the target) and of the first token from the target's, the
probability of an all-zero residual (the official draw raises there), the largest and smallest
float64 prefix acceptance alpha, the number of prefixes whose alpha lies outside [0, 1] by more
than 1e-12, and at those the largest and smallest value of the same formula in exact rational
arithmetic on the same float64 inputs.

    python -m analyses.spectr_gbv                                  # V = 2, K in 1,2,3,7, L in 2,3,4,6 (about a minute)
    python -m analyses.spectr_gbv --vocab 3 --gammas 2,3 --ks 1,7

Outputs under ``--out`` (default ``out/spectr_gbv/markov-V<vocab>``): ``spectr_gbv.parquet``, one
row per world and (K, L).  Bad flags: one line, exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import polars as pl

from analyses._study import WROTE, Opened, Report, declared, folder_only, no_roots, parse, run_study
from backends.cli import ToolParser, add_output_flags, check_flags, fail_from, float_list, int_list, progress_bar
from simlab.builders import chain
from simlab.checks import check_seed
from simlab.efficiency import expected_block_efficiency
from simlab.pairs import MarkovPair
from simlab.spectr_gbv import SpecTrGBV, block_bias, code_prefix_mass, prefix_bound, sequence_bias

PROG = "python -m analyses.spectr_gbv"
CONTEXT = (0,)
EPS = Fraction(1e-20)
TOL = 1e-12
"""Acceptances within this of [0, 1] count as inside (float64 rounding of a value 0 or 1)."""


def exact_alpha(rule: SpecTrGBV, world, u) -> Fraction:
    """alpha of prefix ``u`` in rational arithmetic on the float64 rows (masses as exact products)."""
    m_s = m_b = Fraction(1)
    for i, t in enumerate(u):
        m_s *= Fraction(float(world.q[u[:i]][t]))
        m_b *= Fraction(float(world.p[u[:i]][t]))
    p = [Fraction(float(x)) for x in world.p[u]]
    q = [Fraction(float(x)) for x in world.q[u]]
    one = Fraction(1)

    def power(z):
        return (one - z) ** rule.k

    ratio = [min(m_s * qy / (m_b * py + EPS), one) for py, qy in zip(p, q)]
    raw = min(m_s / (m_b + EPS), one)
    num = sum(m_b * py * power(r) for py, r in zip(p, ratio)) - m_b * power(raw)
    den = one - power(m_s) - sum(m_b * py * (one - power(r)) for py, r in zip(p, ratio))
    return num / (den + EPS)


def row(pair: MarkovPair, k: int, gamma: int) -> dict:
    rule = SpecTrGBV(k=k, gamma=gamma, allow_lossy=True)
    world = rule.world(pair, CONTEXT)
    law, undefined = rule._laws(world)
    lengths = np.zeros(gamma + 1)
    for acc, vector in law.items():
        lengths[len(acc)] += float(vector.sum())
    prefixes = {u: v for u, v in rule.acceptances(world).items() if len(u) < gamma}
    outside = [u for u, v in prefixes.items() if not -TOL <= v <= 1.0 + TOL]
    exact = [exact_alpha(rule, world, u) for u in outside]
    return {
        "K": k,
        "L": gamma,
        "E_spectr_gbv": float(np.dot(np.arange(1, gamma + 2), lengths)) if undefined == 0.0 else float("nan"),
        "E_bv": expected_block_efficiency(pair, CONTEXT, chain(gamma), "bv").mean,
        "bound_lossless_iid": 1.0 + prefix_bound(world, k),
        "code_prefix_mass": 1.0 + code_prefix_mass(world, k),
        "TV_block": block_bias(rule, pair, CONTEXT),
        "TV_first_token": sequence_bias(rule, pair, CONTEXT, 1),
        "undefined_mass": undefined,
        "alpha_max": max(prefixes.values()),
        "alpha_min": min(prefixes.values()),
        "alpha_outside_01": len(outside),
        "alpha_exact_max_of_those": float(max(exact)) if exact else float("nan"),
        "alpha_exact_min_of_those": float(min(exact)) if exact else float("nan"),
    }


def measure(vocab: int, seeds, closeness, ks, gammas, quiet: bool = True) -> pl.DataFrame:
    """One ``row`` per (seed, closeness, L, K) on ``MarkovPair.random(vocab, default_rng(seed),
    closeness=c)``, in that order; a progress bar on stderr unless ``quiet``."""
    rows = []
    with progress_bar(total=len(seeds) * len(closeness) * len(gammas) * len(ks), desc="worlds x (L, K)", quiet=quiet) as bar:
        for seed in seeds:
            for c in closeness:
                pair = MarkovPair.random(vocab, np.random.default_rng(seed), closeness=c)
                for gamma in gammas:
                    for k in ks:
                        rows.append({"vocab": vocab, "seed": seed, "closeness": c, **row(pair, k, gamma)})
                        bar.update()
    return pl.DataFrame(rows)


@dataclass(frozen=True)
class Config:
    """The study's settings (the command-line flags), the lists parsed once."""

    vocab: int = 2
    seeds: tuple[int, ...] = (0, 1, 2, 3)
    closeness: tuple[float, ...] = (0.3, 0.7)
    ks: tuple[int, ...] = (1, 2, 3, 7)
    gammas: tuple[int, ...] = (2, 3, 4, 6)
    out: str | None = None
    quiet: bool = False
    backend = None  # not a field: the worlds are synthetic, no source (no live-model defaults)


def flags(parser: ToolParser, d: Config) -> None:
    """``--vocab``, ``--seeds``, ``--closeness``, ``--ks``, ``--gammas``, ``--out`` and ``--quiet``."""
    text = lambda values: ",".join(map(str, values))  # noqa: E731
    parser.add_argument("--vocab", type=int, default=d.vocab, help="V of the Markov worlds (2..4: every law is enumerated)")
    parser.add_argument("--seeds", default=text(d.seeds), help="seeds of the worlds (comma-separated)")
    parser.add_argument("--closeness", default=text(d.closeness), help="how close q is to p (comma-separated, in [0, 1])")
    parser.add_argument("--ks", default=text(d.ks), help="K values, the number of i.i.d. blocks (1..8; 7 is the default)")
    parser.add_argument("--gammas", default=text(d.gammas), help="L values, the block length (2..6; 6 is the default)")
    add_output_flags(parser, PROG, "markov-V<vocab>")


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (each list parsed once), or exit 2 with one line naming the flag."""
    try:
        seeds = int_list(args.seeds, "--seeds", 0)
        for s in seeds:
            check_seed(s, "--seeds")
        closeness = float_list(args.closeness, "--closeness", 0.0, 1.0)
        ks = int_list(args.ks, "--ks", 1)
        gammas = int_list(args.gammas, "--gammas", 2)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    check_flags(
        PROG,
        [
            (2 <= args.vocab <= 4, f"--vocab: must be in 2..4 (every law is enumerated), got {args.vocab}"),
            (max(ks) <= 8, f"--ks: every value must be in 1..8, got {args.ks!r}"),
            (
                max(gammas) <= 6 and args.vocab ** max(gammas) <= 729,
                f"--gammas: needs L <= 6 and V^L <= 729 (every block is enumerated), got {args.gammas!r} at V = {args.vocab}",
            ),
        ],
    )
    return Config(args.vocab, seeds, closeness, ks, gammas, args.out, args.quiet)


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """No source of roots: the output folder (``--out``, default ``out/spectr_gbv/markov-V<vocab>``), prepared."""
    return folder_only(PROG, config.out or str(Path("out") / "spectr_gbv" / f"markov-V{config.vocab}"))


def values(config: Config, opened: Opened, say) -> pl.DataFrame:
    """``measure`` of the config's worlds."""
    return measure(config.vocab, config.seeds, config.closeness, config.ks, config.gammas, quiet=config.quiet)


def run(config: Config, opened: Opened, table: pl.DataFrame, say) -> Report:
    """``spectr_gbv.parquet`` and the table rounded to 4 digits."""
    shown = table.drop("vocab").with_columns(pl.col(pl.Float64).round(4))
    title = f"SpecTr-GBV as released, exact (Markov worlds V={config.vocab}, context {CONTEXT})"
    return Report({"spectr_gbv.parquet": table}, printed=((shown, title), WROTE))


STUDY = declared(globals(), shardable=no_roots("it values a few Markov worlds exactly, in one process"))


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
