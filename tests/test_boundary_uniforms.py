"""Every sampler at the ends of the uniform's range: U = 0 and U = 1 - 2^-53 (the largest float
below 1), injected through a Generator whose uniforms are all that value (``checks.ConstantGenerator``).

At either end every sampler must emit a token id in [0, V) of positive mass under the exact law
it samples (``output_distribution`` for a node verifier, ``outcome_law`` for a tree verifier):
the draws go through one inverse-CDF helper, ``simlab.distributions.sample_categorical``, whose
guard is tested here directly too.  The verifiers come from the registries
(``simlab.verifiers.names``, ``simlab.tree_verifiers.names``), so a new one is covered.
Deterministic: no statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

from checks import ConstantGenerator
from simlab import tree_verifiers, verifiers
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.pairs import ContextFreePair
from simlab.trees import DraftTree, NodeTable

ENDS = [0.0, 1.0 - 2.0 ** -53]
UNIFORM = np.full(10, 0.1)  # the issue-28 case: children covering p's support at V = 10
P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
THIRDS = np.array([1 / 3, 1 / 3, 0.0, 1 / 3])  # small cases of the same kind (the exact laws enumerate k children)
TENTHS = np.array([0.7, 0.2, 0.0, 0.1])
CASES = {
    "uniform, children cover the support": (THIRDS, np.full(4, 0.25), [0, 1, 3]),
    "uneven, children cover the support": (TENTHS, TENTHS, [3, 0, 1]),
    "zeros and ties": (P, Q, [0, 5, 1]),
    "one-hot p": (np.eye(6)[4], Q, [4, 0, 5]),
}


@pytest.mark.parametrize("u", ENDS, ids=["u=0", "u=1-2^-53"])
def test_the_draw_helper_returns_an_index_of_positive_mass(u):
    for probs in (UNIFORM, P, np.eye(6)[3], np.array([5e-324, 0.0, 0.0]), np.array([0.0, 1e-310, 1e-310, 0.0]),
                  np.array([0.0, 0.5, 0.5 - 2 ** -53, 0.0, 0.0])):
        i = sample_categorical(probs, ConstantGenerator(u))
        assert 0 <= i < probs.size and probs[i] > 0, (probs, i)


def test_the_draw_helper_refuses_a_law_without_mass():
    with pytest.raises(ValueError, match="probs"):
        sample_categorical(np.zeros(4), ConstantGenerator(0.5))


def test_the_draw_helper_keeps_ordinary_draws():
    """The guard touches no ordinary uniform: the same index as the plain inverse CDF."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        probs = rng.dirichlet(np.full(7, 0.5))
        u = rng.random()
        expected = int(np.searchsorted(np.cumsum(probs), u * np.cumsum(probs)[-1], side="right"))
        assert sample_categorical(probs, ConstantGenerator(u)) == expected


@pytest.mark.parametrize("u", ENDS, ids=["u=0", "u=1-2^-53"])
@pytest.mark.parametrize("name", verifiers.names())
@pytest.mark.parametrize("case", list(CASES))
def test_every_node_verifier_emits_a_token_of_positive_mass(name, case, u):
    p, q, children = CASES[case]
    verifier = verifiers.get(name)
    plan = verifier.prepare(p, q, len(children))
    out = plan.sample(children, ConstantGenerator(u))
    assert 0 <= out < p.size, f"{name}: token {out} outside [0, {p.size})"
    assert plan.output_distribution(children)[out] > 0.0, f"{name}: token {out} has no mass in its output law"


def _tree(name, p, q, children):
    """A depth-2 tree of the case's children at the root and below its first child, drawn by a law
    the verifier is designed for (i.i.d. children for the i.i.d. verifiers; the lossy pairings the
    one-hot target makes for ``greedy`` are asked for)."""
    verifier = tree_verifiers.get(name, allow_lossy=True)
    node = getattr(verifier, "node", None)
    law = node.drafting if node is not None else Drafting.WITHOUT_REPLACEMENT
    table = NodeTable(ContextFreePair(p, q), (0,))
    return verifier, DraftTree(table, {(): tuple(children), (children[0],): tuple(children)}, drafting=law)


@pytest.mark.parametrize("u", ENDS, ids=["u=0", "u=1-2^-53"])
@pytest.mark.parametrize("name", tree_verifiers.names())
@pytest.mark.parametrize("case", list(CASES))
def test_every_tree_verifier_emits_a_token_of_positive_mass(name, case, u):
    verifier, tree = _tree(name, *CASES[case])
    path, token = verifier.verify(tree, ConstantGenerator(u))
    assert 0 <= token < tree.table.vocab_size, f"{name}: token {token} outside [0, {tree.table.vocab_size})"
    law = verifier.outcome_law(tree)
    assert path in law and law[path][token] > 0.0, f"{name}: ({path}, {token}) has no mass in the outcome law"


@pytest.mark.parametrize("u", ENDS, ids=["u=0", "u=1-2^-53"])
def test_the_one_hot_rule_at_the_boundary_of_the_issue(u):
    """Issue 28: p uniform on 10 tokens, children covering its support; the rule emitted id 10."""
    assert 0 <= verifiers.get("onehot").sample(UNIFORM, UNIFORM, list(range(10)), ConstantGenerator(u)) < 10
    table = NodeTable(ContextFreePair(UNIFORM, UNIFORM), (0,))
    tree = DraftTree(table, {(): tuple(range(10))}, drafting=Drafting.DETERMINISTIC)
    path, token = tree_verifiers.get("onehot").verify(tree, ConstantGenerator(u))
    assert len(path) == 1 and 0 <= token < 10
