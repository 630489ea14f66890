"""P(all k children drafted without replacement lie in each prefix): the clock integral against enumeration.

``simlab.containment.prefix_containment`` has two methods; the exact enumeration of ordered
tuples is the reference (1e-12), the trapezoid's own error is checked by halving its step, and
``optimal_acceptance(replacement=False)`` (which now reaches real vocabularies) is checked
against the LP on the tiny-mass case that 1 - drawn mass got wrong.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simlab.containment import STEP, default_step, prefix_containment
from simlab.otlp import optimal_acceptance, solve_ot_lp


@st.composite
def masses(draw, max_tokens: int = 7):
    """Positive draft masses in some order: Dirichlet-like, sharpened, tiny, tied or unnormalised."""
    n = draw(st.integers(1, max_tokens))
    raw = np.array(draw(st.lists(st.floats(1e-3, 1.0), min_size=n, max_size=n)))
    kind = draw(st.sampled_from(["plain", "sharp", "tiny", "ties", "scaled"]))
    if kind == "sharp":
        raw = raw**6
    elif kind == "tiny":
        raw[: max(1, n // 2)] *= 1e-15
    elif kind == "ties":
        raw[:] = raw[0]
    q = raw / raw.sum()
    return q * 3.7 if kind == "scaled" else q


@given(q=masses(), k=st.integers(1, 4))
def test_clocks_equal_enumeration(q, k):
    if k > q.size:
        return
    exact = prefix_containment(q, k, method="enumerate")
    clocks = prefix_containment(q, k, method="clocks")
    assert np.abs(clocks - exact).max() <= 2e-14
    assert exact[:k].tolist() == [0.0] * k and exact[-1] == 1.0 and clocks[-1] == 1.0


@given(q=masses())
def test_one_child_is_the_prefix_mass(q):
    expected = np.concatenate(([0.0], np.cumsum(q) / q.sum()))
    for method in ("clocks", "enumerate"):
        got = prefix_containment(q, 1, method=method)
        assert np.abs(got - expected).max() <= 1e-12
        assert got.max() == 1.0 and np.all(np.diff(got) >= 0.0)


@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_step_halving_and_bounds_at_a_large_vocabulary(scale):
    """At V = 3,000 (logits N(0, scale^2)): halving the step moves no prefix by 2e-15; F rises
    along the prefixes and stays below the i.i.d. value q(H)^k (each later draw lands in H with
    probability at most q(H))."""
    rng = np.random.default_rng(11)
    q = np.exp(rng.normal(0.0, scale, 3000))
    q /= q.sum()
    for k in (2, 4):
        coarse = prefix_containment(q, k)
        fine = prefix_containment(q, k, step=default_step(k) / 2)
        assert np.abs(coarse - fine).max() <= 2e-15
        assert np.all(np.diff(coarse) >= -1e-15)
        iid = np.concatenate(([0.0], np.cumsum(q))) ** k
        assert np.all(coarse <= iid + 1e-14)


def test_a_prefix_of_tiny_masses_keeps_its_tiny_containment():
    """20,000 masses of 1e-16 before one token of mass 1: F of the tiny prefix is the product of
    the draws' chances (about 4e-24 at k = 2), to 1e-12 relative.  Summing F as 1 - (1 - F)
    gave -1.4e-13 here (each tiny ring probability lost in 1 - r rounding to 1)."""
    m, eps = 20_000, 1e-16
    q = np.full(m + 1, eps)
    q[-1] = 1.0
    for k in (2, 3):
        got = prefix_containment(q, k)
        exact = np.prod([(m - i) * eps / (1.0 + (m - i) * eps) for i in range(k)])
        assert got[m] == pytest.approx(exact, rel=1e-12)
        assert np.all(np.diff(got) >= 0.0)


def test_a_tiny_containment_stays_tiny_when_the_rest_is_spread():
    """Two masses of 1e-20 before 100 of 0.01 (the grid ends near t = 50, where the tiny pair has
    not rung): F of the pair is 2e-40, not the past-the-grid density (about 1e-23, what taking
    P(N_H >= k) = 1 there gave); the same with the enumeration on six tokens."""
    got = prefix_containment(np.array([1e-20, 1e-20] + [0.01] * 100), 2)[2]
    assert got == pytest.approx(2e-20 / (1 + 2e-20) * 1e-20 / (1 + 1e-20), rel=1e-12)
    q = np.array([1e-20, 1e-20, 0.01, 0.01, 0.01, 0.01])
    exact = prefix_containment(q, 2, method="enumerate")
    assert np.allclose(prefix_containment(q, 2), exact, rtol=1e-12, atol=0.0)


@pytest.mark.parametrize("k", [48, 100, 190])
def test_many_children_take_a_finer_default_step(k):
    """The integrand's strip narrows like 1 / sqrt(k): the default step (STEP sqrt(32 / k) above
    k = 32) moves nothing by 2e-15 when halved, where STEP itself errs (4e-9 at k = 100 on
    V = 3,000; here V = 200, logits N(0, 2^2)).  k near n once overflowed the grid's tail bound."""
    rng = np.random.default_rng(3)
    q = np.exp(rng.normal(0.0, 2.0, 200))
    q /= q.sum()
    default = prefix_containment(q, k)
    assert np.abs(default - prefix_containment(q, k, step=default_step(k) / 2)).max() <= 2e-15
    assert np.all(np.diff(default) >= 0.0) and default[k - 1] == 0.0 and default[k] > 0.0
    if k == 100:
        assert np.abs(prefix_containment(q, k, step=STEP) - default).max() > 1e-14


def test_tiny_masses_beside_a_dominant_token():
    """q = (1e-17, 2e-17, 1) normalised: 1 - drawn mass is 0 in float64 after the big token,
    which once made alpha* 0; the remaining mass summed over the undrawn tokens gives 1."""
    p = np.array([0.549, 0.348, 0.103])
    q = np.array([1e-17, 2e-17, 1.0])
    q /= q.sum()
    lp = solve_ot_lp(p, q, 3, replacement=False).value
    assert lp == pytest.approx(1.0, abs=1e-9)
    for method in ("clocks", "enumerate"):
        assert optimal_acceptance(p, q, 3, replacement=False, method=method) == pytest.approx(1.0, abs=1e-12)


def test_without_replacement_never_below_iid_at_real_vocabulary():
    """alpha* without replacement >= alpha* with i.i.d. children (F_wor <= q(H)^k), V = 32,000."""
    rng = np.random.default_rng(5)
    p = np.exp(rng.normal(0.0, 2.0, 32_000))
    q = np.exp(np.log(p) + rng.normal(0.0, 1.0, p.size))
    p, q = p / p.sum(), q / q.sum()
    for k in (2, 4):
        wor = optimal_acceptance(p, q, k, replacement=False)
        iid = optimal_acceptance(p, q, k)
        assert iid - 1e-12 <= wor <= 1.0
        assert wor > optimal_acceptance(p, q, 1)


def test_scale_and_subnormal_masses():
    """Any positive scale of q gives the same F (drafting renormalises); a subnormal mass beside k
    tokens that carry the rest is fine; with fewer than k such tokens the k-th ring lies beyond
    float64 times and the clocks, kept in logs, still agree with the enumeration; masses that no
    float64 scale holds together are refused by the enumeration (naming q_ordered), and a step so
    small that the grid explodes by the clocks (naming step).  Huge masses are rescaled by a power
    of two for the enumeration (exact)."""
    q = np.array([1.0, 2.0, 3.0, 4.0])
    exact = prefix_containment(q, 2, method="enumerate")
    for scale in (1e-200, 1.0, 1e12, 1e300):
        assert np.abs(prefix_containment(q * scale, 2) - exact).max() <= 2e-14
    for tiny in ([0.5, 0.5, 5e-324], [1.0, 5e-324, 5e-324], [1e10, 5e-324, 5e-324], [1.0, 1e-307, 3e-307, 1e-310]):
        exact = prefix_containment(tiny, 2, method="enumerate")
        assert np.abs(prefix_containment(tiny, 2) - exact).max() <= 2e-14
    assert prefix_containment([1e10, 5e-324, 5e-324], 2, method="enumerate")[2] == pytest.approx(0.5)
    huge = [1e308, 1e308, 5e-324]  # the two huge tokens are drafted first, to within 1e-600
    assert prefix_containment(huge, 2)[2] == 1.0
    assert prefix_containment([1e308, 1e308, 1e308], 2, method="enumerate")[2] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match=r"^q_ordered: the masses span more than float64's range"):
        prefix_containment(huge, 2, method="enumerate")
    with pytest.raises(ValueError, match=r"^step: the masses outside the 1 largest"):
        prefix_containment([1.0, 5e-324, 5e-324], 2, step=1e-3)


def test_masses_far_below_the_largest_keep_their_bits():
    """Masses below 2^-1022 of the largest turn subnormal when q is rescaled by a power of two:
    their logs are taken from q itself (the rescaled ones once gave F = 0.5 for 0.255 here, and
    alpha* = 0.70 for 0.75 on a q summing to 1)."""
    for q in ([2.0**1000, 0.51 * 2.0**-73, 1.49 * 2.0**-73], [2.0**1000, 3 * 2.0**-75, 2.0**-74], [1e300, 1.2345e-15, 1e-15]):
        exact = prefix_containment(q, 2, method="enumerate")
        assert np.abs(prefix_containment(q, 2) - exact).max() <= 2e-14
    p, q = [0.2, 0.3, 0.5], [1.0, 1.5e-323, 5e-324]
    assert optimal_acceptance(p, q, 2, replacement=False) == pytest.approx(0.75, abs=1e-13)


def test_low_temperature_nodes_reach_the_verifier():
    """The lab's own low-temperature sampling gives q a tail of 5e-324 masses (300 tokens with
    q > 0, too many to enumerate in ot_wor): alpha* and ot_wor's plan come out (p uniform, so every
    pair of drafted tokens is accepted: alpha* = 1)."""
    from simlab import verifiers
    from simlab.sampling import sampling_distribution

    logits = np.zeros(300)
    logits[0] = 7.45
    q = sampling_distribution(logits, temperature=0.01)
    assert np.count_nonzero(q) == 300 and q.min() == 5e-324
    p = np.full(300, 1 / 300)
    assert optimal_acceptance(p, q, 2, replacement=False) == pytest.approx(1.0, abs=1e-12)
    plan = verifiers.get("ot_wor").prepare(p, q, 2)
    assert abs(plan.gap) <= 1e-9 and plan.alpha_star == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (([0.5, 0.0, 0.5], 1), {}, r"^q_ordered: "),
        (([0.5, -0.1, 0.6], 1), {}, r"^q_ordered: "),
        (([0.5, np.nan], 1), {}, r"^q_ordered: "),
        (([[0.5, 0.5]], 1), {}, r"^q_ordered: "),
        (([], 1), {}, r"^q_ordered: "),
        (([0.5, 0.5], 3), {}, r"^k: "),
        (([0.5, 0.5], 0), {}, r"^k"),
        (([0.5, 0.5], 1), {"method": "lp"}, r"^method: "),
        (([0.5, 0.5], 1), {"step": 0.0}, r"^step: "),
        (([0.5, 0.5], 1), {"step": float("inf")}, r"^step: "),
        (([0.5, 0.5], 1), {"step": 10.0}, r"^step: "),
        (([0.5, 0.5], 1), {"step": 1e-9}, r"^step: "),
        (([0.5, 0.5], 1), {"step": True}, r"^step: "),
        (([0.5, 0.5], 1), {"step": Fraction(1, 8)}, r"^step: "),
        (([0.5, 0.5], 1), {"method": np.array(["clocks", "x"])}, r"^method: "),
        ((["0.5", "0.5"], 1), {}, r"^q_ordered: "),
        (([10**400, 1, 1], 1), {}, r"^q_ordered: "),
        (([1e308] * 499 + [5e-324] * 501, 500), {}, r"^k: the clocks for 500 children"),
        (([object()], 1), {}, r"^q_ordered: "),
        ((np.array([1.0 + 0j, 2.0 + 0j, 3.0 + 5j]), 2), {}, r"^q_ordered: "),
        ((["a", "b"], 1), {}, r"^q_ordered: "),
        ((np.full(200, 1 / 200), 3), {"method": "enumerate"}, r"^k: exact enumeration would list"),
    ],
)
def test_bad_input_names_the_argument(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        prefix_containment(*args, **kwargs)


def test_optimal_acceptance_method_is_for_drafting_without_replacement():
    u = np.full(4, 0.25)
    with pytest.raises(ValueError, match=r"^method: i\.i\.d\. children"):
        optimal_acceptance(u, u, 2, method="clocks")
    with pytest.raises(ValueError, match=r"^method: "):
        optimal_acceptance(u, u, 2, replacement=False, method="lp")


@pytest.mark.parametrize("fault", ["coarse step", "late left end", "early right end"])
def test_planted_faults_are_caught(fault, monkeypatch):
    """The enumeration comparison can fail: a coarse trapezoid step (0.5), a grid started late
    (at t = 0.1 instead of 1e-12, the part below taken as if no k clocks rang) or ended early
    (the tail bound at 1e-3 instead of 1e-18) moves F by more than 1e-9 on a fixed instance."""
    from simlab import containment

    rng = np.random.default_rng(2)
    q = rng.dirichlet(np.full(7, 0.3))
    kwargs = {}
    if fault == "coarse step":
        kwargs["step"] = 0.5
    elif fault == "late left end":
        monkeypatch.setattr(containment, "LEFT_T", 0.1)
    else:
        monkeypatch.setattr(containment, "TAIL", 1e-3)
    exact = prefix_containment(q, 3, method="enumerate")
    assert np.abs(prefix_containment(q, 3, **kwargs) - exact).max() > 1e-9


def test_prefix_minimum_is_the_minimum_over_all_subsets_without_replacement():
    """Hu et al.'s prefix scan holds without replacement too (the lab has no proof): 300 fixed
    instances, V = 5..7, k = 2..4, sharpened and tied q included, every one of the 2^V subsets."""
    import itertools

    from simlab.drafting import Drafting, child_tuples

    rng = np.random.default_rng(7)
    for trial in range(300):
        vocab = int(rng.integers(5, 8))
        k = int(rng.integers(2, 5))
        p = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0)))
        q = rng.dirichlet(np.full(vocab, rng.uniform(0.2, 3.0))) ** (3 if trial % 3 == 0 else 1)
        q /= q.sum()
        if trial % 4 == 0:  # tied ratios p/q
            p[:2] = q[:2] * p[:2].sum() / q[:2].sum()
        tuples, probs = child_tuples(q, k, Drafting.WITHOUT_REPLACEMENT)
        members = np.zeros((len(tuples), vocab), dtype=bool)
        np.put_along_axis(members, tuples, True, axis=1)
        best = 1.0
        for size in range(k, vocab + 1):
            for subset in itertools.combinations(range(vocab), size):
                inside = np.zeros(vocab, dtype=bool)
                inside[list(subset)] = True
                best = min(best, p[inside].sum() + 1.0 - probs[~(members & ~inside).any(axis=1)].sum())
        assert optimal_acceptance(p, q, k, replacement=False) == pytest.approx(max(best, 0.0), abs=1e-12)
