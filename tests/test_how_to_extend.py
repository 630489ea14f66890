"""README's "How to extend", done: a builder and a metric added in this file exactly as it says,
registered for one test and removed after, and checked by the lab's own checks (issue 41, "Done when").

* **A node verifier**: ``tests/test_new_verifier.py`` adds one (``FirstChildrenSpecInfer``, through
  ``simlab.verifiers.register``) and runs the generic law, losslessness and pairing tests on it;
  here the public check a user runs, ``simlab.conformance``, is run on it too.
* **A builder**: ``ForkThenChain`` meets ``simlab.builders.base.Builder`` and declares its law and
  its example on the class; its entry in ``simlab.builders.REGISTRY`` is all that joins it to the
  builders' generic tests (``tests/test_builders.py``), run here as they stand: its declared law
  decides its lossless verifiers, each of which must emit the target's 3-token law exactly, and
  every other pairing must be refused with a positive exact bias.
* **A metric**: ``simlab.engine_metrics.register_metric`` adds a per-tree metric; computed on a
  small tree, averaged over roots and written as a column.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

import test_builders
from simlab import builders, conformance, engine_metrics, tree_verifiers, verifiers
from simlab.builders.base import enumerate_draws, sampler
from simlab.builders.cost import DraftCost, DraftForward
from simlab.drafting import Drafting
from simlab.pairs import ContextFreePair
from simlab.trees import DraftTree, NodeTable
from test_new_verifier import FirstChildrenSpecInfer
from variants import SAMPLED_T


# ---------------------------------------------------------------------------------------------
# A node verifier: tests/test_new_verifier.py adds it; the public check accepts it.


@pytest.fixture
def registered_verifier():
    verifiers.register(FirstChildrenSpecInfer)
    try:
        yield FirstChildrenSpecInfer
    finally:
        verifiers.unregister(FirstChildrenSpecInfer.name)


def test_the_new_verifier_passes_the_public_check(registered_verifier):
    report = conformance.assert_lossless(registered_verifier)
    assert report.lossless and report.laws == (Drafting.IID,) and report.bias <= 1e-12


@dataclass(frozen=True)
class _FirstChildAlways(FirstChildrenSpecInfer):
    """A planted fault: the same declarations, but the first child is emitted whatever p says."""

    name = "specinfer_first_always"

    def _plan(self, p, q, k):
        plan = super()._plan(p, q, k)
        plan._law = lambda children: np.eye(p.size)[children[0]]
        return plan


def test_the_public_check_refuses_a_lossy_one():
    with pytest.raises(AssertionError, match="exact bias"):
        conformance.assert_lossless(_FirstChildAlways)


# ---------------------------------------------------------------------------------------------
# A builder: one class and its REGISTRY entry.


@dataclass(frozen=True)
class ForkThenChain:
    """``fork`` distinct children drawn without replacement from q at the root, then below each a
    chain of ``depth - 1`` tokens, each drawn from q at its node (a test-only builder).

    Args:
        fork: children of the root, >= 1.
        depth: the tree's depth, >= 1.
    """

    fork: int = 2
    depth: int = 2
    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.WITHOUT_REPLACEMENT})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = False

    @property
    def budget(self) -> int:
        return self.fork * self.depth

    @classmethod
    def example(cls, vocab_size: int = 4) -> ForkThenChain:
        return cls(fork=2, depth=2)

    def _build(self, table: NodeTable, draw) -> DraftTree:
        table.fetch([()])
        left = table.q(()).copy()
        first = []
        for _ in range(self.fork):  # without replacement: each draw from q with the earlier ones removed
            token = draw(left)
            first.append(token)
            left[token] = 0.0
        children = {(): tuple(first)}
        tips = [(t,) for t in first]
        forwards = [DraftForward(1, 0)]
        for level in range(1, self.depth):
            table.fetch(tips)
            for tip in tips:
                children[tip] = (draw(table.q(tip)),)
            tips = [tip + children[tip] for tip in tips]
            forwards.append(DraftForward(len(tips), level))
        return DraftTree(table, children, Drafting.WITHOUT_REPLACEMENT, {}, DraftCost(tuple(forwards), self.budget)).fill()

    def sample(self, table: NodeTable, rng: np.random.Generator | None = None) -> DraftTree:
        return self._build(table, sampler(rng))

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        return enumerate_draws(lambda draw: self._build(table, draw))


BUILDER = "fork_then_chain"


@pytest.fixture
def registered_builder(monkeypatch):
    """The builder's REGISTRY entry for one test (and its example among test_builders' instances)."""
    monkeypatch.setitem(builders.REGISTRY, BUILDER, ForkThenChain)
    monkeypatch.setitem(test_builders.BUILDERS, BUILDER, builders.example(BUILDER))
    yield ForkThenChain
    monkeypatch.undo()
    assert BUILDER not in builders.names()


def test_the_builder_joins_every_query(registered_builder):
    assert BUILDER in builders.names() and builders.sampled(BUILDER) and not builders.parallel_draft(BUILDER)
    assert builders.get(BUILDER, depth=3).budget == 6
    test_builders.test_every_registered_builder_declares_its_laws_and_an_example(BUILDER)
    pair = test_builders.WORLDS["markov"]
    trees = list(builders.example(BUILDER).enumerate(NodeTable(pair, (0,))))
    assert sum(prob for _, prob in trees) == pytest.approx(1.0, abs=1e-12)
    assert all(tree.laws() <= builders.laws(BUILDER) and tree.tokens() == 4 for tree, _ in trees)


def test_the_builders_generic_pairing_tests(registered_builder):
    """Its declared law alone decides the verifiers it pairs with; each lossless one emits the
    target's 3-token law (1e-12), each other one is refused and biased (tests/test_builders.py)."""
    lossless = tree_verifiers.lossless_names(builders.laws(BUILDER), SAMPLED_T)
    assert {"rrs_wor", "traversal", "nss"} <= set(lossless) and "specinfer" not in lossless
    for verifier in lossless:  # the world with zeros and ties in p and q
        test_builders.test_lossless_pairings_emit_the_target_law("markov", BUILDER, verifier)
    for verifier in ("specinfer", "spectr"):
        test_builders.test_lossy_pairings_are_refused_and_their_bias_is_positive(BUILDER, verifier)


# ---------------------------------------------------------------------------------------------
# A metric: registered with simlab.engine_metrics.register_metric.


def nothing_accepted(masses, depth, eos) -> float:
    """P(tau = 0): the mass of the empty accepted path."""
    return float(masses.get((), 0.0))


@pytest.fixture
def registered_metric():
    engine_metrics.register_metric("nothing_accepted", nothing_accepted)
    try:
        yield "nothing_accepted"
    finally:
        engine_metrics.unregister_metric("nothing_accepted")


def _one_token_tree(p, q):
    """The top-1 draft token below the root, verified by the one-hot rule: P(tau = 0) = 1 - p(top)."""
    table = NodeTable(ContextFreePair(p, q), ())
    return builders.get("static", spec=[(0,)], children="topk").sample(table)


def test_the_metric_on_a_small_tree(registered_metric):
    onehot = tree_verifiers.get("onehot")
    first = engine_metrics.tree_metrics(_one_token_tree([0.6, 0.4], [0.8, 0.2]), onehot)
    second = engine_metrics.tree_metrics(_one_token_tree([0.1, 0.9], [0.3, 0.7]), onehot)
    assert first.extra == {registered_metric: pytest.approx(0.4, abs=1e-15)}
    assert second.extra[registered_metric] == pytest.approx(0.1, abs=1e-15)
    assert first.extra[registered_metric] == pytest.approx(1 - first.unconditional[0], abs=1e-15)
    both = engine_metrics.aggregate([first, second])
    assert both.extra[registered_metric] == pytest.approx(0.25, abs=1e-15)
    row = both.row()
    assert list(row)[:4] == [*engine_metrics.ENGINE_COLUMNS, registered_metric] and row[registered_metric] == 0.25


def test_metric_registration_is_checked_and_undone():
    before = engine_metrics.tree_metrics(_one_token_tree([0.6, 0.4], [0.8, 0.2]), tree_verifiers.get("onehot"))
    assert before.extra == {} and "nothing_accepted" not in before.row()
    for name, fn, argument in (
        ("accepted", nothing_accepted, "name"),
        ("not a name", nothing_accepted, "name"),
        ("extra", nothing_accepted, "name"),
        ("fine", 0.5, "fn"),
    ):
        with pytest.raises(ValueError, match=f"^{argument}: "):
            engine_metrics.register_metric(name, fn)
    with pytest.raises(ValueError, match="^name: "):
        engine_metrics.unregister_metric("nothing_accepted")
    engine_metrics.register_metric("nothing_accepted", nothing_accepted)
    try:
        with pytest.raises(ValueError, match="^name: "):
            engine_metrics.register_metric("nothing_accepted", nothing_accepted)
        with pytest.raises(ValueError, match="^metrics: with different registered metrics"):
            engine_metrics.aggregate(
                [before, engine_metrics.tree_metrics(_one_token_tree([0.6, 0.4], [0.8, 0.2]), tree_verifiers.get("onehot"))]
            )
    finally:
        engine_metrics.unregister_metric("nothing_accepted")
    assert engine_metrics.METRICS == {}
