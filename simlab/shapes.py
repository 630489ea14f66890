"""Tree shapes (drafting policies): how a draft tree is drawn from the draft model.

* ``Delayed(K, L1, L2)`` (DDTE Def. 5.2): a trunk of L1 tokens drafted one at a time, then K
  branches of L2 tokens each from the trunk's end.  L1 = 0 gives K i.i.d. root rollouts;
  L2 = 0 a single path of L1 (K is then irrelevant); both 0, no draft.  ``siblings`` sets the
  law of the K first branch tokens: ``Drafting.IID`` (K independent rollouts; equal tokens
  merge into one child of multiplicity > 1) or ``Drafting.WITHOUT_REPLACEMENT`` (K distinct
  first tokens, each branch then continues on its own).
* ``iid(K, L)`` = ``Delayed(K, 0, L)``; ``chain(L)`` = ``Delayed(1, L, 0)``.
* ``Static(spec, children)``: a fixed topology in tuple notation; each node's n children are
  the n most probable tokens of q (``"topk"``, deterministic, EAGLE-style; only NSS-family
  verifiers are lossless on it) or n tokens drafted without replacement from q.

Every shape can ``sample`` one tree (one uniform per drafted token, so a seed fixes the tree)
and ``enumerate`` every tree it can produce with its probability (multiplicities and order
included), up to ``MAX_TREES``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from simlab.checks import check_int
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting, child_tuples, draw_children
from simlab.trees import DraftTree, NodeTable, Path, parse_tuples

MAX_TREES = 200_000
"""Largest number of trees ``enumerate`` will list."""


def _too_many(count: int) -> None:
    if count > MAX_TREES:
        raise ValueError(f"shape: exact enumeration would list {count} trees, above the limit {MAX_TREES}; use method='mc'")


@dataclass(frozen=True)
class Delayed:
    """A delayed tree (K, L1, L2): trunk of L1, then K branches of L2 (DDTE Def. 5.2).

    Args:
        K: number of branches (>= 1).
        L1: trunk length in tokens (>= 0).
        L2: branch length in tokens (>= 0).
        siblings: law of the K first branch tokens (i.i.d. or without replacement).
    """

    K: int
    L1: int
    L2: int
    siblings: Drafting = Drafting.IID

    def __post_init__(self):
        check_int(self.K, "K", 1)
        check_int(self.L1, "L1", 0)
        check_int(self.L2, "L2", 0)
        if not isinstance(self.siblings, Drafting):
            raise ValueError(f"siblings: must be a Drafting, got {self.siblings!r}")

    @property
    def tokens(self) -> int:
        """Drafted tokens in the tree: L1 + K L2 (the target verifies them in one forward)."""
        return self.L1 + (self.K * self.L2)

    def _branches(self) -> int:
        return self.K if self.L2 > 0 else 0

    @staticmethod
    def build(table: NodeTable, trunk: Path, branches: Sequence[Path]) -> DraftTree:
        """The tree with a trunk and branches from its end (child lists in branch order)."""
        children: dict[Path, tuple[int, ...]] = {}
        for j, t in enumerate(trunk):
            children[trunk[:j]] = (t,)
        for branch in branches:
            for j, t in enumerate(branch):
                node = trunk + branch[:j]
                children[node] = children.get(node, ()) + (t,)
        return DraftTree(table, children)

    def sample(self, table: NodeTable, rng: np.random.Generator) -> DraftTree:
        """Draw one tree from the draft model (p and q are fetched level by level, batched)."""
        trunk, branches = self.sample_paths(table, rng)
        return self.build(table, trunk, branches).fill()

    def sample_paths(self, table: NodeTable, rng: np.random.Generator) -> tuple[Path, list[Path]]:
        """Draw one tree as (trunk, branches): the trunk's L1 tokens and K branches of L2 tokens
        (none when L2 = 0).  The first K' < K branches are a draw of ``Delayed(K', L1, L2)``."""
        trunk: Path = ()
        for _ in range(self.L1):
            trunk += (sample_categorical(table.q(trunk), rng),)
        n = self._branches()
        branches: list[Path] = [() for _ in range(n)]
        for j in range(self.L2):
            table.fetch([trunk + b for b in branches])
            if j == 0 and self.siblings is Drafting.WITHOUT_REPLACEMENT:
                firsts = draw_children(table.q(trunk), n, Drafting.WITHOUT_REPLACEMENT, rng)
                branches = [(int(t),) for t in firsts]
                continue
            branches = [b + (sample_categorical(table.q(trunk + b), rng),) for b in branches]
        return trunk, branches

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """Every tree with its probability (ordered branches, so multiplicities are included).

        Raises:
            ValueError: more than ``MAX_TREES`` trees, or more distinct first tokens asked
                for than q has support (without replacement).
        """
        trunks = _sequences(table, (), self.L1)
        n = self._branches()
        for trunk, trunk_prob in trunks:
            if n == 0:
                yield self.build(table, trunk, []).fill(), trunk_prob
                continue
            if self.siblings is Drafting.IID:
                seqs = _sequences(table, trunk, self.L2)
                _too_many(len(trunks) * len(seqs) ** n)
                for combo in itertools.product(seqs, repeat=n):
                    prob = trunk_prob * float(np.prod([pr for _, pr in combo]))
                    yield self.build(table, trunk, [s for s, _ in combo]).fill(), prob
            else:
                firsts, first_probs = child_tuples(table.q(trunk), n, Drafting.WITHOUT_REPLACEMENT)
                tails = {int(t): _sequences(table, trunk + (int(t),), self.L2 - 1) for t in np.unique(firsts)}
                _too_many(len(trunks) * len(firsts) * max(len(v) for v in tails.values()) ** n)
                for first, first_prob in zip(firsts.tolist(), first_probs):
                    for combo in itertools.product(*(tails[t] for t in first)):
                        prob = trunk_prob * first_prob * float(np.prod([pr for _, pr in combo]))
                        branches = [(t,) + s for t, (s, _) in zip(first, combo)]
                        yield self.build(table, trunk, branches).fill(), prob


def iid(K: int, L: int, siblings: Drafting = Drafting.IID) -> Delayed:
    """K rollouts of L tokens from the root: ``Delayed(K, 0, L)``."""
    return Delayed(K, 0, L, siblings)


def chain(L: int) -> Delayed:
    """A single drafted path of L tokens: ``Delayed(1, L, 0)``."""
    return Delayed(1, L, 0)


def named_shape(name: str, width: int, depth: int, trunk: int = 0) -> Delayed:
    """The studies' ``--shape`` flag: ``"iid"`` = iid(width, depth), ``"chain"`` = chain(depth),
    ``"delayed"`` = Delayed(width, trunk, depth - trunk).

    Raises:
        ValueError: an unknown name or invalid sizes.
    """
    if name == "iid":
        return iid(width, depth)
    if name == "chain":
        return chain(depth)
    if name == "delayed":
        return Delayed(width, trunk, depth - trunk)
    raise ValueError(f"shape: must be 'iid', 'chain' or 'delayed', got {name!r}")


def _sequences(table: NodeTable, start: Path, length: int) -> list[tuple[Path, float]]:
    """Every token sequence of ``length`` drafted from node ``start`` (q along its own prefix)."""
    seqs: list[tuple[Path, float]] = [((), 1.0)]
    for _ in range(length):
        table.fetch([start + s for s, _ in seqs])
        nxt = []
        for s, prob in seqs:
            q = table.q(start + s)
            nxt.extend((s + (int(t),), prob * float(q[t])) for t in np.flatnonzero(q > 0))
        _too_many(len(nxt))
        seqs = nxt
    return seqs


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

    def __post_init__(self):
        object.__setattr__(self, "spec", tuple(tuple(int(r) for r in node) for node in self.spec))
        parse_tuples(self.spec)
        if self.children not in ("topk", "without_replacement"):
            raise ValueError(f"children: must be 'topk' or 'without_replacement', got {self.children!r}")

    @property
    def tokens(self) -> int:
        return len(self.spec)

    def _counts(self) -> dict[tuple[int, ...], int]:
        return parse_tuples(self.spec)

    def _topk(self, q: np.ndarray, n: int, where: Path) -> tuple[int, ...]:
        order = np.argsort(-q, kind="stable")[:n]
        if np.any(q[order] <= 0):
            raise ValueError(f"spec: node {where} asks for {n} children but q has fewer tokens with q > 0")
        return tuple(int(t) for t in order)

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
        return DraftTree(table, children).fill()

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """Every tree with its probability (a single tree for ``"topk"``)."""
        if self.children == "topk":
            yield self.sample(table), 1.0
            return
        counts = self._counts()
        yield from self._expand(table, counts, [((), ())], {}, 1.0, 1)

    def _expand(self, table, counts, pending, children, prob, listed):
        if not pending:
            yield DraftTree(table, dict(children)).fill(), prob
            return
        (ranks, tok), rest = pending[0], pending[1:]
        n = counts.get(ranks, 0)
        if n == 0:
            yield from self._expand(table, counts, rest, children, prob, listed)
            return
        tuples, probs = child_tuples(table.q(tok), n, Drafting.WITHOUT_REPLACEMENT)
        _too_many(listed * len(tuples))
        for kids, kid_prob in zip(tuples.tolist(), probs):
            children[tok] = tuple(kids)
            more = [(ranks + (r,), tok + (t,)) for r, t in enumerate(kids)]
            yield from self._expand(table, counts, rest + more, children, prob * float(kid_prob), listed * len(tuples))
        children.pop(tok, None)
