"""Every SpecBlock planted fault (specblock_mutants.py) is caught by its check, which the real code passes."""

from __future__ import annotations

import pytest

from backends.block_drafter.model import rank_labels, valid_prefix_mask
from simlab.specblock import RankGuided
from simlab.specblock.bandit import CostAwareBandit
from backends.block_drafter.train import official_block_losses
from specblock_checks import (
    check_bandit_costs,
    check_block_one,
    check_later_blocks,
    check_official_losses,
    check_pruning,
    check_rank_labels,
    check_valid_prefix,
    check_widths,
)
from specblock_mutants import SPECBLOCK_MUTANTS

CHECKS = {
    "widths": (check_widths, RankGuided),
    "pruning": (check_pruning, RankGuided),
    "block one": (check_block_one, RankGuided),
    "valid prefix": (check_valid_prefix, valid_prefix_mask),
    "rank labels": (check_rank_labels, rank_labels),
    "bandit costs": (check_bandit_costs, CostAwareBandit),
    "later blocks": (check_later_blocks, RankGuided),
    "official losses": (check_official_losses, official_block_losses),
}


@pytest.mark.parametrize("fault", list(SPECBLOCK_MUTANTS))
def test_fault_is_caught(fault):
    check, mutant = SPECBLOCK_MUTANTS[fault][0], SPECBLOCK_MUTANTS[fault][1]
    function, correct = CHECKS[check]
    function(correct)
    with pytest.raises(AssertionError):
        function(mutant)
