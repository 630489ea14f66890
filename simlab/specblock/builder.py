"""SpecBlock's rank-guided block trees (arXiv 2605.07243), as its official code builds them.

A **block drafter** (``BlockDrafter``) drafts K dependent slots in one forward: for a seed (the
root, or a node of the tree) it returns each slot's log-probabilities, the rank class its rank
head predicts for the slot (``simlab.specblock.rank``) and an opaque state that later blocks
inherit.  Slot k's law is conditioned on the greedy tokens of slots < k.

**Block 1** (at the root): the greedy tokens g_0..g_{K-1} form a chain; slot k gets t_k children
in all (the greedy one and the next t_k - 1 by rank, as siblings of g_k, each scored by the
cumulative draft log-probability):

* slot 0 ignores its class: ``beam_width`` (10), or with ``adaptive_slot0`` by the greedy
  probability p_0: >= 0.9 -> 3, >= 0.8 -> 5, >= 0.6 -> 8 (each at most ``beam_width``);
* slots >= 1: ``table[c_k]``, capped with ``adaptive_all`` by p_k: >= 0.95 -> 2, >= 0.85 -> 3; an
  entry 0 (give up) stops block 1 there.

Pending seeds: the greedy nodes of branching slots (t_k > 1), every alternative, and g_{K-1}
when the chain is whole, slot K - 1 does not branch, and the **rank walk** does not give up (the
walk gives up when the first slot of a class other than 0 is of class 3, whatever the table).

**Later blocks** (``later_blocks="official"``, the default; the evaluation runs ``blocks`` = 2):
**every** pending seed gets a block, all in one batched forward; each block adds its **full
K-slot greedy chain** below its seed plus t_k - 1 alternatives at every slot k by the same width
rule, slot 0 by its rank class (no beam rule), a zero width meaning no alternatives (the chain
goes on).  The rank walk's valid length M only masks the drafter's cache in the official code:
it does not cut the chain.  Its pending seeds (for a third block, the lab's extension of the
official two-block path) follow block 1's rule.  Nodes live in a flat buffer, as the official
``tn_*`` arrays: a block's token that is already a sibling is a **duplicate** node with its own
score and subtree.  Finally the buffer is **pruned** to ``budget`` nodes by cumulative draft
log-probability (ancestor-closed: a child never scores above its parent; ties by creation
order), and the kept nodes are merged into the lab's trie (``DraftTree`` keys a node by its
token path): duplicate siblings become one node whose subtree is the union of theirs.  The merge
leaves the exact E[tau+1] of greedy and one-hot verification unchanged (both accept the longest
drafted path that is a prefix of the target's continuation, which depends only on the set of
drafted paths; tested), and the tree's cost counts the buffer's nodes (what the target verifies).

``later_blocks="cut"`` is the lab's earlier reading (a departure, ``docs/departures.md``): the
best ``beam_width`` distinct seeds per depth get a block, each block's chain is cut at the valid
length M (K when every class is 0, else the first slot of another class, plus one unless its
table entry is 0) and stops at a zero width, a token that is already a child is reused (a trie
while growing), and block 1's g_{K-1} is a seed unless a zero width stopped the block.

``table``: the shipped "Pareto" default ``slim_r2`` = [2, 4, 6, 4] with both adaptive rules (under
it a give-up class still branches), or the class default [2, 4, 10, 0] (``CLASS_DEFAULT``).
``rank_head=False`` is the ablation without the rank head: a fixed ``fixed_width`` children per
slot.  Children are deterministic given the context (``Drafting.DETERMINISTIC``): greedy
verification at T = 0, the one-hot rule at T > 0.  Cost: one forward of the drafter named
``"block"`` per block (K tokens per seed).  Budget: 90 draft tokens in the evaluation
(``"1,2,10,90"``: batch, blocks, beam, tokens); 60 for comparisons with EAGLE-3's.
Source: SpecBlock@b7938c5 ``benchmarks_hf/algorithms/_specblock_base.py``
(``_build_tree_from_block1_gpu``, ``_walk_rank_slots_compiled``, ``_prune_tree_np``),
``specblock.py`` (``_PARETO_DEFAULTS``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from simlab.checks import check_int
from simlab.drafting import Drafting
from simlab.builders.cost import DraftCost, DraftForward
from simlab.specblock.block import Block
from simlab.specblock.rank import CLASSES
from simlab.trees import DraftTree, NodeTable, Path

SLIM_R2 = (2, 4, 6, 4)
CLASS_DEFAULT = (2, 4, 10, 0)
SLOT0_WIDTHS = ((0.9, 3), (0.8, 5), (0.6, 8))
ALL_CAPS = ((0.95, 2), (0.85, 3))


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


LATER_BLOCKS = ("official", "cut")
"""How blocks after the first are built: the official production path, or the lab's earlier reading."""


@dataclass(frozen=True)
class RankGuided:
    """SpecBlock's rank-guided tree builder (module docstring).

    Args:
        drafter: a ``BlockDrafter``.
        budget: draft tokens after pruning, >= 1.
        blocks: blocks in all (>= 1; the evaluation runs 2).
        beam_width: slot-0 width of block 1 (and, with ``later_blocks="cut"``, seeds per depth), >= 1.
        table: widths per rank class (``SLIM_R2`` or ``CLASS_DEFAULT``).
        adaptive_slot0, adaptive_all: the probability caps of the shipped defaults.
        rank_head: False for the ablation without it (``fixed_width`` children per slot).
        fixed_width: the width per slot of that ablation, >= 1.
        later_blocks: ``"official"`` (default) or ``"cut"`` (the lab's earlier reading).

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
    later_blocks: str = "official"

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "RankGuided":
        """A tiny instance for the generic builder tests: the synthetic stand-in drafter (2 slots)."""
        from simlab.specblock.synthetic import PairBlockDrafter

        return cls(PairBlockDrafter(vocab_size, K=2), budget=3, beam_width=2)

    def __post_init__(self):
        if not isinstance(self.drafter, BlockDrafter):
            raise ValueError(f"drafter: must be a simlab.specblock.BlockDrafter, got {type(self.drafter).__name__}")
        check_int(self.drafter.K, "K", 1)
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "blocks", check_int(self.blocks, "blocks", 1, 16))
        object.__setattr__(self, "beam_width", check_int(self.beam_width, "beam_width", 1))
        object.__setattr__(self, "table", check_table(self.table))
        object.__setattr__(self, "fixed_width", check_int(self.fixed_width, "fixed_width", 1))
        if self.later_blocks not in LATER_BLOCKS:
            raise ValueError(f"later_blocks: must be one of {', '.join(LATER_BLOCKS)}, got {self.later_blocks!r}")

    def widths(self, block: Block, first: bool, whole: bool = False) -> list[int]:
        """Children per slot by the rules of the module docstring; a 0 (give up) ends the list
        there unless ``whole`` (an official later block: every slot, its chain goes on)."""
        probs = np.exp(block.logprobs.max(axis=1))
        out = []
        for k in range(block.logprobs.shape[0]):
            if not self.rank_head:
                width = self.fixed_width
            elif k == 0 and first:
                width = self.beam_width
                if self.adaptive_slot0:
                    width = next((min(w, self.beam_width) for p, w in SLOT0_WIDTHS if probs[0] >= p), self.beam_width)
            else:
                width = self.table[int(block.classes[k])]
                if self.adaptive_all and width:
                    width = next((min(w, width) for p, w in ALL_CAPS if probs[k] >= p), width)
            out.append(width)
            if width == 0 and not whole:
                break
        return out

    def valid_length(self, block: Block) -> int:
        """The lab's rank walk (``later_blocks="cut"``): K if every class is 0, else the first slot
        of another class, +1 unless its table entry is 0."""
        classes = block.classes
        others = np.flatnonzero(classes != 0)
        if not others.size:
            return len(classes)
        first = int(others[0])
        return first if self.table[int(classes[first])] == 0 else first + 1

    @staticmethod
    def gives_up(block: Block) -> bool:
        """The official rank walk's give-up: the first slot of a class other than 0 is of class 3."""
        others = np.flatnonzero(block.classes != 0)
        return bool(others.size) and int(block.classes[others[0]]) == CLASSES - 1

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used)."""
        return self.build(table)[0]

    def build(self, table: NodeTable) -> tuple[DraftTree, dict[Path, tuple[int, int]]]:
        """The tree and, for each of its nodes, the (block, slot) that drafted it (0-based; a
        merged node: its first drafted copy)."""
        growth = self._growth(table)
        tree = growth.tree()
        return tree, {path: growth.origin[path] for path in tree.nodes() if path}

    def buffer(self, table: NodeTable) -> list[tuple[int, int, float]]:
        """The pruned flat buffer before the merge: (parent index or -1, token, cumulative log q)
        per node in creation order, duplicates kept (the official ``tn_parents``, ``tn_tokens``,
        ``tn_lps``)."""
        growth = self._growth(table)
        growth.grow()
        kept = growth.kept()
        index = {node: i for i, node in enumerate(kept)}
        return [(index.get(growth.parent[n], -1), growth.token[n], growth.score[n]) for n in kept]

    def _growth(self, table: NodeTable) -> "_Growth":
        return _Growth(self, table)

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """The one tree, with probability 1 (the builder protocol's exact enumeration)."""
        yield self.sample(table), 1.0


class _Growth:
    """The flat node buffer of one build: node i has a parent index (-1: the root), a token, a
    path, a cumulative score and its (block, slot)."""

    def __init__(self, builder: RankGuided, table: NodeTable):
        self.b, self.table = builder, table
        self.official = builder.later_blocks == "official"
        self.parent: list[int] = []
        self.token: list[int] = []
        self.path: list[Path] = []
        self.score: list[float] = []
        self.where: list[tuple[int, int]] = []
        self.index: dict[Path, int] = {}  # path -> first node (the trie of later_blocks="cut")
        self.origin: dict[Path, tuple[int, int]] = {}
        self.block, self.slot = 0, 0  # where the next node comes from (block, slot)
        self.forwards: list[DraftForward] = []

    def _add(self, parent: int, token: int, logprob: float) -> int:
        path = (self.path[parent] if parent >= 0 else ()) + (int(token),)
        if not self.official and path in self.index:
            return self.index[path]
        self.parent.append(parent)
        self.token.append(int(token))
        self.path.append(path)
        self.score.append((self.score[parent] if parent >= 0 else 0.0) + float(logprob))
        self.where.append((self.block, self.slot))
        self.index.setdefault(path, len(self.path) - 1)
        return len(self.path) - 1

    def _expand(self, seed: int, block: Block, first: bool) -> list[tuple[int, object]]:
        """Add a block below node ``seed`` (-1: the root); return its pending seeds (node, state)."""
        whole = self.official and not first
        widths = self.b.widths(block, first, whole=whole)
        limit = len(widths) if first or self.official else min(len(widths), self.b.valid_length(block))
        stopped = bool(widths) and widths[-1] == 0 and not whole
        pending, parent, last, branching = [], seed, -1, False
        for k in range(limit):
            self.slot = k
            width = widths[k]
            if width == 0 and not whole:
                break
            lp = block.logprobs[k]
            order = np.argsort(-lp, kind="stable")[: max(width, 1)]
            order = order[np.isfinite(lp[order])]
            if not order.size:
                break
            greedy = self._add(parent, int(order[0]), lp[order[0]])
            for t in order[1:]:
                pending.append((self._add(parent, int(t), lp[t]), block.states[k]))
            branching = order.size > 1
            if branching:
                pending.append((greedy, block.states[k]))
            parent, last = greedy, k
        if self.official:  # g_{K-1} hitchhikes: a whole chain, not already pending, no give-up
            if last == block.logprobs.shape[0] - 1 and not branching and not stopped and not self.b.gives_up(block):
                pending.append((parent, block.states[last]))
        elif parent != seed and not stopped:
            pending.append((parent, block.states[last]))
        return pending

    def grow(self) -> None:
        b, K = self.b, self.b.drafter.K
        block = b.drafter.first_block(self.table)
        self.forwards.append(DraftForward(K, 0, "block"))
        pending = self._expand(-1, block, first=True)
        for block_index in range(1, b.blocks):
            self.block = block_index
            seeds = self._chosen(pending)
            if not seeds:
                break
            self.forwards.append(DraftForward(K * len(seeds), 0, "block"))
            blocks = b.drafter.next_blocks(self.table, [(self.path[node], state) for node, state in seeds])
            pending = []
            for (seed, _), next_block in zip(seeds, blocks):
                pending.extend(self._expand(seed, next_block, first=False))

    def _chosen(self, pending) -> list[tuple[int, object]]:
        """The seeds that get a block: every pending one (official), or ``_seeds`` (cut)."""
        return pending if self.official else self._seeds(pending)

    def _seeds(self, pending) -> list[tuple[int, object]]:
        """``later_blocks="cut"``: the best ``beam_width`` distinct pending seeds per depth, by score
        (then creation order)."""
        unique = {}
        for node, state in pending:
            unique.setdefault(node, state)
        by_depth: dict[int, list[int]] = {}
        for node in sorted(unique, key=lambda n: (-self.score[n], n)):
            by_depth.setdefault(len(self.path[node]), []).append(node)
        chosen = [n for nodes in by_depth.values() for n in nodes[: self.b.beam_width]]
        return [(n, unique[n]) for n in sorted(chosen)]

    def kept(self) -> list[int]:
        """The ``budget`` best nodes by score (ties: creation order), in creation order."""
        ranked = sorted(range(len(self.path)), key=lambda n: (-self.score[n], n))
        kept = sorted(ranked[: self.b.budget])
        chosen = set(kept)
        assert all(self.parent[n] < 0 or self.parent[n] in chosen for n in kept), "ancestor closure"
        return kept

    def tree(self) -> DraftTree:
        self.grow()
        kept = self.kept()
        children: dict[Path, tuple[int, ...]] = {}
        for n in kept:  # the merge: duplicate siblings become one node (the first copy's origin)
            path = self.path[n]
            if path not in self.origin:
                self.origin[path] = self.where[n]
                children[path[:-1]] = children.get(path[:-1], ()) + (path[-1],)
        cost = DraftCost(tuple(self.forwards), len(kept))
        return DraftTree(self.table, children, Drafting.DETERMINISTIC, cost=cost).fill()
