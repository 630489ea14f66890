"""The OT LP (cvxpy) against the closed-form optimum (sorted-ratio scan)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simlab.drafting import Drafting, tuple_probability
from simlab.otlp import optimal_acceptance, solve_ot_lp
from test_verifiers_exact import pairs


@given(pq=pairs(), k=st.integers(1, 3), replacement=st.booleans())
def test_lp_equals_closed_form(pq, k, replacement):
    p, q = pq
    if not replacement and k > np.count_nonzero(q):
        return
    solution = solve_ot_lp(p, q, k, replacement=replacement)
    closed = optimal_acceptance(p, q, k, replacement=replacement)
    assert abs(solution.value - closed) <= 1e-7
    assert abs(solution.acceptance - closed) <= 1e-7
    np.testing.assert_allclose(solution.coupling.sum(axis=0), p, atol=1e-12)
    np.testing.assert_allclose(solution.coupling.sum(axis=1), solution.tuple_probs, atol=1e-12)
    assert solution.coupling.min() >= 0


@given(pq=pairs(), replacement=st.booleans())
def test_k1_is_sum_min(pq, replacement):
    p, q = pq
    assert optimal_acceptance(p, q, 1, replacement) == pytest.approx(np.minimum(p, q).sum(), abs=1e-12)
    assert solve_ot_lp(p, q, 1, replacement).value == pytest.approx(np.minimum(p, q).sum(), abs=1e-7)


@given(pq=pairs(max_vocab=5), k=st.integers(1, 3), replacement=st.booleans())
def test_closed_form_is_the_minimum_over_all_subsets(pq, k, replacement):
    """The prefix scan equals the brute-force minimum over all 2^V token subsets H."""
    p, q = pq
    if not replacement and k > np.count_nonzero(q):
        return
    drafting = Drafting.IID if replacement else Drafting.WITHOUT_REPLACEMENT
    vocab = p.size
    best = 1.0
    for size in range(vocab + 1):
        for subset in itertools.combinations(range(vocab), size):
            inside = list(subset)
            if replacement:
                all_in = q[inside].sum() ** k
            else:
                tuples = np.array(list(itertools.permutations(inside, k)), dtype=np.int64).reshape(-1, k)
                all_in = tuple_probability(q, tuples, drafting).sum() if len(tuples) else 0.0
            best = min(best, p[inside].sum() + 1 - all_in)
    assert optimal_acceptance(p, q, k, replacement) == pytest.approx(max(best, 0.0), abs=1e-12)


def test_two_drafts_known_value():
    """Khisti et al. K = 2: alpha* = 1 iff p(S) >= q(S)^2 for every S; here uniform p, q."""
    u = np.full(4, 0.25)
    assert optimal_acceptance(u, u, 2) == pytest.approx(1.0)
    p = np.array([0.9, 0.1])
    q = np.array([0.1, 0.9])
    # H = {1}: p(H) + 1 - q(H)^2 = 0.1 + 1 - 0.81 = 0.29
    assert optimal_acceptance(p, q, 2) == pytest.approx(0.29)
