"""The price of the engines' lossy verification knobs, exactly: ``python -m analyses.lossy_rules``.

For each knob setting of Medusa's typical acceptance (``posterior_threshold`` epsilon,
``posterior_alpha``, ``next_token``) and of SGLang's threshold rule (``threshold_single``,
``threshold_acc``), on a small synthetic Markov world (``simlab.pairs.MarkovPair.random``) and a
deterministic top-k tree and an i.i.d. tree: the exact block efficiency E[tau + 1] at every
one-token context (``simlab.efficiency.expected_block_efficiency``, ``allow_lossy=True``), its
throughput gain over strict exact-match on the same tree (same tree and drafting cost, so the
same step time: the gain is the ratio of E[tau + 1]), and the exact total variation of the first
``--tokens`` emitted tokens from the target's law (``simlab.efficiency.pairing_bias``), averaged
over the contexts.

    python -m analyses.lossy_rules                       # V = 4, the default knob grids (about a minute of CPU)
    python -m analyses.lossy_rules --vocab 3 --epsilons 0.09 --alphas 0.3 --singles 1 --accs 0.5,1

Outputs under ``--out`` (default ``out/lossy_rules/markov-V<vocab>-seed<seed>``):
``lossy_rules.parquet`` (one row per rule, knobs and tree: E, the exact-match E, gain, TV) and the
chart ``gain_vs_tv.{html,png}``.  Bad flags: one line, exit 2.  (epsilon = 1 with alpha = 1e9 is
the threshold no child passes: typical acceptance then accepts nothing, the knob sweep's end.)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from backends.cli import (
    OutputSet,
    ToolParser,
    add_output_flags,
    chart_writer,
    fail,
    fail_from,
    float_list,
    parquet_writer,
    prepare_out,
    print_table,
    progress_bar,
    run_tool,
)
from simlab import tree_verifiers
from simlab.builders import Static, iid
from simlab.checks import check_seed
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import MarkovPair

PROG = "python -m analyses.lossy_rules"
TOP_K = "top-k tree (5 nodes)"
TREES = {
    TOP_K: Static([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)], "topk"),
    "i.i.d. tree (2 x 2)": iid(2, 2),
}
"""The deterministic (EAGLE/Medusa-like) and i.i.d. trees every rule is run on."""
BASELINE = "exact_match"


@dataclass(frozen=True)
class Config:
    vocab: int = 4
    seed: int = 0
    concentration: float = 0.7
    closeness: float = 0.5
    tokens: int = 3
    epsilons: str = "0.05,0.3,0.6,1"
    alphas: str = "0.3,1,1e9"
    singles: str = "0.3,0.6,1"
    accs: str = "0.25,0.5,0.75,1"


def rules(config: Config) -> list[tuple[str, dict, str]]:
    """(rule, options, knob label) for every knob setting swept, the exact-match baseline first."""
    out = [(BASELINE, {}, "-")]
    for eps in float_list(config.epsilons, "--epsilons", 0.0, 1.0):
        for alpha in float_list(config.alphas, "--alphas", 0.0, 1e9):
            for next_token in ("argmax", "target"):
                options = {"posterior_threshold": eps, "posterior_alpha": alpha, "next_token": next_token}
                out.append(("typical", options, f"eps={eps:g} alpha={alpha:g} next={next_token}"))
    for single in float_list(config.singles, "--singles", 0.0, 1.0):
        for acc in float_list(config.accs, "--accs", 0.0, 1.0):
            out.append(("sglang_threshold", {"threshold_single": single, "threshold_acc": acc}, f"single={single:g} acc={acc:g}"))
    return out


def world(config: Config) -> MarkovPair:
    """The Markov world of ``config`` (``MarkovPair.random`` of its vocab, seed, concentration and closeness)."""
    return MarkovPair.random(config.vocab, np.random.default_rng(config.seed), config.concentration, config.closeness)


def measure(config: Config, quiet: bool) -> pl.DataFrame:
    """One row per (rule, knobs, tree): the means over the one-token contexts of the exact E[tau + 1]
    and the exact n-token TV, the exact-match E on the same tree, and the gain E / E_exact_match."""
    pair = world(config)
    contexts = [(c,) for c in range(config.vocab)]
    swept = rules(config)
    rows = []
    with progress_bar(total=len(swept) * len(TREES), desc="rules x trees", unit="pairing", quiet=quiet) as bar:
        for tree_name, shape in TREES.items():
            base = None
            for name, options, knobs in swept:
                verifier = tree_verifiers.get(name, allow_lossy=True, **options)
                e = float(np.mean([expected_block_efficiency(pair, c, shape, verifier, allow_lossy=True).mean for c in contexts]))
                tv = float(np.mean([pairing_bias(pair, c, shape, verifier, n=config.tokens) for c in contexts]))
                base = e if base is None else base
                rows.append(
                    {
                        "rule": tree_verifiers.paper_name(name),
                        "knobs": knobs,
                        "tree": tree_name,
                        "E": e,
                        "E_exact_match": base,
                        "gain": e / base,
                        "TV": max(tv, 0.0),
                        **{
                            k: options.get(k)
                            for k in ("posterior_threshold", "posterior_alpha", "threshold_single", "threshold_acc")
                        },
                        "next_token": options.get("next_token"),
                    }
                )
                bar.update()
    return pl.DataFrame(rows)


def chart(table: pl.DataFrame, subtitle: str):
    """Gain against TV, one point per knob setting, coloured by rule, one panel per tree."""
    import altair as alt

    return (
        alt.Chart(table)
        .mark_point(filled=True, size=60)
        .encode(
            x=alt.X("TV:Q", title="exact TV of the first emitted tokens from the target's law"),
            y=alt.Y("gain:Q", title="throughput gain over strict exact-match (E[tau+1] ratio)", scale=alt.Scale(zero=False)),
            color=alt.Color("rule:N"),
            tooltip=["rule", "knobs", "tree", "E", "gain", "TV"],
        )
        .properties(width=300, height=240)
        .facet(facet=alt.Facet("tree:N", title=None), columns=2)
        .properties(title=alt.TitleParams("The lossy rules' price: gain against exact bias", subtitle=subtitle))
    )


def parse_args(argv) -> tuple[Config, argparse.Namespace, ToolParser]:
    d = Config()
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=d.vocab, help="V of the Markov world (2..6: the laws are enumerated)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the world")
    parser.add_argument("--concentration", type=float, default=d.concentration, help="Dirichlet concentration of p rows")
    parser.add_argument("--closeness", type=float, default=d.closeness, help="how close q is to p (0..1)")
    parser.add_argument("--tokens", type=int, default=d.tokens, help="emitted tokens whose law's TV is reported (1..4)")
    parser.add_argument("--epsilons", default=d.epsilons, help="typical acceptance: posterior_threshold values")
    parser.add_argument("--alphas", default=d.alphas, help="typical acceptance: posterior_alpha values")
    parser.add_argument("--singles", default=d.singles, help="SGLang: threshold_single values in [0, 1]")
    parser.add_argument("--accs", default=d.accs, help="SGLang: threshold_acc values in [0, 1]")
    add_output_flags(parser, PROG, "markov-V<vocab>-seed<seed>")
    args = parser.parse_args(argv)
    try:
        check_seed(args.seed)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    if not 2 <= args.vocab <= 6:
        fail(PROG, f"--vocab: must be in 2..6 (every law is enumerated), got {args.vocab}")
    if not 1 <= args.tokens <= 4:
        fail(PROG, f"--tokens: must be in 1..4, got {args.tokens}")
    if not 0 < args.concentration < float("inf"):
        fail(PROG, f"--concentration: must be a finite number > 0, got {args.concentration}")
    if not 0 <= args.closeness <= 1:
        fail(PROG, f"--closeness: must be in [0, 1], got {args.closeness}")
    config = Config(
        args.vocab,
        args.seed,
        args.concentration,
        args.closeness,
        args.tokens,
        args.epsilons,
        args.alphas,
        args.singles,
        args.accs,
    )
    try:
        rules(config)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    try:
        with np.errstate(all="ignore"):  # a concentration near the float64 limit draws no laws (refused below)
            support = int((world(config).draft > 0).sum(axis=1).min())
    except ValueError as exc:
        fail(PROG, f"--concentration: {config.concentration:g} draws rows that are not laws ({exc}); choose a smaller value")
    ranks = 1 + max(path[-1] for path in TREES[TOP_K].spec)  # the top-k tree's children need this many tokens of q > 0
    if support < ranks:
        fail(
            PROG,
            f"--concentration: the world of --seed {config.seed} at concentration {config.concentration:g} has a draft row with "
            f"fewer than {ranks} tokens of positive probability, which the top-k tree's {ranks} children need; "
            "raise --concentration or change --seed",
        )
    return config, args, parser


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(sys.argv[1:] if argv is None else argv))


def _main(argv) -> int:
    config, args, parser = parse_args(argv)
    out = prepare_out(PROG, args.out or str(Path("out") / "lossy_rules" / f"markov-V{config.vocab}-seed{config.seed}"))
    try:
        table = measure(config, args.quiet)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    subtitle = f"Markov world V={config.vocab} seed={config.seed}; means over the {config.vocab} one-token contexts; TV of {config.tokens} tokens"
    with OutputSet(out) as outputs:
        outputs.stage("lossy_rules.parquet", parquet_writer(table))
        for fmt in ("html", "png"):
            outputs.stage(f"gain_vs_tv.{fmt}", chart_writer(chart(table, subtitle), fmt))
        outputs.publish()
    if not args.quiet:
        shown = table.select("tree", "rule", "knobs", "E", "gain", "TV").with_columns(pl.col("TV").round(6))
        print_table(shown, f"Lossy rules against strict exact-match ({subtitle})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
