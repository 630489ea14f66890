"""SpecBlock's rank-guided block trees (arXiv 2605.07243), as its official code builds them.

A **block drafter** (``BlockDrafter``) drafts K dependent slots in one forward: for a seed (the
root, or a node of the tree) it returns each slot's log-probabilities, the rank class its rank
head predicts for the slot (``simlab.specblock.rank``) and an opaque state that later blocks
inherit.  Slot k's law is conditioned on the greedy tokens of slots < k.

**Block 1** (at the root): the greedy tokens g_0..g_{K-1} form a chain; slot k gets t_k children
in all (the greedy one and the next t_k - 1 by rank, as siblings of g_k, each scored by the
cumulative draft log-probability):

* slot 0 ignores its class: ``beam_width`` (10), or with ``adaptive_slot0`` by the greedy
  probability p_0: >= 0.9 -> 3, >= 0.8 -> 5, >= 0.6 -> 8;
* slots >= 1: ``table[c_k]``, capped with ``adaptive_all`` by p_k: >= 0.95 -> 2, >= 0.85 -> 3; an
  entry 0 (give up) stops the block there.

Pending seeds: the greedy nodes of branching slots, every alternative, and g_{K-1} unless the
block gave up.  **Later blocks** (up to ``blocks`` in all): the best ``beam_width`` seeds per
depth by score go through one batched forward; each block adds its chain and siblings by the
same rule, slot 0 by its rank class (no beam rule), the chain cut at the rank walk's valid
length M (K when every class is 0, else the first slot of another class, plus one unless it
gave up).  A token that is already a child is reused (the tree is a trie).  Finally the tree is
**pruned** to ``budget`` draft tokens by cumulative draft log-probability (ancestor-closed: a
child never scores above its parent; ties by creation order).

``table``: the shipped "Pareto" default ``slim_r2`` = [2, 4, 6, 4] with both adaptive rules (under
it a give-up class still branches), or the class default [2, 4, 10, 0] (``CLASS_DEFAULT``).
``rank_head=False`` is the ablation without the rank head: a fixed ``fixed_width`` children per
slot.  Children are deterministic given the context (``Drafting.DETERMINISTIC``): greedy
verification at T = 0, the one-hot rule at T > 0.  Cost: one forward of the drafter named
``"block"`` per block (K tokens per seed).  Budget: 90 draft tokens in the evaluation
(``"1,2,10,90"``: batch, blocks, beam, tokens); 60 for comparisons with EAGLE-3's.
Source: SpecBlock@b7938c5 ``benchmarks_hf/algorithms/_specblock_base.py``, ``specblock.py``
(``_PARETO_DEFAULTS``); ``../shared/reference/tree_builders.md`` Sec. 6.  The later-block rules
(seeds per depth, the valid length) are the lab's reading of the reference's summary.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from simlab.checks import check_int
from simlab.drafting import Drafting
from simlab.latency import DraftCost, DraftForward
from simlab.trees import DraftTree, NodeTable, Path

SLIM_R2 = (2, 4, 6, 4)
CLASS_DEFAULT = (2, 4, 10, 0)
SLOT0_WIDTHS = ((0.9, 3), (0.8, 5), (0.6, 8))
ALL_CAPS = ((0.95, 2), (0.85, 3))


@dataclass(frozen=True)
class Block:
    """One block from a seed: slot log-probabilities float64 (K, V), rank classes int64 (K,), and
    the drafter's states for seeds in this block (one per slot, opaque)."""

    logprobs: np.ndarray
    classes: np.ndarray
    states: tuple


@runtime_checkable
class BlockDrafter(Protocol):
    """What the builder needs from a block drafter (``K`` slots per forward)."""

    K: int
    vocab_size: int

    def first_block(self, table: NodeTable) -> Block:
        """The block at the root of ``table``."""
        ...

    def next_blocks(self, table: NodeTable, seeds: Sequence[tuple[Path, object]]) -> list[Block]:
        """One block per (seed path, inherited state), in one batched forward."""
        ...


def check_table(table) -> tuple[int, int, int, int]:
    """A sibling table: 4 non-negative integer widths, one per rank class.

    Raises:
        ValueError: ``table: ...``.
    """
    try:
        out = tuple(check_int(w, "table", 0) for w in table)
    except TypeError:
        raise ValueError(f"table: must be 4 integers (one width per rank class), got {table!r}") from None
    if len(out) != 4:
        raise ValueError(f"table: must hold 4 widths (one per rank class), got {len(out)}")
    return out


@dataclass(frozen=True)
class RankGuided:
    """SpecBlock's rank-guided tree builder (module docstring).

    Args:
        drafter: a ``BlockDrafter``.
        budget: draft tokens after pruning, >= 1.
        blocks: blocks in all (>= 1; the evaluation runs 2).
        beam_width: slot-0 width of block 1 and seeds per depth, >= 1.
        table: widths per rank class (``SLIM_R2`` or ``CLASS_DEFAULT``).
        adaptive_slot0, adaptive_all: the probability caps of the shipped defaults.
        rank_head: False for the ablation without it (``fixed_width`` children per slot).
        fixed_width: the width per slot of that ablation, >= 1.

    Raises:
        ValueError: naming the argument.
    """

    drafter: BlockDrafter
    budget: int = 90
    blocks: int = 2
    beam_width: int = 10
    table: tuple[int, int, int, int] = SLIM_R2
    adaptive_slot0: bool = True
    adaptive_all: bool = True
    rank_head: bool = True
    fixed_width: int = 3

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    deterministic: ClassVar[bool] = True

    def __post_init__(self):
        if not isinstance(self.drafter, BlockDrafter):
            raise ValueError(f"drafter: must be a simlab.specblock.BlockDrafter, got {type(self.drafter).__name__}")
        check_int(self.drafter.K, "K", 1)
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "blocks", check_int(self.blocks, "blocks", 1, 16))
        object.__setattr__(self, "beam_width", check_int(self.beam_width, "beam_width", 1))
        object.__setattr__(self, "table", check_table(self.table))
        object.__setattr__(self, "fixed_width", check_int(self.fixed_width, "fixed_width", 1))

    def widths(self, block: Block, first: bool) -> list[int]:
        """Children per slot (0: the block gives up there), by the rules of the module docstring."""
        probs = np.exp(block.logprobs.max(axis=1))
        out = []
        for k in range(block.logprobs.shape[0]):
            if not self.rank_head:
                width = self.fixed_width
            elif k == 0 and first:
                width = self.beam_width
                if self.adaptive_slot0:
                    width = next((w for p, w in SLOT0_WIDTHS if probs[0] >= p), self.beam_width)
            else:
                width = self.table[int(block.classes[k])]
                if self.adaptive_all and width:
                    width = next((min(w, width) for p, w in ALL_CAPS if probs[k] >= p), width)
            out.append(width)
            if width == 0:
                break
        return out

    def valid_length(self, block: Block) -> int:
        """The rank walk: K if every class is 0, else the first slot of another class, +1 unless it gives up."""
        classes = block.classes
        others = np.flatnonzero(classes != 0)
        if not others.size:
            return len(classes)
        first = int(others[0])
        return first if self.table[int(classes[first])] == 0 else first + 1

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used)."""
        return self.build(table)[0]

    def build(self, table: NodeTable) -> tuple[DraftTree, dict[Path, tuple[int, int]]]:
        """The tree and, for each of its nodes, the (block, slot) that drafted it (0-based)."""
        growth = _Growth(self, table)
        tree = growth.tree()
        return tree, {path: growth.origin[path] for path in tree.nodes() if path}

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """The one tree, with probability 1 (the builder protocol's exact enumeration)."""
        yield self.sample(table), 1.0


class _Growth:
    def __init__(self, builder: RankGuided, table: NodeTable):
        self.b, self.table = builder, table
        self.score: dict[Path, float] = {(): 0.0}
        self.order: dict[Path, int] = {(): 0}
        self.origin: dict[Path, tuple[int, int]] = {}
        self.block, self.slot = 0, 0  # where the next node comes from (block, slot)
        self.forwards: list[DraftForward] = []

    def _add(self, parent: Path, token: int, logprob: float) -> Path:
        node = parent + (int(token),)
        if node not in self.score:
            self.score[node] = self.score[parent] + float(logprob)
            self.order[node] = len(self.order)
            self.origin[node] = (self.block, self.slot)
        return node

    def _expand(self, seed: Path, block: Block, first: bool) -> list[tuple[Path, object]]:
        """Add a block below ``seed``; return the pending seeds (path, inherited state)."""
        widths = self.b.widths(block, first)
        limit = len(widths) if first else min(len(widths), self.b.valid_length(block))
        pending, parent, gave_up, last = [], seed, bool(widths) and widths[-1] == 0, 0
        for k in range(limit):
            self.slot = k
            width = widths[k]
            if width == 0:
                break
            lp = block.logprobs[k]
            order = np.argsort(-lp, kind="stable")[:width]
            order = order[np.isfinite(lp[order])]
            if not order.size:
                break
            greedy = self._add(parent, int(order[0]), lp[order[0]])
            for t in order[1:]:
                pending.append((self._add(parent, int(t), lp[t]), block.states[k]))
            if order.size > 1:
                pending.append((greedy, block.states[k]))
            parent, last = greedy, k
        if parent != seed and not gave_up:  # the chain's last greedy node hitchhikes as a seed
            pending.append((parent, block.states[last]))
        return pending

    def tree(self) -> DraftTree:
        b, K = self.b, self.b.drafter.K
        block = b.drafter.first_block(self.table)
        self.forwards.append(DraftForward(K, 0, "block"))
        pending = self._expand((), block, first=True)
        for block_index in range(1, b.blocks):
            self.block = block_index
            seeds = self._seeds(pending)
            if not seeds:
                break
            self.forwards.append(DraftForward(K * len(seeds), 0, "block"))
            pending = []
            for (seed, _), next_block in zip(seeds, b.drafter.next_blocks(self.table, seeds)):
                pending.extend(self._expand(seed, next_block, first=False))
        return self._prune()

    def _seeds(self, pending) -> list[tuple[Path, object]]:
        """The best ``beam_width`` distinct pending seeds per depth, by score (then creation order)."""
        unique = {}
        for path, state in pending:
            unique.setdefault(path, state)
        by_depth: dict[int, list[Path]] = {}
        for path in sorted(unique, key=lambda p: (-self.score[p], self.order[p])):
            by_depth.setdefault(len(path), []).append(path)
        chosen = [p for paths in by_depth.values() for p in paths[: self.b.beam_width]]
        return [(p, unique[p]) for p in sorted(chosen, key=lambda p: self.order[p])]

    def _prune(self) -> DraftTree:
        ranked = sorted((p for p in self.score if p), key=lambda p: (-self.score[p], self.order[p]))
        kept = set(ranked[: self.b.budget]) | {()}
        children: dict[Path, tuple[int, ...]] = {}
        for path in sorted(kept - {()}, key=lambda p: self.order[p]):
            children[path[:-1]] = children.get(path[:-1], ()) + (path[-1],)
        assert all(p[:-1] in kept for p in kept if p), "ancestor closure"
        cost = DraftCost(tuple(self.forwards), len(kept) - 1)
        return DraftTree(self.table, children, Drafting.DETERMINISTIC, cost=cost).fill()
