"""The DDTE audit conventions (issue 17): duplicated trunk children (declared lossy where they are,
with their exact bias and effect on E[tau+1]), SpecTr's four-step rho and Khisti's rank tail
against direct implementations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from simlab import tree_verifiers, verifiers
from simlab.drafting import Drafting
from simlab.efficiency import emitted_sequence_law, expected_block_efficiency, pairing_bias, target_sequence_law
from simlab.pairs import MarkovPair
from simlab.builders import Delayed
from simlab.trees import NodeTable

PAIR = MarkovPair.random(4, np.random.default_rng(13), concentration=0.7, closeness=0.3)
PER_PATH = Delayed(2, 1, 1, trunk_children="per_path")
_TREE = PER_PATH.sample(NodeTable(PAIR, (0,)), np.random.default_rng(0))
_IID = [
    v
    for v in tree_verifiers.names()
    if not tree_verifiers.get(v).needs_greedy_target and Drafting.IID in tree_verifiers.get(v).lossless_for
]
DECLARED = [
    v
    for v in tree_verifiers.names()
    if not tree_verifiers.get(v).needs_greedy_target and tree_verifiers.get(v).lossless_on(_TREE)
]
REFUSED = [v for v in _IID if v not in DECLARED]


def test_per_path_trees_repeat_the_trunk_child():
    tree = PER_PATH.sample(NodeTable(PAIR, (0,)), np.random.default_rng(0))
    shared = Delayed(2, 1, 1).sample(NodeTable(PAIR, (0,)), np.random.default_rng(0))
    trunk = tree.child_list(())
    assert len(trunk) == 2 and trunk[0] == trunk[1] == shared.child_list(())[0]
    assert tree.law(()) is Drafting.REPEATED and tree.tokens() == shared.tokens()
    assert Delayed(2, 0, 3, trunk_children="per_path").laws == {Drafting.IID}  # no trunk, nothing repeated


def test_the_declared_verifiers_are_lossless_with_repeated_trunk_children():
    assert set(DECLARED) >= {"nss", "naive", "naive_chain", "onehot", "bv", "traversal"}
    assert set(REFUSED) == {"spectr", "specinfer", "khisti", "optimal", "ot_walk", "ot_exact"}
    target = target_sequence_law(PAIR, (0,), 3)
    for v in DECLARED:
        for shape in (PER_PATH, Delayed(3, 2, 1, trunk_children="per_path")):
            law = emitted_sequence_law(PAIR, (0,), shape, v, 3)
            assert 0.5 * sum(abs(law.get(k, 0) - target.get(k, 0)) for k in set(law) | set(target)) <= 1e-12, v


@pytest.mark.parametrize("verifier", REFUSED)
def test_the_multi_draft_verifiers_are_refused_and_biased(verifier):
    with pytest.raises(ValueError, match="is not lossless for children drafted as one draw from q repeated"):
        expected_block_efficiency(PAIR, (0,), PER_PATH, verifier)
    assert pairing_bias(PAIR, (0,), PER_PATH, verifier, n=3) > 1e-3


def test_the_effect_on_block_efficiency_matches_the_issue():
    """SpecInfer's value is unchanged (only its correction token is wrong); SpecTr's and Khisti's rise."""
    value = lambda shape, v: expected_block_efficiency(PAIR, (0,), shape, v, allow_lossy=True).mean
    shared = Delayed(2, 1, 1)
    assert abs(value(PER_PATH, "specinfer") - value(shared, "specinfer")) <= 1e-12
    assert value(PER_PATH, "spectr") > value(shared, "spectr") + 1e-3
    assert value(PER_PATH, "khisti") > value(shared, "khisti") + 1e-3


def specinfer_on_copies(p, q, a, k):
    """Direct SpecInfer (multi-round rejection with residuals) on k copies of token a."""
    out, reach, current = np.zeros_like(p), 1.0, p.copy()
    for _ in range(k):
        accept = min(1.0, current[a] / q[a])
        out[a] += reach * accept
        reach *= 1 - accept
        current = np.maximum(current - q, 0.0)
        current /= current.sum()
    return out + reach * current


def test_specinfer_on_repeated_children_equals_a_direct_implementation():
    rng = np.random.default_rng(2)
    for _ in range(20):
        p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
        a, k = int(rng.integers(5)), int(rng.integers(2, 4))
        got = verifiers.get("specinfer", order="fixed").output_distribution(p, q, [a] * k)
        assert np.allclose(got, specinfer_on_copies(p, q, a, k), atol=1e-12, rtol=0)


def test_khisti_rank_tail_equals_the_pairwise_rule():
    """With s = 2 at k = 2: between two tokens outside the top, the higher p - q^2 wins (ties: lower id),
    and the selection law equals the brute-force sum over the child pairs."""
    rng = np.random.default_rng(4)
    for _ in range(10):
        V = 6
        p, q = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))
        plan = verifiers.get("khisti", mode="truncated", s=2, tail="rank").prepare(p, q, 2)
        rnd = plan.selection.rounds[0]
        key = p - q * q
        tail = [t for t in range(V) if t not in rnd.top]
        for i, j in itertools.permutations(tail, 2):
            assert rnd.champion_wins(i, j) == float(key[i] > key[j] or (key[i] == key[j] and i < j))
        law = np.zeros(V)
        for x1, x2 in itertools.product(range(V), repeat=2):
            win = 1.0 if x1 == x2 else rnd.champion_wins(x1, x2)
            law[x1] += q[x1] * q[x2] * win
            law[x2] += q[x1] * q[x2] * (1 - win)
        assert np.allclose(law, plan.selection_law, atol=1e-12, rtol=0)


def test_bad_audit_options():
    with pytest.raises(ValueError, match="^trunk_children: "):
        Delayed(2, 1, 1, trunk_children="per_edge")
    with pytest.raises(ValueError, match="^rho: "):
        verifiers.get("spectr", rho="five_step")
    with pytest.raises(ValueError, match="^tail: "):
        verifiers.get("khisti", tail="random")
