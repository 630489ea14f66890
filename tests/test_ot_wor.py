"""A mixture of priority orders for children drafted without replacement (simlab.verifiers.ot_wor).

Losslessness by enumeration, the G-tests of its sampler, its tree lifting and its planted faults
run through the generic files (test_verifiers_exact.py, test_verifiers_sampling.py,
test_tree_lossless.py, test_mutants.py).  Here: it reaches alpha* on small supports (the column
generation), its acceptance lies between its selected child's and alpha* at real vocabularies
(the conditional gradient), the exact line search, and its options.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_ot_walk import EDGE

from simlab import verifiers
from simlab.drafting import Drafting, draw_children
from simlab.otlp import optimal_acceptance
from simlab.verifiers import ot_wor
from simlab.verifiers.ot_wor import _line_search


def _instances(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for trial in range(count):
        vocab = int(rng.integers(3, 8))
        k = int(rng.integers(1, min(vocab, 4) + 1))
        p = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0)))
        q = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0))) ** (3 if trial % 3 == 0 else 1)
        yield p, q / q.sum(), k


def test_reaches_alpha_star_on_small_supports():
    """120 fixed instances (V = 3..7, k = 1..4, a third with sharpened q): certified (gap 1e-10),
    the enumerated acceptance equal to alpha* (1e-9) and alpha* equal to the closed form (1e-12)."""
    for p, q, k in _instances(120, 3):
        plan = verifiers.get("ot_wor").prepare(p, q, k)
        assert plan.certified, (p, q, k, plan.gap)
        assert abs(plan.acceptance_rate("enumerate") - plan.alpha_star) <= 1e-9
        assert abs(plan.alpha_star - optimal_acceptance(p, q, k, replacement=False)) <= 1e-12
        assert abs(plan.weights.sum() - 1.0) <= 1e-15 and plan.weights.min() > 0.0


@pytest.mark.parametrize("zeros", [0, 3])
def test_vertex_order_equals_the_lexsort(zeros):
    """The priority order of a vertex (prices ascending, p/q within ties; the last ranked highest)
    as built without a sort (the p/q order inverted from its ranks, a stable partition for 0/1
    prices) equals the two-key lexsort it replaces, with ties in p/q and tokens with q = 0; the
    planted fault (the partition's groups swapped) differs."""
    rng = np.random.default_rng(zeros)
    p = rng.dirichlet(np.ones(40))
    q = rng.dirichlet(np.ones(40))
    q[:zeros] = 0.0
    q[10:14] = p[10:14] * q[20] / p[20]  # ties in p/q
    q /= q.sum()
    plan = verifiers.get("ot_wor").prepare(p, q, 2)
    support = np.flatnonzero(q > 0)
    ratio_rank = np.empty(support.size, dtype=np.int64)
    ratio_rank[np.argsort(p[support] / q[support], kind="stable")] = np.arange(support.size)
    for prices in (None, (rng.random(40) < 0.5).astype(float), rng.random(40).round(1)):
        keys = (ratio_rank,) if prices is None else (ratio_rank, prices[support])
        expected = support[np.lexsort(keys)]
        _, rank, _ = plan._vertex(support, ratio_rank, prices)
        order = np.empty(support.size, dtype=np.int64)
        order[rank[support]] = support
        np.testing.assert_array_equal(order, expected)
        if prices is not None and set(np.unique(prices)) == {0.0, 1.0}:
            swapped = np.concatenate((expected[prices[expected] == 1.0], expected[prices[expected] == 0.0]))
            assert not np.array_equal(swapped, expected)  # the check tells the fault apart


def _tiled(p, q, copies, seed=0):
    """``copies`` scaled copies of a small instance side by side (its ties, zeros and tiny masses
    at many scales), renormalised: a support above the enumeration."""
    scale = np.random.default_rng(seed).uniform(0.5, 2.0, size=(copies, 1))
    big_p, big_q = (np.asarray(p, dtype=np.float64) * scale).ravel(), (np.asarray(q, dtype=np.float64) * scale[::-1]).ravel()
    return big_p / big_p.sum(), big_q / big_q.sum()


def _orders_agree(p, q, k):
    """Each order's selection law (the p/q order and a Frank-Wolfe 0/1 order) by the fast
    containments equals the reference's (the clocks to relative accuracy) to 1e-12, and so does
    alpha*; returns the fast plan."""
    fast = ot_wor.OTWithoutReplacement().prepare(p, q, k)
    slow = ot_wor.OTWithoutReplacement(containment="reference").prepare(p, q, k)
    assert abs(fast.alpha_star - slow.alpha_star) <= 1e-12
    support = np.flatnonzero(q > 0)
    ratio_rank = np.empty(support.size, dtype=np.int64)
    ratio_rank[np.argsort(p[support] / q[support], kind="stable")] = np.arange(support.size)
    for prices in (None, (np.random.default_rng(1).random(p.size) < 0.5).astype(float)):
        law_fast, rank_fast, _ = fast._vertex(support, ratio_rank, prices)
        law_slow, rank_slow, _ = slow._vertex(support, ratio_rank, prices)
        np.testing.assert_array_equal(rank_fast, rank_slow)
        np.testing.assert_allclose(law_fast, law_slow, atol=1e-12, rtol=0)
    return fast


EDGE_CASES = {name: EDGE[name] for name in list(EDGE)[:7]}
"""test_ot_walk's edge cases but its last (a draft token of p = 0): p == q, one-hot p and q, disjoint
supports, q = 0 < p, tiny masses, ties in p/q."""


@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("k", [2, 3])
def test_fast_containments_equal_the_reference(case, k):
    """p == q, one-hot p or q, disjoint supports, q = 0 < p, tiny masses, ties, each on 200 scaled
    copies (above the enumeration): the closed form (k = 2) and the clocks to absolute accuracy
    (k = 3) give every order's law to 1e-12 of the clocks to relative accuracy.  (The climbs
    themselves may part: which tokens are below p after a step moves with the last ulp.)"""
    p, q = _tiled(*EDGE_CASES[case], 200)
    plan = _orders_agree(p, q, k)
    assert plan.containment_method == ("pairs" if k == 2 else "clocks") and plan.containment_absolute == (k > 2)


def test_the_containment_check_catches_a_planted_fault(monkeypatch):
    """Planted fault: the fast containments off by 1e-10 at one prefix; the check above must fail."""
    p, q = _tiled(*EDGE_CASES["p == q"], 100)
    plain = ot_wor.prefix_containment

    def faulty(q_ordered, k, method="clocks", **options):
        out = plain(q_ordered, k, method=method, **options)
        if method == "pairs":
            out[out.size // 2] += 1e-10
        return out

    monkeypatch.setattr(ot_wor, "prefix_containment", faulty)
    ot_wor.PLAN_CACHE.clear()
    with pytest.raises(AssertionError):
        _orders_agree(p, q, 2)
    ot_wor.PLAN_CACHE.clear()


def test_real_vocabulary_bounds():
    """V = 3,000 (above the column generation's limit): the selection law is the mixture of the
    orders' laws and a law; sum min(mu, p) <= alpha*, above one order's and within 0.02 of alpha*;
    the acceptance over 64 drafted tuples (exact given each tuple) is at least the selected child's
    (a correction token that is a child counts too) minus the estimate's noise."""
    rng = np.random.default_rng(4)
    z = 2.0 * rng.standard_normal(3000)
    p = np.exp(z - z.max())
    p /= p.sum()
    q = np.exp(z + 0.7 * rng.standard_normal(z.size))
    q /= q.sum()
    for k in (2, 4):
        plan = verifiers.get("ot_wor").prepare(p, q, k)
        one = verifiers.get("ot_wor", rounds=1).prepare(p, q, k)
        assert plan.mu.min() >= 0.0 and abs(plan.mu.sum() - 1.0) <= 1e-12
        assert one.value - 1e-12 <= plan.value <= plan.alpha_star + 1e-12 and plan.gap <= 0.02
        assert plan.alpha_star == pytest.approx(optimal_acceptance(p, q, k, replacement=False), abs=1e-12)
        tuples = [draw_children(q, k, Drafting.WITHOUT_REPLACEMENT, rng) for _ in range(64)]
        laws = [plan.output_distribution(x) for x in tuples]
        assert all(abs(law.sum() - 1.0) <= 1e-12 and law.min() >= 0.0 for law in laws)
        accepted = np.mean([law[x].sum() for law, x in zip(laws, tuples)])
        assert accepted >= plan.value - 0.05


def test_line_search_is_the_maximum_along_the_segment():
    """The breakpoint scan against a grid of 20,001 steps on random vectors (the grid can only be lower)."""
    rng = np.random.default_rng(5)
    grid = np.linspace(0.0, 1.0, 20_001)
    for _ in range(50):
        p, mu, law = (rng.dirichlet(np.ones(12)) for _ in range(3))
        f = lambda s: np.minimum(mu + s * (law - mu), p).sum()  # noqa: E731
        s = _line_search(mu, law, p)
        assert 0.0 <= s <= 1.0
        assert f(s) >= max(f(g) for g in grid) - 1e-12


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"rounds": 0}, r"^rounds: "),
        ({"rounds": 2.5}, r"^rounds: "),
        ({"tol": -1.0}, r"^tol: "),
        ({"tol": float("nan")}, r"^tol: "),
        ({"tol": True}, r"^tol: "),
        ({"tol": 2.0}, r"^tol: "),
        ({"lp": "simplex"}, r"^lp: "),
    ],
)
def test_bad_options_name_the_argument(options, match):
    with pytest.raises(ValueError, match=match):
        verifiers.get("ot_wor", **options)


def test_needs_k_tokens_and_distinct_children():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.6, 0.4, 0.0])
    with pytest.raises(ValueError, match=r"^k: 3 children drafted without replacement"):
        verifiers.get("ot_wor").prepare(p, q, 3)
    with pytest.raises(ValueError, match=r"^children: "):
        verifiers.get("ot_wor").output_distribution(p, q, [0, 0])


def test_frank_wolfe_path_is_lossless(monkeypatch):
    """With the column generation off (limit 0) small instances take the Frank-Wolfe path: still
    lossless by enumeration (1e-12), its gap reported, its enumerated acceptance within [value, alpha*]."""
    from simlab.drafting import child_tuples

    monkeypatch.setattr(ot_wor, "LP_BELOW", 0)
    for p, q, k in _instances(40, 6):
        plan = verifiers.get("ot_wor").prepare(p, q, k)
        tuples, probs = child_tuples(q, k, Drafting.WITHOUT_REPLACEMENT)
        marginal = sum(prob * plan.output_distribution(x) for x, prob in zip(tuples, probs))
        assert np.abs(marginal - p).max() <= 1e-12
        accepted = plan.acceptance_rate("enumerate")
        assert plan.value - 1e-12 <= accepted <= plan.alpha_star + 1e-12 and plan.gap >= -1e-15


def _fresh(p, q, k, **options):
    """The plan computed from scratch (the cache emptied first)."""
    ot_wor.PLAN_CACHE.clear()
    return verifiers.get("ot_wor", **options).prepare(p, q, k)


def _same_plan(a, b) -> bool:
    return (
        a.alpha_star == b.alpha_star
        and a.value == b.value
        and a.excess == b.excess
        and np.array_equal(a.mu, b.mu)
        and np.array_equal(a.accept, b.accept)
        and np.array_equal(a.weights, b.weights)
        and np.array_equal(a.ranks, b.ranks)
    )


def test_plan_cache_hit_is_the_computed_plan():
    """A node law met again (a new array, equal values) reuses its plan: bit for bit the plan computed
    from scratch, with the caller's own p and q; its law set by ``prepare`` stays its own, and the kept
    arrays are read-only (no caller can change another's plan)."""
    for p, q, k in _instances(12, 8):
        fresh = _fresh(p, q, k)
        again = verifiers.get("ot_wor").prepare(p.copy(), q.copy(), k, Drafting.MIXED)
        assert ot_wor.PLAN_CACHE.hits == 1 and ot_wor.PLAN_CACHE.misses == 1
        assert _same_plan(fresh, again) and again is not fresh
        assert again.law is Drafting.MIXED and fresh.law is Drafting.WITHOUT_REPLACEMENT
        x = draw_children(q, k, Drafting.WITHOUT_REPLACEMENT, np.random.default_rng(0))
        assert np.array_equal(fresh.output_distribution(x), again.output_distribution(x))
        with pytest.raises(ValueError):
            again.mu[0] = 0.5


def test_plan_cache_misses_on_another_law_k_or_option(monkeypatch):
    """Another p, q, k, verifier option or module setting computes its own plan (a miss each)."""
    p, q, _ = next(_instances(1, 9))
    q2 = q.copy()
    q2[[0, 1]] = q[[1, 0]]
    p2 = p.copy()
    p2[[0, 1]] = p[[1, 0]]
    for args, options in [((p2, q, 2), {}), ((p, q2, 2), {}), ((p, q, 1), {}), ((p, q, 2), {"rounds": 1})]:
        _fresh(p, q, 2)
        plan = verifiers.get("ot_wor", **options).prepare(*args)
        assert ot_wor.PLAN_CACHE.misses == 2 and ot_wor.PLAN_CACHE.hits == 0
        assert _same_plan(plan, _fresh(*args, **options))
    ot_wor.PLAN_CACHE.clear()
    verifiers.get("ot_wor").prepare(p, q, 2)
    monkeypatch.setattr(ot_wor, "LP_BELOW", 0)
    verifiers.get("ot_wor").prepare(p, q, 2)
    assert ot_wor.PLAN_CACHE.misses == 2 and ot_wor.PLAN_CACHE.hits == 0


def test_plan_cache_is_bounded_in_bytes(monkeypatch):
    """Past ``PLAN_CACHE_BYTES`` the least recently used plans go first; a plan larger than the bound is not kept."""
    instances = list(_instances(6, 10))
    ot_wor.PLAN_CACHE.clear()
    verifiers.get("ot_wor").prepare(*instances[0])
    one = ot_wor.PLAN_CACHE.bytes
    monkeypatch.setattr(ot_wor, "PLAN_CACHE_BYTES", 3 * one)
    for p, q, k in instances:
        verifiers.get("ot_wor").prepare(p, q, k)
        assert ot_wor.PLAN_CACHE.bytes <= 3 * one
    assert len(ot_wor.PLAN_CACHE) < len(instances)
    hits, misses = ot_wor.PLAN_CACHE.hits, ot_wor.PLAN_CACHE.misses
    verifiers.get("ot_wor").prepare(*instances[-1])  # the most recent: kept
    assert ot_wor.PLAN_CACHE.hits == hits + 1
    verifiers.get("ot_wor").prepare(*instances[0])  # the least recent: gone
    assert ot_wor.PLAN_CACHE.misses == misses + 1
    monkeypatch.setattr(ot_wor, "PLAN_CACHE_BYTES", 0)
    ot_wor.PLAN_CACHE.clear()
    verifiers.get("ot_wor").prepare(*instances[0])
    assert len(ot_wor.PLAN_CACHE) == 0 and ot_wor.PLAN_CACHE.bytes == 0


def _lp_instances(count: int, seed: int):
    """Small supports (V = 4..9, k = 2..4) whose column generation solves restricted LPs with
    contested tokens (about 2.4 a plan past the first)."""
    rng = np.random.default_rng(seed)
    for trial in range(count):
        vocab = int(rng.integers(4, 10))
        k = int(rng.integers(2, (4 if vocab <= 7 else 3) + 1))
        p = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0)))
        q = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0))) ** (3 if trial % 3 == 0 else 1)
        yield p, q / q.sum(), k


def _lp_paths_agree(count: int = 20) -> None:
    """Every plan by HiGHS called directly (``lp="highs"``) equals the plan through scipy's
    ``linprog`` (``lp="linprog"``): the same orders, weights and selection law to 1e-12."""
    for p, q, k in _lp_instances(count, 11):
        fast = ot_wor._OrdersPlan(ot_wor.OTWithoutReplacement(), p, q, k)
        slow = ot_wor._OrdersPlan(ot_wor.OTWithoutReplacement(lp="linprog"), p, q, k)
        assert fast.ranks.shape == slow.ranks.shape and np.array_equal(fast.ranks, slow.ranks), (p, q, k)
        np.testing.assert_allclose(fast.weights, slow.weights, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fast.mu, slow.mu, rtol=0, atol=1e-12)
        assert abs(fast.value - slow.value) <= 1e-12 and fast.alpha_star == slow.alpha_star


def test_highs_direct_equals_linprog(monkeypatch):
    """20 random small supports (48 restricted LPs with contested tokens): the direct HiGHS path
    gives linprog's plans (measured bit for bit here and on compare_builders' 451 plans of T = 1;
    asserted to 1e-12), and it does not go through linprog."""

    def refused(*args, **kwargs):
        raise AssertionError("lp='highs' called scipy's linprog")

    calls = []
    plain = ot_wor._highs_restricted
    monkeypatch.setattr(ot_wor, "_highs_restricted", lambda *args: calls.append(args[1].shape) or plain(*args))
    for p, q, k in _lp_instances(20, 11):
        with monkeypatch.context() as m:
            m.setattr(ot_wor, "linprog", refused)
            ot_wor._OrdersPlan(ot_wor.OTWithoutReplacement(), p, q, k)
    assert len(calls) >= 40 and all(c > 0 and m >= 2 for m, c in calls)
    _lp_paths_agree()


@pytest.mark.parametrize("fault", ["duals of the next row", "caps reversed", "weights ignored"])
def test_highs_direct_check_catches_planted_faults(monkeypatch, fault):
    """Planted faults in the direct path's model or its reading: the agreement check fails."""
    plain = ot_wor._highs_restricted

    def faulty(cost, mu, cap):
        if fault == "caps reversed":
            return plain(cost, mu, cap[::-1].copy())
        if fault == "weights ignored":
            weights, duals = plain(cost, mu, cap)
            return np.ones_like(weights), duals
        weights, duals = plain(cost, mu, cap)
        return weights, np.roll(duals, 1)

    monkeypatch.setattr(ot_wor, "_highs_restricted", faulty)
    with pytest.raises(AssertionError):
        _lp_paths_agree()


def test_highs_instance_follows_the_module_options(monkeypatch):
    """The thread's HiGHS instance carries ``TOLERANCES`` and ``LINPROG_OPTIONS``, and takes them
    again when a caller changes them (as ``linprog`` would, call by call)."""
    solver = ot_wor._highs_instance()
    assert solver.getOptionValue("primal_feasibility_tolerance")[1] == 1e-10
    assert solver.getOptionValue("simplex_strategy")[1] == 1 and solver.getOptionValue("presolve")[1] == "on"
    monkeypatch.setattr(ot_wor, "TOLERANCES", {**ot_wor.TOLERANCES, "primal_feasibility_tolerance": 1e-8})
    assert ot_wor._highs_instance() is solver and solver.getOptionValue("primal_feasibility_tolerance")[1] == 1e-8
    monkeypatch.undo()
    assert ot_wor._highs_instance().getOptionValue("primal_feasibility_tolerance")[1] == 1e-10
