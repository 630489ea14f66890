"""Dynamic trees grown by cumulative score: the expansion EAGLE-2 and the greedy-draft tree share.

``grow`` builds a tree at a root in rounds, as EAGLE-2's ``topK_genrate`` does:

1. the root's proposals (``propose(q_root)``) are the first candidates, scored by their log
   score; the ``top_k`` best form the frontier;
2. ``depth`` times: one draft forward over the frontier; each frontier node proposes its
   children, scored by the parent's score plus their log score; every candidate is kept; the
   ``top_k`` best of this round's candidates are the next frontier;
3. the final tree keeps the ``budget`` best candidates of all rounds.

Ranking is by (score descending, creation order ascending).  Log scores are <= 0, so a child
never outranks its parent, and with creation order as the tie-break (a parent is created before
its children) every kept set is ancestor-closed, ties included.  A tree has up to depth + 1
levels and at most ``budget`` draft tokens; its cost is one draft forward over the root, then
one over each frontier (``simlab.builders.cost.DraftCost``: the frontier tokens at a context that
includes the frontiers forwarded so far).  A proposal is ``(token, log score, tail)``; ``tail``
marks a sampled child, and a node keeps the law ``Drafting.MIXED`` if its tail is kept,
``Drafting.DETERMINISTIC`` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from simlab.drafting import Drafting
from simlab.builders.cost import DraftCost, DraftForward
from simlab.trees import DraftTree, NodeTable, Path


class Candidate(NamedTuple):
    """A scored node: its path, cumulative log score, creation index, and whether it is a sampled
    tail (a named tuple: a tree creates k + depth k^2 of them, 710 for EAGLE's defaults)."""

    path: Path
    score: float
    index: int
    tail: bool = False


def ranked(candidates) -> list[Candidate]:
    """Best first: score descending, then creation order."""
    return sorted(candidates, key=lambda c: (-c.score, c.index))


def _ranked_created(candidates: list[Candidate]) -> list[Candidate]:
    """``ranked`` for a list already in creation order: Python's sort is stable, so sorting by
    score alone keeps creation order among equal scores (no key tuple per candidate)."""
    return sorted(candidates, key=_negated_score)


def _negated_score(c: Candidate) -> float:
    return -c.score


def _index(c: Candidate) -> int:
    return c.index


def grow(
    table: NodeTable, *, depth: int, top_k: int, budget: int, propose: Callable[[np.ndarray], list[tuple[int, float, bool]]]
) -> DraftTree:
    """The tree grown at ``table``'s root (module docstring); p and q fetched one frontier at a time."""
    created: list[Candidate] = []

    def expand(parent: Path, score: float) -> list[Candidate]:
        start = len(created)
        for token, log_score, tail in propose(table.q(parent)):
            created.append(Candidate(parent + (int(token),), score + float(log_score), len(created), tail))
        return created[start:]

    table.fetch([()])
    frontier = _ranked_created(expand((), 0.0))[:top_k]
    forwards, cached = [DraftForward(1, 0)], 0
    for _ in range(depth):
        if not frontier:
            break
        cached += len(frontier)
        forwards.append(DraftForward(len(frontier), cached))
        table.fetch([c.path for c in frontier])
        new = [child for c in frontier for child in expand(c.path, c.score)]
        frontier = _ranked_created(new)[:top_k]
    kept = sorted(_ranked_created(created)[:budget], key=_index)
    children: dict[Path, tuple[int, ...]] = {}
    laws: dict[Path, Drafting] = {}
    for c in kept:
        parent = c.path[:-1]
        children[parent] = children.get(parent, ()) + (c.path[-1],)
        if c.tail:
            laws[parent] = Drafting.MIXED
    tree = DraftTree(table, children, Drafting.DETERMINISTIC, laws, DraftCost(tuple(forwards), len(kept)))
    return tree.fill()
