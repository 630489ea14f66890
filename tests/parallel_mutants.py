"""Planted faults in the parallel drafters (test-only): each a plausible bug of a Medusa/DDTree
implementation or of a parallel stand-in, caught by ``test_parallel_drafters.py``'s checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from backends.parallel_draft import RootConditioned
from simlab.builders import DDTree, Medusa
from simlab.builders.ddtree import ranked_rows
from simlab.builders.parallel import parallel_tree, position_rows
from simlab.drafting import Drafting
from simlab.trees import DraftTree


@dataclass(frozen=True)
class DDTreeScoredByOwnProbability(DDTree):
    """Best-first by each token's own log q instead of the path's sum (a greedy per-level ranking)."""

    def sample(self, table, rng=None):
        import heapq

        rows = position_rows(table, self.depth, "DDTree")
        tokens, logq = ranked_rows(rows, self.budget)
        children, heap, added = {}, [(-logq[0][0], (0,), ())], 0
        while heap and added < self.budget:
            _, ranks, parent = heapq.heappop(heap)
            d, r = len(ranks), ranks[-1]
            token = int(tokens[d - 1][r])
            children.setdefault(parent, []).append(token)
            added += 1
            if r + 1 < tokens[d - 1].size:
                heapq.heappush(heap, (-logq[d - 1][r + 1], ranks[:-1] + (r + 1,), parent))
            if d < len(tokens):
                heapq.heappush(heap, (-logq[d][0], ranks + (0,), parent + (token,)))
        return parallel_tree(table, {k: tuple(v) for k, v in children.items()}, rows)


@dataclass(frozen=True)
class MedusaHeadsShifted(Medusa):
    """Head d ranks the tokens of position d + 1 (an off-by-one between heads and depths)."""

    def sample(self, table, rng=None):
        spec = self.spec
        depth = max(len(n) for n in spec)
        rows = position_rows(table, depth + 1, "Medusa")
        order = [np.argsort(-rows[d + 1], kind="stable") for d in range(depth)]
        children = {}
        for node in sorted(spec, key=lambda n: (len(n), n)):
            parent = tuple(int(order[i][r]) for i, r in enumerate(node[:-1]))
            children.setdefault(parent, []).append(int(order[len(node) - 1][node[-1]]))
        tree = DraftTree(table, {k: tuple(v) for k, v in children.items()}, Drafting.DETERMINISTIC)
        return tree.fill()


@dataclass(frozen=True)
class MedusaDeclaredIID(Medusa):
    """Medusa's top-k children declared i.i.d. draws from q (so SpecInfer and the like accept them)."""

    laws = frozenset({Drafting.IID})

    def sample(self, table, rng=None):
        return dataclasses.replace(super().sample(table), drafting=Drafting.IID)


class PrefixConditioned(RootConditioned):
    """A stand-in whose node rows follow the drafted prefix (the autoregressive q) while its position
    rows follow the greedy chain: it claims to be parallel and is not."""

    def node_distributions(self, root, paths):
        inner = self._inner(tuple(root))
        return inner.distributions([tuple(root) + tuple(p) for p in paths])

    def rooted(self, root_length):
        return PrefixConditioned(self.pair, root_length)


BUILDER_MUTANTS = {
    "DDTree scored by each token's own probability": (DDTreeScoredByOwnProbability(budget=6, depth=3), "best-first reference"),
    "Medusa heads shifted by one position": (MedusaHeadsShifted(((0,), (1,), (0, 0), (1, 0), (0, 1))), "Medusa reference"),
    "Medusa children declared i.i.d.": (MedusaDeclaredIID(((0,), (1,), (0, 0))), "lossless"),
}
PAIR_MUTANTS = {
    "stand-in rows follow the drafted prefix": (PrefixConditioned, "stand-in rows"),
}
