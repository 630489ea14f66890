"""The action grid's one axes type (``simlab.grid.GridAxes``): the actions it lists against a
written-out reference, the capture's width/depth mapping, and bad axes refused by name."""

from __future__ import annotations

import pytest

from simlab.grid import GridAxes


def test_actions_within_a_budget_match_a_written_out_reference():
    axes = GridAxes()
    assert len(axes.actions()) == 4 * 9 * 9 and axes.actions()[:2] == [(1, 0, 0), (1, 0, 1)]
    for budget in (1, 4, 8, 16):
        for rollouts in (False, True):
            reference = [
                (K, L1, L2)
                for K in range(1, 5)
                for L1 in range(9)
                for L2 in range(9)
                if L1 + K * L2 <= budget and L1 + L2 > 0 and not (rollouts and L1)
            ]
            assert axes.actions(budget, rollouts=rollouts) == reference


def test_capture_width_and_depth_map_onto_the_axes():
    axes = GridAxes.from_width_depth(3, 2)
    assert axes == GridAxes((1, 2, 3), (0, 1, 2), (0, 1, 2))
    assert (axes.width, axes.depth, axes.largest_tree) == (3, 2, 2 + 3 * 2)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(K_values=()), "K_values"),
        (dict(K_values=(0, 1)), "K_values"),
        (dict(L1_values=(1, 1)), "L1_values"),
        (dict(L2_values=(-1,)), "L2_values"),
    ],
)
def test_bad_axes_are_refused_by_name(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        GridAxes(**kwargs)


def test_bad_capture_sizes_are_refused_by_name():
    with pytest.raises(ValueError, match="^width: "):
        GridAxes.from_width_depth(0, 2)
    with pytest.raises(ValueError, match="^depth: "):
        GridAxes.from_width_depth(2, -1)
