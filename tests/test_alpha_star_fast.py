"""alpha* with i.i.d. children: the fast path (one int64 key sort) against the plain reference
(stable argsort), the order of tied ratios, and planted faults in the fast path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from checks import pairs
from simlab import otlp
from simlab.otlp import optimal_acceptance

KS = (1, 2, 3, 4, 7, 8)
AGREE = 1e-12


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _cases():
    """(name, p, q): the input families the fast path must agree on with the reference."""
    rng = np.random.default_rng(44)
    out = []
    for vocab in (3, 50, 2_000):
        out.append((f"random {vocab}", _softmax(2.0 * rng.standard_normal(vocab)), _softmax(2.0 * rng.standard_normal(vocab))))
    # tied ratios: masses on a coarse grid (many equal p/q), and blocks where p = c q exactly
    for vocab in (8, 300):
        p = rng.integers(0, 4, vocab).astype(float) + 1.0
        q = rng.integers(0, 4, vocab).astype(float) + 1.0
        out.append((f"tied grid {vocab}", p / p.sum(), q / q.sum()))
    q = rng.dirichlet(np.ones(400))
    p = q.copy()
    p[:200] *= 0.5
    p[200:] *= (1.0 - p[:200].sum()) / p[200:].sum()
    out.append(("tied blocks", p, q))
    vocab = 64
    one = np.zeros(vocab)
    one[5] = 1.0
    out.append(("one-hot p", one, rng.dirichlet(np.ones(vocab))))
    out.append(("one-hot q", rng.dirichlet(np.ones(vocab)), one))
    out.append(("one-hot both", one, one))
    disjoint_p, disjoint_q = np.zeros(vocab), np.zeros(vocab)
    disjoint_p[:32] = rng.dirichlet(np.ones(32))
    disjoint_q[32:] = rng.dirichlet(np.ones(32))
    out.append(("disjoint", disjoint_p, disjoint_q))
    p = rng.dirichlet(np.ones(vocab))
    q = rng.dirichlet(np.ones(vocab))
    q[::3] = 0.0
    out.append(("q = 0 < p", p, q / q.sum()))
    same = rng.dirichlet(np.full(vocab, 0.3))
    out.append(("p == q", same, same.copy()))
    tiny_p = np.full(1_000, 1e-300)
    tiny_p[0] = 1.0 - 999e-300
    tiny_q = np.full(1_000, 1e-300)
    tiny_q[-1] = 1.0 - 999e-300
    out.append(("tiny masses", tiny_p, tiny_q))
    subnormal_q = rng.dirichlet(np.ones(vocab))
    subnormal_q[:4] = 5e-324  # p / q overflows to inf for these: they sort last
    out.append(("subnormal q", rng.dirichlet(np.ones(vocab)), subnormal_q / subnormal_q.sum()))
    return out


CASES = _cases()


def _prefix_minimum(p, q, k, order):
    """min over the prefixes of ``order`` (token ids with q > 0) of p(H) + 1 - q(H)^k, H = {} included."""
    p_prefix = np.concatenate(([0.0], np.cumsum(p[order])))
    q_prefix = np.minimum(np.concatenate(([0.0], np.cumsum(q[order]))), 1.0)
    return float(np.clip(np.min(p_prefix + 1.0 - q_prefix**k), 0.0, 1.0))


@pytest.mark.parametrize("name, p, q", CASES, ids=[c[0] for c in CASES])
def test_fast_equals_reference(name, p, q):
    for k in KS:
        fast = optimal_acceptance(p, q, k)
        reference = optimal_acceptance(p, q, k, method="reference")
        assert abs(fast - reference) <= AGREE, f"{name}, k = {k}: fast {fast!r}, reference {reference!r}"
        assert optimal_acceptance(p, q, k, method="fast") == fast


@given(pq=pairs(max_vocab=8), k=st.integers(1, 9))
def test_fast_equals_reference_on_generated_pairs(pq, k):
    p, q = pq
    assert abs(optimal_acceptance(p, q, k) - optimal_acceptance(p, q, k, method="reference")) <= AGREE


TIED = [c for c in CASES if "tied" in c[0] or "==" in c[0]]


@pytest.mark.parametrize("name, p, q", TIED, ids=[c[0] for c in TIED])
def test_value_does_not_depend_on_the_order_of_tied_ratios(name, p, q):
    """Every p/q-ascending order (ties shuffled, reversed, or by index as in the stable sort) gives
    the same minimum over prefixes (the docstring's concavity argument), and the fast path its value."""
    rng = np.random.default_rng(3)
    support = np.flatnonzero(q > 0)
    ratio = p[support] / q[support]
    assert np.unique(ratio).size < ratio.size  # the case has ties
    stable = support[np.argsort(ratio, kind="stable")]
    orders = [stable, support[np.lexsort((-support, ratio))]]
    orders += [support[np.lexsort((rng.permutation(support.size), ratio))] for _ in range(5)]
    for k in KS:
        values = [_prefix_minimum(p, q, k, order) for order in orders]
        assert max(values) - min(values) <= AGREE, f"{name}, k = {k}: {values}"
        assert abs(optimal_acceptance(p, q, k) - values[0]) <= AGREE


@pytest.mark.parametrize("name, p, q", CASES, ids=[c[0] for c in CASES])
def test_key_order_is_the_stable_order(name, p, q):
    """Where q > 0 the key sort gathers p and q exactly as the stable argsort of p/q does."""
    support = q > 0
    p, q = p[support], q[support]
    with np.errstate(over="ignore"):
        order = np.argsort(p / q, kind="stable")
    got_p, got_q = otlp._ratio_order(p, q)
    assert np.array_equal(got_p, p[order]) and np.array_equal(got_q, q[order])


def _near_ties(vocab=2_000, seed=5):
    """Ratios spread over 2^-20 relative (distinct, in random index order): with 40 index bits the
    keys keep only 12 of the ratio's mantissa bits, so most neighbours share a key prefix."""
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.ones(vocab))
    p = q * (1.0 + rng.random(vocab) * 2.0**-20)
    p[: vocab // 2] *= 0.5  # two blocks far apart, so the minimum is not at an end
    return p / p.sum(), q


def _orders_agree(p, q, bits_list=(None, 30, 40)):
    with np.errstate(over="ignore"):
        order = np.argsort(p / q, kind="stable")
    for bits in bits_list:
        got_p, got_q = otlp._ratio_order(p, q, bits=bits)
        if not (np.array_equal(got_p, p[order]) and np.array_equal(got_q, q[order])):
            return False
    return True


def test_repair_restores_the_exact_order_of_near_ties():
    assert _orders_agree(*_near_ties())


def _plant(monkeypatch, fault):
    """``optimal_acceptance``'s fast path with one planted fault."""
    original = otlp._ratio_order
    if fault == "prefix off by one":

        def broken(p, q, bits=None):
            got_p, got_q = original(p, q, bits)
            return np.concatenate(([0.0], got_p[:-1])), got_q  # p(H) lags q(H) by one token

    elif fault == "no repair":

        def broken(p, q, bits=None):
            bits = max(1, (p.size - 1).bit_length()) if bits is None else bits
            key = np.divide(p, q).view(np.int64) & np.int64(-(1 << bits)) | np.arange(p.size, dtype=np.int64)
            key = np.sort(key) & np.int64((1 << bits) - 1)
            return p[key], q[key]

    else:  # "power off"

        def broken(p, q, bits=None):
            got_p, got_q = original(p, q, bits)
            return got_p, np.sqrt(got_q)  # q(H)^(k/2) instead of q(H)^k

    monkeypatch.setattr(otlp, "_ratio_order", broken)


@pytest.mark.parametrize("fault", ["prefix off by one", "power off"])
def test_planted_value_faults_are_caught(fault, monkeypatch):
    """Each fault moves the fast value away from the reference by more than AGREE on the cases above."""
    _plant(monkeypatch, fault)
    worst = 0.0
    for _, p, q in CASES:
        for k in KS:
            worst = max(worst, abs(optimal_acceptance(p, q, k) - optimal_acceptance(p, q, k, method="reference")))
    assert worst > AGREE


def test_planted_order_fault_is_caught(monkeypatch):
    """Without the repair a coarse key misorders the near ties (the repair test's own check fails)."""
    _plant(monkeypatch, "no repair")
    assert not _orders_agree(*_near_ties())


def test_power_by_squaring():
    x = np.random.default_rng(1).random(1_000)
    for k in range(1, 20):
        np.testing.assert_allclose(otlp._power(x.copy(), k), x**k, rtol=k * 2.3e-16, atol=0)


def test_method_names():
    u = np.full(4, 0.25)
    assert optimal_acceptance(u, u, 2, method="reference") == optimal_acceptance(u, u, 2) == 1.0
    for bad in ("clocks", "stable", 1, 1.5):
        with pytest.raises(ValueError, match=r"^method: i\.i\.d\. children"):
            optimal_acceptance(u, u, 2, method=bad)


WOR_CASES = [c for c in CASES if np.count_nonzero(c[2]) >= 3 and c[2].size <= 2_000]


@pytest.mark.parametrize("name, p, q", WOR_CASES, ids=[c[0] for c in WOR_CASES])
def test_without_replacement_default_equals_the_plain_path(name, p, q):
    """The default (key sort; "pairs" for k <= 2, clocks above) against the stable argsort with the clocks."""
    for k in (1, 2, 3):
        fast = optimal_acceptance(p, q, k, replacement=False)
        plain = optimal_acceptance(p, q, k, replacement=False, method="clocks")
        assert abs(fast - plain) <= AGREE, f"{name}, k = {k}: {fast!r} against {plain!r}"


def _pair_inputs():
    rng = np.random.default_rng(11)
    out = [rng.dirichlet(np.full(n, a)) * s for n in (2, 3, 5, 8) for a in (0.2, 1.0, 5.0) for s in (1.0, 1e-300, 1e300)]
    out.append(np.array([1.0 - 3e-15, 1e-15, 1e-15, 1e-15]))  # a mass near 1: 1 - q_i from the others' sum
    out.append(np.array([1e10, 1e-290, 1e-290, 1.0]))  # the smallest masses the closed form takes
    out.append(np.full(6, 1 / 6))
    return out


def _pairs_error():
    from simlab.containment import prefix_containment

    return max(
        np.abs(prefix_containment(q, 2, method="pairs") - prefix_containment(q, 2, method="enumerate")).max()
        for q in _pair_inputs()
    )


def test_pairs_equals_enumeration():
    assert _pairs_error() <= 1e-15


@pytest.mark.parametrize("fault", ["i.i.d. square", "prefix off by one"])
def test_planted_pairs_faults_are_caught(fault, monkeypatch):
    from simlab import containment

    original = containment.pairs_containment

    def broken(q):
        out = original(q)
        if fault == "i.i.d. square":
            return np.cumsum(np.concatenate(([0.0], q))) ** 2 / q.sum() ** 2
        return np.concatenate(([0.0], out[:-1]))

    monkeypatch.setattr(containment, "pairs_containment", broken)
    assert _pairs_error() > 1e-9


def test_pairs_refuses_more_than_two_children():
    from simlab.containment import prefix_containment

    with pytest.raises(ValueError, match=r"^k: method='pairs'"):
        prefix_containment(np.full(5, 0.2), 3, method="pairs")
    with pytest.raises(ValueError, match=r"^k: method='pairs'"):
        optimal_acceptance(np.full(5, 0.2), np.full(5, 0.2), 3, replacement=False, method="pairs")


def test_pairs_refuses_masses_beyond_the_normal_range():
    """A mass below 2^-1022 of the largest would overflow q_i / (1 - q_i): "pairs" refuses it, and the
    default alpha* takes the clocks there (0.75: the case the clocks' log masses were written for)."""
    from simlab.containment import prefix_containment

    with pytest.raises(ValueError, match=r"^q_ordered: method='pairs' needs"):
        prefix_containment([1.0, 1.5e-323, 5e-324], 2, method="pairs")
    assert optimal_acceptance([0.2, 0.3, 0.5], [1.0, 1.5e-323, 5e-324], 2, replacement=False) == pytest.approx(0.75, abs=1e-13)


def _absolute_error():
    """Largest |F| difference of the clocks with ``absolute=True`` from the enumeration (V = 5..7,
    k = 2..4, sharpened q included) and from the default clocks (V = 3,000, k = 3, 4, 8)."""
    from simlab.containment import prefix_containment

    rng = np.random.default_rng(21)
    worst = 0.0
    for trial in range(24):
        vocab, k = 5 + trial % 3, 2 + trial % 3
        q = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0))) ** (3 if trial % 4 == 0 else 1)
        exact = prefix_containment(q, k, method="enumerate")
        worst = max(worst, np.abs(prefix_containment(q, k, absolute=True) - exact).max())
    q = _softmax(2.0 * rng.standard_normal(3_000))
    for k in (3, 4, 8):
        worst = max(worst, np.abs(prefix_containment(q, k, absolute=True) - prefix_containment(q, k)).max())
    return worst


def test_clocks_with_the_absolute_left_end():
    from simlab.containment import absolute_left

    assert _absolute_error() <= 2e-15
    # t0^(k + 1) / (k + 1)! = TAIL below the cap, and the cap from k = 9 on
    for k in (2, 3, 4, 8):
        t0 = absolute_left(k)
        assert t0 ** (k + 1) / math.factorial(k + 1) == pytest.approx(1e-18, rel=1e-9)
    assert absolute_left(9) == absolute_left(20) == 0.05


@pytest.mark.parametrize("fault", ["left end 100x later", "left lattice sum as a geometric series"])
def test_planted_absolute_left_faults_are_caught(fault, monkeypatch):
    """A grid started 100x later drops integrand mass above 1e-12; the left lattice sum taken as if
    u e^(-u) = u (true only at LEFT_T's u <= 1e-12) misplaces the density's remainder past the grid."""
    from simlab import containment

    if fault == "left end 100x later":
        original = containment.absolute_left
        monkeypatch.setattr(containment, "absolute_left", lambda k: 100.0 * original(k))
    else:
        original = containment._left_lattice
        monkeypatch.setattr(containment, "_left_lattice", lambda log_u0, step, series: original(log_u0, step, False))
    assert _absolute_error() > 1e-12


def test_absolute_is_a_flag():
    from simlab.containment import prefix_containment

    with pytest.raises(ValueError, match=r"^absolute: "):
        prefix_containment(np.full(5, 0.2), 3, absolute=1)


def _minimum_inputs():
    """(p, q) in p/q order: independent and close pairs, ties, a non-normalised q, V = 50..3,000."""
    rng = np.random.default_rng(31)
    out = []
    for vocab in (50, 3_000):
        p, q = _softmax(2.0 * rng.standard_normal(vocab)), _softmax(2.0 * rng.standard_normal(vocab))
        out.append((p, q))
        out.append((p, _softmax(np.log(p) + 0.7 * rng.standard_normal(vocab))))
    q = rng.dirichlet(np.ones(900)) * 7.0
    p = q.copy() / 7.0
    p[:450] *= 0.5
    out.append((p / p.sum(), q))
    ordered = []
    for p, q in out:
        order = np.argsort(p / q, kind="stable")
        ordered.append((p[order], q[order]))
    return ordered


def _minimum_error():
    from simlab.containment import prefix_containment, prefix_minimum

    worst = 0.0
    for p, q in _minimum_inputs():
        p_prefix = np.concatenate(([0.0], np.cumsum(p)))
        for k in (3, 4, 8):
            for absolute in (False, True):
                full = np.min(p_prefix + 1.0 - prefix_containment(q, k, absolute=absolute))
                worst = max(worst, abs(prefix_minimum(p, q, k, absolute=absolute) - full))
    return worst


def test_prefix_minimum_equals_the_minimum_over_every_prefix():
    """Finishing only the blocks whose bound can win gives the minimum over all of F's prefixes."""
    assert _minimum_error() <= 1e-14


@pytest.mark.parametrize("fault", ["bound from the block's own start", "no block finished", "the least bound's block dropped"])
def test_planted_pruning_faults_are_caught(fault, monkeypatch):
    from simlab import containment

    original = containment._blocks_to_finish
    if fault == "bound from the block's own start":

        def broken(p_prefix, first, at_start):  # P rises within the block but F does too: not a bound
            best = min(1.0, float(np.min(p_prefix[first] + 1.0 - at_start)), float(p_prefix[-1]))
            return np.flatnonzero(p_prefix[first + 1] + 1.0 - at_start <= best + 1e-13)

    elif fault == "no block finished":  # only the blocks' starts

        def broken(p_prefix, first, at_start):
            return np.zeros(0, dtype=np.int64)

    else:

        def broken(p_prefix, first, at_start):
            chosen = original(p_prefix, first, at_start)
            bound = p_prefix[first + 1] + 1.0 - np.append(at_start[1:], 1.0)
            return chosen[chosen != chosen[np.argmin(bound[chosen])]]

    monkeypatch.setattr(containment, "_blocks_to_finish", broken)
    assert _minimum_error() > 1e-12


def test_prefix_minimum_checks_its_arguments():
    from simlab.containment import prefix_minimum

    with pytest.raises(ValueError, match=r"^p_ordered: "):
        prefix_minimum(np.full(4, 0.25), np.full(5, 0.2), 3)
    with pytest.raises(ValueError, match=r"^p_ordered: "):
        prefix_minimum([0.5, -0.1, 0.6], [0.2, 0.3, 0.5], 2)
    with pytest.raises(ValueError, match=r"^q_ordered: "):
        prefix_minimum([0.5, 0.5], [0.0, 1.0], 1)
    with pytest.raises(ValueError, match=r"^k: "):
        prefix_minimum(np.full(5, 0.2), np.full(5, 0.2), 6)
    with pytest.raises(ValueError, match=r"^absolute: "):
        prefix_minimum(np.full(5, 0.2), np.full(5, 0.2), 2, absolute="yes")
