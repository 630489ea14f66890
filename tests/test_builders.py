"""Builders and lossless pairings (issue 12): every builder with every verifier declared lossless for
its drafting law emits the target's 3-token law exactly; every other pairing is refused, and its
exact bias is positive."""

from __future__ import annotations


import numpy as np
import pytest

from simlab import builders, tree_verifiers
from simlab.builders import EAGLE2, Delayed, GreedyDraftTree, Sequoia, Static
from simlab.drafting import Drafting
from backends.parallel_draft import RootConditioned
from simlab.efficiency import emitted_sequence_law, expected_block_efficiency, pairing_bias, target_sequence_law
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.sampling import sampling_distribution
from simlab.trees import NodeTable
from tree_checks import check_estimates_agree
from variants import SAMPLED_T

N = 3


def tv(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def markov_with_zeros_and_ties():
    """V = 4: zeros in p and q, ties in q (the top-k order is decided by the lowest id)."""
    target = np.array([[0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25], [0.0, 0.7, 0.1, 0.2]])
    draft = np.array([[0.3, 0.3, 0.2, 0.2], [0.4, 0.2, 0.0, 0.4], [0.1, 0.6, 0.3, 0.0], [0.25, 0.25, 0.25, 0.25]])
    return MarkovPair(target, draft)


WORLDS = {
    "context-free": ContextFreePair([0.45, 0.0, 0.35, 0.2], [0.3, 0.3, 0.0, 0.4]),
    "markov": markov_with_zeros_and_ties(),
}
BUILDERS = {name: builders.example(name) for name in builders.names()}
"""Every registered builder's own tiny example (``simlab.builders.example``), plus option variants."""
BUILDERS["greedy_draft best=2"] = GreedyDraftTree(budget=3, depth=1, top_k=2, best=2)
SEQUOIA = BUILDERS["sequoia"]


@pytest.mark.parametrize("name", builders.names())
def test_every_registered_builder_declares_its_laws_and_an_example(name):
    """A builder joins the generic tests by registering: its example's node laws are the ones it declares."""
    example = builders.example(name)
    assert isinstance(example, builders.Builder)
    assert example.laws == builders.laws(name)


def world_for(world: str, builder: str):
    """The world ``world`` as the builder drafts from it: its parallel stand-in
    (``backends.parallel_draft.RootConditioned``) for a builder that declares ``parallel_draft``."""
    pair = WORLDS[world]
    return RootConditioned(pair) if getattr(BUILDERS[builder], "parallel_draft", False) else pair


def lossless_verifiers(builder) -> list[str]:
    """Every tree verifier declared lossless for all of the builder's node laws at T > 0
    (``simlab.tree_verifiers.lossless_names``)."""
    return tree_verifiers.lossless_names(builder.laws, SAMPLED_T)


PAIRINGS = [(w, b, v) for w in WORLDS for b in BUILDERS for v in lossless_verifiers(BUILDERS[b])]


def test_declared_pairings():
    assert set(lossless_verifiers(BUILDERS["eagle2"])) == {"nss", "exact_match", "onehot", "greedy_draft"}
    assert set(lossless_verifiers(BUILDERS["greedy_draft"])) == {"nss", "exact_match", "onehot", "greedy_draft"}
    assert {"rrs_wor", "traversal", "nss", "naive", "naive_chain", "bv", "greedy_draft"} <= set(lossless_verifiers(SEQUOIA))
    assert "specinfer" not in lossless_verifiers(SEQUOIA) and "specinfer" in lossless_verifiers(BUILDERS["delayed"])


@pytest.mark.parametrize("world, builder, verifier", PAIRINGS)
def test_lossless_pairings_emit_the_target_law(world, builder, verifier):
    pair = world_for(world, builder)
    context = (0,) if world == "markov" else ()
    law = emitted_sequence_law(pair, context, BUILDERS[builder], verifier, N)
    assert tv(law, target_sequence_law(pair, context, N)) <= 1e-12


LOSSY = [
    (b, v)
    for b in BUILDERS
    for v in tree_verifiers.names()
    if v not in lossless_verifiers(BUILDERS[b]) and not tree_verifiers.get(v).needs_greedy_target and b != "chain"
]
"""(A chain's nodes have one child each, where every sampled verifier is lossless: the k = 1 clause
of ``simlab.tree_verifiers.lossless_pairing``.)"""


@pytest.mark.parametrize("builder, verifier", LOSSY)
def test_lossy_pairings_are_refused_and_their_bias_is_positive(builder, verifier):
    """Every declared-lossy pairing is refused; asked for anyway, its exact 3-token bias is positive
    (unless its children are impossible inputs for the verifier: repeated i.i.d. tokens for the
    verifiers of distinct children).  A declared-lossy rule (``lossless_for`` empty) is refused on
    every tree too; its bias is 0 at parameters that make it exact (SGLang's default thresholds),
    positive elsewhere: ``tests/test_lossy_rules.py``."""
    pair, context = world_for("markov", builder), (0,)
    with pytest.raises(ValueError, match=f"^verifier: {verifier} is not lossless (for children drafted|on any tree)"):
        expected_block_efficiency(pair, context, BUILDERS[builder], verifier)
    try:
        estimate = expected_block_efficiency(pair, context, BUILDERS[builder], verifier, allow_lossy=True)
    except ValueError as exc:
        assert "repeats a token" in str(exc) and builders.laws(builder.split()[0]) == {Drafting.IID}, exc
        return
    assert not estimate.lossless
    bias = pairing_bias(pair, context, BUILDERS[builder], verifier, n=N)
    assert bias > 1e-4 if tree_verifiers.get(verifier).lossless_for else bias >= 0.0


def test_the_issue_example_top1_with_specinfer():
    """p = (0.6, 0.4), q = (0.8, 0.2), the top-1 child: SpecInfer silently gave 1.75 and the law
    (0.75, 0.25); the lossless value is 1.6 and the law p."""
    pair = ContextFreePair([0.6, 0.4], [0.8, 0.2])
    with pytest.raises(ValueError, match="specinfer is not lossless for children drafted deterministically"):
        expected_block_efficiency(pair, (), Static([(0,)], "topk"), "specinfer")
    lossy = expected_block_efficiency(pair, (), Static([(0,)], "topk"), "specinfer", allow_lossy=True)
    assert lossy.mean == pytest.approx(1.75, abs=1e-15) and not lossy.lossless
    assert emitted_sequence_law(pair, (), Static([(0,)], "topk"), "specinfer", 1, allow_lossy=True) == pytest.approx(
        {(0,): 0.75, (1,): 0.25}
    )
    assert pairing_bias(pair, (), Static([(0,)], "topk"), "specinfer", n=1) == pytest.approx(0.15, abs=1e-15)
    exact = expected_block_efficiency(pair, (), Static([(0,)], "topk"), "onehot")
    assert exact.mean == pytest.approx(1.6, abs=1e-15) and exact.lossless


def test_greedy_pairs_at_temperature_zero_only():
    rng = np.random.default_rng(8)
    one_hot = lambda rows: np.array([sampling_distribution(r, temperature=0) for r in rows])
    pair = MarkovPair(one_hot(rng.standard_normal((4, 4))), one_hot(rng.standard_normal((4, 4))))
    for builder in (EAGLE2(budget=3, depth=1, top_k=2), GreedyDraftTree(budget=3, depth=1, top_k=2), Delayed(2, 1, 1)):
        law = emitted_sequence_law(pair, (0,), builder, "greedy", 4)
        assert law == pytest.approx(target_sequence_law(pair, (0,), 4), abs=1e-12) and len(law) == 1
    with pytest.raises(ValueError, match="greedy is lossless only for a greedy"):
        expected_block_efficiency(WORLDS["markov"], (0,), BUILDERS["eagle2"], "greedy")


def test_deterministic_builders_give_one_exact_value_per_root():
    pair = WORLDS["markov"]
    estimate = expected_block_efficiency(pair, (0,), BUILDERS["eagle2"], "onehot")
    assert estimate.samples == 1 and estimate.stderr == 0.0 and estimate.method == "exact"
    # one-hot on a deterministic tree: 1 + the target mass of the drafted prefixes
    tree = BUILDERS["eagle2"].sample(NodeTable(pair, (0,)))
    mass = sum(
        np.prod([pair.distributions([(0,) + path[:i]])[0][0][path[i]] for i in range(len(path))]) for path in tree.nodes() if path
    )
    assert estimate.mean == pytest.approx(1 + mass, abs=1e-12)


def test_mixed_builders_exact_and_estimated_agree():
    pair, builder = WORLDS["markov"], GreedyDraftTree(budget=4, depth=2, top_k=2)
    exact = expected_block_efficiency(pair, (0,), builder, "greedy_draft")
    assert exact.samples > 1 and exact.lossless
    check_estimates_agree(exact, expected_block_efficiency(pair, (0,), builder, "greedy_draft", method="mc", samples=300, seed=2))
    assert expected_block_efficiency(pair, (0,), builder, "greedy_draft", method="auto").method == "exact"


def test_greedy_draft_verifier_attains_hu_et_al_at_a_node():
    """At a mixed node, acceptance = p(D) + sum_{t not in D} min(p, q~) (Hu et al.'s optimum)."""
    from simlab import verifiers

    p, q = np.array([0.1, 0.4, 0.2, 0.3]), np.array([0.5, 0.1, 0.3, 0.1])
    plan = verifiers.get("greedy_draft").prepare(p, q, 2)  # D = {0}, q~ = (0, .2, .6, .2)
    assert plan.acceptance_rate() == pytest.approx(0.1 + 0.2 + 0.2 + 0.2, abs=1e-15)
    assert verifiers.get("onehot").acceptance_rate(p, q, 2) == pytest.approx(0.1 + 0.2, abs=1e-15)


def test_builders_by_name_and_bad_options():
    assert set(builders.names()) >= {"delayed", "iid", "chain", "static", "eagle2", "sequoia", "greedy_draft"}
    assert builders.get("eagle2").budget == 59 and builders.get("eagle2").depth == 7 and builders.get("eagle2").top_k == 10
    for name, options, message in (
        ("eagle2", dict(budget=0), "budget"),
        ("eagle2", dict(top_k=0), "top_k"),
        ("eagle2", dict(depth=-1), "depth"),
        ("greedy_draft", dict(best=-1), "best"),
        ("sequoia", dict(acceptance=(0.7, 0.5)), "acceptance"),
        ("sequoia", dict(acceptance=(0.5,), budget=5, depth=2), "budget"),
        ("nope", {}, "name"),
        ("eagle2", dict(width=3), "options"),
    ):
        with pytest.raises(ValueError, match=f"^{message}: "):
            builders.get(name, **options)


def test_builders_report_their_drafting_cost():
    pair = WORLDS["markov"]
    tree = EAGLE2(budget=5, depth=2, top_k=2).sample(NodeTable(pair, (0,)))
    assert [f.tokens for f in tree.cost.forwards] == [1, 2, 2] and tree.cost.verified == tree.tokens() == 5
    assert [f.context for f in tree.cost.forwards] == [0, 2, 4]
    from simlab.latency import LatencyModel

    latency = LatencyModel.from_cost_ratio(0.1)
    assert latency.tree_step_time(7, tree) == pytest.approx(3 * 0.1 + 1.0)
    static = Static([(0,), (1,), (0, 0)]).sample(NodeTable(pair, (0,)))
    assert latency.tree_step_time(7, static) == latency.tree_time(7, [2, 1])


# -- EAGLE-2 against a brute-force reference -----------------------------------------------------------
def eagle_reference(pair, context, budget, depth, top_k):
    """Score every candidate EAGLE-2 creates, sort all of them, keep the best ``budget``: written
    from the description alone (lists, no shared code)."""

    def q_at(path):
        return pair.distributions([tuple(context) + path])[1][0]

    def top(path):
        q = q_at(path)
        order = sorted((i for i in range(len(q)) if q[i] > 0), key=lambda i: (-q[i], i))
        return order[:top_k]

    candidates = []  # (score, creation index, path)
    for t in top(()):
        candidates.append((np.log(q_at(())[t]), len(candidates), (t,)))
    frontier = sorted(candidates, key=lambda c: (-c[0], c[1]))[:top_k]
    for _ in range(depth):
        new = []
        for score, _, path in frontier:
            for t in top(path):
                new.append((score + np.log(q_at(path)[t]), len(candidates) + len(new), path + (t,)))
        candidates += new
        frontier = sorted(new, key=lambda c: (-c[0], c[1]))[:top_k]
    kept = sorted(candidates, key=lambda c: (-c[0], c[1]))[:budget]
    paths = {c[2] for c in kept}
    assert all(p[:-1] in paths or len(p) == 1 for p in paths)  # ancestor-closed
    children = {}
    for _, _, path in sorted(kept, key=lambda c: c[1]):
        children.setdefault(path[:-1], []).append(path[-1])
    return {k: tuple(v) for k, v in children.items()}


@pytest.mark.parametrize("budget, depth, top_k", [(1, 0, 1), (4, 2, 2), (7, 3, 3), (20, 4, 2), (59, 7, 10)])
@pytest.mark.parametrize("seed", [0, 1])
def test_eagle2_equals_the_brute_force_reference(budget, depth, top_k, seed):
    pair = MarkovPair.random(6, np.random.default_rng(seed), concentration=0.5)
    if seed == 1:  # ties in q: rounded rows
        pair = MarkovPair(pair.target, np.round(pair.draft, 1) / np.round(pair.draft, 1).sum(1, keepdims=True))
    tree = EAGLE2(budget, depth, top_k).sample(NodeTable(pair, (2,)))
    assert tree.children == eagle_reference(pair, (2,), budget, depth, top_k)
    assert tree.tokens() <= budget and tree.depth() <= depth + 1


def test_eagle2_conventions_are_pinned():
    """Budget = EAGLE's total_token - 1 draft tokens; depth rounds give up to depth + 1 levels."""
    pair = ContextFreePair(np.full(4, 0.25), [0.97, 0.01, 0.01, 0.01])  # the first token dominates every level
    tree = EAGLE2(budget=3, depth=2, top_k=1).sample(NodeTable(pair, ()))
    assert tree.children == {(): (0,), (0,): (0,), (0, 0): (0,)} and tree.depth() == 3
    assert EAGLE2(budget=100, depth=1, top_k=2).sample(NodeTable(pair, ())).tokens() == 2 + 4  # k + depth k^2 candidates


# -- Sequoia --------------------------------------------------------------------------------------------------
def all_trees(m, l):
    """Every rank-ordered tree with m nodes (root included) and at most l levels, as frozensets of rank paths."""
    if m == 1:
        return [frozenset()]
    if l == 1:
        return []
    out = set()

    def forests(size, depth):  # ordered lists of child subtrees with `size` nodes in total
        if size == 0:
            yield ()
            return
        for first in range(1, size + 1):
            for sub in all_trees(first, depth):
                for rest in forests(size - first, depth):
                    yield (sub,) + rest

    for forest in forests(m - 1, l - 1):
        out.add(frozenset({(r,) for r in range(len(forest))} | {(r,) + node for r, sub in enumerate(forest) for node in sub}))
    return list(out)


@pytest.mark.parametrize("acceptance", [(0.5, 0.2, 0.1), (0.3, 0.3), (0.8,), (0.4, 0.0, 0.3)])
@pytest.mark.parametrize("m, l", [(2, 2), (4, 3), (5, 3), (6, 4), (7, 5)])
def test_sequoia_dp_equals_brute_force(acceptance, m, l):
    from simlab.builders.sequoia import positional_value, tree_dp

    table = tree_dp(acceptance, m, l)
    trees = [t for t in all_trees(m, l) if all(r < len(acceptance) for node in t for r in node)]
    best = max((positional_value(sorted(t), acceptance) for t in trees), default=-np.inf)
    assert table.value(m, l) == pytest.approx(best, abs=1e-12)
    if np.isfinite(best):
        spec = table.spec(m, l)
        assert len(spec) == m - 1 and positional_value(spec, acceptance) == pytest.approx(best, abs=1e-12)


def test_sequoia_acceptance_vector_equals_enumeration():
    """P(j-th sibling accepted) from the prefix recursion = the rrs_wor law over every ordered sibling tuple."""
    from simlab import verifiers
    from simlab.builders.sequoia import acceptance_vector
    from simlab.drafting import child_tuples

    rng = np.random.default_rng(4)
    for _ in range(5):
        p, q = rng.dirichlet(np.full(5, 0.6)), rng.dirichlet(np.full(5, 0.6))
        q[rng.integers(5)] = 0.0
        q /= q.sum()
        for width in (1, 2, 3):
            tuples, probs = child_tuples(q, width, Drafting.WITHOUT_REPLACEMENT)
            plan = verifiers.get("rrs_wor").prepare(p, q, width)
            expected = np.zeros(width)
            for x, prob in zip(tuples, probs):
                law = plan.output_distribution(x)
                expected += prob * law[x]
            np.testing.assert_allclose(acceptance_vector(p, q, width), expected, atol=1e-12)
            estimate = acceptance_vector(p, q, width, method="mc", samples=4000, rng=np.random.default_rng(1))
            np.testing.assert_allclose(estimate, expected, atol=0.03)


def test_sequoia_fitted_and_choose(tmp_path):
    from simlab.builders.sequoia import choose
    from simlab.latency import LatencyModel

    pair = WORLDS["markov"]
    builder = Sequoia.fitted(pair, [(0,), (1,), (2,)], width=2, budget=4, depth=3)
    assert len(builder.spec) == 4 and builder.laws == frozenset({Drafting.WITHOUT_REPLACEMENT})
    spec, facts = choose((0.6, 0.2), LatencyModel.from_cost_ratio(0.05, per_token=0.01), context=16, budgets=[2, 4, 8], levels=4)
    assert facts["budget"] in (2, 4, 8) and len(spec) == facts["budget"]
    assert facts["tokens_per_second"] == pytest.approx(facts["expected_tokens"] / facts["T"])


def test_sequoia_tool_prints_the_chosen_tree(tmp_path, capsys):
    import json

    from analyses import sequoia_tree

    (tmp_path / "acc.json").write_text(json.dumps([0.55, 0.2, 0.1]))
    (tmp_path / "lat.json").write_text(
        json.dumps(
            {
                "draft": {"contexts": [0], "tokens": [1], "seconds": [[0.002]]},
                "target": {"contexts": [0, 100], "tokens": [1, 64], "seconds": [[0.02, 0.03], [0.021, 0.031]]},
            }
        )
    )
    assert (
        sequoia_tree.main(
            [
                "--acceptance",
                str(tmp_path / "acc.json"),
                "--latency",
                str(tmp_path / "lat.json"),
                "--budgets",
                "4,8,16",
                "--depth",
                "5",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "expected tokens" in out and "nodes per depth" in out


# -- the greedy-draft builder's sampler ------------------------------------------------------------------
def test_greedy_draft_samples_follow_its_enumeration():
    """G-test (stats.py design) of sampled trees against the enumerated tree law."""
    from stats import assert_sampler_matches

    pair, builder = WORLDS["markov"], GreedyDraftTree(budget=4, depth=2, top_k=2)
    table = NodeTable(pair, (0,))
    merged: dict = {}  # draw sequences that end in the same tree (a tail drawn, then pruned) merge
    for tree, prob in builder.enumerate(table):
        key = tuple(sorted(tree.children.items()))
        merged[key] = merged.get(key, 0.0) + prob
    index = {key: i for i, key in enumerate(merged)}
    law = np.array(list(merged.values()))
    assert len(index) > 3 and abs(law.sum() - 1) <= 1e-12
    assert_sampler_matches(lambda rng: index[tuple(sorted(builder.sample(table, rng).children.items()))], law, seed=21)


@pytest.mark.parametrize("builder, verifier", [("eagle2", "onehot"), ("greedy_draft", "greedy_draft"), ("sequoia", "rrs_wor")])
def test_sampling_loop_with_builders_emits_the_target_two_token_law(builder, verifier):
    """Build, verify, emit, repeat: G-test of the first two emitted tokens (design: stats.py).

    False alarm 1e-6; power 0.99 against TV 0.05 (``stats.TV_SAMPLING_LOOP``), not the node-level
    0.02: the law of these pairings is proved exactly (1e-12) by
    ``test_lossless_pairings_emit_the_target_law``; this test checks the sampling loop end to end."""
    from stats import TV_SAMPLING_LOOP, assert_sampler_matches

    pair, context = WORLDS["markov"], (0,)
    target = target_sequence_law(pair, context, 2)
    cells = sorted(target)
    index = {c: i for i, c in enumerate(cells)}
    shape, tree_verifier = BUILDERS[builder], tree_verifiers.get(verifier)
    tables = {}

    def two_tokens(rng):
        emitted = ()
        while len(emitted) < 2:
            table = tables.setdefault(emitted, NodeTable(pair, context + emitted))
            path, token = tree_verifier.verify(shape.sample(table, rng), rng)
            emitted += path + (token,)
        return index[emitted[:2]]

    assert_sampler_matches(two_tokens, np.array([target[c] for c in cells]), seed=33, tv=TV_SAMPLING_LOOP)


def test_tree_value_is_the_exact_value_of_the_builders_trees():
    """``simlab.valuation.tree_value``: one exact tree for a deterministic builder (ranked on
    ``drafting``, valued on the root's table), the mean of the drawn trees' exact values for a
    sampled one (same seed, same trees), None where the verifier is not lossless on a tree."""
    from simlab.latency import LatencyModel
    from simlab.valuation import tree_value, value_tree

    latency = LatencyModel.from_cost_ratio(0.3, per_token=0.002)
    pair = WORLDS["markov"]
    table, drafting = NodeTable(pair, (0,)), NodeTable(pair, (0,)).untempered()
    eagle = BUILDERS["eagle2"]
    out = tree_value(eagle, table, "onehot", latency, drafting=drafting)
    exact = value_tree(eagle.sample(drafting).on(table), "onehot", latency)
    assert (out["E"], out["T"], out["tokens"], out["se"]) == (exact["E"], exact["T"], exact["tokens"], 0.0)
    assert tree_value(eagle, table, "specinfer", latency) is None
    delayed = BUILDERS["delayed"]
    out = tree_value(delayed, table, "specinfer", latency, samples=5, rng=np.random.default_rng(3))
    rng = np.random.default_rng(3)
    values = [value_tree(delayed.sample(table, rng), "specinfer", latency)["E"] for _ in range(5)]
    assert out["E"] == pytest.approx(np.mean(values), abs=1e-15) and out["se"] > 0 and len(out["trees"]) == 5
    assert out["E"] != pytest.approx(values[0], abs=1e-9)  # five different trees, not one
