"""Every tree-level planted fault (tree_mutants.py) is caught by the tree checks."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.pairs import MarkovPair
from simlab.shapes import Delayed, iid
from tree_checks import check_simulation_matches_exact, check_tree_lossless
from tree_mutants import TREE_MUTANTS

PAIR = MarkovPair.random(3, np.random.default_rng(13), concentration=0.7, closeness=0.3)
CONTEXT = (0,)

CHECKS = {
    "lossless": lambda v: [check_tree_lossless(PAIR, CONTEXT, shape, v) for shape in (iid(3, 1), Delayed(2, 1, 2))],
    "simulation": lambda v: check_simulation_matches_exact(PAIR, CONTEXT, iid(1, 3), v, steps=3000, seed=5),
}


def failing_checks(verifier):
    failed = []
    for name, check in CHECKS.items():
        try:
            check(verifier)
        except AssertionError:
            failed.append(name)
    return failed


@pytest.mark.parametrize("fault", list(TREE_MUTANTS))
def test_tree_fault_is_caught(fault):
    verifier, expected = TREE_MUTANTS[fault]
    assert expected in failing_checks(verifier), f"planted fault '{fault}' not caught by the '{expected}' check"
