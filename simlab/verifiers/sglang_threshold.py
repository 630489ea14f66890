"""SGLang's threshold acceptance (``--speculative-accept-threshold-single`` / ``-acc``): lossy.

The rule of SGLang's target-only tree kernel (sgl-project/sglang@120affb
``sgl-kernel/csrc/speculative/speculative_sampling.cuh::TreeSpeculativeSamplingTargetOnly``), at
one node with target p and ordered children x_1..x_k: draw one coin U ~ Uniform[0, 1); visit
the children in sibling order, accumulating P_i = p(x_1) + ... + p(x_i) (a repeated child counts
at each copy); child x_i is accepted, and the walk descends into it, at the first i with

    U <= P_i / max(threshold_acc, 1e-9)    or    p(x_i) >= threshold_single.

When no child is accepted, the correction token is a draw from p with every child removed,
renormalised (the kernel writes p(x_i) into its zeroed draft buffer at each rejected child and
samples relu(p - buffer)); at a leaf the bonus token is a draw from p.  Exact law: with
c_i = min(1, P_i / threshold_acc) and s the first child with p(x_s) >= threshold_single,
child x_i (i < s) gets c_i - c_{i-1}, x_s gets 1 - c_{s-1}, and with no such s the correction
gets 1 - c_k times p outside the children, renormalised.

With both thresholds 1 (SGLang's defaults) and distinct children, child x_i is accepted iff U
falls in (P_{i-1}, P_i]: the accepted child, or the correction, is a draw from p, so B(x, .) = p,
the law of strict exact-match / NSS, lossless for every law of distinct children (SGLang's top-k
trees).  A repeated child (i.i.d. drafts) is counted at each copy, so even at (1, 1) it is
accepted with probability min(1, m p(x)) for m copies: lossy on i.i.d. trees.  Below 1 a threshold raises
the acceptance of p(x) to min(1, p(x) / threshold_acc) (cumulated over siblings) or to 1 for a
likely child: lossy.  The verifier is declared lossy (``lossless_for`` empty, so every tree
refuses it without ``allow_lossy=True``) and its exact bias is ``simlab.efficiency.pairing_bias``;
at thresholds (1, 1) that bias is 0 (tests).

Conventions: the lab's coin test is strict (U * acc < P_i, ``accept_draw``) where the kernel's is
not (U <= P_i / acc): they differ on the null event U = P_i / acc only (the kernel's float32
coin of 0 accepts a child with p = 0; the lab's never does).  Where the children cover p's
support, P_k >= 1 >= threshold_acc in exact arithmetic, so the last child of positive mass takes
what rounding leaves (the kernel's zero residual would otherwise fall back to its last index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.verifiers.base import NodePlan, NodeVerifier

ACC_FLOOR = 1e-9
"""The kernel's floor on threshold_acc (``fmaxf(threshold_acc, 1e-9f)``): threshold_acc = 0
accepts the first child of positive mass."""


def _check_threshold(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: must be a number in [0, 1] (1 is SGLang's default, the lossless rule), got {value!r}")


class _ThresholdPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.acc = max(float(verifier.threshold_acc), ACC_FLOOR)
        self.single = float(verifier.threshold_single)

    def _rest(self, children):
        rest = self.p.copy()
        rest[children] = 0.0
        return rest

    def _last_positive(self, children) -> int | None:
        """Index of the last child with p > 0 (None: none)."""
        positive = np.flatnonzero(self.p[children] > 0.0)
        return int(positive[-1]) if positive.size else None

    def _law(self, children):
        out = np.zeros_like(self.p)
        rest = self._rest(children)
        covered = not rest.any()  # the children hold all of p: P_k >= 1 in exact arithmetic
        last = self._last_positive(children)
        reached, cumulative = 0.0, 0.0  # reached = c_{i-1}: P(some earlier child was accepted)
        for i, x in enumerate(children.tolist()):
            cumulative += self.p[x]
            if self.p[x] >= self.single:
                out[x] += 1.0 - reached
                return out
            bound = 1.0 if covered and i == last else min(1.0, cumulative / self.acc)
            out[x] += max(bound - reached, 0.0)
            reached = max(reached, bound)
        if reached < 1.0:
            out += (1.0 - reached) * rest / rest.sum()
        return out

    def _draw(self, children, rng):
        u = rng.random()
        cumulative = 0.0
        for x in children.tolist():
            cumulative += self.p[x]
            if u * self.acc < cumulative or self.p[x] >= self.single:
                return int(x)
        rest = self._rest(children)
        if not rest.any():  # rounding left P_k just below 1: the last child of positive mass
            return int(children[self._last_positive(children)])
        return sample_categorical(rest, rng)


@dataclass(frozen=True)
class SGLangThreshold(NodeVerifier):
    """SGLang's relaxed acceptance: a child is accepted when the coin falls below the cumulated
    target mass over ``threshold_acc``, or its own target mass reaches ``threshold_single``.

    Args:
        threshold_single: in [0, 1]; 1 (SGLang's default) never fires below a one-hot target.
        threshold_acc: in [0, 1], floored at 1e-9 as the kernel does; 1 is SGLang's default.

    Raises:
        ValueError: a threshold outside [0, 1] or not a finite number.
    """

    name = "sglang_threshold"
    label = "threshold acceptance (SGLang)"
    drafting = Drafting.DETERMINISTIC  # SGLang's EAGLE trees: top-k children
    lossless_for = frozenset()  # declared lossy: exact only at thresholds (1, 1) on distinct children (NSS's law)
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def __post_init__(self):
        _check_threshold(self.threshold_single, "threshold_single")
        _check_threshold(self.threshold_acc, "threshold_acc")

    def _plan(self, p, q, k):
        return _ThresholdPlan(self, p, q, k)
