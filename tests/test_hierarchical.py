"""Hierarchical Speculative Decoding (``hsd``, ``hsd_official``): exact laws by enumeration, the
equivalences the derivation gives (Block Verification on every chain; standard speculative
sampling on one token), the official acceptance's exact bias, and the samplers.

The generic suites pick ``hsd`` up from its declarations (``tests/test_tree_lossless.py``: the
first three emitted tokens on every shape, the decode-loop G-test; ``tests/test_lossless_flag.py``)
and ``hsd_official`` at T = 0 (greedy decoding); the planted fault is in ``tests/tree_mutants.py``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simlab import tree_verifiers
from simlab.builders import chain
from simlab.drafting import Drafting
from simlab.efficiency import emitted_sequence_law, pairing_bias, target_sequence_law
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.trees import DraftTree, NodeTable
from stats import assert_sampler_matches
from variants import EDGE_CASES, edge_case

RANDOM_PAIRS = [
    MarkovPair.random(3, np.random.default_rng(s), concentration=c, closeness=0.3) for s, c in ((1, 0.3), (2, 0.7), (3, 5.0))
]


def chains(pair, context, g):
    """Every chain of g drafted tokens at ``context`` with q > 0 along it (the trees a chain drafter can draw)."""
    table = NodeTable(pair, context)
    for tokens in itertools.product(range(table.q(()).size), repeat=g):
        if all(table.q(tokens[:i])[tokens[i]] > 0 for i in range(g)):
            yield DraftTree(table, {tokens[:i]: (tokens[i],) for i in range(g)}, drafting=Drafting.IID)


def assert_same_law(a, b, atol=1e-12):
    zero = np.zeros_like(next(iter(a.values())))
    for path in set(a) | set(b):
        np.testing.assert_allclose(a.get(path, zero), b.get(path, zero), rtol=0, atol=atol, err_msg=f"path {path}")


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_hsd_emits_the_target_law_at_the_edge_cases(case):
    """p == q, one-hot p or q, disjoint supports, q = 0 < p, tiny masses, ties: the first three
    emitted tokens of repeated three-token HSD steps have the target's law (1e-12)."""
    pair = ContextFreePair(*edge_case(case))
    law, target = emitted_sequence_law(pair, (0,), chain(3), "hsd", 3), target_sequence_law(pair, (0,), 3)
    for seq in set(law) | set(target):
        assert abs(law.get(seq, 0.0) - target.get(seq, 0.0)) <= 1e-12, (seq, law.get(seq), target.get(seq))


@pytest.mark.parametrize("pair", RANDOM_PAIRS + [ContextFreePair(*edge_case(c)) for c in EDGE_CASES], ids=lambda p: "")
def test_hsd_is_block_verification_on_every_chain(pair):
    """With its branches divided by Q_k, HSD's weight r_k / m_k is BV's w_k and its not-step-back
    probability S+ / max(S+, S-) is BV's h_k; capped, its whole-block acceptance is BV's w_g.  The
    two derivations give the same outcome law (1e-12) on every chain of 1..3 tokens."""
    hsd, bv = tree_verifiers.get("hsd"), tree_verifiers.get("bv")
    for g in (1, 2, 3):
        for tree in chains(pair, (0,), g):
            assert_same_law(hsd.outcome_law(tree), bv.outcome_law(tree))


@pytest.mark.parametrize("pair", RANDOM_PAIRS, ids=lambda p: "")
def test_one_token_is_standard_speculative_sampling(pair):
    """g = 1: m_0 = 1, so the capped and the official acceptance agree, and both are speculative
    sampling (accept min(1, p/q), else draw norm((p - q)_+)): ``naive_chain``'s law."""
    naive = tree_verifiers.get("naive_chain")
    for tree in chains(pair, (0,), 1):
        for name in ("hsd", "hsd_official"):
            assert_same_law(tree_verifiers.get(name, allow_lossy=True).outcome_law(tree), naive.outcome_law(tree))


def test_official_acceptance_is_lossy_and_refused_at_temperature_above_zero():
    """The official whole-block acceptance min(1, P(X)/Q(X)) >= BV's w_g accepts more and leaves
    the target law (exact TV of the first three tokens > 1e-3 on random pairs); it is refused
    without ``allow_lossy`` and accepts at least as much as ``hsd`` on every chain."""
    for pair in RANDOM_PAIRS:
        bias = pairing_bias(pair, (0,), chain(3), tree_verifiers.get("hsd_official", allow_lossy=True), n=3)
        print(f"exact TV of hsd_official, chain(3), 3 tokens: {bias:.4f}")
        assert bias > 1e-3
        assert pairing_bias(pair, (0,), chain(3), tree_verifiers.get("hsd"), n=3) <= 1e-12
        official, capped = tree_verifiers.get("hsd_official", allow_lossy=True), tree_verifiers.get("hsd")
        for tree in chains(pair, (0,), 3):
            assert official.expected_block_efficiency(tree) >= capped.expected_block_efficiency(tree) - 1e-12
    with pytest.raises(ValueError, match="^verifier: hsd_official is lossless only for a greedy"):
        emitted_sequence_law(RANDOM_PAIRS[0], (0,), chain(3), "hsd_official", 2)


@pytest.mark.parametrize("name", [pytest.param("hsd", marks=pytest.mark.slow), "hsd_official"])
def test_sampler_draws_the_exact_outcome_law(name):
    """G-test (design: tests/stats.py) of ``verify`` on one three-token chain against
    ``outcome_law``, cells (accepted path, next token); a chain whose stops at depths 0, 1, 2 and
    whole-block acceptance all have positive probability.  ``hsd``'s sampler is also G-tested by
    the generic decode loop (``tests/test_tree_lossless.py``), so its run here is marked slow."""
    verifier = tree_verifiers.get(name, allow_lossy=True)
    tree = DraftTree(NodeTable(RANDOM_PAIRS[1], (0,)), {(): (0,), (0,): (0,), (0, 0): (2,)}, drafting=Drafting.IID)
    law = verifier.outcome_law(tree)
    assert {len(path) for path, v in law.items() if v.sum() > 1e-3} == {0, 1, 2, 3}
    cells = [(path, t) for path in sorted(law) for t in range(law[path].size)]
    index = {cell: i for i, cell in enumerate(cells)}
    assert_sampler_matches(lambda rng: index[verifier.verify(tree, rng)], np.array([law[p][t] for p, t in cells]), seed=41)
