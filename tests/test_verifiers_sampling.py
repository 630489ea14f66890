"""Each verifier's sampler runs the algorithm whose exact law output_distribution states.

Statistical design (stats.py): G-test, false-alarm probability 1e-6 per test, power >= 0.99
against any law at total variation >= 0.02; fixed seeds; N from ``stats.sample_size``.
"""

from __future__ import annotations

import numpy as np
import pytest

from checks import (
    check_sampler_end_to_end,
    check_sampler_given_children,
    check_zero_target_never_accepted,
    ConstantGenerator,
)
from simlab import verifiers
from stats import sample_size
from variants import node_variants, renames_another, variant_id

P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
SAMPLED = [v for v in node_variants() if not renames_another(v)]  # exact_match's sampler is NSS's (variants.py)
IDS = [variant_id(v) for v in SAMPLED]


def test_design_sample_size_is_the_stated_one():
    # 6 cells: df 5, critical value chi2.isf(1e-6, 5); power 0.99 at TV 0.02 needs about 42k draws.
    n = sample_size(6)
    assert 30_000 <= n <= 60_000


@pytest.mark.parametrize("verifier", SAMPLED, ids=IDS)
def test_sample_matches_output_distribution(verifier):
    children = [0, 3, 0] if verifier.drafting.value == "iid" else [0, 3, 1]
    check_sampler_given_children(verifier, P, Q, children, seed=11)


ONE_HOT_P = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


LOSSLESS = [v for v in SAMPLED if v.lossless_for]  # a declared-lossy rule's output is not p (tests/test_lossy_rules.py)


@pytest.mark.parametrize("verifier", LOSSLESS, ids=[variant_id(v) for v in LOSSLESS])
def test_drafted_then_verified_output_is_p(verifier):
    """Children from the verifier's own drafting law; the greedy rule on a greedy (one-hot) target."""
    check_sampler_end_to_end(verifier, ONE_HOT_P if verifier.needs_greedy_target else P, Q, 3, seed=12)


@pytest.mark.parametrize("verifier", SAMPLED, ids=IDS)
def test_zero_target_child_is_never_accepted_at_u_zero(verifier):
    check_zero_target_never_accepted(verifier)


def test_strict_acceptance_at_the_ratio():
    """u exactly equal to p(x)/q(x) rejects (the test is U < p/q with U in [0, 1))."""
    p, q = np.array([0.25, 0.75]), np.array([0.5, 0.5])
    plan = verifiers.get("naive").prepare(p, q, 1)
    assert plan.sample([0], ConstantGenerator(0.5)) == 1  # rejected: the residual is (0, 1)
    assert plan.sample([0], ConstantGenerator(0.4999999)) == 0


@pytest.mark.parametrize("name", verifiers.names())
def test_same_seed_same_output(name):
    plan = verifiers.get(name).prepare(P, Q, 2)
    draws = [[plan.sample([0, 1], rng) for _ in range(200)] for rng in (np.random.default_rng(5), np.random.default_rng(5))]
    assert draws[0] == draws[1]
