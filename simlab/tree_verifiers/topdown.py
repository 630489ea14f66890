"""Top-down tree verification with a node-level verifier (DDTE Sec. 3, "OT-based verification").

Start at the root.  At node u with children x = ch(u) run the node verifier f on (p_u, q_u, x):
if its output t is a child, move to u + (t,); otherwise stop, t being the correction token.  At
a leaf draw the bonus token from p_u.  Reaching node v has probability prod of B(f, ch(c), t)
along its path, so E[tau + 1 | tree] = 1 + sum_{v != root} P(reach v).  Lossless when, given
its prefix, every node's children have the law f assumes (the next tokens of the m >= 1 drafts
through a node are i.i.d. q_u for i.i.d. rollouts).

``first_path_only=True`` gives the single-path methods run on the first draft of a tree: with
``naive`` this is standard speculative sampling on the first path ("naive_chain").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.verifiers.base import NodeVerifier
from simlab.tree_verifiers.base import TreeVerifier


@dataclass(frozen=True)
class TopDown(TreeVerifier):
    """Top-down lifting of a node verifier.

    Args:
        node: the node-level verifier (``simlab.verifiers.get(name)``).
        first_path_only: verify only the first child of every node (single-path methods).
    """

    node: NodeVerifier
    first_path_only: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.node.name}_chain" if self.first_path_only else self.node.name

    def _children(self, tree, path):
        kids = tree.child_list(path)
        return kids[:1] if self.first_path_only else kids

    def outcome_law(self, tree):
        out = {}
        stack = [((), 1.0)]
        while stack:
            path, reach = stack.pop()
            kids = self._children(tree, path)
            if not kids:
                out[path] = reach * tree.table.p(path)
                continue
            law = tree.table.plan(self.node, path, len(kids)).output_distribution(np.asarray(kids))
            stop = reach * law
            for t in dict.fromkeys(kids):
                stop[t] = 0.0
                if law[t] > 0.0:
                    stack.append((path + (t,), reach * law[t]))
            out[path] = stop
        return out

    def block_efficiency_by_depth(self, tree, depths):
        """One pass: cutting the tree does not change P(reach v) above the cut, so
        E[tau + 1 | cut at d] = 1 + sum of P(reach v) over nodes at depths 1..d.  With an EOS
        id, nodes whose path holds an EOS add nothing (no token after an EOS is kept)."""
        eos = tree.table.eos_id
        reach_at = np.zeros(tree.depth() + 1)
        stack = [((), 1.0)]
        while stack:
            path, reach = stack.pop()
            reach_at[len(path)] += reach
            kids = self._children(tree, path)
            if not kids:
                continue
            law = tree.table.plan(self.node, path, len(kids)).output_distribution(np.asarray(kids))
            stack.extend((path + (t,), reach * law[t]) for t in dict.fromkeys(kids) if law[t] > 0.0 and t != eos)
        cumulative = np.cumsum(reach_at)
        return np.array([cumulative[min(d, reach_at.size - 1)] for d in depths])

    def verify(self, tree, rng):
        path = ()
        while True:
            kids = self._children(tree, path)
            if not kids:
                return path, sample_categorical(tree.table.p(path), rng)
            t = tree.table.plan(self.node, path, len(kids)).sample(np.asarray(kids), rng)
            if t not in kids:
                return path, t
            path = path + (t,)
