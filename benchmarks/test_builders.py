"""Builder timings at V = 32,000, model calls excluded (issue 12).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_builders.py --benchmark-columns=min,median,mean,rounds
(and once more without OMP_NUM_THREADS, the default environment).
Targets (recorded in benchmarks/RESULTS.md, not asserted): exact E[tau+1] of one EAGLE-2 tree
(60 tokens, depth 7, top-k 10) with the one-hot verifier <= 20 ms; building the tree <= 10 ms
beyond the model calls (p and q of every candidate fetched before timing).
"""

import numpy as np
import pytest

from benchmarks.test_trees import PrefetchedPair
from simlab import tree_verifiers
from simlab.builders import EAGLE2, GreedyDraftTree
from simlab.trees import DraftTree, NodeTable

EAGLE = EAGLE2(budget=59, depth=7, top_k=10)


@pytest.fixture(scope="module")
def table():
    """A table holding p and q of every node the builders ask for (so no model call is timed)."""
    table = NodeTable(PrefetchedPair(), [5, 6])
    EAGLE.sample(table)
    GreedyDraftTree(budget=59, depth=7, top_k=10).sample(table, np.random.default_rng(0))
    return table


def test_build_eagle2_tree(benchmark, table):
    tree = benchmark(lambda: EAGLE.sample(table.without_plans()))
    assert tree.tokens() == 59 and tree.depth() <= 8


def test_exact_block_efficiency_eagle2_onehot(benchmark, table):
    tree = EAGLE.sample(table)
    verifier = tree_verifiers.get("onehot")

    def run():
        return verifier.expected_block_efficiency(DraftTree(tree.table.without_plans(), tree.children, tree.drafting))

    value = benchmark(run)
    assert 1.0 <= value <= 9.0


def test_build_greedy_draft_tree(benchmark, table):
    builder = GreedyDraftTree(budget=59, depth=7, top_k=10)
    assert benchmark(lambda: builder.sample(table.without_plans(), np.random.default_rng(0))).tokens() <= 59
