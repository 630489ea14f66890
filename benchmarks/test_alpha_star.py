"""alpha* (``simlab.otlp.optimal_acceptance``) beside one default ``np.sort`` of the V ratios, in one
process, interleaved (issue 44 item 1: the whole call, validation included, at most 3x the sort).

Workload: p, q = softmax of independent N(0, 2^2) logits (the ``node`` recipe of benchmarks/conftest.py)
at V = 32,000, 128,000 and 151,936; k = 2, 4, 8.

* ``lab``: ``optimal_acceptance(p, q, k)`` (the default: i.i.d. children, the int64 key sort);
* ``reference``: ``optimal_acceptance(p, q, k, method="reference")`` (stable argsort, ``**k``);
* ``sort``: ``np.sort`` (default kind) of the V float64 ratios p / q, the floor of any rule that
  orders tokens by p/q; ``argsort`` and ``stable_argsort`` of the same ratios for comparison.

Without replacement (``test_alpha_star_without_replacement``): ``lab`` is the default (key sort;
closed form for k = 2, exponential clocks above), ``clocks`` the plain path (stable argsort and the
clocks), beside the same sort; fewer rounds (the clocks take 0.1-2 s).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_alpha_star.py -s --benchmark-columns=min,rounds
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.interleave import interleaved, report
from simlab.otlp import optimal_acceptance


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.fixture(scope="module", params=[32_000, 128_000, 151_936])
def pair(request):
    rng = np.random.default_rng(0)
    vocab = request.param
    return vocab, _softmax(2.0 * rng.standard_normal(vocab)), _softmax(2.0 * rng.standard_normal(vocab))


@pytest.mark.parametrize("k", [2, 4, 8])
def test_alpha_star_iid(benchmark, pair, k):
    vocab, p, q = pair
    ratio = p / q
    lab = optimal_acceptance(p, q, k)
    assert abs(lab - optimal_acceptance(p, q, k, method="reference")) <= 1e-12
    runs = {
        "lab": lambda: optimal_acceptance(p, q, k),
        "reference": lambda: optimal_acceptance(p, q, k, method="reference"),
        "sort": lambda: np.sort(ratio),
        "argsort": lambda: np.argsort(ratio),
        "stable_argsort": lambda: np.argsort(ratio, kind="stable"),
    }
    times = interleaved(runs, rounds=25)
    report(f"alpha* i.i.d., V = {vocab}, k = {k}", times, benchmark=benchmark)
    benchmark.pedantic(runs["lab"], rounds=3, iterations=1)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_alpha_star_without_replacement(benchmark, pair, k):
    vocab, p, q = pair
    ratio = p / q
    lab = optimal_acceptance(p, q, k, replacement=False)
    assert abs(lab - optimal_acceptance(p, q, k, replacement=False, method="clocks")) <= 1e-12
    runs = {
        "lab": lambda: optimal_acceptance(p, q, k, replacement=False),
        "clocks": lambda: optimal_acceptance(p, q, k, replacement=False, method="clocks"),
        "sort": lambda: np.sort(ratio),
    }
    times = interleaved(runs, rounds=3)
    report(f"alpha* without replacement, V = {vocab}, k = {k}", times, benchmark=benchmark)
    benchmark.pedantic(runs["lab"], rounds=1, iterations=1)
