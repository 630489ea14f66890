"""Fast-HSD's SpecCascade rule (truncation-based verification with the min-p allowed set): lossy.

The rule Fast-HSD runs for ``fast-hsd-eval --method speccascade --param c`` (``cascade=True,
min_p_spd=c`` passed to the patched ``_speculative_sampling``): ZhouYuxuanYX/Fast-HSD@66ef1dc
``transformers/generation/utils.py::_speculative_sampling``, branch ``min_p_spd is not None``;
knob grid ``configs/methods/speccascade.json`` (Fast-HSD@8cf2ad2: 0.1, 0.3, 0.5, 0.7, 0.9);
SpecCascade is Narasimhan et al. 2024; the allowed set is the paper's Eq. 3 as Fast-HSD@812560c
``fast_hsd/core/truncation_verification.py`` writes it.

At one node with drafted child x (the first child with k > 1, NaiveTree's convention): accept x
iff it lies in the min-p allowed set of the target,

    A(p) = {t : p(t) >= c max p},

with no coin; otherwise the correction token is a draw from p itself (the official code samples
the next token from the target row ``p_n_plus_1`` whenever ``min_p_spd`` or ``eta_spd`` is set,
the rejected draft included; the ``cascade=True`` also passed is not read by this branch).  Exact law
B(x, .) = delta_x for x in A(p), p otherwise; over x ~ q the output law is
q 1_A + q(A^c) p.  Declared lossy (``lossless_for`` empty): exact only where A(p) holds no token
q can draft outside p's law (c = 0 accepts every child: the output is q).

The truncation sampler it imitates, min-p sampling (Fast-HSD's ``min_p_sampling`` baseline: the
``min_p`` generation option, Hugging Face transformers' ``MinPLogitsWarper`` on the target's logits,
then lossless speculative decoding, whose output is the truncated target), emits ``min_p_law(p, c)``: p restricted to A(p),
renormalised (the warper keeps tokens with p >= c max p and always the most probable one, which
A(p) holds for c <= 1).  ``MembershipPlan`` is the shared plan of the rules that accept a child
iff it lies in an allowed set and otherwise draw from p (``simlab.verifiers.eta_acceptance``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.distributions import check_distribution, sample_categorical
from simlab.verifiers.base import NodePlan, NodeVerifier


def min_p_allowed(p: np.ndarray, min_p: float) -> np.ndarray:
    """The min-p allowed set of ``p`` (float64 (V,), a validated law): bool (V,), p >= min_p * max p."""
    return p >= min_p * p.max()


def truncated_law(p, allowed: np.ndarray) -> np.ndarray:
    """p restricted to the bool (V,) mask ``allowed``, renormalised; float64 (V,).

    Raises:
        ValueError: ``p: ...`` for an invalid law; ``allowed: ...`` for a mask of another shape or
            one that keeps no mass of p.
    """
    p = check_distribution(p, "p")
    allowed = np.asarray(allowed)
    if allowed.shape != p.shape or allowed.dtype != bool:
        raise ValueError(f"allowed: must be a bool mask of shape {p.shape}, got {allowed.dtype} {allowed.shape}")
    kept = np.where(allowed, p, 0.0)
    if not kept.sum() > 0.0:
        raise ValueError("allowed: keeps no mass of p")
    return kept / kept.sum()


def min_p_law(p, min_p: float) -> np.ndarray:
    """The law of min-p sampling from ``p`` with threshold ``min_p`` in [0, 1]: ``truncated_law`` of
    the min-p allowed set; float64 (V,).

    Raises:
        ValueError: invalid ``p`` or ``min_p``.
    """
    p = check_distribution(p, "p")
    return truncated_law(p, min_p_allowed(p, check_in_range(min_p, "min_p")))


class MembershipPlan(NodePlan):
    """Accept the first child iff ``allowed`` (bool (V,), from the verifier's ``allowed(p)``) holds
    it; otherwise emit a draw from p.  No uniform is spent on the test."""

    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.allowed = verifier.allowed(p)

    def _law(self, children):
        x = int(children[0])
        if self.allowed[x]:
            out = np.zeros_like(self.p)
            out[x] = 1.0
            return out
        return self.p.copy()

    def _draw(self, children, rng):
        x = int(children[0])
        return x if self.allowed[x] else sample_categorical(self.p, rng)


@dataclass(frozen=True)
class SpecCascade(NodeVerifier):
    """Fast-HSD's SpecCascade rule: accept the drafted child iff p(x) >= min_p_spd * max p, else a draw from p.

    Args:
        min_p_spd: c in [0, 1]; 0 (Fast-HSD's CLI default) accepts every child.

    Raises:
        ValueError: ``min_p_spd: ...`` outside [0, 1] or not a number.
    """

    name = "speccascade"
    exact_at_greedy_target = False  # min_p_spd = 0 (the default) accepts every child, at a one-hot target too
    label = "SpecCascade min-p (Fast-HSD)"
    lossless_for = frozenset()  # declared lossy
    min_p_spd: float = 0.0

    def __post_init__(self):
        check_in_range(self.min_p_spd, "min_p_spd")

    def allowed(self, p: np.ndarray) -> np.ndarray:
        """The min-p allowed set of the validated target ``p``: bool (V,)."""
        return min_p_allowed(p, self.min_p_spd)

    def sampler_law(self, p) -> np.ndarray:
        """The law of the truncation sampler this rule imitates (min-p sampling at ``min_p_spd``)."""
        return min_p_law(p, self.min_p_spd)

    def _plan(self, p, q, k):
        return MembershipPlan(self, p, q, k)
