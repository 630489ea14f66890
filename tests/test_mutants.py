"""The planted-fault suite: every broken verifier in mutants.py fails at least one check.

The checks are the same functions the real verifiers pass (checks.py), run on fixed
instances, cheapest first; the statistical checks keep their stated design (stats.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from checks import (
    applicable,
    check_acceptance,
    check_boundary_uniforms,
    check_draw_helper,
    check_children_mass,
    check_lossless,
    check_sampler_end_to_end,
    check_sampler_given_children,
    check_zero_target_never_accepted,
)
from mutants import DRAW_MUTANTS, MUTANTS
from simlab.distributions import sample_categorical

P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
ONE_HOT_P = np.array([0.0, 0.0, 0.0, 0.0, 1.0, 0.0])


def target(v):
    """The target a check uses: P, or a one-hot one for a verifier lossless only for greedy targets."""
    return ONE_HOT_P if v.needs_greedy_target else P


def children(v):
    return [0, 3, 0] if v.drafting.value == "iid" else [0, 3, 1]


CHECKS = [
    ("lossless k=2", lambda v: check_lossless(v, target(v), Q, 2)),
    ("lossless k=3", lambda v: check_lossless(v, target(v), Q, 3)),
    ("acceptance k=3", lambda v: check_acceptance(v, target(v), Q, 3)),
    ("u = 0 boundary", check_zero_target_never_accepted),
    ("children mass", lambda v: check_children_mass(v, target(v), Q, 3)),  # exact: before the G-tests
    ("sampler vs law", lambda v: check_sampler_given_children(v, target(v), Q, children(v), seed=21)),
    ("sampler end to end", lambda v: check_sampler_end_to_end(v, target(v), Q, 3, seed=22)),
    ("u boundaries", check_boundary_uniforms),
]


def first_failing_check(verifier):
    for name, check in CHECKS:
        try:
            check(verifier)
        except AssertionError:
            return name
    return None


@pytest.mark.parametrize("fault", list(MUTANTS))
def test_the_correct_verifier_passes_the_check_that_catches_its_mutant(fault):
    """The check is a real test: the verifier the fault was planted in passes it."""
    mutant, expected = MUTANTS[fault]
    correct = type(mutant).__mro__[1](**{f: getattr(mutant, f) for f in mutant.__dataclass_fields__})
    assert applicable(correct, Q, 3, target(correct))
    dict(CHECKS)[expected](correct)


@pytest.mark.parametrize("fault", list(MUTANTS))
def test_planted_fault_is_caught(fault):
    verifier, expected = MUTANTS[fault]
    caught_by = first_failing_check(verifier)
    assert caught_by is not None, f"planted fault '{fault}' passed every check"
    assert caught_by == expected, f"planted fault '{fault}' caught by '{caught_by}', expected '{expected}'"


def test_the_shared_draw_passes_the_check_that_catches_its_mutants():
    check_draw_helper(sample_categorical)


@pytest.mark.parametrize("fault", list(DRAW_MUTANTS))
def test_planted_fault_in_the_shared_draw_is_caught(fault):
    with pytest.raises(AssertionError, match="draw: index"):
        check_draw_helper(DRAW_MUTANTS[fault])
