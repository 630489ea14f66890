"""Fast-HSD's lenience rule (collaborative verification with a lenience factor l): lossy.

The rule of Fast-HSD's speculative-decoding path (``fast-hsd-eval --method lenience --param l``,
which passes ``lenience=l`` to the patched ``_speculative_sampling``): ZhouYuxuanYX/Fast-HSD@66ef1dc
``transformers/generation/utils.py::_speculative_sampling``, its default (not backward, not
blockwise) branch with ``lenience < 1``; knob grid ``configs/methods/lenience.json``
(Fast-HSD@8cf2ad2: 0.2, 0.4, 0.6, 0.8); paper "Revisiting Lossy Verification" (arXiv 2607.26627),
Eqs. 6-7 as Fast-HSD@812560c ``fast_hsd/core/collaborative_verification.py`` writes them.

At one node with drafted child x ~ q (a chain's one child; with k > 1 children only the first is
tested, NaiveTree's convention, ``simlab.verifiers.naive``): accept x with probability

    a(x) = min(1, p(x) / (l q(x)))

(the official code scales q_i by l before the ratio), otherwise emit the correction token
Y ~ norm((p - q)_+): the residual of q itself, not of l q (the official code subtracts the
unscaled q).  Exact law

    B(x, .) = a(x) delta_x + (1 - a(x)) norm((p - q)_+),

and over x ~ q the output law is min(q, p / l) + R norm((p - q)_+) with R = sum_t (q - p / l)_+
(the paper's Eq. 7: q where q <= p / l, capped at p / l above it, the rejected mass spread over
the tokens p under-drafts).  a(x) < 1 forces p(x) < q(x), so (p - q)_+ has mass whenever the
correction is drawn.  At l = 1 this is speculative sampling (lossless at k = 1); for l < 1 the
bias is positive wherever some q(t) > p(t) (tests).  Declared lossy (``lossless_for`` empty: every
tree refuses it without ``allow_lossy=True``; its exact bias is ``simlab.efficiency.pairing_bias``).

Fast-HSD's EAGLE-3 path (``EAGLE/eagle/model/utils.py::evaluate_posterior``) names a different
rule "lenience" (q taken as the constant l on top-k children): not this module.  Conventions: the
lab's coin test is strict (``U l q(x) < p(x)``, ``accept_draw``), the official ``r_i <= ratio`` is
not; they differ on the null event U = ratio only.  q(x) = 0 (a deterministic child) accepts a
child with p(x) > 0, as speculative sampling's limit (``accept_probabilities``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.distributions import residual, sample_categorical
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw
from simlab.verifiers.speculative import accept_probabilities


class _LeniencePlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.scaled = verifier.lenience * q  # l q, the denominator of the acceptance ratio
        self._correction = None

    @property
    def correction(self) -> np.ndarray:
        """norm((p - q)_+), float64 (V,), built on first use (p itself when it has no mass: ``residual``)."""
        if self._correction is None:
            self._correction = residual(self.p, self.q)
        return self._correction

    def _law(self, children):
        x = int(children[0])
        a = float(accept_probabilities(self.p[x], self.scaled[x]))
        out = (1.0 - a) * self.correction if a < 1.0 else np.zeros_like(self.p)
        out[x] += a
        return out

    def _draw(self, children, rng):
        x = int(children[0])
        if accept_draw(rng, self.p[x], self.scaled[x]):
            return x
        return sample_categorical(self.correction, rng)


@dataclass(frozen=True)
class Lenience(NodeVerifier):
    """Fast-HSD's lenience rule: accept the drafted child with min(1, p / (l q)), else a draw from
    norm((p - q)_+).

    Args:
        lenience: l in (0, 1]; 1 (Fast-HSD's default) is speculative sampling.

    Raises:
        ValueError: ``lenience: ...`` outside (0, 1] or not a number.
    """

    name = "lenience"
    label = "lenience (Fast-HSD)"
    lossless_for = frozenset()  # declared lossy: exact only at l = 1 (speculative sampling on the first child)
    lenience: float = 1.0

    def __post_init__(self):
        check_in_range(self.lenience, "lenience", low_open=True)

    def _plan(self, p, q, k):
        return _LeniencePlan(self, p, q, k)
