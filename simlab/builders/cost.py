"""Drafting cost: the draft forwards one tree took to build, and the tokens the target then verifies.

Builders attach a ``DraftCost`` to the trees they draw (``DraftTree.cost``); the latency model
(``simlab.latency.LatencyModel.step_time``) turns it into seconds by DDTE's T-hat (Sec. 6, App. E).
The types live with the builders so that a builder needs no latency model to state its cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simlab.checks import check_int


def delayed_levels(K: int, L1: int, L2: int) -> tuple[int, ...]:
    """Tokens at depths 1..L1+L2 of a delayed tree (K, L1, L2): L1 ones, then L2 times K."""
    return (1,) * L1 + (K,) * L2


@dataclass(frozen=True)
class DraftForward:
    """One draft forward while a tree is built: ``tokens`` new tokens, timed at context length
    l + ``context`` (l = the root context; ``context`` = the drafted tokens already in the
    draft's cache, by the convention of DDTE's T-hat)."""

    tokens: int
    context: int = 0
    model: str = "draft"

    def __post_init__(self):
        object.__setattr__(self, "tokens", check_int(self.tokens, "tokens", 1))
        object.__setattr__(self, "context", check_int(self.context, "context", 0))
        if not isinstance(self.model, str) or not self.model or self.model == "target":
            raise ValueError(f"model: a drafter's name (default 'draft'), got {self.model!r}")


@dataclass(frozen=True)
class DraftCost:
    """What building one tree cost: its draft forwards in order, and the tree tokens the target
    then verifies in one forward (root excluded).  Builders attach it to their trees
    (``DraftTree.cost``); ``LatencyModel.step_time`` turns it into seconds."""

    forwards: tuple[DraftForward, ...]
    verified: int

    def __post_init__(self):
        object.__setattr__(self, "forwards", tuple(self.forwards))
        object.__setattr__(self, "verified", check_int(self.verified, "verified", 0))
        if not all(isinstance(f, DraftForward) for f in self.forwards):
            raise ValueError("forwards: must be DraftForward values")

    @classmethod
    def levels(cls, levels: Sequence[int]) -> "DraftCost":
        """One draft forward per depth level d = 0..D-1 over m_d tokens (m_0 = 1, the root;
        m_d = levels[d - 1]) at context sum(levels[:d]) (DDTE's T-hat; a static or sampled
        tree drafted level by level).

        Raises:
            ValueError: a level with fewer than 1 token.
        """
        if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence):
            raise ValueError(f"levels: must be a sequence of integers >= 1 (tokens per depth level), got {levels!r}")
        levels = [check_int(m, "levels", 1) for m in levels]
        widths = [1] + levels[:-1]
        return cls(tuple(DraftForward(widths[d], sum(levels[:d])) for d in range(len(levels))), sum(levels))

    @classmethod
    def of_tree(cls, tree) -> "DraftCost":
        """The level-by-level cost of a tree's shape (its tokens per depth)."""
        counts: dict[int, int] = {}
        for path in tree.nodes():
            if path:
                counts[len(path)] = counts.get(len(path), 0) + 1
        return cls.levels([counts[d] for d in sorted(counts)])
