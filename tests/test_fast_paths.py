"""Every fast path agrees with a plain reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.distributions import residual
from simlab.drafting import hit_probability
from simlab.verifiers import get
from simlab.verifiers.khisti import _top_s
from simlab.verifiers.spectr import _p_acc, optimal_rho


def plain_bisection_rho(p, q, k, tol=1e-12):
    def g(rho):
        beta = np.minimum(q, p / rho).sum()
        return _p_acc(beta, k) - rho * beta

    lo, hi = 1.0, float(k)
    if k == 1 or g(lo) <= 8 * np.finfo(float).eps:
        return 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if g(mid) <= 0 else (mid, hi)
    return hi


def random_pairs(count, seed):
    rng = np.random.default_rng(seed)
    for i in range(count):
        vocab = int(rng.integers(2, 300))
        p, q = rng.dirichlet(np.full(vocab, 0.3)), rng.dirichlet(np.full(vocab, 0.3))
        if i % 4 == 0:
            q[rng.integers(vocab)] = 0.0
            q /= q.sum()
        yield p, q, int(rng.integers(1, 7))


def test_spectr_rho_matches_plain_bisection():
    for p, q, k in random_pairs(300, seed=1):
        assert optimal_rho(p, q, k) == pytest.approx(plain_bisection_rho(p, q, k), abs=1e-9)


def test_spectr_rho_makes_the_residual_valid():
    for p, q, k in random_pairs(100, seed=2):
        rho = optimal_rho(p, q, k)
        beta = np.minimum(q, p / rho).sum()
        c = _p_acc(beta, k) / beta if beta > 0 else k
        assert c <= rho * (1 + 1e-12)


def test_specinfer_closed_form_chain_matches_iterated_residuals():
    for p, q, k in random_pairs(100, seed=3):
        plan = get("specinfer").prepare(p, q, k)
        current = p
        tokens = np.arange(p.size)
        for trial in range(k):
            if plan.reject_all == 0.0:
                break
            np.testing.assert_allclose(plan.target_at(trial, tokens), current, atol=1e-12)
            current = residual(current, q)
        else:
            np.testing.assert_allclose(plan.final, current, atol=1e-12)


def test_hit_probability_matches_the_formula():
    q = np.random.default_rng(4).dirichlet(np.ones(50))
    for n in range(8):
        np.testing.assert_allclose(hit_probability(q, n), 1 - (1 - q) ** n, atol=1e-15)


def test_top_s_matches_a_stable_sort():
    rng = np.random.default_rng(5)
    for _ in range(50):
        vocab = int(rng.integers(6, 100))
        p, c, q = (rng.dirichlet(np.ones(vocab)) for _ in range(3))
        p[: vocab // 3] = p[0]  # ties
        key = p - c * q
        expected = np.argsort(-key, kind="stable")[:5]
        assert _top_s(p, c, q, 5).tolist() == expected.tolist()
