"""The OT walk (simlab.verifiers.ot_walk) at real vocabularies (issue 26).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_ot_walk.py --benchmark-columns=min,median,mean,rounds
Targets (recorded in benchmarks/RESULTS.md, not asserted): the law for one drafted tuple at
V = 128,000, k = 4 within 10x of SpecInfer's ``prepare`` (measured here in the same run); one
root's DDTE label grid with it at V = 32,000 (beside SpecInfer's, same drafts).
"""

import pytest

from benchmarks.test_trees import grid_drafts  # noqa: F401  (the fixture: one root's drafts at V = 32,000)
from simlab import tree_verifiers, verifiers
from simlab.grid import grid_block_efficiency


@pytest.mark.parametrize("name", ["ot_walk", "specinfer"])
def test_prepare(benchmark, node, name):
    """``prepare`` on validated inputs (what a tree pays per node), V = 128,000, k = 4."""
    p, q, children = node
    benchmark(verifiers.get(name).prepare, p, q, len(children), checked=True)


def test_law_for_one_drafted_tuple(benchmark, node):
    """prepare + the whole law B(x, .) for one drafted tuple, V = 128,000, k = 4."""
    p, q, children = node
    walk = verifiers.get("ot_walk")
    law = benchmark(lambda: walk.prepare(p, q, len(children), checked=True).output_distribution(children))
    assert abs(law.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("call", ["output_distribution", "children_mass"])
def test_prepared_plan(benchmark, node, call):
    """Per child list once the node is prepared."""
    p, q, children = node
    plan = verifiers.get("ot_walk").prepare(p, q, len(children))
    benchmark(getattr(plan, call), children)


@pytest.mark.parametrize("name", ["ot_walk", "specinfer"])
def test_grid_labels_given_drafts(benchmark, grid_drafts, name):  # noqa: F811
    """The 324 labels of one root from its drafts (drafting and model calls excluded), V = 32,000."""
    table, drafts = grid_drafts
    verifier = tree_verifiers.get(name)
    grid = benchmark.pedantic(lambda: grid_block_efficiency(table.without_plans(), drafts, verifier), rounds=1, iterations=1)
    assert len(grid) == 4 * 9 * 9
