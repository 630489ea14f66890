"""Node-verifier timings at V = 128,000, k = 4 (issue: output_distribution and acceptance_rate
<= 0.5 ms for nss/naive/spectr/specinfer, Khisti with s-truncation <= 10 ms).

Run:  python -m pytest benchmarks/test_node_verifiers.py --benchmark-columns=min,median,mean,rounds
Results are recorded in benchmarks/RESULTS.md, not asserted.
"""

import pytest

from simlab import verifiers

FAST = ["nss", "naive", "spectr", "specinfer"]


@pytest.mark.parametrize("name", FAST)
def test_output_distribution(benchmark, node, name):
    p, q, children = node
    verifier = verifiers.get(name)
    law = benchmark(verifier.output_distribution, p, q, children)
    assert abs(law.sum() - 1.0) < 1e-9


@pytest.mark.parametrize("name", FAST)
def test_acceptance_rate(benchmark, node, name):
    p, q, children = node
    verifier = verifiers.get(name)
    alpha = benchmark(verifier.acceptance_rate, p, q, len(children))
    assert 0.0 <= alpha <= 1.0


def test_khisti_truncated_output_distribution(benchmark, node):
    p, q, children = node
    verifier = verifiers.get("khisti", mode="truncated", s=5)
    law = benchmark(verifier.output_distribution, p, q, children)
    assert abs(law.sum() - 1.0) < 1e-9


@pytest.mark.parametrize("name", FAST + ["khisti"])
def test_prepared_plan_output_distribution(benchmark, node, name):
    """The per-child cost once the node is prepared (what a tree computation pays per child list)."""
    p, q, children = node
    plan = verifiers.get(name).prepare(p, q, len(children))
    benchmark(plan.output_distribution, children)


@pytest.mark.parametrize("name", FAST)
def test_prepare_validated_once(benchmark, node, name):
    """``prepare`` on inputs a NodeTable already validated (what every tree and label path pays)."""
    p, q, children = node
    verifier = verifiers.get(name)
    benchmark(verifier.prepare, p, q, len(children), checked=True)


@pytest.mark.parametrize("name", FAST)
def test_children_mass_after_prepare(benchmark, node, name):
    """The children's branch masses once the node is prepared (issue 16: <= 0.05 ms)."""
    p, q, children = node
    plan = verifiers.get(name).prepare(p, q, len(children))
    mass = benchmark(plan.children_mass, children)
    assert mass.shape == children.shape
