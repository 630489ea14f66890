"""Engine metrics (``simlab.engine_metrics``) against hand-computed values on small trees."""

from __future__ import annotations

import numpy as np
import pytest

from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.engine_metrics import aggregate, chain_acceptance_length, path_metrics, tree_metrics
from simlab.pairs import ContextFreePair
from simlab.trees import DraftTree, NodeTable

P = [0.5, 0.3, 0.2]
CHILDREN = {(): (0, 1), (0,): (1,), (1,): (2,)}
# one-hot verification of this deterministic tree with p = (.5, .3, .2) at every node: the root
# accepts 0 w.p. .5, else 1 w.p. .3/.5 of the rest; (0,) accepts 1 w.p. .3; (1,) accepts 2 w.p. .2
MASSES = {(): 0.2, (0,): 0.35, (0, 1): 0.15, (1,): 0.24, (1, 2): 0.06}


def tree(eos=None):
    pair = ContextFreePair(P, P, eos_id=eos)
    return DraftTree(NodeTable(pair, (1,)), dict(CHILDREN), Drafting.DETERMINISTIC)


def test_the_verifier_law_is_the_hand_law():
    masses = tree_verifiers.get("onehot").accept_masses(tree())
    assert set(masses) == set(MASSES) and all(abs(masses[k] - v) < 1e-12 for k, v in MASSES.items())


def test_without_eos():
    m = tree_metrics(tree(), tree_verifiers.get("onehot"))
    assert m.accept_length == pytest.approx(2.01, abs=1e-12)
    assert m.accepted == pytest.approx(1.01, abs=1e-12)
    np.testing.assert_allclose(m.unconditional, [0.8, 0.21], atol=1e-12)
    np.testing.assert_allclose(m.conditional, [0.8, 0.2625], atol=1e-12)
    assert m.chain == pytest.approx(1.01, abs=1e-12) and not m.eos
    assert m.accept_length == pytest.approx(tree_verifiers.get("onehot").expected_block_efficiency(tree()), abs=1e-12)


def test_eos_inside_the_accepted_prefix_ends_the_block():
    # EOS = 0: (0,) and (0, 1) keep one token (the EOS), no bonus; position 2 counts (1, 2) only
    m = tree_metrics(tree(eos=0), tree_verifiers.get("onehot"))
    assert m.accept_length == pytest.approx(0.2 + 0.35 + 0.15 + 0.48 + 0.18, abs=1e-12)
    assert m.accepted == pytest.approx(0.35 + 0.15 + 0.24 + 0.12, abs=1e-12)
    np.testing.assert_allclose(m.unconditional, [0.8, 0.06], atol=1e-12)
    np.testing.assert_allclose(m.conditional, [0.8, 0.075], atol=1e-12)
    assert m.chain == pytest.approx(0.86, abs=1e-12) and m.eos
    # the lab's block efficiency keeps the same tokens; without truncation the plain values come back
    assert m.accept_length == pytest.approx(tree_verifiers.get("onehot").expected_block_efficiency(tree(eos=0)), abs=1e-12)
    assert tree_metrics(tree(eos=0), tree_verifiers.get("onehot"), eos=False).accept_length == pytest.approx(2.01)


def test_chain_metric_and_aggregate():
    assert chain_acceptance_length([0.8, 0.5, 0.25]) == pytest.approx(0.8 + 0.4 + 0.1)
    assert chain_acceptance_length([0.5, float("nan"), 1.0]) == 0.5
    with pytest.raises(ValueError, match="rates"):
        chain_acceptance_length([1.5])
    a = path_metrics({(): 0.5, (3,): 0.5}, 2)  # reach (.5, 0): position 2 reached, never accepted
    b = path_metrics({(3, 4): 1.0}, 2)  # reach (1, 1)
    m = aggregate([a, b])
    assert m.accept_length == pytest.approx((1.5 + 3.0) / 2) and m.accepted == pytest.approx(1.25)
    np.testing.assert_allclose(m.unconditional, [0.75, 0.5])
    np.testing.assert_allclose(m.conditional, [0.75, 0.5 / 0.75])
    # SpecForge: the per-position rates averaged first (position 1: (.5 + 1)/2, position 2: (0 + 1)/2)
    assert m.chain == pytest.approx(0.75 + 0.75 * 0.5)
    c = path_metrics({(): 0.5, (3,): 0.5}, 1)  # a one-token tree: position 2 reached, no draft there (rate 0)
    assert aggregate([c, b]).chain == pytest.approx(0.75 + 0.75 * 0.5)
    assert aggregate([path_metrics({(): 1.0}, 1), b]).chain == pytest.approx(0.5 + 0.5 * 1.0)
    # a one-token tree, always accepted, beside a three-token one: position 2 is reached (rate 0,
    # the draft ends), position 3 is not (no rate: averaged over the roots that reach it)
    d = path_metrics({(3, 4, 5): 1.0}, 3)
    assert aggregate([path_metrics({(3,): 1.0}, 1), d]).chain == pytest.approx(1.0 + 1.0 * 0.5 + 1.0 * 0.5 * 1.0)
    assert a.conditional[1] == 0.0 and np.isnan(path_metrics({(): 1.0}, 2).conditional[1])
    with pytest.raises(ValueError, match="masses"):
        path_metrics({(): 0.5}, 1)
    with pytest.raises(ValueError, match="metrics"):
        aggregate([a, path_metrics({(): 1.0}, 1, eos=0)])


@pytest.mark.parametrize("eos", [None, 1])
def test_expected_positions_of_a_sampled_chain_are_the_closed_forms(eos):
    """Over the law of i.i.d.-drafted chains of 2 tokens with p and q context-free, standard
    speculative sampling accepts each position w.p. alpha = sum min(p, q) independently:
    P(tau >= d) = alpha^d; with an EOS, position 2 counts only when the first accepted token is
    not EOS: alpha * (alpha - min(p, q)[eos])."""
    from simlab.builders import chain
    from simlab.engine_metrics import expected_positions

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.5, 0.3])
    alpha = np.minimum(p, q).sum()
    table = NodeTable(ContextFreePair(p, q, eos_id=eos), (0,))
    accepted, unconditional = expected_positions(table, chain(2), tree_verifiers.get("naive"))
    second = alpha * (alpha - (np.minimum(p, q)[eos] if eos is not None else 0.0))
    np.testing.assert_allclose(unconditional, [alpha, second], rtol=0, atol=1e-12)
    assert accepted == pytest.approx(alpha + second, abs=1e-12)
