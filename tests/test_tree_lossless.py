"""End-to-end losslessness of every tree verifier and shape, exact (enumeration) and statistical."""

from __future__ import annotations

import numpy as np
import pytest

from simlab import tree_verifiers
from simlab.sampling import SamplingSettings, sampling_distribution
from simlab.drafting import Drafting
from simlab.efficiency import emitted_sequence_law, target_sequence_law
from simlab.pairs import MarkovPair
from simlab.builders import Delayed, GreedyDraftTree, Static, chain, iid
from simlab.trees import DraftTree, NodeTable
from stats import TV_SAMPLING_LOOP, assert_sampler_matches
from variants import lossless_tree_names, renames_another

PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)
CONTEXT = (1,)
N = 3

IID_SHAPES = {"chain(3)": chain(3), "iid(2,2)": iid(2, 2), "iid(3,1)": iid(3, 1), "delayed(2,1,2)": Delayed(2, 1, 2)}
WOR_SHAPES = {
    "iid(2,2) w/o repl.": iid(2, 2, Drafting.WITHOUT_REPLACEMENT),
    "delayed(2,1,1) w/o repl.": Delayed(2, 1, 1, Drafting.WITHOUT_REPLACEMENT),
    "static w/o repl.": Static([(0,), (1,), (0, 0), (0, 1)], "without_replacement"),
}
STATIC_TOPK = Static([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)], "topk")

IID_VERIFIERS = lossless_tree_names(Drafting.IID)  # from the declarations, so a newly registered verifier is covered
WOR_VERIFIERS = lossless_tree_names(Drafting.WITHOUT_REPLACEMENT)

PAIRINGS = (
    [(v, s) for v in IID_VERIFIERS for s in IID_SHAPES]
    + [(v, s) for v in WOR_VERIFIERS for s in WOR_SHAPES]
    + [("nss", "static top-k")]
)


def shape_named(name):
    return {**IID_SHAPES, **WOR_SHAPES, "static top-k": STATIC_TOPK}[name]


def total_variation(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("verifier, shape", PAIRINGS)
def test_first_three_tokens_have_the_target_law(verifier, shape):
    law = emitted_sequence_law(PAIR, CONTEXT, shape_named(shape), verifier, N)
    target = target_sequence_law(PAIR, CONTEXT, N)
    assert total_variation(law, target) <= 1e-10


def greedy_pair():
    """Temperature 0 applied to both models: one-hot target and draft rows."""
    rng = np.random.default_rng(8)
    logits_p, logits_q = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    logits_q[:2] = logits_p[:2]  # the draft agrees on some contexts
    one_hot = lambda rows: np.array([sampling_distribution(r, temperature=0) for r in rows])
    return MarkovPair(one_hot(logits_p), one_hot(logits_q))


@pytest.mark.parametrize("verifier", tree_verifiers.names())
def test_temperature_zero_every_verifier_is_greedy_decoding(verifier):
    if not getattr(getattr(tree_verifiers.get(verifier), "node", None), "exact_at_greedy_target", True):
        pytest.skip("declared lossy at a one-hot target too (NodeVerifier.exact_at_greedy_target)")
    pair = greedy_pair()
    declared = tree_verifiers.get(verifier).lossless_for
    shape = iid(2, 2)  # chosen by what the verifier declares:
    if Drafting.IID not in declared:  # one-hot q cannot draft 2 distinct children; one child is a draw from q
        shape = chain(3)
    if Drafting.MIXED in declared:  # greedy-draft trees (one-hot q: no tail, deterministic children)
        shape = GreedyDraftTree(budget=4, depth=2, top_k=2)
    # a declared-lossy rule (no law declared) is asked for its biased law: at T = 0 it is exact too
    law = emitted_sequence_law(pair, (0,), shape, verifier, 4, allow_lossy=not declared)
    assert law == pytest.approx(target_sequence_law(pair, (0,), 4), abs=1e-12)
    assert len(law) == 1


def test_other_pairings_are_reported_not_hidden():
    """Verifiers that assume i.i.d. children are biased on trees with siblings drafted without
    replacement (exact TV measured here); Traversal stays exact on i.i.d. rollouts, because the
    distinct children of i.i.d. draws, in order of first appearance, follow the without-replacement law."""
    target = target_sequence_law(PAIR, CONTEXT, 2)
    shape = WOR_SHAPES["iid(2,2) w/o repl."]
    biases = {
        v: total_variation(emitted_sequence_law(PAIR, CONTEXT, shape, v, 2, allow_lossy=True), target)
        for v in ["spectr", "specinfer", "khisti", "optimal"]
    }
    print("exact TV bias on siblings drafted without replacement:", {k: f"{b:.3g}" for k, b in biases.items()})
    assert all(b > 1e-3 for b in biases.values())
    for v in biases:  # refused without allow_lossy, naming the verifier and the law
        with pytest.raises(ValueError, match=f"^verifier: {v} is not lossless for children drafted from q without replacement"):
            emitted_sequence_law(PAIR, CONTEXT, shape, v, 2)
    traversal_iid = total_variation(emitted_sequence_law(PAIR, CONTEXT, iid(3, 1), "traversal", 2), target)
    print(f"exact TV bias of traversal on i.i.d. rollouts: {traversal_iid:.3g}")
    assert traversal_iid <= 1e-10
    with pytest.raises(ValueError, match="^verifier: rrs_wor is not lossless for children drafted i.i.d."):
        emitted_sequence_law(PAIR, CONTEXT, iid(3, 1), "rrs_wor", 1)
    with pytest.raises(ValueError, match="repeats a token"):  # and asked anyway, duplicate children are impossible for it
        emitted_sequence_law(PAIR, CONTEXT, iid(3, 1), "rrs_wor", 1, allow_lossy=True)


STATISTICAL = [(v, "iid(2,2)") for v in IID_VERIFIERS if not renames_another(tree_verifiers.get(v))] + [
    ("rrs_wor", "iid(2,2) w/o repl."),
    ("greedy", "iid(2,2)"),
]
"""(A rule that only renames another registered class, ``exact_match``, runs under the original's name.)"""


@pytest.mark.parametrize("verifier, shape", STATISTICAL)
def test_sampling_loop_emits_the_target_two_token_law(verifier, shape):
    """Draft a tree, verify, emit, repeat: G-test of the first two emitted tokens (design: stats.py).

    False alarm 1e-6; power 0.99 against TV 0.05 (``stats.TV_SAMPLING_LOOP``: 8,000 draws at 9
    cells), not the node-level 0.02: the law itself is proved exactly (1e-12) by
    ``test_first_three_tokens_have_the_target_law`` on these pairings, and each node sampler by the
    TV 0.02 G-tests of ``test_verifiers_sampling.py``; this test checks the sampling loop end to end."""
    pair = greedy_pair() if verifier == "greedy" else PAIR
    shape_obj, tree_verifier = shape_named(shape), tree_verifiers.get(verifier)
    target = target_sequence_law(pair, CONTEXT, 2)
    cells = sorted(target)
    law = np.array([target[c] for c in cells])
    index = {c: i for i, c in enumerate(cells)}

    tables: dict[tuple[int, ...], NodeTable] = {}  # p, q and node plans per context, reused across steps

    def two_tokens(rng):
        emitted: tuple[int, ...] = ()
        while len(emitted) < 2:
            table = tables.setdefault(emitted, NodeTable(pair, CONTEXT + emitted))
            path, token = tree_verifier.verify(shape_obj.sample(table, rng), rng)
            emitted += path + (token,)
        return index[emitted[:2]]

    assert_sampler_matches(two_tokens, law, seed=31, tv=TV_SAMPLING_LOOP)


def test_greedy_leaf_emits_the_argmax_at_every_temperature():
    """The greedy rule's bonus at a leaf is argmax p, not a draw from p (issue 24, item 4).

    ``ContextFreePair(p = [0.6, 0.4], q = [0.7, 0.3])``, the EAGLE-2 tree with one child
    (budget 1, depth 0, top-k 1): the child is argmax q = 0.  Greedy: argmax p = 0 is the child,
    so it is accepted (probability 1) and verification reaches the leaf (0,), where the rule
    emits argmax p = 0 again: the law at the leaf is [1, 0] (a draw from p would give [0.6, 0.4]).
    The first two emitted tokens are (0, 0) with probability 1; the target's two-token law is
    p x p: (0, 0) 0.36, (0, 1) 0.24, (1, 0) 0.24, (1, 1) 0.16.  Bias = TV =
    0.5 (|1 - 0.36| + 0.24 + 0.24 + 0.16) = 0.5 x 1.28 = 0.64 (the draw from p gave
    0.5 (0.24 + 0.16 + 0.24 + 0.16) = 0.4).  E[tau + 1] = 2 either way."""
    from simlab.builders import EAGLE2
    from simlab.efficiency import pairing_bias
    from simlab.pairs import ContextFreePair

    pair, builder = ContextFreePair([0.6, 0.4], [0.7, 0.3]), EAGLE2(budget=1, depth=0, top_k=1)
    tree = builder.sample(NodeTable(pair, (0,)))
    assert tree.children == {(): (0,)}
    greedy = tree_verifiers.get("greedy", allow_lossy=True)
    law = greedy.outcome_law(tree)
    assert law[(0,)].tolist() == [1.0, 0.0] and law[()].tolist() == [0.0, 0.0]
    assert all(greedy.verify(tree, np.random.default_rng(s)) == ((0,), 0) for s in range(50))
    assert pairing_bias(pair, (0,), builder, greedy, n=2) == pytest.approx(0.64, abs=1e-12)
    assert greedy.expected_block_efficiency(tree) == pytest.approx(2.0, abs=1e-12)
    with pytest.raises(ValueError, match="^verifier: greedy is lossless only for a greedy"):
        tree_verifiers.get("greedy").outcome_law(tree)


def test_greedy_ties_go_to_the_lowest_id_in_law_sampler_and_leaf():
    """argmax ties: the lowest token id, the same in the node law, the sampler and the leaf rule
    (the convention of ``sampling_distribution`` at T = 0 and ``greedy_decode``).  p = [0.2, 0.4, 0.4]:
    the output at the root and the bonus at a leaf are token 1 (never 2), drafted children or not."""
    from simlab.pairs import ContextFreePair
    from simlab.trees import DraftTree
    from simlab.verifiers.greedy import greedy_token

    p = [0.2, 0.4, 0.4]
    assert greedy_token(np.array(p)) == 1 and int(np.argmax(sampling_distribution(np.log(p), temperature=0))) == 1
    table = NodeTable(ContextFreePair(p, [0.1, 0.45, 0.45]), (0,))
    greedy = tree_verifiers.get("greedy", allow_lossy=True)
    for children, accepted in (((2,), ()), ((1, 2), (1,)), ((2, 1), (1,))):
        tree = DraftTree(table, {(): children}, drafting=Drafting.DETERMINISTIC)
        law = greedy.outcome_law(tree)
        assert law[accepted].tolist() == [0.0, 1.0, 0.0] and sum(v.sum() for v in law.values()) == 1.0
        assert all(greedy.verify(tree, np.random.default_rng(s)) == (accepted, 1) for s in range(20))


@pytest.mark.parametrize("law", [Drafting.IID, Drafting.WITHOUT_REPLACEMENT, Drafting.DETERMINISTIC])
@pytest.mark.parametrize("k", [1, 2])
def test_lossless_names_is_the_tree_check(law, k):
    """``lossless_names({law}, settings, k)`` (the set query every study asks) names exactly the
    verifiers whose own tree check accepts a node of that law with k children (``lossless_on``),
    at T > 0 and at T = 0 (a one-hot target: the greedy rule joins)."""
    for pair, greedy in ((PAIR, False), (greedy_pair(), True)):
        tree = DraftTree(NodeTable(pair, CONTEXT), {(): tuple(range(k))}, drafting=law)
        by_tree = [v for v in tree_verifiers.names() if tree_verifiers.get(v).lossless_on(tree)]
        assert tree_verifiers.lossless_names({law}, SamplingSettings(temperature=0.0 if greedy else 1.0), k) == by_tree


def test_lossless_names_refuses_bad_arguments():
    with pytest.raises(ValueError, match="^laws: "):
        tree_verifiers.lossless_names(set(), SamplingSettings())
    with pytest.raises(ValueError, match="^laws: "):
        tree_verifiers.lossless_names({"iid"}, SamplingSettings())
    with pytest.raises(ValueError, match="^k: "):
        tree_verifiers.lossless_names({Drafting.IID}, SamplingSettings(), k=0)
