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
    python -m analyses.lossy_rules --rules lenience,cos,speccascade,eta_acceptance,diverse   # the 2026 rules too
    python -m analyses.lossy_rules --rules eagle_lenience,eagle_min_p,eagle_eta             # Fast-HSD's EAGLE-3 rules

``--rules`` adds the 2026 lossy rules, each over its knob grid (Fast-HSD's ``configs/methods``
sweeps by default: ``--leniences``, ``--cos-lambdas``, ``--min-ps``, ``--etas``; DIVERSE's
``--weights``), and a third tree, a chain of 3 drafted tokens (the path Fast-HSD's
speculative-decoding rules and DIVERSE are shipped for; with several children they test the
first); each added rule runs on the trees of its drafting law only (``TREE_LAWS``: the drafted-child
rules on the i.i.d. tree and the chain, Fast-HSD's EAGLE-3 rules, ``eagle_*``, on the top-k tree).  With ``--rules``
the table gains, for the rules that imitate a truncation sampler (the min-p rules: min-p sampling;
the eta rules: eta sampling), ``TV_sampler``, the exact TV of the first ``--tokens`` emitted tokens
from the law of that sampler at the same knob, and ``TV_sampler_target``, the sampler's own TV
from the target; the default run's output is unchanged.

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
    name_list,
    parquet_writer,
    prepare_out,
    print_table,
    progress_bar,
    run_tool,
)
from simlab import tree_verifiers
from simlab import verifiers as node_verifiers
from simlab.builders import Static, chain, iid
from simlab.checks import check_seed
from simlab.drafting import Drafting
from simlab.efficiency import (
    emitted_sequence_law,
    expected_block_efficiency,
    pairing_bias,
    sequence_tv,
    target_sequence_law,
)
from simlab.pairs import MarkovPair

PROG = "python -m analyses.lossy_rules"
TOP_K = "top-k tree (5 nodes)"
TREES = {
    TOP_K: Static([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)], "topk"),
    "i.i.d. tree (2 x 2)": iid(2, 2),
}
"""The deterministic (EAGLE/Medusa-like) and i.i.d. trees every rule is run on."""
CHAIN = "chain (3 drafted tokens)"
CHAIN_TREE = chain(3)
"""The tree added with ``--rules``: the chain the 2026 rules are shipped for."""
BASELINE = "exact_match"
EXTRA_RULES = {
    "lenience": ("lenience", "leniences"),
    "cos": ("cos_lambda", "cos_lambdas"),
    "speccascade": ("min_p_spd", "min_ps"),
    "eta_acceptance": ("eta_spd", "etas"),
    "diverse": ("weight", "weights"),
    "eagle_lenience": ("lenience", "leniences"),
    "eagle_min_p": ("min_p", "min_ps"),
    "eagle_eta": ("eta", "etas"),
}
"""The rules ``--rules`` adds: name -> (the verifier's knob, the Config field of its grid)."""
TREE_LAWS = {TOP_K: Drafting.DETERMINISTIC, "i.i.d. tree (2 x 2)": Drafting.IID, CHAIN: Drafting.IID}
"""The drafting law of each tree's children: a rule ``--rules`` adds runs on the trees of its own
``drafting`` law only (Fast-HSD's speculative-decoding rules and DIVERSE test a drafted first child:
the i.i.d. tree and the chain; its EAGLE-3 rules, top-k children: the top-k tree)."""


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
    rules: str = ""
    leniences: str = "0.2,0.4,0.6,0.8"
    cos_lambdas: str = "0.2,0.4,0.6,0.8"
    min_ps: str = "0.1,0.3,0.5,0.7,0.9"
    etas: str = "0.05,0.1,0.15,0.2,0.25"
    weights: str = "0.2,0.4,0.6,0.8"


def extra_rules(config: Config) -> tuple[str, ...]:
    """The names ``--rules`` lists (empty by default)."""
    return name_list(config.rules, "--rules", EXTRA_RULES) if config.rules else ()


def trees(config: Config) -> dict:
    """The trees of the run: the default two, and the chain when ``--rules`` adds rules."""
    return {**TREES, CHAIN: CHAIN_TREE} if extra_rules(config) else TREES


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
    for name in extra_rules(config):
        knob, field = EXTRA_RULES[name]
        flag = "--" + field.replace("_", "-")
        for value in float_list(getattr(config, field), flag, 0.0, 1.0):
            try:
                node_verifiers.get(name, **{knob: value})  # the verifier's own range: (0, 1] or [0, 1)
            except ValueError as exc:
                raise ValueError(f"{flag}: {exc}") from None
            out.append((name, {knob: value}, f"{knob}={value:g}"))
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
    extras = extra_rules(config)
    shapes = trees(config)
    rows = []
    with progress_bar(total=len(swept) * len(shapes), desc="rules x trees", unit="pairing", quiet=quiet) as bar:
        for tree_name, shape in shapes.items():
            base = None
            for name, options, knobs in swept:
                if name in extras and node_verifiers.REGISTRY[name].drafting is not TREE_LAWS[tree_name]:
                    bar.update()
                    continue
                verifier = tree_verifiers.get(name, allow_lossy=True, **options)
                e = float(np.mean([expected_block_efficiency(pair, c, shape, verifier, allow_lossy=True).mean for c in contexts]))
                tv = float(np.mean([pairing_bias(pair, c, shape, verifier, n=config.tokens) for c in contexts]))
                base = e if base is None else base
                row = {
                    "rule": tree_verifiers.paper_name(name),
                    "knobs": knobs,
                    "tree": tree_name,
                    "E": e,
                    "E_exact_match": base,
                    "gain": e / base,
                    "TV": max(tv, 0.0),
                    **{
                        k: options.get(k) for k in ("posterior_threshold", "posterior_alpha", "threshold_single", "threshold_acc")
                    },
                    "next_token": options.get("next_token"),
                }
                if extras:
                    row.update({knob: options.get(knob) for knob, _ in EXTRA_RULES.values()})
                    row.update(sampler_distances(pair, contexts, shape, verifier, config.tokens))
                rows.append(row)
                bar.update()
    return pl.DataFrame(rows, infer_schema_length=None)  # a knob column may be empty for the first 100 rows


def sampler_distances(pair: MarkovPair, contexts, shape, verifier, tokens: int) -> dict:
    """For a rule that imitates a truncation sampler (its node rule has ``sampler_law``): the means
    over ``contexts`` of the exact TV of its first ``tokens`` emitted tokens from the sampler's
    ``tokens``-token law (``TV_sampler``) and of the sampler's law from the target's
    (``TV_sampler_target``); None for the other rules."""
    node = getattr(verifier, "node", None)
    if not hasattr(node, "sampler_law"):
        return {"TV_sampler": None, "TV_sampler_target": None}
    sampler = MarkovPair(np.array([node.sampler_law(row) for row in pair.target]), pair.draft)
    to_sampler, sampler_to_target = [], []
    for c in contexts:
        law = emitted_sequence_law(pair, c, shape, verifier, tokens, allow_lossy=True)
        truncated, target = target_sequence_law(sampler, c, tokens), target_sequence_law(pair, c, tokens)
        to_sampler.append(sequence_tv(law, truncated))
        sampler_to_target.append(sequence_tv(truncated, target))
    return {"TV_sampler": float(np.mean(to_sampler)), "TV_sampler_target": float(np.mean(sampler_to_target))}


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
    parser.add_argument("--rules", default=d.rules, help=f"2026 rules to add (comma-separated): {', '.join(EXTRA_RULES)}")
    parser.add_argument("--leniences", default=d.leniences, help="Fast-HSD lenience: values in (0, 1]")
    parser.add_argument(
        "--cos-lambdas", default=d.cos_lambdas, help="Fast-HSD CoS: cos_lambda values (the draft's weight) in [0, 1]"
    )
    parser.add_argument("--min-ps", default=d.min_ps, help="Fast-HSD SpecCascade: min_p_spd values in [0, 1]")
    parser.add_argument("--etas", default=d.etas, help="Fast-HSD eta acceptance: eta_spd values in [0, 1)")
    parser.add_argument("--weights", default=d.weights, help="DIVERSE: ensemble weights w in (0, 1]")
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
        args.rules,
        args.leniences,
        args.cos_lambdas,
        args.min_ps,
        args.etas,
        args.weights,
    )
    try:
        rules(config)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    read = {EXTRA_RULES[name][1] for name in extra_rules(config)}
    for field in sorted({field for _, field in EXTRA_RULES.values()} - read):
        if getattr(config, field) != getattr(d, field):
            users = " or ".join(name for name, (_, f) in EXTRA_RULES.items() if f == field)
            fail(PROG, f"--{field.replace('_', '-')}: given without a rule that reads it (--rules {users})")
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
        columns = ["tree", "rule", "knobs", "E", "gain", "TV"] + (
            ["TV_sampler", "TV_sampler_target"] if extra_rules(config) else []
        )
        shown = table.select(columns).with_columns(pl.col(c).round(6) for c in columns[5:])
        print_table(shown, f"Lossy rules against strict exact-match ({subtitle})")
        print(f"wrote {out}/lossy_rules.parquet, gain_vs_tv.html/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
