"""Traversal Verification (Weng et al. 2025, arXiv 2505.12398), bottom-up over the whole tree.

State per node u: current target Mb_u, current draft Ms_u (p_u, q_u at the start) and a weight
w_u; w_root = 1 and w_c = min(1, w_u Mb_u(c) / Ms_u(c)) top-down.  Repeat: let v be the first
leaf in post-order (follow first children down).  If v is the root, output Y ~ Mb_root.  With
probability w_v accept the path root -> v and draw the bonus Y ~ Mb_v.  Otherwise, with u the
parent of v: s = sum (w_u Mb_u - Ms_u)_+, Mb_u <- norm((w_u Mb_u - Ms_u)_+) (with Ms_u before
the removal), Ms_u <- Ms_u without token(v), renormalised, w_u <- s / (s + 1 - w_u) (1 at the
root), delete v and recompute the weights below u.  Lossless when siblings are drafted without
replacement, in sibling order; on a chain it equals Block Verification.

The event sequence is one chain of rejections, so the exact law is accumulated along it.
Source: ``../shared/reference/verifiers.md`` Sec. 10 (reconstructed, checked lossless here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.drafting import SAMPLED, Drafting
from simlab.tree_verifiers.base import TreeVerifier, drafted_q


class _State:
    def __init__(self, tree):
        self.kids = {path: list(dict.fromkeys(tree.child_list(path))) for path in tree.nodes()}
        self.target = {path: tree.table.p(path) for path in self.kids}
        self.draft = {path: tree.table.q(path) for path in self.kids}
        for path, kids in self.kids.items():
            for t in kids:
                drafted_q(tree, path, t)  # a child with q = 0 cannot have been drafted: ValueError
        self.weight = {(): 1.0}
        self._reweight(())

    def _reweight(self, path):
        stack = [path]
        while stack:
            u = stack.pop()
            for t in self.kids[u]:
                c = u + (t,)
                self.weight[c] = min(1.0, self.weight[u] * self.target[u][t] / self.draft[u][t])
                stack.append(c)

    def first_leaf(self):
        path = ()
        while self.kids[path]:
            path = path + (self.kids[path][0],)
        return path

    def reject(self, v):
        u, t = v[:-1], v[-1]
        w = self.weight[u]
        excess = np.maximum(w * self.target[u] - self.draft[u], 0.0)
        s = float(excess.sum())
        if s > 0.0:  # else u can no longer be accepted (w_u becomes 0) and Mb_u is never used
            self.target[u] = excess / s
        draft = self.draft[u].copy()
        draft[t] = 0.0
        total = draft.sum()
        self.draft[u] = draft / total if total > 0 else draft
        if u != () and s + 1.0 - w > 0.0:
            self.weight[u] = s / (s + 1.0 - w)
        self.kids[u].remove(t)
        self._reweight(u)


@dataclass(frozen=True)
class Traversal(TreeVerifier):
    """Traversal Verification (sequence-level acceptance, leaf to root)."""

    name = "traversal"
    lossless_for = SAMPLED | {Drafting.REPEATED}  # repeated copies of one draw act as one child (exact: tests/test_audit.py)
    state_class = _State  # the per-node bookkeeping (a seam for the planted-fault tests)

    def _outcome_law(self, tree):
        state, out, reach = self.state_class(tree), {}, 1.0
        while reach > 0.0:
            v = state.first_leaf()
            accept = 1.0 if v == () else state.weight[v]
            if accept > 0.0:
                out[v] = out.get(v, 0.0) + reach * accept * state.target[v]
            if v == ():
                break
            reach *= 1.0 - accept
            state.reject(v)
        return out

    def _verify(self, tree, rng):
        state = self.state_class(tree)
        while True:
            v = state.first_leaf()
            if v == () or rng.random() < state.weight[v]:
                return v, sample_categorical(state.target[v], rng)
            state.reject(v)
