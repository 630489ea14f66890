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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analyses._study import WROTE, Opened, Report, chart_files, declared, folder_only, no_roots, parse, run_study
from backends.cli import (
    ToolParser,
    add_output_flags,
    chart_writer,
    check_flags,
    fail,
    fail_from,
    float_list,
    name_list,
    progress_bar,
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


KNOB_GRIDS = ("epsilons", "alphas", "singles", "accs")
"""The Config fields of the default knob grids (typical acceptance's, SGLang's), in flag order."""
RANGES = {"epsilons": (0.0, 1.0), "alphas": (0.0, 1e9), "singles": (0.0, 1.0), "accs": (0.0, 1.0)}
"""Each default knob grid's allowed range (both ends included)."""


@dataclass(frozen=True)
class Config:
    """The study's settings (the command-line flags), each knob grid a tuple of floats parsed once
    (``backends.cli.float_list``) and ``--rules`` a tuple of names."""

    vocab: int = 4
    seed: int = 0
    concentration: float = 0.7
    closeness: float = 0.5
    tokens: int = 3
    epsilons: tuple[float, ...] = (0.05, 0.3, 0.6, 1.0)
    alphas: tuple[float, ...] = (0.3, 1.0, 1e9)
    singles: tuple[float, ...] = (0.3, 0.6, 1.0)
    accs: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    rules: tuple[str, ...] = ()
    leniences: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    cos_lambdas: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    min_ps: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    etas: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25)
    weights: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8)
    out: str | None = None
    quiet: bool = False
    backend = None  # not a field: the world is synthetic, no source (no live-model defaults)


def extra_rules(config: Config) -> tuple[str, ...]:
    """The names ``--rules`` lists (empty by default)."""
    return config.rules


def trees(config: Config) -> dict:
    """The trees of the run: the default two, and the chain when ``--rules`` adds rules."""
    return {**TREES, CHAIN: CHAIN_TREE} if extra_rules(config) else TREES


def rules(config: Config) -> list[tuple[str, dict, str]]:
    """(rule, options, knob label) for every knob setting swept, the exact-match baseline first."""
    out = [(BASELINE, {}, "-")]
    for eps in config.epsilons:
        for alpha in config.alphas:
            for next_token in ("argmax", "target"):
                options = {"posterior_threshold": eps, "posterior_alpha": alpha, "next_token": next_token}
                out.append(("typical", options, f"eps={eps:g} alpha={alpha:g} next={next_token}"))
    for single in config.singles:
        for acc in config.accs:
            out.append(("sglang_threshold", {"threshold_single": single, "threshold_acc": acc}, f"single={single:g} acc={acc:g}"))
    for name in extra_rules(config):
        knob, field = EXTRA_RULES[name]
        out.extend((name, {knob: value}, f"{knob}={value:g}") for value in getattr(config, field))
    return out


def check_knobs(name: str, values: tuple[float, ...]) -> None:
    """Raise ``ValueError`` (``--<grid>: ...``) when a knob of ``values`` lies outside the added rule
    ``name``'s own range (``simlab.verifiers.get``: (0, 1] or [0, 1))."""
    knob, field = EXTRA_RULES[name]
    for value in values:
        try:
            node_verifiers.get(name, **{knob: value})
        except ValueError as exc:
            raise ValueError(f"--{field.replace('_', '-')}: {exc}") from None


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


def flags(parser: ToolParser, d: Config) -> None:
    """The world's flags, the knob grids, ``--rules`` and the added rules' grids, ``--out`` and ``--quiet``."""
    text = lambda values: ",".join(f"{v:g}".replace("e+0", "e") for v in values)  # noqa: E731
    parser.add_argument("--vocab", type=int, default=d.vocab, help="V of the Markov world (2..6: the laws are enumerated)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the world")
    parser.add_argument("--concentration", type=float, default=d.concentration, help="Dirichlet concentration of p rows")
    parser.add_argument("--closeness", type=float, default=d.closeness, help="how close q is to p (0..1)")
    parser.add_argument("--tokens", type=int, default=d.tokens, help="emitted tokens whose law's TV is reported (1..4)")
    parser.add_argument("--epsilons", default=text(d.epsilons), help="typical acceptance: posterior_threshold values")
    parser.add_argument("--alphas", default=text(d.alphas), help="typical acceptance: posterior_alpha values")
    parser.add_argument("--singles", default=text(d.singles), help="SGLang: threshold_single values in [0, 1]")
    parser.add_argument("--accs", default=text(d.accs), help="SGLang: threshold_acc values in [0, 1]")
    parser.add_argument("--rules", default="", help=f"2026 rules to add (comma-separated): {', '.join(EXTRA_RULES)}")
    parser.add_argument("--leniences", default=text(d.leniences), help="Fast-HSD lenience: values in (0, 1]")
    parser.add_argument(
        "--cos-lambdas", default=text(d.cos_lambdas), help="Fast-HSD CoS: cos_lambda values (the draft's weight) in [0, 1]"
    )
    parser.add_argument("--min-ps", default=text(d.min_ps), help="Fast-HSD SpecCascade: min_p_spd values in [0, 1]")
    parser.add_argument("--etas", default=text(d.etas), help="Fast-HSD eta acceptance: eta_spd values in [0, 1)")
    parser.add_argument("--weights", default=text(d.weights), help="DIVERSE: ensemble weights w in (0, 1]")
    add_output_flags(parser, PROG, "markov-V<vocab>-seed<seed>")


def grids(args, parser: ToolParser) -> dict:
    """The knob grids as tuples of floats: the default grids, ``--rules``, and the grids of the added
    rules (an added rule's grid is read once; a grid no added rule reads keeps its default), or exit
    2 with one line naming the flag (a bad list, a knob outside the rule's range, a grid given
    without a rule that reads it)."""
    d, flag = Config(), lambda field: "--" + field.replace("_", "-")
    try:
        out = {field: float_list(getattr(args, field), flag(field), *RANGES[field]) for field in KNOB_GRIDS}
        out["rules"] = name_list(args.rules, "--rules", EXTRA_RULES) if args.rules else ()
        for name in out["rules"]:
            field = EXTRA_RULES[name][1]
            out[field] = float_list(getattr(args, field), flag(field), 0.0, 1.0)
            check_knobs(name, out[field])
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    for field in sorted({field for _, field in EXTRA_RULES.values()} - set(out)):
        if getattr(args, field) != parser.get_default(field):
            users = " or ".join(name for name, (_, f) in EXTRA_RULES.items() if f == field)
            fail(PROG, f"{flag(field)}: given without a rule that reads it (--rules {users})")
    return {**{field: getattr(d, field) for _, field in EXTRA_RULES.values()}, **out}


def config_of(args, parser: ToolParser) -> Config:
    """The typed config, or exit 2 with one line naming the flag (``grids``; the world's flags; a
    world whose draft rows cannot feed the top-k tree)."""
    try:
        check_seed(args.seed)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    check_flags(
        PROG,
        [
            (2 <= args.vocab <= 6, f"--vocab: must be in 2..6 (every law is enumerated), got {args.vocab}"),
            (1 <= args.tokens <= 4, f"--tokens: must be in 1..4, got {args.tokens}"),
            (0 < args.concentration < float("inf"), f"--concentration: must be a finite number > 0, got {args.concentration}"),
            (0 <= args.closeness <= 1, f"--closeness: must be in [0, 1], got {args.closeness}"),
        ],
    )
    world_flags = ("vocab", "seed", "concentration", "closeness", "tokens")
    config = Config(**{k: getattr(args, k) for k in world_flags}, **grids(args, parser), out=args.out, quiet=args.quiet)
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
    return config


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv``."""
    return parse(STUDY, argv)


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """No source of roots: the output folder (``--out``, default ``out/lossy_rules/markov-V<vocab>-seed<seed>``), prepared."""
    return folder_only(PROG, config.out or str(Path("out") / "lossy_rules" / f"markov-V{config.vocab}-seed{config.seed}"))


def values(config: Config, opened: Opened, say) -> pl.DataFrame:
    """``measure`` of the config (a progress bar unless ``--quiet``)."""
    return measure(config, config.quiet)


def run(config: Config, opened: Opened, table: pl.DataFrame, say) -> Report:
    """``lossy_rules.parquet``, the chart ``gain_vs_tv`` and the table of gains and TVs."""
    subtitle = f"Markov world V={config.vocab} seed={config.seed}; means over the {config.vocab} one-token contexts; TV of {config.tokens} tokens"
    columns = ["tree", "rule", "knobs", "E", "gain", "TV"] + (["TV_sampler", "TV_sampler_target"] if extra_rules(config) else [])
    shown = table.select(columns).with_columns(pl.col(c).round(6) for c in columns[5:])
    outputs = {"lossy_rules.parquet": table, **chart_files("gain_vs_tv", chart(table, subtitle), chart_writer)}
    return Report(outputs, printed=((shown, f"Lossy rules against strict exact-match ({subtitle})"), WROTE))


STUDY = declared(globals(), shardable=no_roots("it values one Markov world exactly, in one process"))


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
