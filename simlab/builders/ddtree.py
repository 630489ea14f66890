"""DDTree's best-first draft tree under a node budget (Ringel et al. 2026, "Accelerating Speculative
Decoding with Block Diffusion Draft Trees"), from a parallel drafter's per-position distributions.

The drafter (DFlash, a block diffusion model) gives rows q_1..q_D in one forward; a path
(x_1, ..., x_d) scores sum_i log q_i(x_i), and the tree is the ``budget`` best-scoring paths,
found best-first with a heap (liranringel/ddtree@c96427a ``ddtree.py::build_ddtree_tree``): pop
the best candidate, add it, push its next sibling (the next rank of the same position) and its
first child (the top token of the next position), until ``budget`` nodes are in.  A child never
outscores its parent, so the kept set is ancestor-closed: it is the top ``budget`` of all paths
of depth <= D ranked by (-score, rank path), the heap's key (ties: the smaller rank path, as the
official tuple comparison).  Children are a function of the root (``Drafting.DETERMINISTIC``):
the official code verifies by sampling from the target and following the tree (the lab's
``nss``; greedy at T = 0), and every verifier lossless for deterministic trees applies.

Conventions: ``depth`` = the drafter's positions (DFlash-b16: block 16 = the root + 15);
``budget`` = draft tokens (root excluded), ``ddtree_generate``'s default being the draft
horizon (15); the official benchmark sweeps 16 to 1024.  Each position offers its
min(budget, count(q > 0)) most probable tokens (official: ``torch.topk`` of min(budget, V),
which can include zero-probability tokens only when V is tiny); scores in float64 from the
table's q (official: float32 log-softmax of the raw logits: build on an untempered table,
``NodeTable.untempered``, to rank as it does).  Cost: one draft forward
(``simlab.builders.parallel``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.builders.parallel import parallel_tree, position_rows
from simlab.checks import check_int
from simlab.distributions import top_positive
from simlab.drafting import Drafting
from simlab.trees import DraftTree, NodeTable


def ranked_rows(rows: np.ndarray, budget: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per position: its min(budget, count(q > 0)) top tokens (ties: lowest id) and their log q."""
    tokens = [top_positive(row, budget) for row in rows]
    return tokens, [np.log(row[top]) for row, top in zip(rows, tokens)]


def best_first(tokens: list[np.ndarray], logq: list[np.ndarray], budget: int) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The children of the best-first tree: at most ``budget`` nodes, by the heap (module docstring);
    a path's score is its parent's plus its own log q (one float addition per edge)."""
    children: dict[tuple[int, ...], list[int]] = {}
    if not len(tokens) or not tokens[0].size:
        return {}
    heap = [(-float(logq[0][0]), (0,), (), 0.0)]  # (-score, rank path, parent token path, parent score)
    added = 0
    while heap and added < budget:
        neg, ranks, parent, base = heapq.heappop(heap)
        depth, rank = len(ranks), ranks[-1]
        token = int(tokens[depth - 1][rank])
        children.setdefault(parent, []).append(token)
        added += 1
        if rank + 1 < tokens[depth - 1].size:
            score = base + float(logq[depth - 1][rank + 1])
            heapq.heappush(heap, (-score, ranks[:-1] + (rank + 1,), parent, base))
        if depth < len(tokens) and tokens[depth].size:
            score = -neg + float(logq[depth][0])
            heapq.heappush(heap, (-score, ranks + (0,), parent + (token,), -neg))
    return {path: tuple(kids) for path, kids in children.items()}


@dataclass(frozen=True)
class DDTree:
    """DDTree's best-first tree (module docstring).

    Args:
        budget: draft tokens (nodes, root excluded), >= 1.
        depth: the drafter's positions D (the deepest level), 1 to 64.

    Raises:
        ValueError: ``budget: ...`` or ``depth: ...`` out of range.
    """

    budget: int = 15
    depth: int = 15

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True
    parallel_draft: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "DDTree":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(budget=4, depth=2)

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 1, 64))

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used).

        Raises:
            ValueError: ``pair: ...`` for a pair that is not a parallel drafter.
        """
        rows = position_rows(table, self.depth, "DDTree")
        return parallel_tree(table, best_first(*ranked_rows(rows, self.budget), self.budget), rows)

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield self.sample(table), 1.0
