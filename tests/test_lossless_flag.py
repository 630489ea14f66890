"""Every result that can come from a lossy pairing carries the same ``lossless`` flag.

The flag is computed in one place (``simlab.efficiency.lossless_over``, from
``TreeVerifier.lossless_depth``); here it is checked against the reference, ``TreeVerifier.mismatch``
on the very trees (and cuts) a value was computed from, at every entry point that returns an
``Estimate``: ``expected_block_efficiency`` (exact, mc, auto), ``simulate_block_efficiency``,
``grid_block_efficiency`` (numpy, streamed, torch) and ``action_grid_block_efficiency``.
Deterministic (fixed seeds, exact flags).
"""

from __future__ import annotations

import numpy as np
import pytest

from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.efficiency import expected_block_efficiency, simulate_block_efficiency
from simlab.grid import action_grid_block_efficiency, draw_grid, grid_block_efficiency
from simlab.pairs import MarkovPair
from simlab.builders import Delayed, iid
from simlab.trees import NodeTable
from tree_checks import check_lossless_flag

PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)
CONTEXT = (1,)
PER_PATH = Delayed(2, 1, 1, trunk_children="per_path")  # trunk children REPEATED: SpecInfer is lossy there
# (verifier, shape, lossless?): the flag each entry point must report
PAIRINGS = [
    ("specinfer", PER_PATH, False),
    ("traversal", PER_PATH, True),
    ("specinfer", iid(2, 2), True),
    ("specinfer", Delayed(2, 0, 1, siblings=Drafting.WITHOUT_REPLACEMENT), False),
    ("greedy", iid(2, 1), False),
]


def _mismatch_free(verifier, trees) -> bool:
    return all(verifier.mismatch(tree) is None for tree in trees)


@pytest.mark.parametrize("name, shape, lossless", PAIRINGS, ids=[f"{n}-{s}" for n, s, _ in PAIRINGS])
def test_every_estimate_of_a_pairing_carries_its_flag(name, shape, lossless):
    verifier = tree_verifiers.get(name, allow_lossy=True)
    trees = [tree for tree, _ in shape.enumerate(NodeTable(PAIR, CONTEXT))]
    assert _mismatch_free(verifier, trees) is lossless  # the reference agrees with the table above
    estimates = {
        "exact": expected_block_efficiency(PAIR, CONTEXT, shape, verifier),
        "mc": expected_block_efficiency(PAIR, CONTEXT, shape, verifier, method="mc", samples=8, seed=1),
        "auto": expected_block_efficiency(PAIR, CONTEXT, shape, verifier, method="auto"),
        "exact, by name": expected_block_efficiency(PAIR, CONTEXT, shape, name, allow_lossy=True),
        "simulation": simulate_block_efficiency(PAIR, CONTEXT, shape, verifier, steps=50, seed=2),
        "simulation, by name": simulate_block_efficiency(PAIR, CONTEXT, shape, name, steps=50, seed=2, allow_lossy=True),
    }
    for where, estimate in estimates.items():
        assert estimate.lossless is lossless, f"{name} on {shape}: {where} says lossless={estimate.lossless}"


def _grid_trees(table, drafts, K, trunk_children):
    return [Delayed.build(table, d.trunk, d.branches[:K], repeats=K if trunk_children == "per_path" else 1) for d in drafts]


@pytest.mark.parametrize("engine, stream", [("numpy", False), ("numpy", True), ("torch", False)])
@pytest.mark.parametrize(
    "name, trunk_children", [("specinfer", "per_path"), ("nss", "per_path"), ("specinfer", "shared"), ("naive", "per_path")]
)
def test_every_grid_action_carries_the_flag_of_its_cut_trees(name, trunk_children, engine, stream):
    """Issue 28: the grid reported lossless=True for SpecInfer on per-path trunk children."""
    table = NodeTable(PAIR, CONTEXT)
    drafts = draw_grid(table, K_max=2, L1_values=(0, 1, 2), L2_max=2, samples=2, rng=np.random.default_rng(3))
    verifier = tree_verifiers.get(name, allow_lossy=True)
    grid = grid_block_efficiency(
        table, drafts, verifier, K_values=(1, 2), L2_values=(0, 1, 2), trunk_children=trunk_children, engine=engine, stream=stream
    )
    for (K, L1, L2), estimate in grid.items():
        trees = _grid_trees(table, [d for d in drafts if d.L1 == L1], K, trunk_children)
        expected = _mismatch_free(verifier, [tree.truncate(L1 + L2) for tree in trees])
        assert estimate.lossless is expected, (K, L1, L2)
    if name == "specinfer" and trunk_children == "per_path":
        assert not grid[(2, 1, 1)].lossless and grid[(1, 1, 1)].lossless and grid[(2, 0, 1)].lossless


@pytest.mark.parametrize("name, lossless", [("greedy", False), ("nss", True)])
def test_the_action_grid_carries_the_flag(name, lossless):
    """greedy at T = 1 is lossy at every cut (p is not one-hot, even at the root); NSS nowhere."""
    verifier = tree_verifiers.get(name, allow_lossy=True)
    grid = action_grid_block_efficiency(PAIR, CONTEXT, verifier, K_values=(1, 2), L1_values=(0, 1), L2_values=(0, 1), samples=2)
    assert all(est.lossless is lossless for est in grid.values())


@pytest.mark.parametrize("name", tree_verifiers.names())
def test_lossless_depth_agrees_with_mismatch_on_every_cut(name):
    """The one-pass flag against the reference (``mismatch``) on every cut of a few sampled trees
    (its planted fault: tests/tree_mutants.py ``FlagOffByOne``)."""
    check_lossless_flag(tree_verifiers.get(name, allow_lossy=True), PAIR, CONTEXT)
