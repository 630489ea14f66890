"""Greedy verification (temperature 0): follow the target's argmax while it is a drafted child.

At node u let t* = argmax p_u (ties: the lowest token id).  If t* is a child, accept it and
move on; otherwise t* is the correction token.  At a leaf t* is the bonus token.  The output
equals plain greedy decoding of the target token for token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.tree_verifiers.base import TreeVerifier


@dataclass(frozen=True)
class Greedy(TreeVerifier):
    """The longest path that matches the target argmax, then the argmax token."""

    name = "greedy"

    def verify(self, tree, rng=None):
        path = ()
        while True:
            t = int(np.argmax(tree.table.p(path)))
            if t not in tree.child_list(path):
                return path, t
            path = path + (t,)

    def outcome_law(self, tree):
        path, t = self.verify(tree)
        vector = np.zeros(tree.table.vocab_size)
        vector[t] = 1.0
        return {path: vector}
