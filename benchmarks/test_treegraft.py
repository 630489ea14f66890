"""TreeGraft timings at V = 4096, model calls excluded (issue 13).

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_treegraft.py --benchmark-columns=min,median,mean,rounds
Targets (recorded in benchmarks/RESULTS.md, not asserted): building one TreeGraft tree (D = 5,
k = 10, budget 63) <= 20 ms; the exact 32-schedule oracle for one root <= 2 s.
"""

import numpy as np
import pytest

from backends.synthetic import RepetitiveWorld
from simlab.latency import ForwardTime, LatencyModel
from simlab.pairs import target_trajectory
from simlab.treegraft import TreeGraft
from simlab.treegraft.schedules import evaluate_schedules
from simlab.trees import NodeTable

LATENCY = LatencyModel.from_cost_ratio(0.3, per_token=0.002).with_drafter("small", ForwardTime.constant(0.011))


@pytest.fixture(scope="module")
def table():
    """A root of the repetitive world (V = 4096) whose table holds p and q of every node any schedule asks for."""
    world = RepetitiveWorld(vocab=4096, seed=0)
    context = target_trajectory(world, 60, np.random.default_rng(0), prefix=(7,))
    table = NodeTable(world, context)
    evaluate_schedules(TreeGraft(), table, "onehot", LATENCY)  # warm-up: fetch every node once
    return table


def test_build_one_tree(benchmark, table):
    builder = TreeGraft()
    root = builder.prepare(table)
    tree = benchmark(lambda: builder.build(root))
    assert tree.tokens() <= 63


def test_exact_oracle_of_32_schedules(benchmark, table):
    values = benchmark.pedantic(
        evaluate_schedules, args=(TreeGraft(), table.without_plans(), "onehot", LATENCY), rounds=3, iterations=1
    )
    assert len(values) == 32
