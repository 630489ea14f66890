"""Grid labels beside the DDTE authors' label loop, timed in one process, interleaved (issues 29, 44).

The anchor-equivalent workload (the trees and inputs of DDTE's label loop, reproduced by the lab):
one root, V = 32,000 (``benchmarks.test_trees.HashedPair`` logits), the 324-action delayed grid
K in 1..4, L1 in 0..8, L2 in 0..8 with s = 4 drafts ``Delayed(4, L1, 8)`` per L1 (``draw_grid``,
seed 0): 36 drafts, 144 trees (one per draft and K), each cut at the nine L2.

Each workload is timed on the WHOLE call: it starts from the pair (``PrefetchedPair``, whose rows
are computed once; a batch asked again in the same order gets its first answer's arrays back, so
the pair costs a look-up on both sides, as a captured tree forward replayed) and does everything
after it: the lab builds a fresh ``NodeTable`` on the pair inside the call (fetching and
validating every node's p and q), the anchor builds its p and q dicts from one call of the same
pair inside its call (torch views of the answer's rows, keyed by prefix string, as its workflow
holds a tree forward's rows).  Called in turn every round (the order reversed every other round),
one warm-up round dropped; each call's wall time and thread CPU time (``time.thread_time``: what
the other jobs of a shared machine do not inflate):

* ``lab``: ``grid_block_efficiency`` (default engine) on ``NodeTable(pair, [root])``;
* ``reference``: the same with ``engine="reference"`` (the plain per-tree path);
* ``anchor-style``: ``benchmarks.anchor_style.label_loop`` on rows from the pair, a plain
  transcription of their loop;
* ``fresh answer``: the pair answering every node with new arrays (``PrefetchedPair(copy=True)``),
  what a pair that returns fresh (n, V) arrays would add to every other row (not in them);
* ``anchor``: the DDTE authors' code itself (``TreeVerifier.expected_<m>_depths(8)`` per tree,
  their node caches emptied per call), only when ``SIMLAB_DDTE_ANCHOR`` names a folder holding
  their ``node.py`` and ``verifier.py`` (never vendored; benchmarks/RESULTS.md says where from);
  checked against the stand-in to 1e-9 first.

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_labels_anchor.py -s --benchmark-columns=min,rounds
      (SIMLAB_DDTE_ANCHOR=/path/to/their/files ... adds the anchor's row).
Ratios are printed and kept in the benchmark's extra_info; recorded in benchmarks/RESULTS.md, not asserted.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import numpy as np
import pytest
import torch

from benchmarks import anchor_style
from benchmarks.interleave import interleaved, report
from benchmarks.test_trees import PrefetchedPair
from simlab import tree_verifiers, verifiers
from simlab.grid import draw_grid, grid_block_efficiency
from simlab.trees import NodeTable

ROOT = 5
ROUNDS = int(os.environ.get("SIMLAB_BENCH_ROUNDS", "5"))
ANCHOR = os.environ.get("SIMLAB_DDTE_ANCHOR")


@pytest.fixture(scope="module")
def workload():
    pair = PrefetchedPair()
    drafts = draw_grid(NodeTable(pair, [ROOT]), K_max=4, L1_values=range(9), L2_max=8, samples=4, rng=np.random.default_rng(0))
    paths = {(d.L1, K, i): [d.trunk + b for b in d.branches[:K]] for i, d in enumerate(drafts) for K in (1, 2, 3, 4)}
    nodes = sorted({path[:j] for ps in paths.values() for path in ps for j in range(len(path) + 1)})
    trees = [(L1, K, ps) for (L1, K, _), ps in paths.items()]
    return pair, drafts, trees, nodes


def pair_rows(pair, nodes) -> dict:
    """node -> (p, q) torch float64 tensors (views of the pair's answer), from ONE call of the pair
    for every node: how their workflow holds a tree forward's rows."""
    P, Q = pair.distributions([(ROOT, *node) for node in nodes])
    with warnings.catch_warnings():  # the pair's replayed answer is read-only; nothing here writes it
        warnings.simplefilter("ignore", UserWarning)
        P, Q = torch.from_numpy(P), torch.from_numpy(Q)
    return {node: (P[i], Q[i]) for i, node in enumerate(nodes)}


def _anchor_runner(pair, nodes, trees, method):
    """Their TreeVerifier on the same trees, its inputs built inside the call: p and q of every
    node from the pair (one call), their dicts keyed by prefix string (the same tensors for every
    tree), paths as token lists from the root token."""
    sys.path.insert(0, ANCHOR)
    node_module, verifier_module = importlib.import_module("node"), importlib.import_module("verifier")

    def run():
        for cache in ("naive_cache", "spectr_cache", "specinfer_cache"):
            getattr(node_module.Node, cache).clear()
        rows = pair_rows(pair, nodes)
        p_dict, q_dict, inputs = {}, {}, []
        for _, _, paths in trees:
            token_paths = [[ROOT, *path] for path in paths]
            prefixes = list(dict.fromkeys(",".join(map(str, path[:i])) for path in token_paths for i in range(1, len(path) + 1)))
            for rep in prefixes:
                if rep not in p_dict:
                    p_dict[rep], q_dict[rep] = rows[tuple(int(t) for t in rep.split(",")[1:])]
            inputs.append((token_paths, prefixes))
        return [
            getattr(verifier_module.TreeVerifier(paths, prefixes, q_dict, p_dict), f"expected_{method}_depths")(8)
            for paths, prefixes in inputs
        ]

    return run


@pytest.mark.parametrize("name", ["specinfer", "spectr", "naive", "nss"])
def test_grid_labels_beside_the_anchor_loop(benchmark, workload, name):
    pair, drafts, trees, nodes = workload
    verifier = tree_verifiers.get(name)
    # the stand-in computes their numbers: the lab's per-path grid (their trunk convention, their rho)
    node = verifiers.get(name, rho="four_step") if name == "spectr" else verifiers.get(name)
    same = tree_verifiers.TopDown(node, allow_lossy=True)
    lab_per_path = grid_block_efficiency(NodeTable(pair, [ROOT]), drafts, same, trunk_children="per_path")
    plain = anchor_style.label_loop(trees, pair_rows(pair, nodes), name)
    for L1 in range(9):
        for K in (1, 2, 3, 4):
            values = np.mean([v for (l1, k, _), v in zip(trees, plain) if (l1, k) == (L1, K)], axis=0)
            assert np.allclose(values, [lab_per_path[(K, L1, L2)].mean for L2 in range(9)], rtol=0, atol=1e-9)
    if ANCHOR:
        theirs = _anchor_runner(pair, nodes, trees, name)()  # E[depth]: the stand-in's E[tau + 1] less 1
        assert np.allclose(np.array(theirs) + 1.0, plain, rtol=0, atol=1e-9)
    copying = PrefetchedPair(copy=True)
    copying.memo = pair.memo
    contexts = [(ROOT, *node) for node in nodes]
    runs = {
        "lab": lambda: grid_block_efficiency(NodeTable(pair, [ROOT]), drafts, verifier),
        "reference": lambda: grid_block_efficiency(NodeTable(pair, [ROOT]), drafts, verifier, engine="reference"),
        "anchor-style": lambda: anchor_style.label_loop(trees, pair_rows(pair, nodes), name),
        "fresh answer": lambda: copying.distributions(contexts),
    }
    if ANCHOR:
        runs["anchor"] = _anchor_runner(pair, nodes, trees, name)
    times = benchmark.pedantic(interleaved, args=(runs, ROUNDS), rounds=1, iterations=1)
    report(f"grid labels, {name}", times, benchmark=benchmark)
