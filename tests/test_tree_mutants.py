"""Every tree-level planted fault (tree_mutants.py) is caught by the tree checks."""

from __future__ import annotations

import numpy as np
import pytest

from simlab.builders import EAGLE2, Delayed, GreedyDraftTree, iid
from simlab.pairs import MarkovPair
from tree_checks import (
    check_fast_efficiency,
    check_greedy_decoding,
    check_lossless_flag,
    check_simulation_matches_exact,
    check_tree_lossless,
)
from tree_mutants import BUILDER_MUTANTS, TREE_MUTANTS, SequoiaWeightsReversed

PAIR = MarkovPair.random(3, np.random.default_rng(13), concentration=0.7, closeness=0.3)
CONTEXT = (0,)

CHECKS = {
    "lossless": lambda v: [check_tree_lossless(PAIR, CONTEXT, shape, v) for shape in (iid(3, 1), Delayed(2, 1, 2))],
    "simulation": lambda v: check_simulation_matches_exact(PAIR, CONTEXT, iid(1, 3), v, steps=3000, seed=5),
    "fast E": lambda v: check_fast_efficiency(v),
    "lossless on deterministic trees": lambda v: check_tree_lossless(PAIR, CONTEXT, EAGLE2(budget=3, depth=1, top_k=2), v),
    "greedy decoding at T > 0": lambda v: [
        check_greedy_decoding(PAIR, CONTEXT, shape, v) for shape in (EAGLE2(budget=3, depth=1, top_k=2), iid(2, 1))
    ],
    "lossless flag": lambda v: check_lossless_flag(v, PAIR, CONTEXT),
}
BUILDER_CHECKS = {
    "lossless": lambda b: [check_tree_lossless(PAIR, CONTEXT, b, v) for v in ("greedy_draft", "onehot")],
}


def failing_checks(verifier):
    """The checks the verifier fails (a pairing it refuses is not a failure: the check does not apply)."""
    failed = []
    for name, check in CHECKS.items():
        try:
            check(verifier)
        except AssertionError:
            failed.append(name)
        except ValueError as exc:
            assert "is not lossless for" in str(exc) or "is lossless only for a greedy" in str(exc), exc
    return failed


@pytest.mark.parametrize("fault", list(TREE_MUTANTS))
def test_tree_fault_is_caught(fault):
    verifier, expected = TREE_MUTANTS[fault]
    assert expected in failing_checks(verifier), f"planted fault '{fault}' not caught by the '{expected}' check"


def test_the_checks_pass_on_the_real_verifiers():
    from simlab import tree_verifiers

    for name in ("specinfer", "spectr", "traversal", "naive_chain", "hsd"):
        CHECKS["lossless"](tree_verifiers.get(name))
        CHECKS["fast E"](tree_verifiers.get(name))
        CHECKS["lossless flag"](tree_verifiers.get(name))
    for name in ("onehot", "nss", "greedy_draft"):
        CHECKS["lossless on deterministic trees"](tree_verifiers.get(name))
    CHECKS["greedy decoding at T > 0"](tree_verifiers.get("greedy"))
    BUILDER_CHECKS["lossless"](GreedyDraftTree(budget=3, depth=2, top_k=1))


@pytest.mark.parametrize("fault", list(BUILDER_MUTANTS))
def test_builder_fault_is_caught(fault):
    builder, expected = BUILDER_MUTANTS[fault]
    with pytest.raises(AssertionError):
        BUILDER_CHECKS[expected](builder)


def test_sequoia_dp_fault_is_caught():
    """The DP with its positional weights reversed is caught by the brute-force DP check."""
    from test_builders import all_trees
    from simlab.builders.sequoia import positional_value

    acceptance, m, l = (0.5, 0.2, 0.1), 6, 4
    table = SequoiaWeightsReversed.tree_dp(acceptance, m, l)
    best = max(positional_value(sorted(t), acceptance) for t in all_trees(m, l) if all(r < 3 for n in t for r in n))
    assert abs(positional_value(table.spec(m, l), acceptance) - best) > 1e-6
