"""Fast-HSD's eta acceptance (truncation-based verification with the eta-sampling allowed set): lossy.

The rule Fast-HSD runs when ``eta_spd`` is passed to the patched ``_speculative_sampling``
(ZhouYuxuanYX/Fast-HSD@66ef1dc ``transformers/generation/utils.py``, branch
``eta_spd is not None``); the README's table calls it "Typical Sampling + SD" (``--eta_spd``,
0.05 to 0.25), ``fast_hsd/benchmarks/base.py`` (Fast-HSD@2d79e7a) runs it for ``--method
eta_sampling``, whose ``configs/methods/eta_sampling.json`` (Fast-HSD@8cf2ad2) describes instead
"eta truncation sampling + lossless SD"; the lab names it by what the code does.  The allowed set
is the paper's Eq. 4 ("Revisiting Lossy Verification", arXiv 2607.26627) with the official code's
sqrt(eta) factor.

At one node with drafted child x (the first child with k > 1, NaiveTree's convention): with
H(p) the entropy of the target in nats and

    tau(p) = min(eta, sqrt(eta) exp(-H(p))),

accept x iff p(x) >= tau(p), with no coin; otherwise the correction token is a draw from p itself
(as ``simlab.verifiers.speccascade``: ``MembershipPlan``).  Exact law B(x, .) = delta_x for
p(x) >= tau(p), p otherwise; over x ~ q: q 1_A + q(A^c) p.  Declared lossy.

The truncation sampler it imitates, eta sampling (Hennig et al. 2022; Hugging Face transformers'
``EtaLogitsWarper(epsilon=eta)``, which removes the tokens with p < tau(p) and keeps the most
probable one), emits ``eta_law(p, eta)``: p restricted to {p >= tau(p)}, renormalised (that set
always holds the most probable token: max p >= exp(-H(p)) > sqrt(eta) exp(-H(p)) for eta < 1).
Fast-HSD's EAGLE-3 path tests min(1, p'(x) / tau(p')) with a coin on the renormalised residual
p' of top-k children (``EAGLE/eagle/model/utils.py::evaluate_posterior``): another rule, not
this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.distributions import check_distribution, entropy
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.speccascade import MembershipPlan, truncated_law


def eta_threshold(p: np.ndarray, eta: float) -> float:
    """tau(p) = min(eta, sqrt(eta) exp(-H(p))) for a validated float64 (V,) law ``p``."""
    return min(eta, math.sqrt(eta) * math.exp(-entropy(p, checked=True)))


def eta_allowed(p: np.ndarray, eta: float) -> np.ndarray:
    """The eta allowed set of a validated ``p``: bool (V,), p >= tau(p)."""
    return p >= eta_threshold(p, eta)


def eta_law(p, eta: float) -> np.ndarray:
    """The law of eta sampling from ``p`` with ``eta`` in [0, 1): ``truncated_law`` of the eta
    allowed set; float64 (V,).

    Raises:
        ValueError: invalid ``p`` or ``eta``.
    """
    p = check_distribution(p, "p")
    return truncated_law(p, eta_allowed(p, check_in_range(eta, "eta", high_open=True)))


@dataclass(frozen=True)
class EtaAcceptance(NodeVerifier):
    """Fast-HSD's eta acceptance: accept the drafted child iff p(x) >= min(eta, sqrt(eta) e^-H(p)), else a draw from p.

    Args:
        eta_spd: eta in [0, 1); 0 (Fast-HSD's CLI default) accepts every child.

    Raises:
        ValueError: ``eta_spd: ...`` outside [0, 1) or not a number.
    """

    name = "eta_acceptance"
    exact_at_greedy_target = False  # eta_spd = 0 (the default) accepts every child, at a one-hot target too
    label = "eta acceptance (Fast-HSD eta_spd)"
    lossless_for = frozenset()  # declared lossy
    eta_spd: float = 0.0

    def __post_init__(self):
        check_in_range(self.eta_spd, "eta_spd", high_open=True)

    def allowed(self, p: np.ndarray) -> np.ndarray:
        """The eta allowed set of the validated target ``p``: bool (V,)."""
        return eta_allowed(p, self.eta_spd)

    def sampler_law(self, p) -> np.ndarray:
        """The law of the truncation sampler this rule imitates (eta sampling at ``eta_spd``)."""
        return eta_law(p, self.eta_spd)

    def _plan(self, p, q, k):
        return MembershipPlan(self, p, q, k)
