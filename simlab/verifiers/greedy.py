"""The greedy rule (temperature 0): the output is the target's argmax, accepted iff it is a child.

At a node, t* = argmax p (``greedy_token``; ties: the lowest token id, the convention of
``simlab.sampling.sampling_distribution`` at T = 0 and of ``simlab.decoding.greedy_decode``);
B(x, .) = delta_{t*} whatever the children.  Lifted to a tree it follows the longest path of
children that match the target's argmax, then emits the argmax, also at a leaf where the bonus
token is t* and not a draw from p (``leaf_law``; ``tree_verifiers.get("greedy")``), so its output
equals greedy decoding of the target token for token at every temperature.  It is lossless
exactly when p is one-hot (a greedy target), for every drafting law (``needs_greedy_target``);
at T > 0 (``allow_lossy=True``) its emitted law is the point mass on the greedy continuation.
Sources: SafeAILab/EAGLE@cb7e084 ``eagle/model/utils.py::evaluate_posterior`` and TreeGraft@f53e3a8's at T = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.drafting import Drafting, top_tokens
from simlab.verifiers.base import ALL_LAWS, NodePlan, NodeVerifier


def greedy_token(p: np.ndarray) -> int:
    """argmax p, ties to the lowest token id (int), for float (V,) ``p``: the one tie rule of the
    greedy rule's law, its sampler and its leaf."""
    return int(np.argmax(p))


def _point_mass(p: np.ndarray, token: int) -> np.ndarray:
    out = np.zeros_like(p)
    out[token] = 1.0
    return out


class _GreedyPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.argmax = greedy_token(p)

    def _law(self, children):
        return _point_mass(self.p, self.argmax)

    def _draw(self, children, rng):
        return self.argmax

    def acceptance_formula(self) -> float:
        return float(self.argmax in top_tokens(self.q, self.k))


@dataclass(frozen=True)
class Greedy(NodeVerifier):
    """Output the target's argmax (lowest id on ties); lossless for a one-hot target."""

    name = "greedy"
    drafting = Drafting.DETERMINISTIC
    lossless_for = ALL_LAWS
    needs_greedy_target = True

    def leaf_law(self, p):
        """The bonus at a leaf is the argmax too (point mass at ``greedy_token(p)``), at every T."""
        return _point_mass(p, greedy_token(p))

    def leaf_draw(self, p, rng):
        """``greedy_token(p)``; consumes no randomness."""
        return greedy_token(p)

    def _plan(self, p, q, k):
        return _GreedyPlan(self, p, q, k)
