"""Fast-HSD's SpecCascade (min-p verification) on its EAGLE-3 path (top-k tree): lossy.

The rule Fast-HSD runs for ``fast-hsd-eval --use-eagle3 --method speccascade --param c`` (``min_p=c``
passed to ``EaModel.eagenerate``): ZhouYuxuanYX/Fast-HSD@6750413
``EAGLE/eagle/model/utils.py::evaluate_posterior``, branch ``min_p is not None``; mapping in
``fast_hsd/benchmarks/base.py`` (Fast-HSD@2d79e7a).  The sequential visit of
``simlab.verifiers.eagle_lenience.SequentialPlan`` with the acceptance

    1 if p'(x) >= c max p' else 0,

p' the renormalised residual after the rejected children (no coin decides: a child is accepted or
not; the official ``r <= acp`` also accepts at acp = 0 when r is exactly 0, the lab never does).
A rejected child is never the maximum of p' (c <= 1), so the test reads p(x) >= c max of p over the
tokens not yet rejected; when every child is rejected the correction token is a draw from p without
them, renormalised (unlike the speculative-decoding path, ``simlab.verifiers.speccascade``, which
draws it from p).  Declared lossy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.drafting import Drafting
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.eagle_lenience import SequentialPlan
from simlab.verifiers.speccascade import min_p_law


@dataclass(frozen=True)
class EagleMinP(NodeVerifier):
    """Fast-HSD's EAGLE-3 SpecCascade: accept the first distinct top-k child with p'(x) >= min_p max p'.

    Args:
        min_p: c in [0, 1]; 0 accepts the first child.

    Raises:
        ValueError: ``min_p: ...`` outside [0, 1] or not a number.
    """

    name = "eagle_min_p"
    exact_at_greedy_target = False  # min_p = 0 (the default) accepts every child, at a one-hot target too
    label = "SpecCascade min-p, EAGLE-3 path (Fast-HSD)"
    drafting = Drafting.DETERMINISTIC
    lossless_for = frozenset()  # declared lossy
    min_p: float = 0.0

    def __post_init__(self):
        check_in_range(self.min_p, "min_p")

    def acceptance(self, residual: np.ndarray, x: int) -> float:
        """1 if p'(x) >= min_p * max p' else 0, for the renormalised residual p' (float64 (V,))."""
        return 1.0 if residual[x] >= residual.max() * self.min_p else 0.0

    def sampler_law(self, p) -> np.ndarray:
        """The law of the truncation sampler this rule imitates (min-p sampling at ``min_p``:
        ``simlab.verifiers.speccascade.min_p_law``)."""
        return min_p_law(p, self.min_p)

    def _plan(self, p, q, k):
        return SequentialPlan(self, p, q, k)
