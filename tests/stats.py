"""Designed goodness-of-fit tests for samplers (used by the statistical and mutation tests); the
test itself is public (``simlab.conformance``: ``sample_size``, ``g_test_pvalue``, ``gtest_draws``).

Design, shared by every statistical test in the suite:

* false-alarm probability ``FALSE_ALARM = 1e-6``: a correct sampler fails with probability
  at most 1e-6 (the G statistic's asymptotic chi-square law, df = cells - 1);
* power ``POWER = 0.99`` against any law at total-variation distance ``TV_ALTERNATIVE = 0.02``
  or more: under such an alternative the statistic is asymptotically non-central chi-square
  with non-centrality at least N * chi2-divergence >= N * (2 TV)^2, so ``sample_size`` picks
  the smallest N (rounded up to 1,000) whose non-central tail beyond the critical value is
  >= 0.99.  Cells whose expected count is below 5 are merged (they hold < 5/N of the mass,
  so merging hides at most that much TV); a draw in a zero-probability cell fails at once.
* a test may state a larger alternative (``tv=``) only where an exact enumeration test already
  proves the same law and the sampled test checks the sampling code path end to end (the costly
  tree-level sampling loops: ``TV_SAMPLING_LOOP``); it says so in its docstring.  The node-level
  tests keep ``TV_ALTERNATIVE``;
* fixed seeds everywhere; no Monte Carlo inside hypothesis ``@given``.
"""

from __future__ import annotations

import numpy as np

from simlab.conformance import FALSE_ALARM, POWER, TV_ALTERNATIVE, g_test_pvalue, gtest_draws, sample_size

TV_SAMPLING_LOOP = 0.05
"""The stated alternative of the tree-level sampling-loop tests (draft, verify, emit, repeat), whose
law the exact enumeration tests already prove at 1e-12: they check the sampling path end to end."""


def assert_sampler_matches(draw, law: np.ndarray, seed: int, tv: float = TV_ALTERNATIVE) -> None:
    """Draw N tokens with ``draw(rng)`` (N from ``sample_size`` at power 0.99 against ``tv``) and
    G-test them against ``law`` (``simlab.conformance.gtest_draws``).

    Raises AssertionError when the test rejects at level FALSE_ALARM.
    """
    report = gtest_draws(draw, law, seed, tv)
    assert report.passed, report.summary()


__all__ = ["FALSE_ALARM", "POWER", "TV_ALTERNATIVE", "TV_SAMPLING_LOOP", "assert_sampler_matches", "g_test_pvalue", "sample_size"]
