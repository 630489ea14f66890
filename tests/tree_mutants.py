"""Planted faults at tree level (test-only), each a bug class from public reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.tree_verifiers.topdown import TopDown
from simlab.tree_verifiers.traversal import Traversal, _State
from simlab.verifiers import get


@dataclass(frozen=True)
class BonusFromParent(TopDown):
    """The bonus token drawn from the parent's p instead of the leaf's (an off-by-one row)."""

    def outcome_law(self, tree):
        law = super().outcome_law(tree)
        return {path: (vec if tree.child_list(path) or not path else vec.sum() * tree.table.p(path[:-1])) for path, vec in law.items()}

    def verify(self, tree, rng):
        path, token = super().verify(tree, rng)
        if path and not tree.child_list(path):
            token = sample_categorical(tree.table.p(path[:-1]), rng)
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


TREE_MUTANTS = {
    "bonus from the wrong node": (BonusFromParent(get("specinfer")), "lossless"),
    "correction from p": (CorrectionFromP(get("spectr")), "lossless"),
    "duplicate children counted twice": (DuplicatesCountedTwice(get("specinfer")), "lossless"),
    "traversal update not renormalised": (TraversalUnnormalised(), "lossless"),
    "accepted count = per-position accepts": (PerPositionAcceptCount(get("naive"), first_path_only=True), "simulation"),
}
