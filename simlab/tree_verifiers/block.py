"""Block Verification (Sun et al. 2024, arXiv 2403.10444) on the first path of a tree.

For the draft block X_1..X_g (the first path) with target p_i and draft q_i at the node after
i tokens: weights w_0 = 1, w_i = min(1, w_{i-1} p_{i-1}(X_i) / q_{i-1}(X_i)); the residual mass
s_i = sum_x (w_i p_i(x) - q_i(x))_+; block acceptance h_i = s_i / (s_i + 1 - w_i) for i < g
(h_i = 1 where w_i = 1), h_g = w_g, h_0 = 1.  With independent uniforms eta_i,
tau = max{i : eta_i < h_i}, so P(tau = i) = h_i prod_{j > i} (1 - h_j).  The next token is the
bonus Y ~ p_g when tau = g, else the correction Y ~ norm((w_tau p_tau - q_tau)_+).  Optimal
among verifiers that see only on-path p and q.  On a chain it matches Traversal Verification.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import positive_part, residual, sample_categorical
from simlab.drafting import SAMPLED, Drafting
from simlab.tree_verifiers.base import TreeVerifier, drafted_q


@dataclass(frozen=True)
class BlockVerification(TreeVerifier):
    """Block Verification of the first drafted path."""

    name = "bv"
    label = "BV"
    single_path = True
    lossless_for = SAMPLED | {Drafting.REPEATED}  # repeated copies of one draw act as one child (exact: tests/test_audit.py)

    def _block(self, tree):
        """(path, h (g+1,), next-token laws [g+1 vectors]) for the first path."""
        path = tree.first_path()
        g = len(path)
        w = np.ones(g + 1)
        for i in range(1, g + 1):
            node, x = path[: i - 1], path[i - 1]
            w[i] = min(1.0, w[i - 1] * tree.table.p(node)[x] / drafted_q(tree, node, x))
        h = np.ones(g + 1)
        laws = []
        for i in range(g + 1):
            p_i = tree.table.p(path[:i])
            if i == g:
                h[i] = w[i]
                laws.append(p_i)
                continue
            q_i = tree.table.q(path[:i])
            s = float(positive_part(w[i] * p_i - q_i).sum())
            if i > 0:
                h[i] = 1.0 if w[i] >= 1.0 else s / (s + 1.0 - w[i])
            # With w_i = 0 the block cannot stop here (h_i = 0), so any law serves; use p_i.
            laws.append(residual(w[i] * p_i, q_i) if w[i] > 0 else p_i)
        return path, h, laws

    @staticmethod
    def _tau_distribution(h):
        """P(tau = i) = h_i prod_{j > i} (1 - h_j), i = 0..g (h_0 = 1)."""
        later_rejected = np.concatenate((np.cumprod((1.0 - h)[::-1])[::-1][1:], [1.0]))
        return h * later_rejected

    def _outcome_law(self, tree):
        path, h, laws = self._block(tree)
        probs = self._tau_distribution(h)
        return {path[:i]: probs[i] * laws[i] for i in range(len(path) + 1) if probs[i] > 0.0}

    def _verify(self, tree, rng):
        path, h, laws = self._block(tree)
        tau = 0
        for i in range(1, len(path) + 1):
            if rng.random() < h[i]:
                tau = i
        return path[:tau], sample_categorical(laws[tau], rng)
