"""Planted faults at tree level (test-only), each a bug class from public reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.tree_verifiers.hierarchical import HierarchicalSD, HierarchicalSDOfficial
from simlab.tree_verifiers.topdown import TopDown
from simlab.tree_verifiers.traversal import Traversal, _Masses, _State
from simlab.builders import GreedyDraftTree
from simlab.drafting import top_tokens
from simlab.verifiers import get


@dataclass(frozen=True)
class BonusFromParent(TopDown):
    """The bonus token drawn from the parent's p instead of the leaf's (an off-by-one row)."""

    def outcome_law(self, tree):
        law = super().outcome_law(tree)
        return {
            path: (vec if tree.child_list(path) or not path else vec.sum() * tree.table.p(path[:-1])) for path, vec in law.items()
        }

    def verify(self, tree, rng):
        path, token = super().verify(tree, rng)
        if path and not tree.child_list(path):
            token = sample_categorical(tree.table.p(path[:-1]), rng)
        return path, token


@dataclass(frozen=True)
class LeafFromP(TopDown):
    """The bonus token at a leaf drawn from p whatever the rule (the greedy rule emits argmax p)."""

    def outcome_law(self, tree):
        law = super().outcome_law(tree)
        return {path: (vec if tree.child_list(path) else vec.sum() * tree.table.p(path)) for path, vec in law.items()}

    def verify(self, tree, rng):
        path, token = super().verify(tree, rng)
        if not tree.child_list(path):
            token = sample_categorical(tree.table.p(path), rng)
        return path, token


@dataclass(frozen=True)
class CorrectionFromP(TopDown):
    """The correction token sampled from p instead of the verifier's residual."""

    def outcome_law(self, tree):
        law = super().outcome_law(tree)
        return {path: (vec.sum() * tree.table.p(path) if tree.child_list(path) else vec) for path, vec in law.items()}

    def verify(self, tree, rng):
        path, token = super().verify(tree, rng)
        if tree.child_list(path):
            token = sample_categorical(tree.table.p(path), rng)
        return path, token


@dataclass(frozen=True)
class DuplicatesCountedTwice(TopDown):
    """Every copy of a duplicated child descends separately (its subtree counted twice)."""

    def outcome_law(self, tree):
        out, stack = {}, [((), 1.0)]
        while stack:
            path, reach = stack.pop()
            kids = tree.child_list(path)
            if not kids:
                out[path] = out.get(path, 0.0) + reach * tree.table.p(path)
                continue
            law = tree.table.plan(self.node, path, len(kids)).output_distribution(np.asarray(kids))
            stop = reach * law
            for t in kids:
                stop[t] = 0.0
                stack.append((path + (t,), reach * law[t]))
            out[path] = out.get(path, 0.0) + stop
        return out


class _UnnormalisedUpdate(_State):
    def reject(self, v):
        u = v[:-1]
        w, target, draft = self.weight[u], self.target[u], self.draft[u]
        excess = np.maximum(w * target - draft, 0.0)
        super().reject(v)
        self.target[u] = excess  # the bug: no division by its mass


@dataclass(frozen=True)
class TraversalUnnormalised(Traversal):
    """Traversal's parent update Mb_u <- (w Mb_u - Ms_u)_+ without renormalisation."""

    state_class = _UnnormalisedUpdate


class _MassesNotRenormalised(_Masses):
    def reject(self, v):
        super().reject(v)
        self.left[v[:-1]] = 1.0  # the bug: Ms_u = D_u, not renormalised after a child is removed


@dataclass(frozen=True)
class TraversalMassesNotRenormalised(Traversal):
    """Traversal's mass recursion (block efficiency) without renormalising the draft after a removal."""

    masses_class = _MassesNotRenormalised


@dataclass(frozen=True)
class PerPositionAcceptCount(TopDown):
    """naive_chain whose accepted count is the number of per-position accepts, not the prefix."""

    def verify(self, tree, rng):
        path = tree.first_path()
        accepts, stopped_at = 0, None
        for i, x in enumerate(path):
            node = path[:i]
            ok = rng.random() * tree.table.q(node)[x] < tree.table.p(node)[x]
            accepts += ok
            if not ok and stopped_at is None:
                stopped_at = i
        stop = len(path) if stopped_at is None else stopped_at
        token = sample_categorical(tree.table.p(path[:stop]), rng)
        return path[:accepts], token


@dataclass(frozen=True)
class ClaimsEveryLaw(TopDown):
    """A top-down verifier that claims to be lossless for every drafting law (the fault is the
    pairing: min(1, p/q) with the softmax q, or SpecInfer, on deterministic top-k children)."""

    def node_lossless(self, tree, path):
        return True


@dataclass(frozen=True)
class FlagOffByOne(TopDown):
    """The lossless flag's cut off by one: a node's children counted outside the cut one level
    deeper than they are (a lossy node at depth d reported lossless at the cut d + 1)."""

    def lossless_depth(self, tree):
        return super().lossless_depth(tree) + 1


@dataclass(frozen=True)
class HSDUncappedBranches(HierarchicalSD):
    """HSD whose branches use the raw prefix mass P_k instead of P_k / m_k (the official code's
    uncapped ``clever=False`` rule, which needs its forward-sampling steps, run without them)."""

    capped_branches = False


@dataclass(frozen=True)
class HSDOfficialClaimedLossless(HierarchicalSDOfficial):
    """HSD's official whole-block acceptance min(1, P(X)/Q(X)) declared lossless at every temperature."""

    needs_greedy_target = False


class TailRankedByItsOwnProbability(GreedyDraftTree):
    """A greedy-draft builder that ranks the tail by its own q~ (so its survival depends on the token drawn)."""

    def _proposer(self, draw):
        def propose(q):
            best = top_tokens(q, min(self.best, int(np.count_nonzero(q))))
            out = [(t, np.log(q[t]), False) for t in best.tolist()]
            tail = q.copy()
            tail[best] = 0.0
            if tail.sum() > 0.0:
                t = draw(tail / tail.sum())
                out.append((t, float(np.log(q[t] / tail.sum())), True))  # the bug: a token-dependent score
            return out

        return propose


class SequoiaWeightsReversed:
    """Sequoia's DP with the positional weights in reverse order (p_W given to the first sibling)."""

    @staticmethod
    def tree_dp(acceptance, nodes, levels):
        from simlab.builders.sequoia import tree_dp

        return tree_dp(list(acceptance)[::-1], nodes, levels)


BUILDER_MUTANTS = {
    "greedy-draft tail ranked by its own probability": (TailRankedByItsOwnProbability(budget=3, depth=2, top_k=1), "lossless"),
}

TREE_MUTANTS = {
    "min(1, p/q) with softmax q on top-k trees": (ClaimsEveryLaw(get("naive")), "lossless on deterministic trees"),
    "SpecInfer on EAGLE trees": (ClaimsEveryLaw(get("specinfer")), "lossless on deterministic trees"),
    "bonus from the wrong node": (BonusFromParent(get("specinfer")), "lossless"),
    "correction from p": (CorrectionFromP(get("spectr")), "lossless"),
    "leaf token drawn from p": (LeafFromP(get("greedy")), "greedy decoding at T > 0"),
    "duplicate children counted twice": (DuplicatesCountedTwice(get("specinfer")), "lossless"),
    "traversal update not renormalised": (TraversalUnnormalised(), "lossless"),
    "traversal masses: draft not renormalised": (TraversalMassesNotRenormalised(), "fast E"),
    "accepted count = per-position accepts": (PerPositionAcceptCount(get("naive"), first_path_only=True), "simulation"),
    "lossless flag's cut off by one": (FlagOffByOne(get("specinfer")), "lossless flag"),
    "hsd branches without the prefix cap": (HSDUncappedBranches(), "lossless"),
    "hsd official acceptance claimed lossless": (HSDOfficialClaimedLossless(), "lossless"),
}
