"""Reusable checks for tree verifiers (used by the tree tests and the tree planted-fault suite).

The estimator cross-check compares two estimates of E[tau + 1] by |a - b| <= 5 combined
standard errors: two-sided false-alarm probability 5.7e-7 under the normal approximation
(fixed seeds make every run identical), power >= 0.99 against a bias of 7.33 standard errors.
"""

from __future__ import annotations

import math

import numpy as np

from simlab.efficiency import (
    emitted_sequence_law,
    expected_block_efficiency,
    simulate_block_efficiency,
    target_sequence_law,
)

Z = 5.0


def check_tree_lossless(pair, context, shape, verifier, n=2):
    law = emitted_sequence_law(pair, context, shape, verifier, n)
    target = target_sequence_law(pair, context, n)
    tv = 0.5 * sum(abs(law.get(k, 0.0) - target.get(k, 0.0)) for k in set(law) | set(target))
    assert tv <= 1e-10, f"emitted {n}-token law differs from the target by TV {tv:.3g}"


def check_estimates_agree(a, b):
    se = math.hypot(a.stderr, b.stderr)
    assert abs(a.mean - b.mean) <= Z * se + 1e-12, f"{a.method} {a.mean:.4f} vs {b.method} {b.mean:.4f} (combined SE {se:.4f})"


def check_simulation_matches_exact(pair, context, shape, verifier, steps=2000, seed=0):
    exact = expected_block_efficiency(pair, context, shape, verifier)
    check_estimates_agree(exact, simulate_block_efficiency(pair, context, shape, verifier, steps=steps, seed=seed))


def check_outcome_law_is_a_law(tree, verifier):
    law = verifier.outcome_law(tree)
    total = sum(float(v.sum()) for v in law.values())
    assert abs(total - 1.0) <= 1e-12, f"outcome law sums to {total}"
    assert all(np.all(v >= -1e-15) for v in law.values())
