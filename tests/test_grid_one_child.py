"""The grid's one-child masses without a plan (``simlab.grid.one_child_masses``) against the plans.

A one-child node of a top-down NaiveTree, SpecTr or SpecInfer tree is valued by the shared
speculative-sampling plan (``simlab.trees.SPECULATIVE``); the grid settles most of them at once
from p(x) and q(x) (a = 1, or q(x) - p(x) above ``EXCESS_MARGIN``, where Z > 0 is certain) and
leaves the rest to the plan.  Checked here on rows where the shortcut must not apply: p = q (Z = 0,
a = 1), p just below q everywhere (Z = 0, a < 1: the correction is p), a child with q = 0.
"""

from __future__ import annotations

import numpy as np
import pytest

from simlab import grid, tree_verifiers
from simlab.grid import GridDraft, draw_grid, grid_block_efficiency, one_child_masses
from simlab.trees import SPECULATIVE, NodeTable

V = 8


def _rows(kind: str, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(V, 0.7))
    if kind == "equal":
        return q.copy(), q
    if kind == "below":  # p < q everywhere: no residual mass at all
        return q * (1 - 1e-11), q
    if kind == "barely":  # p(x) below q(x) by less than the margin, an excess elsewhere
        p = q.copy()
        p[:4] -= 1e-12
        p[4:] += 1e-12
        return p, q
    return rng.dirichlet(np.full(V, 0.7)), q


class MixedPair:
    """p and q chosen by the context's last token: ordinary rows, p = q, p < q everywhere, p(x) just
    below q(x); deterministic, so every table of the pair agrees."""

    vocab_size = V
    KINDS = ("ordinary", "equal", "below", "barely")

    def distributions(self, contexts):
        rows = [_rows(self.KINDS[c[-1] % 4], c[-1] + 7 * len(c)) for c in contexts]
        return np.array([r[0] for r in rows]), np.array([r[1] for r in rows])


@pytest.fixture(scope="module")
def drafts():
    return draw_grid(
        NodeTable(MixedPair(), (1,)), K_max=3, L1_values=(0, 1, 3), L2_max=3, samples=3, rng=np.random.default_rng(5)
    )


def _agrees(name, drafts) -> bool:
    verifier = tree_verifiers.get(name)
    options = dict(K_values=(1, 2, 3), L2_values=(0, 1, 2, 3))
    fast = grid_block_efficiency(NodeTable(MixedPair(), (1,)), drafts, verifier, **options)
    plain = grid_block_efficiency(NodeTable(MixedPair(), (1,)), drafts, verifier, engine="reference", **options)
    return all(fast[a].mean == plain[a].mean for a in plain)


@pytest.mark.parametrize("name", ["naive", "spectr", "specinfer"])
def test_the_grid_with_settled_one_child_masses_equals_the_reference_bit_for_bit(name, drafts):
    assert _agrees(name, drafts)


def test_settled_masses_are_the_plan_masses_and_the_doubtful_ones_are_left():
    table = NodeTable(MixedPair(), (1,))
    requests = [((t,), x) for t in range(V) for x in range(V)]
    settled = one_child_masses(table, requests)
    for (path, x), value in settled.items():
        plan = table.plan(SPECULATIVE, path, 1)
        assert value == plan.children_masses(np.array([[x]]))[0, 0]
    kinds = {path: MixedPair.KINDS[path[0] % 4] for path, _ in requests}
    below = [r for r in requests if kinds[r[0]] == "below"]
    assert below and not any(r in settled for r in below)  # Z = 0 with a < 1: only the plan knows
    assert all(r in settled for r in requests if kinds[r[0]] == "equal")  # a = 1: 1.0 either way
    assert any(r not in settled for r in requests if kinds[r[0]] == "barely")


def test_a_child_with_zero_draft_mass_is_left_to_the_plan_and_refused():
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.4, 0.0])

    class Pair:
        vocab_size = 3

        def distributions(self, contexts):
            return np.tile(p, (len(contexts), 1)), np.tile(q, (len(contexts), 1))

    table = NodeTable(Pair(), (0,))
    assert one_child_masses(table, [((), 2), ((), 7), ((), 1)]) == {((), 1): 0.3 / 0.4}  # ids 2 (q = 0), 7 left
    assert one_child_masses(table, [((), np.int64(1)), ((), True)]) == {((), np.int64(1)): 0.3 / 0.4}  # a bool is no id
    with pytest.raises(ValueError, match="q = 0"):
        grid_block_efficiency(table, [GridDraft(1, (2,), ((1,),))], "naive", K_values=(1,), L2_values=(0, 1))


def test_the_agreement_catches_a_shortcut_taken_without_an_excess(monkeypatch, drafts):
    """Planted fault: the margin dropped, so p < q everywhere (Z = 0) is settled as a."""
    monkeypatch.setattr(grid, "EXCESS_MARGIN", -1.0)
    assert not _agrees("naive", drafts)
