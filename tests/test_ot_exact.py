"""The OT optimum by the curtain (simlab.verifiers.ot_exact): lossless by enumeration on the edge
cases, acceptance alpha* (the closed form and the LP, 1e-9) at every instance, the walk's
uncertified ones included, the fast curtain equal to its one-atom-at-a-time reference, and its law
at real vocabularies (V = 32,000, including the low-temperature nodes whose curtain leaves
thousands of gaps).  The generic files test its sampler (designed G-tests,
test_verifiers_sampling.py), its tree lifting (test_trees.py, test_tree_lossless.py) and its
planted faults (mutants.py 25-27); the optimality fault is planted here."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks import check_children_mass, check_lossless
from simlab.drafting import Drafting, child_tuples
from simlab.otlp import optimal_acceptance, solve_ot_lp
from simlab.verifiers import ot_exact
from simlab.verifiers.ot_exact import OTExact
from simlab.verifiers.ot_walk import OTWalk
from test_ot_walk import EDGE, SUBNORMAL_Q, check_quiet_on_subnormal_q, fixed_sample
from test_verifiers_exact import pairs

EXACT = OTExact()


def exact_check(p, q, k, verifier=EXACT):
    """Every row a law whose selection sums to 1, the children's mixture equal to p (1e-12), and the
    enumerated acceptance equal to the plan's formula (1e-12) and to alpha* (1e-9)."""
    plan = verifier.prepare(p, q, k)
    tuples, probs = child_tuples(plan.q, k, Drafting.IID)
    mixture, accepted = np.zeros_like(plan.p), 0.0
    for x, prob in zip(tuples, probs):
        assert abs(plan._selection(x).sum() - 1.0) <= 1e-12
        law = plan.output_distribution(x)
        assert law.min() >= 0.0 and abs(law.sum() - 1.0) <= 1e-12
        mixture += prob * law
        accepted += prob * law[np.unique(x)].sum()
    np.testing.assert_allclose(mixture, plan.p, atol=1e-12, rtol=0)
    assert abs(accepted - plan.acceptance_formula()) <= 1e-12
    assert abs(accepted - optimal_acceptance(p, q, k)) <= 1e-9 and plan.certified
    return plan, accepted


@pytest.mark.parametrize("case", list(EDGE))
@pytest.mark.parametrize("k", [2, 3, 4])  # k = 1 is speculative sampling (speculative_at_one, generic tests)
def test_edge_cases_exact_and_optimal(case, k):
    p, q = (np.array(v) for v in EDGE[case])
    exact_check(p, q, k)
    check_children_mass(EXACT, p, q, k)


@settings(max_examples=15, deadline=None)
@given(pq=pairs(max_vocab=5), k=st.integers(2, 3))
def test_matches_the_lp(pq, k):
    p, q = pq
    _, accepted = exact_check(p, q, k)
    assert abs(accepted - solve_ot_lp(p, q, k).value) <= 1e-9


def walk_uncertified():
    """The fixed sample's instances where the walk falls short of alpha* (test_ot_walk: one of 50)."""
    return [(p, q, k) for p, q, k in fixed_sample() if not OTWalk().prepare(p, q, k).certified]


def test_optimal_where_the_walk_is_not():
    """On the walk's uncertified instance: lossless, alpha* (closed form and LP, 1e-9), above the walk."""
    cases = walk_uncertified()
    assert cases, "the fixed sample holds no instance where the walk is uncertified"
    for p, q, k in cases:
        plan, accepted = exact_check(p, q, k)
        assert abs(accepted - solve_ot_lp(p, q, k).value) <= 1e-9
        assert accepted > OTWalk().prepare(p, q, k).value + 1e-6
        check_lossless(EXACT, p, q, k)


def random_instances(n: int, seed: int):
    """n random (p, q, k): V 2..11, k 2..8, Dirichlet 0.05/0.2/1/5, a zero planted in q or p 1 time in 5."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        vocab, k = int(rng.integers(2, 12)), int(rng.integers(2, 9))
        conc = rng.choice([0.05, 0.2, 1.0, 5.0])
        p, q = rng.dirichlet(np.full(vocab, conc)), rng.dirichlet(np.full(vocab, conc))
        if rng.random() < 0.2:
            q[rng.integers(vocab)] = 0.0
        if rng.random() < 0.2:
            p[rng.integers(vocab)] = 0.0
        if q.sum() > 0 and p.sum() > 0:
            yield p / p.sum(), q / q.sum(), k


def test_alpha_star_on_many_instances_where_the_walk_clips():
    """500 random instances (the walk uncertified on some of them, counted): the plan's acceptance
    sum min(mu, p) is alpha* to 1e-12; the enumeration (above) ties mu to the rule."""
    uncertified = 0
    for p, q, k in random_instances(500, 1):
        plan = EXACT.prepare(p, q, k)
        assert abs(plan.value - optimal_acceptance(p, q, k)) <= 1e-12 and plan.certified
        uncertified += not OTWalk().prepare(p, q, k).certified
    assert uncertified >= 5


def test_uncertified_instances_by_enumeration():
    """The instances of a fixed random draw where the walk clips, up to 1,500 child tuples (V 5..11,
    k 2..4): lossless and alpha* by enumeration, and the LP's value."""
    cases = [(p, q, k) for p, q, k in random_instances(1000, 3) if p.size**k <= 1500 and not OTWalk().prepare(p, q, k).certified]
    assert len(cases) >= 5 and max(k for _, _, k in cases) >= 4
    for p, q, k in cases:
        _, accepted = exact_check(p, q, k)
        if p.size**k <= 200:
            assert abs(accepted - solve_ot_lp(p, q, k).value) <= 1e-9


def logits(vocab: int, temperature: float, seed: int):
    rng = np.random.default_rng(seed)
    z = 2.0 * rng.normal(size=vocab)
    zq = z + 0.7 * rng.normal(size=vocab)
    p, q = np.exp((z - z.max()) / temperature), np.exp((zq - zq.max()) / temperature)
    return p / p.sum(), q / q.sum()


def prepared(p, q, k, engine):
    """The plan with the curtain run by ``engine``."""
    return OTExact(engine=engine).prepare(p, q, k)


def agree(p, q, k, engine, reference="reference"):
    """The plans of two engines: the same selection laws, values and selection probabilities of
    three tuples drafted from q (1e-12: not the output laws, whose correction norm((p - mu)_+)
    magnifies the rounding of mu where sum (p - mu)_+ is tiny, nor tuples of atoms far below the
    rounding of their score positions, which the runs may order differently with the same mu);
    the loop engines also the same number of pieces."""
    fast, slow = prepared(p, q, k, engine), prepared(p, q, k, reference)
    if engine != "vectorised":
        assert fast.pieces == slow.pieces
    np.testing.assert_allclose(fast.mu, slow.mu, atol=1e-12, rtol=0)
    assert abs(fast.value - slow.value) <= 1e-12
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.choice(fast.q.size, size=k, p=fast.q)
        np.testing.assert_allclose(fast._selection(x), slow._selection(x), atol=1e-12, rtol=0)
    return fast, slow


ENGINES = [
    "vectorised",
    "python",
    pytest.param("compiled", marks=pytest.mark.skipif(not ot_exact._numba_available(), reason="numba not installed")),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(
    "vocab,temperature,k,seed", [(500, 1.0, 4, 0), (3000, 0.2, 8, 11), (3000, 0.2, 2, 15), (3000, 0.2, 4, 13)]
)
def test_fast_curtain_equals_the_reference(engine, vocab, temperature, k, seed):
    """The runs placed at once (``stretch``, ``leap``) and the compiled loop (and the same loop
    uncompiled) against one atom at a time: the selection laws agree to 1e-12, both reach alpha*;
    the loop's pieces are the reference's bit for bit."""
    p, q = logits(vocab, temperature, seed)
    fast, slow = agree(p, q, k, engine)
    if engine != "vectorised":
        np.testing.assert_array_equal(fast.mu, slow.mu)
    for plan in (fast, slow):
        assert abs(plan.value - optimal_acceptance(p, q, k)) <= 1e-9


def tiled(p, q, copies, seed=0):
    """``copies`` scaled copies of a small instance side by side (its ties, zeros and tiny masses
    repeated at many scales: the runs the fast engines place at once), p and q renormalised."""
    scale = np.random.default_rng(seed).uniform(0.5, 2.0, size=(copies, 1))
    big_p, big_q = (np.asarray(p) * scale).ravel(), (np.asarray(q) * scale[::-1]).ravel()
    return big_p / big_p.sum(), big_q / big_q.sum()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", list(EDGE))
@pytest.mark.parametrize("k", [2, 4])
def test_engines_agree_on_the_edge_cases(engine, case, k):
    """p == q, one-hot p or q, disjoint supports, q = 0 < p, tiny masses, ties: every engine's plan
    equals the reference's (1e-12), on the four-token case and on 100 scaled copies of it."""
    p, q = (np.array(v, dtype=np.float64) for v in EDGE[case])
    agree(p, q, k, engine)
    agree(*tiled(p, q, 100), k, engine)


def test_the_engine_check_catches_a_planted_fault(monkeypatch):
    """Planted fault: the loop solves one atom's root for a target off by 1e-6 (relative); the
    agreement check above must fail."""
    p, q = logits(500, 1.0, 0)
    loop = ot_exact._loop("python")

    def faulty(lengths, targets, *args):
        targets = targets.copy()
        targets[targets.size // 2] *= 1.0 + 1e-6
        return loop(lengths, targets, *args)

    monkeypatch.setitem(ot_exact._LOOPS, "python", faulty)
    with pytest.raises(AssertionError):
        agree(p, q, 4, "python")


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine"):
        ot_exact.curtain(np.ones(2) / 2, np.ones(2), 0.0, 1.0, 2, True, engine="fast")
    with pytest.raises(ValueError, match="engine"):
        OTExact(engine="numba")


@pytest.mark.parametrize("temperature,k", [(1.0, 2), (1.0, 4), (0.2, 4), (0.2, 8)])
def test_real_vocabulary_law_and_acceptance(temperature, k):
    """V = 32,000 logits (T = 0.2: draft masses down to 1e-300 and, at k = 8, a curtain with
    thousands of gaps): acceptance alpha* (1e-9), the speculative identity sum_y mu(y) min(1, p/mu)
    + (1 - alpha) R = p, mu a law, a drafted tuple's law a law, children_mass its entries."""
    p, q = logits(32_000, temperature, 16 if temperature < 1 else 7)
    plan = EXACT.prepare(p, q, k)
    assert abs(plan.acceptance_formula() - optimal_acceptance(p, q, k)) <= 1e-9
    assert abs(plan.mu.sum() - 1.0) <= 1e-12 and np.isfinite(plan.mu).all()
    np.testing.assert_allclose(plan.mu * plan.accept + (1 - plan.value) * plan.correction, p, atol=1e-15, rtol=0)
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = rng.choice(p.size, size=k, p=q)
        law = plan.output_distribution(x)
        assert law.min() >= 0.0 and abs(law.sum() - 1.0) <= 1e-12
        np.testing.assert_allclose(plan.children_mass(x), law[x], atol=1e-15, rtol=0)


def test_tiny_draft_masses_and_underflowed_rows():
    """The walk's numerical edge cases (q down to 1e-177, k = 3, 4): finite, exact, alpha*."""
    for p, q, k in [
        ([0.5, 0.25, 0.0, 0.25], [1.0, 8.891631235112405e-51, 1.6659909496157956e-81, 3.687001046550036e-107], 4),
        ([1.0, 0.0], [1.0, 8.92408389229593e-177], 4),
        ([0.0, 1.0, 0.0], [7.072335581312517e-134, 1.0, 1.169537122245447e-235], 3),
    ]:
        p, q = np.array(p), np.array(q) / np.sum(q)
        plan, _ = exact_check(p, q, k)
        assert np.isfinite(plan.mu).all()


class _Comonotone(ot_exact._ExactPlan):
    """Planted fault: the atoms' pieces laid end to end in p/q order (no curtain): a selection, so
    lossless, but not mu*."""

    def _store(self, order, qs, atom, length, pieces):
        n = length.size
        super()._store(order, qs, atom, length, (np.arange(n), np.concatenate(([0.0], np.cumsum(length)[:-1])), length))


class Comonotone(OTExact):
    def _plan(self, p, q, k):
        return _Comonotone(self, p, q, k)


def test_the_optimality_check_catches_a_selection_without_the_curtain():
    p, q, k = walk_uncertified()[0]
    check_lossless(Comonotone(), p, q, k)  # still a selection: lossless
    with pytest.raises(AssertionError):
        exact_check(p, q, k, Comonotone())


def test_children_with_zero_draft_mass_get_a_law():
    """Children a deterministic law may hold with q = 0 (a lossy pairing): such a child is selected
    only when all are such, uniformly; every row is still a law and the sampler draws from it."""
    p, q = np.array([0.3, 0.3, 0.4]), np.array([0.0, 0.5, 0.5])
    plan = EXACT.prepare(p, q, 2, law=Drafting.DETERMINISTIC)
    for x in ([0, 1], [0, 0], [2, 0]):
        law = plan.output_distribution(x)
        assert law.min() >= 0.0 and abs(law.sum() - 1.0) <= 1e-12
    np.testing.assert_allclose(plan._selection(np.array([0, 1])), [0.0, 1.0], atol=1e-15)
    np.testing.assert_allclose(plan._selection(np.array([0, 0])), [0.5, 0.5], atol=1e-15)
    assert plan.output_distribution([0, 0])[0] == 1.0  # selected with mu = 0 < p: accepted (the walk's convention)
    rng = np.random.default_rng(0)
    assert {plan.sample([0, 0], rng) for _ in range(20)} == {0}


@pytest.mark.parametrize("case", list(SUBNORMAL_Q))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_subnormal_q_raises_no_overflow_warning(case, k):
    """Issue 40 item 11: ``RuntimeWarning: overflow encountered in divide`` leaked from prepare
    (the ratio order, the levels and the selection's test p / mu)."""
    check_quiet_on_subnormal_q(EXACT, case, k)
