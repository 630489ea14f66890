"""The greedy rule (temperature 0): the output is the target's argmax, accepted iff it is a child.

At a node, t* = argmax p (ties: the lowest token id, the convention of
``simlab.sampling.sampling_distribution`` at T = 0 and of ``simlab.decoding.greedy_decode``);
B(x, .) = delta_{t*} whatever the children.  Lifted to a tree it follows the longest path of
children that match the target's argmax, then emits the argmax (``tree_verifiers.get("greedy")``),
so its output equals greedy decoding of the target token for token.  It is lossless exactly
when p is one-hot (a greedy target), for every drafting law (``needs_greedy_target``).
Sources: EAGLE and TreeGraft ``evaluate_posterior`` at T = 0; ``../shared/reference/testing.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.drafting import Drafting, top_tokens
from simlab.verifiers.base import ALL_LAWS, NodePlan, NodeVerifier


class _GreedyPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.argmax = int(np.argmax(p))

    def _law(self, children):
        out = np.zeros_like(self.p)
        out[self.argmax] = 1.0
        return out

    def _draw(self, children, rng):
        return self.argmax

    def acceptance_rate(self) -> float:
        return float(self.argmax in top_tokens(self.q, self.k))


@dataclass(frozen=True)
class Greedy(NodeVerifier):
    """Output the target's argmax (lowest id on ties); lossless for a one-hot target."""

    name = "greedy"
    drafting = Drafting.DETERMINISTIC
    lossless_for = ALL_LAWS
    needs_greedy_target = True

    def _plan(self, p, q, k):
        return _GreedyPlan(self, p, q, k)
