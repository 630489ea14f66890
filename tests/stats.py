"""Designed goodness-of-fit tests for samplers (used by the statistical and mutation tests).

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
from scipy import stats

FALSE_ALARM = 1e-6
POWER = 0.99
TV_ALTERNATIVE = 0.02
TV_SAMPLING_LOOP = 0.05
"""The stated alternative of the tree-level sampling-loop tests (draft, verify, emit, repeat), whose
law the exact enumeration tests already prove at 1e-12: they check the sampling path end to end."""


def sample_size(cells: int, tv: float = TV_ALTERNATIVE) -> int:
    """Smallest N (multiple of 1,000) giving power >= POWER at level FALSE_ALARM with ``cells`` cells."""
    df = max(cells - 1, 1)
    critical = stats.chi2.isf(FALSE_ALARM, df)
    n = 1000
    while stats.ncx2.sf(critical, df, 4.0 * n * tv**2) < POWER:
        n += 1000
    return n


def g_test_pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """p-value of the G-test of ``counts`` (V,) against ``law`` (V,); 0.0 if a zero-law cell was hit."""
    counts = np.asarray(counts, dtype=np.float64)
    law = np.asarray(law, dtype=np.float64)
    if np.any(counts[law <= 0] > 0):
        return 0.0
    n = counts.sum()
    expected = n * law / law.sum()
    keep = expected >= 5
    obs = list(counts[keep]) + ([counts[~keep].sum()] if np.any(~keep & (law > 0)) else [])
    exp = list(expected[keep]) + ([expected[~keep].sum()] if np.any(~keep & (law > 0)) else [])
    if len(obs) < 2:
        return 1.0
    obs, exp = np.array(obs), np.array(exp)
    exp *= obs.sum() / exp.sum()
    return float(stats.power_divergence(obs, exp, lambda_="log-likelihood").pvalue)


def assert_sampler_matches(draw, law: np.ndarray, seed: int, tv: float = TV_ALTERNATIVE) -> None:
    """Draw N tokens with ``draw(rng)`` (N from ``sample_size`` at power 0.99 against ``tv``) and
    G-test them against ``law``.

    Raises AssertionError when the test rejects at level FALSE_ALARM.
    """
    law = np.asarray(law, dtype=np.float64)
    n = sample_size(int(np.count_nonzero(law)), tv)
    rng = np.random.default_rng(seed)
    counts = np.bincount([draw(rng) for _ in range(n)], minlength=law.size)
    pvalue = g_test_pvalue(counts, law)
    assert pvalue > FALSE_ALARM, (
        f"G-test rejects (p-value {pvalue:.3g}, N = {n}): counts {counts.tolist()} vs law {np.round(law, 4).tolist()}"
    )
