"""Adding a node verifier is a change to its own module plus its test (issue 25, "Done when").

A small verifier is defined here, in the test file: SpecInfer run on the first ``j`` children only
(the first j of k i.i.d. children are j i.i.d. children, so it is lossless for i.i.d. drafting, and
has no closed-form acceptance of its own: the enumeration is its only method).  It is registered
through the declared registry (``simlab.verifiers.register``, removed again after each test), and
the generic law, losslessness and pairing tests of the suite are run on it as they stand: no
variants list, pairing list or name-keyed property list is edited for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import test_builders
import test_tree_lossless
import test_verifiers_exact
import test_verifiers_sampling
from simlab import tree_verifiers, verifiers
from simlab.drafting import Drafting
from simlab.verifiers.base import NodePlan, NodeVerifier
from simlab.verifiers.specinfer import SpecInfer
from variants import EDGE_CASES, SAMPLED_T, lossless_tree_names, node_variants


class _FirstChildrenPlan(NodePlan):
    """SpecInfer's plan for the first min(j, k) children; the later children are ignored."""

    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.inner = SpecInfer()._plan(p, q, min(k, verifier.j))

    def _law(self, children):
        return self.inner._law(children[: self.verifier.j])

    def _draw(self, children, rng):
        return self.inner._draw(children[: self.verifier.j], rng)


@dataclass(frozen=True)
class FirstChildrenSpecInfer(NodeVerifier):
    """SpecInfer on the first ``j`` children (a test-only verifier)."""

    name = "specinfer_first"
    label = "SpecInfer (first j)"
    divides_by_q = True  # SpecInfer's acceptance test divides by q at the children it reads
    j: int = 2

    def _plan(self, p, q, k):
        return _FirstChildrenPlan(self, p, q, k)


NAME = FirstChildrenSpecInfer.name


@pytest.fixture
def registered():
    """The test verifier, registered for one test and removed afterwards."""
    verifiers.register(FirstChildrenSpecInfer)
    try:
        yield verifiers.get(NAME)
    finally:
        verifiers.unregister(NAME)
    assert NAME not in tree_verifiers.names()


def test_registration_reaches_every_query(registered):
    assert any(v.name == NAME for v in node_variants())
    assert NAME in lossless_tree_names(Drafting.IID) and NAME not in lossless_tree_names(Drafting.DETERMINISTIC)
    assert tree_verifiers.paper_name(NAME) == "SpecInfer (first j)"
    assert not registered.prepare([0.5, 0.5], [0.5, 0.5], 2).has_formula()
    with pytest.raises(ValueError, match="no closed-form"):
        registered.acceptance_rate([0.5, 0.5], [0.5, 0.5], 2, method="formula")
    with pytest.raises(ValueError, match="already registered"):
        verifiers.register(FirstChildrenSpecInfer)


def test_it_is_a_different_rule_from_specinfer(registered):
    """With k = 3 > j the later child is ignored: the branch law differs from SpecInfer's."""
    p, q = np.array([0.6, 0.3, 0.1]), np.array([0.1, 0.3, 0.6])
    assert np.abs(registered.output_distribution(p, q, [2, 2, 0]) - SpecInfer().output_distribution(p, q, [2, 2, 0])).max() > 0.05


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_generic_node_law_tests(registered, case, k):
    test_verifiers_exact.test_lossless_edge_cases(registered, case, k)


def test_generic_random_law_and_acceptance_tests(registered):
    test_verifiers_exact.test_lossless_random(registered)
    test_verifiers_exact.test_acceptance_methods_agree(registered)


def test_generic_sampler_tests(registered):
    test_verifiers_sampling.test_sample_matches_output_distribution(registered)
    test_verifiers_sampling.test_drafted_then_verified_output_is_p(registered)
    test_verifiers_sampling.test_zero_target_child_is_never_accepted_at_u_zero(registered)


def test_generic_tree_losslessness_tests(registered):
    shapes = {**test_tree_lossless.IID_SHAPES, **test_tree_lossless.WOR_SHAPES}
    for law, names in (
        (Drafting.IID, test_tree_lossless.IID_SHAPES),
        (Drafting.WITHOUT_REPLACEMENT, test_tree_lossless.WOR_SHAPES),
    ):
        if NAME in lossless_tree_names(law):
            for shape in names:
                test_tree_lossless.test_first_three_tokens_have_the_target_law(NAME, shape)
    assert set(shapes) >= set(test_tree_lossless.IID_SHAPES)
    test_tree_lossless.test_temperature_zero_every_verifier_is_greedy_decoding(NAME)


def test_generic_pairing_tests(registered):
    """Every builder's trees: lossless pairings emit the target law, the others are refused with a
    positive exact bias (``tests/test_builders.py``), decided by the declarations alone."""
    paired = []
    for builder in test_builders.BUILDERS:
        if NAME in tree_verifiers.lossless_names(test_builders.BUILDERS[builder].laws, SAMPLED_T):
            paired.append(builder)
            for world in test_builders.WORLDS:
                test_builders.test_lossless_pairings_emit_the_target_law(world, builder, NAME)
        else:
            test_builders.test_lossy_pairings_are_refused_and_their_bias_is_positive(builder, NAME)
    assert "delayed" in paired and "eagle2" not in paired
