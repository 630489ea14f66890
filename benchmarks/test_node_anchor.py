"""One node's children-only masses and acceptance rate beside the DDTE authors' per-node code,
in one process, interleaved (issue 29: every ratio <= 1 for NSS, NaiveTree and SpecTr).

Workload: p, q = softmax of N(0, 2^2) logits at V = 32,000 and 128,000, k = 4 children drawn
i.i.d. from q (the node of benchmarks/conftest.py).  Each call is repeated 20 times (masses) or 5
times (acceptance) per round, 15 or 9 rounds, calls interleaved, one warm-up round dropped.

* ``lab``: ``prepare(p, q, k, checked=True)`` (a node whose p and q a NodeTable validated, as in
  every tree and label computation), then ``children_mass(x)`` or ``acceptance_rate()``;
* ``lab_validated``: the same with ``prepare(p, q, k)`` (public inputs validated: two passes over
  each of p and q, which their code never makes);
* ``anchor-style``: ``benchmarks.anchor_style.node_branch`` / ``ACCEPT`` (torch, a fresh cache);
* ``anchor``: their ``Node.<m>_otlp_branch`` (caches emptied per call: a node's first visit) and
  ``Node.<m>_otlp_accept``, only when ``SIMLAB_DDTE_ANCHOR`` names their files' folder.

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_node_anchor.py -s --benchmark-columns=min,rounds
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest
import torch

from benchmarks import anchor_style
from benchmarks.interleave import interleaved, report
from simlab import verifiers

ANCHOR = os.environ.get("SIMLAB_DDTE_ANCHOR")
K = 4


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.fixture(scope="module", params=[32_000, 128_000])
def node(request):
    rng = np.random.default_rng(0)
    vocab = request.param
    p, q = _softmax(2.0 * rng.standard_normal(vocab)), _softmax(2.0 * rng.standard_normal(vocab))
    return vocab, p, q, rng.choice(vocab, size=K, p=q)


def _anchor_node(kids):
    sys.path.insert(0, ANCHOR)
    node_class = importlib.import_module("node").Node
    node = node_class(0, "0", 0, 0)
    node.children = [node_class(i + 1, f"0,{t}", int(t), 1) for i, t in enumerate(kids)]

    def fresh():
        for cache in ("naive_cache", "spectr_cache", "specinfer_cache"):
            getattr(node_class, cache).clear()
        return node

    return fresh


@pytest.mark.parametrize("what", ["children_mass", "acceptance"])
@pytest.mark.parametrize("name", ["nss", "naive", "spectr"])
def test_node_beside_the_anchor(benchmark, node, name, what):
    vocab, p, q, x = node
    pt, qt = torch.from_numpy(p), torch.from_numpy(q)
    v = verifiers.get(name)
    plan = v.prepare(p, q, K)
    if what == "children_mass":
        reference = anchor_style.node_branch(pt, qt, x.tolist(), name)
        assert np.allclose(plan.children_mass(x), [reference[int(t)] for t in x], rtol=0, atol=1e-12) or name == "spectr"
        repeat, rounds = 20, 15
        runs = {
            "lab": lambda: v.prepare(p, q, K, checked=True).children_mass(x),
            "lab_validated": lambda: v.prepare(p, q, K).children_mass(x),
            "anchor-style": lambda: anchor_style.node_branch(pt, qt, x.tolist(), name),
        }
        if ANCHOR:
            fresh = _anchor_node(x.tolist())
            runs["anchor"] = lambda: getattr(fresh(), f"{name}_otlp_branch")(pt, qt)
    else:
        assert abs(plan.acceptance_rate() - anchor_style.ACCEPT[name](pt, qt, K)) <= (1e-3 if name == "spectr" else 1e-12)
        repeat, rounds = 5, 9
        runs = {
            "lab": lambda: v.prepare(p, q, K, checked=True).acceptance_rate(),
            "lab_validated": lambda: v.prepare(p, q, K).acceptance_rate(),
            "anchor-style": lambda: anchor_style.ACCEPT[name](pt, qt, K),
        }
        if ANCHOR:
            fresh = _anchor_node(x.tolist())
            runs["anchor"] = lambda: getattr(fresh(), f"{name}_otlp_accept")(pt, qt, K)
    repeated = {n: (lambda f: lambda: [f() for _ in range(repeat)])(f) for n, f in runs.items()}
    times = benchmark.pedantic(interleaved, args=(repeated, rounds), rounds=1, iterations=1)
    report(f"node V={vocab} k={K} {name} {what} ({repeat} calls per round)", times, benchmark=benchmark)
