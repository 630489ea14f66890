"""The OT optimum's i.i.d. verifiers against one sort (issue 44 item 2): ``ot_exact``'s and ``ot_walk``'s
law for one drafted tuple as a ratio to one default ``np.sort`` of V float64 values (the p/q ratios),
measured side by side in one process (thread CPU time, calls interleaved, medians).

Workload: p = softmax of N(0, 2^2) logits, q = softmax of the same logits plus N(0, s^2) noise (a
correlated draft; s = 0.3, 0.7, 2.0: the closer the draft, the more gaps the curtain leaves), k = 4
children drawn i.i.d. from q; V = 32,000, 128,000 and 151,936.

* ``sort``: ``np.sort(p / q)`` (default kind);
* ``exact[engine]``: ``OTExact().prepare(p, q, k, checked=True).output_distribution(x)``, the curtain
  by ``engine`` (``vectorised``: numpy runs; ``compiled``: the numba loop, only where numba imports;
  ``reference`` is too slow to time here);
* ``walk``: the same for ``OTWalk``;
* ``exact | plan``, ``walk | plan``: ``output_distribution(x)`` of a plan prepared once (the plan
  reused across the tuples of a node).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_ot_exact.py -s --benchmark-columns=min,rounds
Target (recorded in benchmarks/RESULTS.md, never asserted): each law for one tuple at most 10x the sort.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from benchmarks.conftest import _softmax
from benchmarks.interleave import interleaved
from simlab import verifiers
from simlab.verifiers import ot_exact

K = 4
ENGINES = ("vectorised", "compiled") if ot_exact._numba_available() else ("vectorised",)


def correlated(vocab: int, noise: float, seed: int = 0):
    rng = np.random.default_rng(seed)
    z = 2.0 * rng.standard_normal(vocab)
    p, q = _softmax(z), _softmax(z + noise * rng.standard_normal(vocab))
    return p, q, rng.choice(vocab, size=K, p=q)


def exact_with(engine: str):
    """The law for one tuple by ``OTExact`` whose curtain runs on ``engine``."""
    verifier = ot_exact.OTExact(engine=engine)
    return lambda p, q, children: verifier.prepare(p, q, K, checked=True).output_distribution(children)


@pytest.mark.parametrize("vocab,noise", [(128_000, 0.3), (128_000, 0.7), (128_000, 2.0), (32_000, 0.7), (151_936, 0.7)], ids=str)
def test_law_for_one_tuple_against_one_sort(benchmark, vocab, noise):
    p, q, children = correlated(vocab, noise)
    ratio = p / q
    walk = verifiers.get("ot_walk")
    runs = {"sort": lambda: np.sort(ratio)}
    for engine in ENGINES:
        law = exact_with(engine)
        law(p, q, children)  # numba compiles once per process, outside the timing
        runs[f"exact[{engine}]"] = lambda law=law: law(p, q, children)
    runs["walk"] = lambda: walk.prepare(p, q, K, checked=True).output_distribution(children)
    exact_plan = verifiers.get("ot_exact").prepare(p, q, K, checked=True)
    walk_plan = walk.prepare(p, q, K, checked=True)
    runs["exact | plan"] = lambda: exact_plan.output_distribution(children)
    runs["walk | plan"] = lambda: walk_plan.output_distribution(children)
    rounds = 9 if vocab <= 128_000 else 7
    times = benchmark.pedantic(lambda: interleaved(runs, rounds), rounds=1, iterations=1)
    cpu = {name: float(np.median(c)) for name, (_, c) in times.items()}
    lines = [
        f"V={vocab} k={K} noise={noise}: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
        f"load {os.getloadavg()[0]:.2f}, {rounds} rounds, thread CPU medians, sort {cpu['sort'] * 1e3:.2f} ms"
    ]
    lines += [f"  {name:18s} {t * 1e3:9.3f} ms  {t / cpu['sort']:7.2f} x sort" for name, t in cpu.items() if name != "sort"]
    print("\n" + "\n".join(lines))
    benchmark.extra_info.update({f"{name}_cpu_ms": t * 1e3 for name, t in cpu.items()})
    assert abs(exact_plan.value - exact_plan.alpha_star) <= 1e-9
