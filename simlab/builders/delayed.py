"""Delayed trees (DDTE Def. 5.2) and their special cases: i.i.d. rollouts and chains.

* ``Delayed(K, L1, L2)``: a trunk of L1 tokens drafted one at a time, then K branches of L2
  tokens each from the trunk's end.  L1 = 0 gives K i.i.d. root rollouts; L2 = 0 a single path
  of L1 (K is then irrelevant); both 0, no draft.  ``siblings`` sets the law of the K first
  branch tokens: ``Drafting.IID`` (K independent rollouts; equal tokens merge into one child of
  multiplicity > 1) or ``Drafting.WITHOUT_REPLACEMENT`` (K distinct first tokens, each branch
  then continues on its own).  Every other node has one child drawn from q.
* ``iid(K, L)`` = ``Delayed(K, 0, L)``; ``chain(L)`` = ``Delayed(1, L, 0)``.

Drafting cost: one draft forward per level, K tokens per branch level (DDTE's T-hat); the
budget (drafted tokens) is L1 + K L2.  ``sample`` draws one tree (one uniform per drafted
token); ``enumerate`` lists every tree with its probability (multiplicities and order included).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.builders.base import too_many
from simlab.checks import check_generator, check_int
from simlab.distributions import sample_categorical
from simlab.drafting import SAMPLED, Drafting, child_tuples, draw_children
from simlab.builders.cost import DraftCost, delayed_levels
from simlab.trees import DraftTree, NodeTable, Path


@dataclass(frozen=True)
class Delayed:
    """A delayed tree (K, L1, L2): trunk of L1, then K branches of L2 (DDTE Def. 5.2).

    Args:
        K: number of branches (>= 1).
        L1: trunk length in tokens (>= 0).
        L2: branch length in tokens (>= 0).
        siblings: law of the K first branch tokens (i.i.d. or without replacement).
        trunk_children: ``"shared"`` (default: a trunk node has its one drafted child) or
            ``"per_path"`` (the audit convention of the DDTE authors' public code, one edge per
            path: each trunk node lists its child K times, law ``Drafting.REPEATED``; verifiers
            that treat the copies as K i.i.d. draws are refused there unless ``allow_lossy``).
    """

    K: int
    L1: int
    L2: int
    siblings: Drafting = Drafting.IID
    trunk_children: str = "shared"

    deterministic: ClassVar[bool] = False
    default_laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.IID})

    @classmethod
    def example(cls, vocab_size: int = 4) -> "Delayed":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(2, 1, 1)

    def __post_init__(self):
        check_int(self.K, "K", 1)
        check_int(self.L1, "L1", 0)
        check_int(self.L2, "L2", 0)
        if self.siblings not in SAMPLED:
            raise ValueError(f"siblings: must be Drafting.IID or Drafting.WITHOUT_REPLACEMENT, got {self.siblings!r}")
        if self.trunk_children not in ("shared", "per_path"):
            raise ValueError(f"trunk_children: must be 'shared' or 'per_path', got {self.trunk_children!r}")

    @property
    def repeats(self) -> int:
        """How many times a trunk node lists its child: K with ``per_path`` and branches, else 1."""
        return self.K if self.trunk_children == "per_path" and self.L2 > 0 else 1

    @property
    def laws(self) -> frozenset[Drafting]:
        if self.repeats > 1 and self.L1 > 0:
            return frozenset({self.siblings, Drafting.REPEATED})
        return frozenset({self.siblings})

    @property
    def budget(self) -> int:
        return self.tokens

    def cost(self) -> DraftCost:
        """One draft forward per level (DDTE's T-hat: K tokens per branch level)."""
        return DraftCost.levels(delayed_levels(self.K, self.L1, self.L2))

    @property
    def tokens(self) -> int:
        """Drafted tokens in the tree: L1 + K L2 (the target verifies them in one forward)."""
        return self.L1 + (self.K * self.L2)

    def _branches(self) -> int:
        return self.K if self.L2 > 0 else 0

    @staticmethod
    def build(
        table: NodeTable,
        trunk: Path,
        branches: Sequence[Path],
        siblings: Drafting = Drafting.IID,
        cost: DraftCost | None = None,
        repeats: int = 1,
    ) -> DraftTree:
        """The tree with a trunk and branches from its end (child lists in branch order); a trunk
        node lists its child ``repeats`` times (``Drafting.REPEATED`` when > 1)."""
        children: dict[Path, tuple[int, ...]] = {}
        for j, t in enumerate(trunk):
            children[trunk[:j]] = (t,) * repeats
        for branch in branches:
            for j, t in enumerate(branch):
                node = trunk + branch[:j]
                children[node] = children.get(node, ()) + (t,)
        laws = {trunk[:j]: Drafting.REPEATED for j in range(len(trunk))} if repeats > 1 else {}
        return DraftTree(table, children, siblings, laws, cost=cost)

    def sample(self, table: NodeTable, rng: np.random.Generator | None = None) -> DraftTree:
        """Draw one tree from the draft model (p and q are fetched level by level, batched).

        Raises:
            ValueError: ``rng: ...`` when a token must be drawn and ``rng`` is not a Generator.
        """
        if self.tokens:
            check_generator(rng)
        trunk, branches = self.sample_paths(table, rng)
        return self.build(table, trunk, branches, self.siblings, self.cost(), self.repeats).fill()

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
                yield self.build(table, trunk, [], self.siblings, self.cost(), self.repeats).fill(), trunk_prob
                continue
            if self.siblings is Drafting.IID:
                seqs = _sequences(table, trunk, self.L2)
                too_many(len(trunks) * len(seqs) ** n)
                for combo in itertools.product(seqs, repeat=n):
                    prob = trunk_prob * float(np.prod([pr for _, pr in combo]))
                    yield self.build(table, trunk, [s for s, _ in combo], self.siblings, self.cost(), self.repeats).fill(), prob
            else:
                firsts, first_probs = child_tuples(table.q(trunk), n, Drafting.WITHOUT_REPLACEMENT)
                tails = {int(t): _sequences(table, trunk + (int(t),), self.L2 - 1) for t in np.unique(firsts)}
                too_many(len(trunks) * len(firsts) * max(len(v) for v in tails.values()) ** n)
                for first, first_prob in zip(firsts.tolist(), first_probs):
                    for combo in itertools.product(*(tails[t] for t in first)):
                        prob = trunk_prob * first_prob * float(np.prod([pr for _, pr in combo]))
                        branches = [(t,) + s for t, (s, _) in zip(first, combo)]
                        yield self.build(table, trunk, branches, self.siblings, self.cost(), self.repeats).fill(), prob


def iid(K: int, L: int, siblings: Drafting = Drafting.IID) -> Delayed:
    """K rollouts of L tokens from the root: ``Delayed(K, 0, L)``."""
    return Delayed(K, 0, L, siblings)


iid.default_laws = Delayed.default_laws
iid.example = lambda vocab_size=4: iid(2, 1)


def chain(L: int) -> Delayed:
    """A single drafted path of L tokens: ``Delayed(1, L, 0)``."""
    return Delayed(1, L, 0)


chain.default_laws = Delayed.default_laws
chain.example = lambda vocab_size=4: chain(2)


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
        too_many(len(nxt))
        seqs = nxt
    return seqs
