"""The grid's lossless flags and refusals from ``simlab.grid.lossless_depths`` against the plain path.

The top-down numpy grid decides each node's pairing once per (law, number of children) and asks
``verifier.check`` and ``lossless_over`` only for trees with a lossy node; its flags and refusals
must be those of ``engine="reference"`` (``block_efficiency_by_depth``'s check per tree and
``lossless_over`` over every tree), for lossless pairings and lossy ones (repeated trunk children,
``trunk_children="per_path"``, where SpecTr and SpecInfer are lossy).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from simlab import grid, tree_verifiers
from simlab.grid import draw_grid, grid_block_efficiency, lossless_depths
from simlab.pairs import MarkovPair
from simlab.trees import NodeTable

OPTIONS = dict(K_values=(1, 2, 3), L2_values=(0, 1, 2, 3))


@pytest.fixture(scope="module")
def setting():
    pair = MarkovPair.random(6, np.random.default_rng(8), concentration=0.6, closeness=0.4)
    drafts = draw_grid(NodeTable(pair, (0,)), K_max=3, L1_values=(0, 1, 2), L2_max=3, samples=3, rng=np.random.default_rng(9))
    return pair, drafts


def _outcome(pair, drafts, name, trunk, allow_lossy, engine="numpy"):
    verifier = tree_verifiers.get(name, allow_lossy=allow_lossy)
    try:
        out = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, trunk_children=trunk, engine=engine, **OPTIONS)
    except ValueError as exc:
        return str(exc)
    return {a: (e.lossless, e.mean) for a, e in out.items()}


def _agrees(pair, drafts, name, trunk, allow_lossy) -> bool:
    return _outcome(pair, drafts, name, trunk, allow_lossy) == _outcome(pair, drafts, name, trunk, allow_lossy, "reference")


@pytest.mark.parametrize("name", ["naive", "spectr", "specinfer", "nss", "khisti"])
@pytest.mark.parametrize("trunk", ["shared", "per_path"])
@pytest.mark.parametrize("allow_lossy", [False, True])
def test_flags_and_refusals_equal_the_reference(setting, name, trunk, allow_lossy):
    assert _agrees(*setting, name, trunk, allow_lossy)


def test_the_cases_hold_lossy_flags_and_refusals(setting):
    """The comparisons above see both kinds of outcome: a refusal and a flag False."""
    refused = _outcome(*setting, "spectr", "per_path", False)
    assert isinstance(refused, str) and refused.startswith("verifier: ")
    flags = _outcome(*setting, "spectr", "per_path", True)
    assert not all(lossless for lossless, _ in flags.values()) and any(lossless for lossless, _ in flags.values())


def test_lossless_depths_are_the_verifiers_own(setting):
    pair, drafts = setting
    table = NodeTable(pair, (0,))
    for name in ("spectr", "naive"):
        verifier = tree_verifiers.get(name, allow_lossy=True)
        trees = [t for d in drafts for t in grid._draft_trees(table, d, (1, 2, 3), True).values()]
        assert lossless_depths(verifier, trees) == [verifier.lossless_depth(t) for t in trees]
        assert any(depth != math.inf for depth in lossless_depths(verifier, trees)) == (name == "spectr")
    assert lossless_depths(tree_verifiers.get("naive_chain"), trees) is None  # not the TopDown class itself


def test_the_agreement_catches_a_shortcut_that_trusts_every_tree(setting, monkeypatch):
    """Planted fault: every tree taken as lossless, so the lossy one is neither refused nor flagged."""
    monkeypatch.setattr(grid, "lossless_depths", lambda verifier, trees: [math.inf] * len(trees))
    assert not _agrees(*setting, "spectr", "per_path", False)
    assert not _agrees(*setting, "spectr", "per_path", True)
