"""Static trees: a fixed topology in tuple notation, children by rank.

``Static(spec, children)``: each node's n children are the n most probable tokens of q
(``"topk"``, deterministic: EAGLE-1's static trees, Medusa, Sequoia at T = 0; verified by the
one-hot or greedy rule, never by the i.i.d. verifiers) or n tokens drafted without replacement
from q (``"without_replacement"``: Sequoia's stochastic trees, verified by RRS without
replacement or Traversal).  Drafting cost: one forward per level; budget: the spec's nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from simlab.builders.base import too_many
from simlab.drafting import Drafting, child_tuples, draw_children, top_tokens
from simlab.builders.cost import DraftCost
from simlab.trees import DraftTree, NodeTable, Path, parse_tuples, rank_paths


@dataclass(frozen=True)
class Static:
    """A static topology in tuple notation, e.g. ``[(0,), (1,), (0, 0)]``.

    Args:
        spec: the nodes as tuples of child ranks (validated by ``simlab.trees.parse_tuples``).
        children: ``"topk"`` (the n most probable tokens of q with q > 0, ties to the lowest
            id) or ``"without_replacement"`` (n tokens drafted without replacement).
    """

    spec: tuple[tuple[int, ...], ...]
    children: Literal["topk", "without_replacement"] = "topk"

    default_laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})

    @classmethod
    def example(cls, vocab_size: int = 4) -> "Static":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls([(0,), (1,), (0, 0)], "topk")

    def __post_init__(self):
        object.__setattr__(self, "spec", rank_paths(self.spec))
        parse_tuples(self.spec)
        if self.children not in ("topk", "without_replacement"):
            raise ValueError(f"children: must be 'topk' or 'without_replacement', got {self.children!r}")

    @property
    def tokens(self) -> int:
        return len(self.spec)

    @property
    def budget(self) -> int:
        return self.tokens

    @property
    def drafting(self) -> Drafting:
        return Drafting.DETERMINISTIC if self.children == "topk" else Drafting.WITHOUT_REPLACEMENT

    @property
    def laws(self) -> frozenset[Drafting]:
        return frozenset({self.drafting})

    @property
    def deterministic(self) -> bool:
        return self.children == "topk"

    def cost(self) -> DraftCost:
        """One draft forward per level of the topology."""
        per_depth: dict[int, int] = {}
        for node in self.spec:
            per_depth[len(node)] = per_depth.get(len(node), 0) + 1
        return DraftCost.levels([per_depth[d] for d in sorted(per_depth)])

    def _tree(self, table, children) -> DraftTree:
        return DraftTree(table, children, self.drafting, cost=self.cost())

    def _counts(self) -> dict[tuple[int, ...], int]:
        return parse_tuples(self.spec)

    def _topk(self, q: np.ndarray, n: int, where: Path) -> tuple[int, ...]:
        if np.count_nonzero(q) < n:
            raise ValueError(f"spec: node {where} asks for {n} children but q has fewer tokens with q > 0")
        return tuple(int(t) for t in top_tokens(q, n))

    def sample(self, table: NodeTable, rng: np.random.Generator | None = None) -> DraftTree:
        """The tree (``rng`` is needed only for ``children="without_replacement"``)."""
        counts = self._counts()
        children: dict[Path, tuple[int, ...]] = {}
        frontier = [((), ())]  # (rank path, token path)
        while frontier:
            table.fetch([tok for _, tok in frontier])
            nxt = []
            for ranks, tok in frontier:
                n = counts.get(ranks, 0)
                if n == 0:
                    continue
                q = table.q(tok)
                if self.children == "topk":
                    kids = self._topk(q, n, tok)
                else:
                    if rng is None:
                        raise ValueError("rng: children drafted without replacement need a numpy Generator")
                    kids = tuple(int(t) for t in draw_children(q, n, Drafting.WITHOUT_REPLACEMENT, rng))
                children[tok] = kids
                nxt.extend((ranks + (r,), tok + (t,)) for r, t in enumerate(kids))
            frontier = nxt
        return self._tree(table, children).fill()

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """Every tree with its probability (a single tree for ``"topk"``)."""
        if self.children == "topk":
            yield self.sample(table), 1.0
            return
        counts = self._counts()
        yield from self._expand(table, counts, [((), ())], {}, 1.0, 1)

    def _expand(self, table, counts, pending, children, prob, listed):
        if not pending:
            yield self._tree(table, dict(children)).fill(), prob
            return
        (ranks, tok), rest = pending[0], pending[1:]
        n = counts.get(ranks, 0)
        if n == 0:
            yield from self._expand(table, counts, rest, children, prob, listed)
            return
        tuples, probs = child_tuples(table.q(tok), n, Drafting.WITHOUT_REPLACEMENT)
        too_many(listed * len(tuples))
        for kids, kid_prob in zip(tuples.tolist(), probs):
            children[tok] = tuple(kids)
            more = [(ranks + (r,), tok + (t,)) for r, t in enumerate(kids)]
            yield from self._expand(table, counts, rest + more, children, prob * float(kid_prob), listed * len(tuples))
        children.pop(tok, None)
