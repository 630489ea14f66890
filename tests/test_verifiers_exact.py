"""Exact losslessness and acceptance of every node verifier, by enumeration of the children."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks import applicable, check_acceptance, check_lossless, pairs
from variants import EDGE_CASES, edge_case, node_variants, variant_id
from simlab import verifiers
from simlab.otlp import optimal_acceptance

ALL = node_variants()
IDS = [variant_id(v) for v in ALL]


@pytest.mark.parametrize("verifier", ALL, ids=IDS)
@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_lossless_edge_cases(verifier, case, k):
    p, q = edge_case(case)
    if not applicable(verifier, q, k):  # too few tokens with q > 0 for the law's k distinct children
        with pytest.raises(ValueError, match="k"):
            verifier.prepare(p, q, k).acceptance_rate()
        return
    if not applicable(verifier, q, k, p):  # lossy, as declared: the greedy rule off a one-hot target, or a lossy rule
        if verifier.needs_greedy_target:
            assert verifier.output_distribution(p, q, np.flatnonzero(q > 0)[:1]).max() == 1.0
        else:
            assert not verifier.lossless_for
            check_acceptance(verifier, p, q, k)
        return
    check_lossless(verifier, p, q, k)
    check_acceptance(verifier, p, q, k)


@pytest.mark.parametrize("verifier", ALL, ids=IDS)
@given(pq=pairs(), k=st.integers(1, 3))
def test_lossless_random(verifier, pq, k):
    p, q = pq
    if not applicable(verifier, q, k, p):
        return
    check_lossless(verifier, p, q, k)


@pytest.mark.parametrize("verifier", ALL, ids=IDS)
@given(pq=pairs(), k=st.integers(1, 3))
def test_acceptance_methods_agree(verifier, pq, k):
    """The one test that every acceptance-rate method agrees where several exist (``check_acceptance``)."""
    p, q = pq
    if not applicable(verifier, q, k):
        return
    check_acceptance(verifier, p, q, k)


@given(pq=pairs())
def test_k1_reductions_equal_speculative_sampling(pq):
    """At k = 1 naive, spectr, specinfer, rrs_wor, khisti and optimal all are speculative sampling."""
    p, q = pq
    reference = verifiers.get("naive").prepare(p, q, 1)
    target = float(np.minimum(p, q).sum())
    assert abs(reference.acceptance_rate() - target) <= 1e-12
    for name in ("spectr", "specinfer", "rrs_wor", "khisti", "optimal"):
        plan = verifiers.get(name).prepare(p, q, 1)
        assert abs(plan.acceptance_rate() - target) <= 1e-9, name
        for x in np.flatnonzero(q > 0):
            np.testing.assert_allclose(plan.output_distribution([x]), reference.output_distribution([x]), atol=1e-9, err_msg=name)


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_p_equals_q_accepts_everything_but_nss(k):
    """... and but the rules that ignore q (onehot, exact_match, sglang_threshold, eagle_lenience:
    p(top-k) at default thresholds; greedy: argmax p in the top-k)."""
    rng = np.random.default_rng(3)
    p = rng.dirichlet(np.ones(5))
    for name in verifiers.names():
        alpha = verifiers.get(name).acceptance_rate(p, p, k)
        if name in ("nss", "exact_match", "onehot", "greedy", "sglang_threshold", "eagle_lenience"):
            assert alpha < 1.0 or (name == "greedy" and alpha == 1.0)
        else:
            assert abs(alpha - 1.0) <= 1e-9, (name, alpha)


@given(pq=pairs(), k=st.integers(1, 3))
def test_optimal_bounds_every_verifier(pq, k):
    p, q = pq
    best = verifiers.get("optimal").acceptance_rate(p, q, k)
    assert abs(best - optimal_acceptance(p, q, k)) <= 1e-7
    for name in ("nss", "naive", "spectr", "specinfer", "khisti"):
        assert verifiers.get(name).acceptance_rate(p, q, k) <= best + 1e-7, name
    if applicable(verifiers.get("rrs_wor"), q, k):
        best_wor = verifiers.get("optimal", replacement=False).acceptance_rate(p, q, k)
        assert verifiers.get("rrs_wor").acceptance_rate(p, q, k) <= best_wor + 1e-7


@given(pq=pairs(), k=st.integers(1, 3))
def test_khisti_lp_weights_reach_the_optimum(pq, k):
    p, q = pq
    alpha = verifiers.get("khisti", mode="lp").acceptance_rate(p, q, k)
    assert abs(alpha - optimal_acceptance(p, q, k)) <= 1e-7


@given(pq=pairs(max_vocab=7), k=st.integers(2, 4), s=st.integers(2, 4))
def test_guarded_khisti_truncation_never_loses_to_one_draft(pq, k, s):
    """The default truncated tournament accepts at least 1 - TV(p, q) = sum min(p, q), one draft's
    speculative sampling (exact acceptance by enumeration)."""
    p, q = pq
    one = float(np.minimum(p, q).sum())
    assert verifiers.get("khisti", mode="truncated", s=s).acceptance_rate(p, q, k) >= one - 1e-12


def test_the_unguarded_tail_rules_can_lose_to_one_draft():
    """The previous rule (champion wins, every round played) and the DDTE authors' rank rule fall below
    one draft on a fixed instance; the guarded rule does not, and at k = 2 with s covering the
    support the truncated round is the full LP (alpha*)."""
    p = np.array([0.13, 0.36, 0.09, 0.03, 0.39])
    q = np.array([0.14, 0.47, 0.17, 0.22, 0.0])
    one = float(np.minimum(p, q).sum())
    for tail in ("champion", "rank"):
        assert verifiers.get("khisti", mode="truncated", s=2, tail=tail).acceptance_rate(p, q, 4) < one - 0.01, tail
    assert verifiers.get("khisti", mode="truncated", s=2).acceptance_rate(p, q, 4) >= one - 1e-12
    assert abs(verifiers.get("khisti", mode="truncated", s=5).acceptance_rate(p, q, 2) - optimal_acceptance(p, q, 2)) <= 1e-9


def test_spectr_four_step_rho_is_valid_and_below_the_optimum():
    """The audit convention's rho equals a direct four-halving search, lies in [rho*, k], and never
    raises the probability that a child passes its test (p_acc); the acceptance alpha, which also
    counts corrections that land on a rejected child, can move either way (a finding)."""
    from simlab.verifiers.spectr import optimal_rho

    rng = np.random.default_rng(3)
    for _ in range(40):
        V, k = int(rng.integers(3, 9)), int(rng.integers(2, 5))
        p, q = rng.dirichlet(np.ones(V) * 0.5), rng.dirichlet(np.ones(V) * 0.5)
        beta = lambda r: float(np.minimum(q, p / r).sum())
        g = lambda r: 1 - (1 - beta(r)) ** k - r * beta(r)
        lo, hi = 1.0, float(k)
        if g(1.0) > 1e-15:
            for _ in range(4):
                lo, hi = (lo, (lo + hi) / 2) if g((lo + hi) / 2) <= 0 else ((lo + hi) / 2, hi)
        else:
            hi = 1.0
        plan = verifiers.get("spectr", rho="four_step").prepare(p, q, k)
        assert abs(plan.rho - hi) <= 1e-12 and optimal_rho(p, q, k) <= plan.rho + 1e-12
        assert plan.p_acc <= verifiers.get("spectr").prepare(p, q, k).p_acc + 1e-12


def test_published_closed_forms():
    """NSS, NaiveTree, SpecInfer closed forms on a hand-checked instance (verifiers.md Sec. 4)."""
    p = np.array([1 / 3, 1 / 3, 1 / 3])
    q = np.array([1 / 3, 1 / 6, 1 / 2])
    assert verifiers.get("nss").acceptance_rate(p, q, 1) == pytest.approx(1 / 3, abs=1e-15)
    # NaiveTree at k=2: sum min(p,q) + (p-q)_+ . (1 - (1-q)) = 5/6 + (1/6)(1/6)
    assert verifiers.get("naive").acceptance_rate(p, q, 2) == pytest.approx(5 / 6 + 1 / 36, abs=1e-15)
    # SpecInfer at k=2: 1 - TV(p, q) TV(res, q) with res = (0, 1, 0): 1 - (1/6)(5/6)
    assert verifiers.get("specinfer").acceptance_rate(p, q, 2) == pytest.approx(1 - 5 / 36, abs=1e-15)


def test_acceptance_rate_method_is_checked():
    p, q = np.array([0.6, 0.4]), np.array([0.8, 0.2])
    with pytest.raises(ValueError, match="^method: "):
        verifiers.get("nss").acceptance_rate(p, q, 2, method="exact")
    with pytest.raises(ValueError, match="^method: khisti has no closed-form"):
        verifiers.get("khisti").acceptance_rate(p, q, 2, method="formula")
    with pytest.raises(ValueError, match="^rng: "):
        verifiers.get("khisti").acceptance_rate(p, q, 2, method="enumerate", rng=np.random.default_rng(0))
    # "auto" with an rng enumerates while at most exact_tuples child tuples exist: the exact value
    exact = verifiers.get("khisti").acceptance_rate(p, q, 2, method="enumerate")
    assert verifiers.get("khisti").acceptance_rate(p, q, 2, rng=np.random.default_rng(0)) == exact


def test_the_auto_estimate_agrees_with_the_enumeration():
    """Beyond ``exact_tuples`` child tuples, ``method="auto"`` with an rng averages the exact
    P(output in set(x) | x) over sampled children: a mean of n = 4000 values in [0, 1], so by
    Hoeffding P(|estimate - alpha| > 0.06) <= 2 exp(-2 n 0.06^2) < 1e-12 (false alarm), and any
    bias above 0.12 fails with probability > 1 - 1e-12 (power)."""

    class Estimated(verifiers.Khisti):
        exact_tuples = 0

    p, q = np.array([0.5, 0.2, 0.2, 0.1]), np.array([0.1, 0.2, 0.3, 0.4])
    exact = verifiers.get("khisti").acceptance_rate(p, q, 3, method="enumerate")
    estimate = Estimated().acceptance_rate(p, q, 3, rng=np.random.default_rng(5), samples=4000)
    assert estimate != exact and abs(estimate - exact) <= 0.06
