"""The OT optimum's verifiers at real vocabularies (issue 26): the OT walk (simlab.verifiers.ot_walk)
and the curtain (simlab.verifiers.ot_exact, alpha* at every node).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_ot_walk.py --benchmark-columns=min,median,mean,rounds
Targets (recorded in benchmarks/RESULTS.md, not asserted): the law for one drafted tuple at
V = 128,000, k = 4 within 10x of SpecInfer's ``prepare`` (measured here in the same run, at
V = 32,000 and 128,000); one root's DDTE label grid with it at V = 32,000 (beside SpecInfer's,
same drafts).
"""

import numpy as np
import pytest

from benchmarks.conftest import K, VOCAB, _softmax
from benchmarks.test_trees import grid_drafts  # noqa: F401  (the fixture: one root's drafts at V = 32,000)
from simlab import tree_verifiers, verifiers
from simlab.grid import grid_block_efficiency


@pytest.fixture(scope="module", params=[32_000, VOCAB], ids=lambda v: f"V={v}")
def real_node(request, node):
    """``node`` (V = 128,000) or the same recipe at V = 32,000: p, q softmax of N(0, 2^2) logits, k = 4."""
    if request.param == VOCAB:
        return node
    rng = np.random.default_rng(0)
    p, q = _softmax(2.0 * rng.standard_normal(request.param)), _softmax(2.0 * rng.standard_normal(request.param))
    return p, q, np.array([int(i) for i in rng.choice(request.param, size=K, p=q)])


@pytest.mark.parametrize("name", ["ot_walk", "ot_exact", "specinfer"])
def test_prepare(benchmark, real_node, name):
    """``prepare`` on validated inputs (what a tree pays per node), k = 4."""
    p, q, children = real_node
    benchmark(verifiers.get(name).prepare, p, q, len(children), checked=True)


@pytest.mark.parametrize("name", ["ot_walk", "ot_exact"])
def test_law_for_one_drafted_tuple(benchmark, real_node, name):
    """prepare + the whole law B(x, .) for one drafted tuple, k = 4."""
    p, q, children = real_node
    verifier = verifiers.get(name)
    law = benchmark(lambda: verifier.prepare(p, q, len(children), checked=True).output_distribution(children))
    assert abs(law.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("name", ["ot_walk", "ot_exact"])
@pytest.mark.parametrize("call", ["output_distribution", "children_mass"])
def test_prepared_plan(benchmark, node, name, call):
    """Per child list once the node is prepared (V = 128,000)."""
    p, q, children = node
    plan = verifiers.get(name).prepare(p, q, len(children))
    benchmark(getattr(plan, call), children)


@pytest.mark.parametrize("name", ["ot_walk", "ot_exact", "specinfer"])
def test_grid_labels_given_drafts(benchmark, grid_drafts, name):  # noqa: F811
    """The 324 labels of one root from its drafts (drafting and model calls excluded), V = 32,000."""
    table, drafts = grid_drafts
    verifier = tree_verifiers.get(name)
    grid = benchmark.pedantic(lambda: grid_block_efficiency(table.without_plans(), drafts, verifier), rounds=1, iterations=1)
    assert len(grid) == 4 * 9 * 9
