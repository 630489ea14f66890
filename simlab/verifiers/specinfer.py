"""SpecInfer's multi-step speculative sampling = recursive rejection sampling *with* replacement.

Children X_1..X_k ~ i.i.d. q.  Keep a working target p_0 = p.  Pick a remaining child x
(uniformly at random, as in SpecInfer Alg. 2, or in the drafted order with
``order="fixed"``); accept it with probability min(1, p_i(x) / q(x)); on rejection set
p_{i+1} = norm((p_i - q)_+) and remove that one copy of x.  When no child is left, output
Y ~ p_k.  Since p_{i+1} depends only on i, the random-order law is a DP over the at most 2^k
subsets of remaining children (DDTE App. D), touching the full vocabulary only k times.
alpha = 1 - prod_{i<k} TV(p_i, q) (a rejected token has p_{i+1} = 0, so the final sample
never lands on a child).  Sources: Miao et al. 2024, Alg. 2 and Thm. 4.2; DDTE App. C-D.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from simlab.distributions import residual, sample_categorical
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw


class _SpecInferPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        chain = [p]
        for _ in range(k):
            chain.append(residual(chain[-1], q))
        self.chain = chain  # p_0 .. p_k

    def _accept_matrix(self, children):
        """A[i, j] = min(1, p_i(x_j) / q(x_j)): accepting child j as the (i+1)-th trial."""
        qx = self.q[children]
        return np.minimum(1.0, np.stack([pi[children] for pi in self.chain[:-1]]) / qx)

    def _law(self, children):
        accept = self._accept_matrix(children)
        k = self.k
        out = np.zeros_like(self.p)
        if self.verifier.order == "fixed":
            reach = 1.0
            for i, x in enumerate(children):
                out[x] += reach * accept[i, i]
                reach *= 1.0 - accept[i, i]
        else:
            # reach[mask] = P(the children in `mask` remain, all others rejected).
            reach_by_mask = np.zeros(1 << k)
            reach_by_mask[(1 << k) - 1] = 1.0
            for mask in sorted(range(1, 1 << k), key=lambda m: -m.bit_count()):
                weight = reach_by_mask[mask]
                if weight == 0.0:
                    continue
                remaining = mask.bit_count()
                trial = k - remaining
                for j in range(k):
                    if mask >> j & 1:
                        a = accept[trial, j]
                        out[children[j]] += weight * a / remaining
                        reach_by_mask[mask ^ (1 << j)] += weight * (1.0 - a) / remaining
            reach = reach_by_mask[0]
        if reach > 0.0:
            out += reach * self.chain[-1]
        return out

    def _draw(self, children, rng):
        order = np.arange(self.k) if self.verifier.order == "fixed" else rng.permutation(self.k)
        for trial, j in enumerate(order):
            x = children[j]
            if accept_draw(rng, self.chain[trial][x], self.q[x]):
                return int(x)
        return sample_categorical(self.chain[-1], rng)

    def acceptance_rate(self) -> float:
        reject = 1.0
        for pi in self.chain[:-1]:
            reject *= float(np.maximum(self.q - pi, 0.0).sum())
        return 1.0 - reject


@dataclass(frozen=True)
class SpecInfer(NodeVerifier):
    """Recursive rejection sampling with replacement (SpecInfer MSS).

    Args:
        order: ``"random"`` (default, SpecInfer's uniform choice among remaining children)
            or ``"fixed"`` (children tried in drafted order).
    """

    name = "specinfer"
    order: Literal["random", "fixed"] = "random"

    def __post_init__(self):
        if self.order not in ("random", "fixed"):
            raise ValueError(f"order: must be 'random' or 'fixed', got {self.order!r}")

    def _plan(self, p, q, k):
        return _SpecInferPlan(self, p, q, k)
