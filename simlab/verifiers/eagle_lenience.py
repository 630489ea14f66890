"""Fast-HSD's lenience rule on its EAGLE-3 path (top-k tree, q taken as the constant l): lossy.

The rule Fast-HSD runs for ``fast-hsd-eval --use-eagle3 --method lenience --param l`` (``lenience=l``
passed to ``EaModel.eagenerate``): ZhouYuxuanYX/Fast-HSD@6750413
``EAGLE/eagle/model/utils.py::evaluate_posterior``, its last branch (neither ``min_p`` nor ``eta``);
mapping in ``fast_hsd/benchmarks/base.py`` (Fast-HSD@2d79e7a, ``_EAGLE_METHOD_KWARGS``).  EAGLE's
one-hot rule (``simlab.verifiers.onehot``) with the draft probability replaced by l.

At one node with ordered children (EAGLE's top-k tokens, ``Drafting.DETERMINISTIC``), starting from
the working law p' = p: visit the distinct children in order and accept child x with probability
``acceptance(p', x)``, here min(1, p'(x) / l); on rejection set p'(x) = 0 and, when the remaining
mass s exceeds ``RESIDUAL_FLOOR`` (1e-9), renormalise p' by s and go on; otherwise stop and emit a
draw from p itself (the official code then falls back to the target row).  When every child is
rejected, the correction token is a draw from the final p'.  Exact law: the sum over the visiting
order of (probability of reaching child i) times its acceptance, and the rejected mass times p'
(``SequentialPlan._law``).  At l = 1 this is the one-hot rule, whose law is p (lossless); l < 1
accepts more and is lossy.  Declared lossy (``lossless_for`` empty).

``SequentialPlan`` is the plan of the three EAGLE-path rules (``eagle_min_p``, ``eagle_eta``): they
differ in ``acceptance`` only.  Conventions: the lab's coin test is strict (U < a, ``accept_draw``),
the official ``r <= acp`` is not (the null event r = acp; a ``random.random()`` of 0 accepts a child
of acceptance 0 there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw

RESIDUAL_FLOOR = 1e-9
"""``evaluate_posterior``: after a rejection p' is renormalised only if its remaining mass exceeds
this; otherwise the loop stops and the next token is drawn from the target row p."""


class SequentialPlan(NodePlan):
    """Visit the distinct children in order, accept each with ``verifier.acceptance(p', x)`` (p'
    the renormalised residual, float64 (V,)), remove and renormalise on rejection."""

    def acceptance(self, residual: np.ndarray, x: int) -> float:
        """The verifier's acceptance of child ``x`` given the renormalised residual (``acceptance``)."""
        return self.verifier.acceptance(residual, x)

    def _law(self, children):
        out = np.zeros_like(self.p)
        residual, reach = self.p.copy(), 1.0
        for x in dict.fromkeys(children.tolist()):
            a = self.acceptance(residual, x)
            out[x] += reach * a
            reach *= 1.0 - a
            if reach == 0.0:
                return out
            residual[x] = 0.0
            mass = residual.sum()
            if not mass > RESIDUAL_FLOOR:
                return out + reach * self.p
            residual /= mass
        return out + reach * residual

    def _draw(self, children, rng):
        residual = self.p.copy()
        for x in dict.fromkeys(children.tolist()):
            if accept_draw(rng, self.acceptance(residual, x), 1.0):
                return int(x)
            residual[x] = 0.0
            mass = residual.sum()
            if not mass > RESIDUAL_FLOOR:
                return sample_categorical(self.p, rng)
            residual /= mass
        return sample_categorical(residual, rng)


@dataclass(frozen=True)
class EagleLenience(NodeVerifier):
    """Fast-HSD's EAGLE-3 lenience: accept each distinct top-k child with min(1, p'(x) / l).

    Args:
        lenience: l in (0, 1]; 1 (Fast-HSD's default) is EAGLE's one-hot rule.

    Raises:
        ValueError: ``lenience: ...`` outside (0, 1] or not a number.
    """

    name = "eagle_lenience"
    label = "lenience, EAGLE-3 path (Fast-HSD)"
    drafting = Drafting.DETERMINISTIC
    lossless_for = frozenset()  # declared lossy: exact at l = 1 (the one-hot rule) up to the 1e-9 floor
    lenience: float = 1.0

    def __post_init__(self):
        check_in_range(self.lenience, "lenience", low_open=True)

    def acceptance(self, residual: np.ndarray, x: int) -> float:
        """min(1, p'(x) / l) for the renormalised residual p' (float64 (V,))."""
        return min(1.0, float(residual[x]) / self.lenience)

    def _plan(self, p, q, k):
        return SequentialPlan(self, p, q, k)
