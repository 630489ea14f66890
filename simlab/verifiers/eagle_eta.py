"""Fast-HSD's eta (typical) acceptance on its EAGLE-3 path (top-k tree): lossy.

The rule Fast-HSD runs for ``fast-hsd-eval --use-eagle3 --method typical_sampling --param eta``
(``eta=eta`` passed to ``EaModel.eagenerate``): ZhouYuxuanYX/Fast-HSD@6750413
``EAGLE/eagle/model/utils.py::evaluate_posterior``, branch ``eta is not None``; mapping in
``fast_hsd/benchmarks/base.py`` (Fast-HSD@2d79e7a; on the speculative-decoding path the same method
name runs eta truncation sampling, and ``eta_sampling`` runs ``simlab.verifiers.eta_acceptance``).
The sequential visit of ``simlab.verifiers.eagle_lenience.SequentialPlan`` with the acceptance

    min(1, p'(x) / tau(p')),   tau(p') = min(eta, sqrt(eta) exp(-H(p'))),

recomputed on the renormalised residual p' after each rejection, with the official entropy
H(p') = -sum_t h(t) log h(t), h = max(p', 1e-10) (the clamp makes each token of zero mass add
2.3e-9 nats), and acceptance 1 where tau(p') <= 1e-9.  A coin decides (unlike Fast-HSD's
speculative-decoding path, whose ``eta_spd`` test is a set membership).  Declared lossy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.drafting import Drafting
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.eagle_lenience import SequentialPlan
from simlab.verifiers.eta_acceptance import eta_law

ENTROPY_CLAMP = 1e-10
"""``evaluate_posterior``: the entropy is computed from p' clamped below at this value."""
THRESHOLD_FLOOR = 1e-9
"""``evaluate_posterior``: a threshold at or below this accepts the child surely."""


@dataclass(frozen=True)
class EagleEta(NodeVerifier):
    """Fast-HSD's EAGLE-3 eta acceptance: accept each distinct top-k child with min(1, p'(x) / tau(p')).

    Args:
        eta: in [0, 1); 0 accepts the first child (tau = 0).

    Raises:
        ValueError: ``eta: ...`` outside [0, 1) or not a number.
    """

    name = "eagle_eta"
    exact_at_greedy_target = False  # eta = 0 (the default) accepts every child, at a one-hot target too
    label = "eta acceptance, EAGLE-3 path (Fast-HSD)"
    drafting = Drafting.DETERMINISTIC
    lossless_for = frozenset()  # declared lossy
    eta: float = 0.0

    def __post_init__(self):
        check_in_range(self.eta, "eta", high_open=True)

    def threshold(self, residual: np.ndarray) -> float:
        """tau(p') = min(eta, sqrt(eta) exp(-H(p'))) with the clamped entropy (module docstring)."""
        h = np.maximum(residual, ENTROPY_CLAMP)
        return min(self.eta, math.sqrt(self.eta) * math.exp(float(np.sum(h * np.log(h)))))

    def acceptance(self, residual: np.ndarray, x: int) -> float:
        """min(1, p'(x) / tau(p')), 1 where tau(p') <= 1e-9, for the renormalised residual p'."""
        tau = self.threshold(residual)
        return min(float(residual[x]) / tau, 1.0) if tau > THRESHOLD_FLOOR else 1.0

    def sampler_law(self, p) -> np.ndarray:
        """The law of the truncation sampler this rule imitates (eta sampling at ``eta``:
        ``simlab.verifiers.eta_acceptance.eta_law``)."""
        return eta_law(p, self.eta)

    def _plan(self, p, q, k):
        return SequentialPlan(self, p, q, k)
