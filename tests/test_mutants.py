"""The planted-fault suite: every broken verifier in mutants.py fails at least one check.

The checks are the same functions the real verifiers pass (checks.py), run on fixed
instances, cheapest first; the statistical checks keep their stated design (stats.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from checks import (
    check_acceptance,
    check_lossless,
    check_sampler_end_to_end,
    check_sampler_given_children,
    check_zero_target_never_accepted,
)
from mutants import MUTANTS

P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])

CHECKS = [
    ("lossless k=2", lambda v: check_lossless(v, P, Q, 2)),
    ("lossless k=3", lambda v: check_lossless(v, P, Q, 3)),
    ("acceptance k=3", lambda v: check_acceptance(v, P, Q, 3)),
    ("u = 0 boundary", check_zero_target_never_accepted),
    ("sampler vs law", lambda v: check_sampler_given_children(v, P, Q, [0, 3, 0], seed=21)),
    ("sampler end to end", lambda v: check_sampler_end_to_end(v, P, Q, 3, seed=22)),
]


def first_failing_check(verifier):
    for name, check in CHECKS:
        try:
            check(verifier)
        except AssertionError:
            return name
    return None


@pytest.mark.parametrize("fault", list(MUTANTS))
def test_planted_fault_is_caught(fault):
    verifier, expected = MUTANTS[fault]
    caught_by = first_failing_check(verifier)
    assert caught_by is not None, f"planted fault '{fault}' passed every check"
    assert caught_by == expected, f"planted fault '{fault}' caught by '{caught_by}', expected '{expected}'"


def test_there_are_at_least_six_planted_faults():
    assert len(MUTANTS) >= 6
