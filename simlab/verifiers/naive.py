"""NaiveTree (DDTE's "Naive" OTLP solver): single-draft speculative sampling on the first child.

Accept X_1 with probability a = min(1, p(X_1) / q(X_1)); otherwise output Y ~ norm((p - q)_+),
which counts as accepted when it lands on another child X_2..X_k.  At k = 1 this is standard
speculative sampling.  B(x, t) = a 1[t = x_1] + (1 - a) norm((p - q)_+)(t);
alpha = sum min(p, q) + sum_t (p - q)_+(t) (1 - (1 - q(t))^(k-1)) for i.i.d. children.
Sources: DDTE Alg. 2 and App. C; Leviathan et al. 2023.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import inner, positive_part, scratch
from simlab.drafting import SAMPLED, Drafting, hit_probability
from simlab.verifiers.base import NodePlan, NodeVerifier
from simlab.verifiers.speculative import SingleDraft


class _NaivePlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = SingleDraft(p, q)

    def _law(self, children):
        return self.single.law(children[0])

    def _children_mass(self, children):
        return self.single.mass_at(children[0], children)

    def _children_masses(self, rows):
        return self.single.masses_at(rows[:, 0], rows)

    def _draw(self, children, rng):
        return self.single.draw(children[0], rng)

    def acceptance_formula(self) -> float:
        """sum min(p, q) + sum (p - q)_+ (1 - (1 - q)^(k - 1)), both V-vectors in the thread's work
        vector (``scratch``: no fresh V-sized temporary to fault in; the same values)."""
        hit_others = hit_probability(self.q, self.k - 1)
        buffer = scratch(self.p.size)
        overlap = np.minimum(self.p, self.q, out=buffer).sum()
        excess = positive_part(np.subtract(self.p, self.q, out=buffer), out=buffer)
        return float(overlap + inner(excess, hit_others))


@dataclass(frozen=True)
class Naive(NodeVerifier):
    """NaiveTree: speculative sampling on the first child; the residual may land on another child."""

    name = "naive"
    label = "NaiveTree"
    ot_based = True
    speculative_at_one = True
    lossless_for = SAMPLED | {Drafting.REPEATED}  # only the first child is used, a draw from q under these laws

    def _plan(self, p, q, k):
        return _NaivePlan(self, p, q, k)
