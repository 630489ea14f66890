"""alpha* for children drafted without replacement at real vocabularies (simlab.containment's clocks).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_wor_optimum.py --benchmark-columns=min,median,mean,rounds
Recorded in benchmarks/RESULTS.md (no target in the issue: this is the bound the without-
replacement verifiers are measured against; the i.i.d. closed form is timed beside it).
"""

import numpy as np
import pytest

from benchmarks.conftest import VOCAB, _softmax
from simlab.otlp import optimal_acceptance
from simlab.verifiers import ot_wor


@pytest.fixture(scope="module", params=[32_000, VOCAB], ids=lambda v: f"V={v}")
def pair(request):
    """p, q softmax of N(0, 2^2) logits, independent (the ``node`` recipe of benchmarks/conftest.py)."""
    rng = np.random.default_rng(0)
    return _softmax(2.0 * rng.standard_normal(request.param)), _softmax(2.0 * rng.standard_normal(request.param))


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("replacement", [False, True], ids=["without_replacement", "iid"])
def test_optimal_acceptance(benchmark, pair, k, replacement):
    p, q = pair
    alpha = benchmark.pedantic(optimal_acceptance, args=(p, q, k, replacement), rounds=3, iterations=1)
    assert optimal_acceptance(p, q, 1) - 1e-12 <= alpha <= 1.0


@pytest.fixture(scope="module", params=[32_000, VOCAB], ids=lambda v: f"V={v}")
def close_pair(request):
    """Target logits N(0, 2^2), the draft's perturbed by N(0, 0.7^2) (README's tour at V = 32,000):
    a node where ``ot_wor`` climbs through all its orders (independent p, q stop after two)."""
    rng = np.random.default_rng(0)
    z = 2.0 * rng.standard_normal(request.param)
    return _softmax(z), _softmax(z + 0.7 * rng.standard_normal(z.size))


@pytest.mark.parametrize("containment", ["fast", "reference"])
@pytest.mark.parametrize("k", [2, 4])
def test_ot_wor_prepare(benchmark, close_pair, k, containment):
    """``ot_wor``'s plan (16 orders at most; Frank-Wolfe at these supports), computed each round (its
    plan cache emptied first), with its containments by ``containment`` (``"reference"``: the
    clocks to relative accuracy, as before the closed form and the absolute grid)."""
    p, q = close_pair
    verifier = ot_wor.OTWithoutReplacement(containment=containment)
    plan = benchmark.pedantic(verifier.prepare, args=(p, q, k), setup=ot_wor.PLAN_CACHE.clear, rounds=2, iterations=1)
    assert 0.0 <= plan.gap <= 0.01
