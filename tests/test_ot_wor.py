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
