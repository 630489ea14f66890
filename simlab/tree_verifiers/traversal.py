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
Block efficiency and the accepted-length law need only the mass of each accepted path, so they
run the same recursion on ``_Masses`` (no law vectors; target and draft kept with a scale and the draft
row never copied, so a rejection costs four passes over V and no allocation where the reference
makes eight passes and four arrays); ``outcome_law`` is its reference (tests:
equal to 1e-12, and a planted fault in the mass recursion is caught).
Source: Weng et al. 2025 (Traversal Verification, arXiv 2505.12398); no official code: reconstructed from the
paper, checked lossless here (``docs/sources.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import positive_part, sample_categorical, scratch
from simlab.drafting import SAMPLED, Drafting
from simlab.tree_verifiers.base import TreeVerifier, drafted_q


class _State:
    def __init__(self, tree):
        self.kids = {path: list(dict.fromkeys(tree.child_list(path))) for path in tree.nodes()}
        self._load(tree)
        for path, kids in self.kids.items():
            for t in kids:
                drafted_q(tree, path, t)  # a child with q = 0 cannot have been drafted: ValueError
        self.weight = {(): 1.0}
        self._reweight(())

    def _load(self, tree):
        self.target = {path: tree.table.p(path) for path in self.kids}
        self.draft = {path: tree.table.q(path) for path in self.kids}

    def _ratio(self, u, t) -> float:
        """Mb_u(t) / Ms_u(t) for a child t still listed at u."""
        return self.target[u][t] / self.draft[u][t]

    def _reweight(self, path):
        stack = [path]
        while stack:
            u = stack.pop()
            for t in self.kids[u]:
                c = u + (t,)
                self.weight[c] = min(1.0, self.weight[u] * self._ratio(u, t))
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
        if u != () and s + (1.0 - w) > 0.0:  # 1 - w first: s + 1 would round a small s away
            self.weight[u] = s / (s + (1.0 - w))
        self.kids[u].remove(t)
        self._reweight(u)


class _Masses(_State):
    """``_State``'s recursion for the acceptance masses only.  Mb_u = T_u / raw_u and Ms_u = D_u /
    left_u, where D_u is q_u with the removed children's entries read as zero (the table's row is
    never copied or written) and raw_u, left_u are scalars: a rejection costs (w left / raw) T - q,
    its positive part and its sum, into a scratch buffer unless u keeps children (then it is u's
    new T_u); a removal updates left_u, the draft's mass left, in O(1) (summed afresh once it
    falls below a thousandth of the row's mass, where the running difference would lose digits);
    a child's ratio Mb_u(t) / Ms_u(t) divides as the reference does.  A node's only rejection (its last child, none
    removed before) reads p_u and q_u alone, so its excess mass sum (w p_u - q_u)_+ is memoised in
    the table by (node, w): the cut-offs and K variants of one sampled tree meet the same nodes
    with the same initial weights (``NodeTable.memo``)."""

    def _load(self, tree):
        self.table = tree.table
        self.T = {path: tree.table.p(path) for path in self.kids}  # table rows: read, never written
        self.q = {path: tree.table.q(path) for path in self.kids}
        self.raw, self.left, self.total, self.removed = {}, {}, {}, {}  # Mb_u = T_u / raw_u, Ms_u = D_u / left_u
        self.scratch = scratch(tree.table.vocab_size)  # this thread's work vector: one mass recursion at a time

    def _ratio(self, u, t) -> float:
        # as the reference's Mb_u(t) / Ms_u(t): the same divisions, so an exact 1 stays 1 where the
        # scale would round it (the weight update s / (s + 1 - w) is ill-conditioned near w = 1);
        # a listed child was never removed (D_u[t] = q_u[t]) and left_u > 0 while u lists one
        target = self.T[u][t] / self.raw[u] if u in self.raw else self.T[u][t]
        draft = self.q[u][t] / self.left[u] if u in self.left else self.q[u][t]
        return target / draft

    def _excess_mass(self, u, w) -> float:
        """sum (w p_u - q_u)_+, through the scratch buffer."""
        buf = np.multiply(self.T[u], w, out=self.scratch)
        buf -= self.q[u]
        positive_part(buf, out=buf)
        return float(buf.sum())

    def reject(self, v):
        u, t = v[:-1], v[-1]
        w, raw_u, left_u = self.weight[u], self.raw.get(u, 1.0), self.left.get(u, 1.0)
        self.kids[u].remove(t)
        keep = bool(self.kids[u])  # only then is u's target read again
        removed = self.removed.setdefault(u, [])
        if not keep and not removed:  # u's first and last rejection: Mb_u = p_u, Ms_u = q_u, only the mass is read
            s = self.table.memo(("traversal excess", u, w), lambda: self._excess_mass(u, w))  # the same in every cut and K
        else:  # (w T / raw - D / left)_+ = (scale T - D)_+ / left
            scale = w * left_u / raw_u
            buf = np.multiply(self.T[u], scale, out=None if keep else self.scratch)
            buf -= self.q[u]
            if removed:  # D_u is zero there
                buf[removed] = self.T[u][removed] * scale
            positive_part(buf, out=buf)
            raw = float(buf.sum())
            s = raw / left_u
            if raw > 0.0 and keep:
                self.T[u], self.raw[u] = buf, raw
        if u not in self.total:
            self.total[u] = self.left[u] = self.table.memo(("q mass", u), lambda: float(self.q[u].sum()))
        removed.append(t)
        left = self.left[u] - float(self.q[u][t])
        if left < 1e-3 * self.total[u]:  # the running difference would lose digits: sum what is left
            kept = self.scratch
            np.copyto(kept, self.q[u])
            kept[removed] = 0.0
            left = float(kept.sum())
        self.left[u] = left  # > 0 while u lists a child (a listed child has q > 0)
        if u != () and s + (1.0 - w) > 0.0:  # 1 - w first, as the reference
            self.weight[u] = s / (s + (1.0 - w))
        self._reweight(u)


def _acceptances(state):
    """Walk the chain of rejections: yield (v, P(accept v), state) for each leaf v accepted with
    positive probability, the state as it stands before v is rejected (the consumer reads it then)."""
    reach = 1.0
    while reach > 0.0:
        v = state.first_leaf()
        accept = 1.0 if v == () else state.weight[v]
        if accept > 0.0:
            yield v, reach * accept, state
        if v == ():
            return
        reach *= 1.0 - accept
        state.reject(v)


@dataclass(frozen=True)
class Traversal(TreeVerifier):
    """Traversal Verification (sequence-level acceptance, leaf to root)."""

    name = "traversal"
    label = "Traversal"
    lossless_for = SAMPLED | {Drafting.REPEATED}  # repeated copies of one draw act as one child (exact: tests/test_audit.py)
    state_class = _State  # the per-node bookkeeping (a seam for the planted-fault tests)
    masses_class = _Masses  # the same recursion for the masses only (E[tau + 1], P(tau = j))

    def accept_masses(self, tree) -> dict:
        """P(accepted path = v | tree) (floats summing to 1) by ``_Masses``, without the law's
        V-vectors; equal to the sums of ``outcome_law``'s vectors to 1e-12 (tests).

        Raises:
            ValueError: a pairing the verifier refuses, a drafted child with q = 0.
        """
        self.check(tree)
        out: dict = {}
        for v, mass, _ in _acceptances(self.masses_class(tree)):
            out[v] = out.get(v, 0.0) + mass
        return out

    def _outcome_law(self, tree):
        out = {}
        for v, mass, state in _acceptances(self.state_class(tree)):
            out[v] = out.get(v, 0.0) + mass * state.target[v]
        return out

    def _verify(self, tree, rng):
        state = self.state_class(tree)
        while True:
            v = state.first_leaf()
            if v == () or rng.random() < state.weight[v]:
                return v, sample_categorical(state.target[v], rng)
            state.reject(v)
