"""Every TreeGraft planted fault (treegraft_mutants.py) is caught by the hand-built cases or by the
written-out reference (treegraft_checks.py), which the real builder passes (test_treegraft.py)."""

from __future__ import annotations

import pytest

from treegraft_checks import HAND_CASES, check_reference, sweep_roots
from treegraft_mutants import TREEGRAFT_MUTANTS

QUICK_ROOTS = sweep_roots()[:4]


def caught(make) -> list[str]:
    """The checks ``make``'s builders fail."""
    failed = []
    for name, case in HAND_CASES.items():
        try:
            case(make)
        except AssertionError:
            failed.append(name)
    if not failed:
        try:
            check_reference(make, roots=QUICK_ROOTS)
        except AssertionError:
            failed.append("reference")
    return failed


@pytest.mark.parametrize("fault", list(TREEGRAFT_MUTANTS))
def test_fault_is_caught(fault):
    assert caught(TREEGRAFT_MUTANTS[fault]), f"planted fault '{fault}' not caught"


@pytest.mark.parametrize(
    "rule, case",
    [
        ("continue_after_empty_frontier", "empty frontier"),
        ("top_k_fallback", "fallback"),
        ("truncated_chains", "truncated chain"),
        ("coverage_by_proposals", "coverage with existing children"),
        ("frontier_attached_only", "coverage with existing children"),
        ("overwrite_scores", "max score / existing path"),
        ("cache_without_last_row", "last prompt row"),
    ],
)
def test_each_corrected_rule_has_its_hand_case(rule, case):
    """The hand case written for a corrected rule fails with the lab's rule (it changes the tree)."""
    with pytest.raises(AssertionError):
        HAND_CASES[case](TREEGRAFT_MUTANTS[f"lab rule {rule}"])
