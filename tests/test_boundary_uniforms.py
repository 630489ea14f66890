"""Every sampler at the ends of the uniform's range: U = 0 and U = 1 - 2^-53 (the largest float
below 1), injected through a Generator whose uniforms are all that value (``checks.ConstantGenerator``).

At either end every sampler must emit a token id in [0, V) of positive mass under the exact law
it samples (``output_distribution`` for a node verifier, ``outcome_law`` for a tree verifier):
the draws go through one inverse-CDF helper, ``simlab.distributions.sample_categorical``, whose
guard is tested here directly too (its planted faults: tests/mutants.py ``DRAW_MUTANTS``).  The
verifiers come from the registries (``simlab.verifiers.names``, ``simlab.tree_verifiers.names``),
so a new one is covered.  The batched torch engine (``simlab.batched``) draws nothing: it
computes exact masses.  Deterministic: no statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

from checks import BOUNDARY_CASES, BOUNDARY_UNIFORMS, ConstantGenerator, check_boundary_uniforms, check_draw_helper
from simlab import tree_verifiers, verifiers
from simlab.distributions import inverse_cdf, sample_categorical
from simlab.drafting import Drafting
from simlab.pairs import ContextFreePair
from simlab.trees import DraftTree, NodeTable

ENDS = pytest.mark.parametrize("u", BOUNDARY_UNIFORMS, ids=["u=0", "u=1-2^-53"])
UNIFORM = np.full(10, 0.1)  # the issue-28 case: children covering p's support at V = 10


def test_the_draw_helper_returns_an_index_of_positive_mass():
    check_draw_helper(sample_categorical)
    check_draw_helper(lambda probs, rng: inverse_cdf(np.cumsum(probs), rng))  # the form for a kept cdf


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


@pytest.mark.parametrize("name", verifiers.names())
def test_every_node_verifier_emits_a_token_of_positive_mass(name):
    check_boundary_uniforms(verifiers.get(name))


def _tree(name, p, q, children):
    """A depth-2 tree of the case's children at the root and below its first child, drawn by the law
    the verifier's node rule is designed for (without replacement for the whole-tree verifiers);
    pairings the case makes lossy (greedy at a target that is not one-hot) are asked for."""
    verifier = tree_verifiers.get(name, allow_lossy=True)
    node = getattr(verifier, "node", None)
    law = node.drafting if node is not None else Drafting.WITHOUT_REPLACEMENT
    table = NodeTable(ContextFreePair(p, q), (0,))
    return verifier, DraftTree(table, {(): tuple(children), (children[0],): tuple(children)}, drafting=law)


@ENDS
@pytest.mark.parametrize("name", tree_verifiers.names())
@pytest.mark.parametrize("case", list(BOUNDARY_CASES))
def test_every_tree_verifier_emits_a_token_of_positive_mass(name, case, u):
    verifier, tree = _tree(name, *BOUNDARY_CASES[case])
    path, token = verifier.verify(tree, ConstantGenerator(u))
    assert 0 <= token < tree.table.vocab_size, f"{name}: token {token} outside [0, {tree.table.vocab_size})"
    law = verifier.outcome_law(tree)
    assert path in law and law[path][token] > 0.0, f"{name}: ({path}, {token}) has no mass in the outcome law"


@ENDS
def test_the_one_hot_rule_at_the_boundary_of_the_issue(u):
    """Issue 28: p uniform on 10 tokens, children covering its support; the rule emitted id 10."""
    assert 0 <= verifiers.get("onehot").sample(UNIFORM, UNIFORM, list(range(10)), ConstantGenerator(u)) < 10
    table = NodeTable(ContextFreePair(UNIFORM, UNIFORM), (0,))
    tree = DraftTree(table, {(): tuple(range(10))}, drafting=Drafting.DETERMINISTIC)
    path, token = tree_verifiers.get("onehot").verify(tree, ConstantGenerator(u))
    assert len(path) == 1 and 0 <= token < 10


def test_token_id_checks_agree_on_plain_and_numpy_ints():
    """``check_token_ids``' plain-int fast path returns and refuses what the general path does."""
    import numpy as np
    import pytest

    from simlab.checks import check_token_ids

    ids = [3, 0, 7, 7]
    assert check_token_ids(ids, 8) == check_token_ids(np.array(ids), 8) == (3, 0, 7, 7)
    assert all(type(t) is int for t in check_token_ids(np.array(ids), 8))
    for bad in ([3, 8], [-1, 2]):
        for form in (bad, np.array(bad)):
            with pytest.raises(ValueError, match=rf"^context: token id {[t for t in bad if not 0 <= t < 8][0]} is outside"):
                check_token_ids(form, 8)
    with pytest.raises(ValueError, match="^context: token ids must be integers"):
        check_token_ids([1, True], 8)
