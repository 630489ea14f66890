"""SpecBlock's rank-guided block trees (arXiv 2605.07243), as its official code builds them.

A **block drafter** (``BlockDrafter``) drafts K dependent slots in one forward: for a seed (the
root, or a node of the tree) it returns each slot's log-probabilities, the rank class its rank
head predicts for the slot (``simlab.specblock.rank``) and an opaque state that later blocks
inherit.  Slot k's law is conditioned on the greedy tokens of slots < k.

Vocabulary: slot k's **width** t_k (its children: the greedy one and the next t_k - 1 by rank,
each **scored** by the cumulative draft log-probability), from ``table[c_k]`` and the adaptive
caps; **block 1** at the root, **later blocks** at **pending seeds** (``later_blocks``:
``"official"`` or the lab's earlier reading ``"cut"``, a departure in ``docs/departures.md``); a
**duplicate**, a block's token already a sibling; the **finalize** (``duplicates``), which merges
duplicates and **prunes** to the ``budget`` best nodes by score.  The kept nodes become the lab's
trie; that leaves the exact E[tau+1] of greedy and one-hot verification unchanged (tested).  The
rules step by step, as the official code runs them: ``docs/derivations/specblock_builder.md``.

``table``: the shipped "Pareto" default ``slim_r2`` = [2, 4, 6, 4] with both adaptive rules (under
it a give-up class still branches), or the class default [2, 4, 10, 0] (``CLASS_DEFAULT``).
``rank_head=False`` is the ablation without the rank head: a fixed ``fixed_width`` children per
slot.  Children are deterministic given the context (``Drafting.DETERMINISTIC``): greedy
verification at T = 0, the one-hot rule at T > 0; alternatives of draft probability 0 are not
drafted.  Cost: one forward of the drafter named ``"block"`` per block (K tokens per seed).
Budget: 90 draft tokens in the evaluation (``"1,2,10,90"``: batch, blocks, beam, tokens); 60 for
comparisons with EAGLE-3's.
Source: SpecBlock@b7938c5 ``benchmarks_hf/algorithms/_specblock_base.py``
(``_build_tree_from_block1_gpu`` and its Triton twin ``tree_build_triton.py``, the eager
``_build_tree_from_block1``, ``_walk_rank_slots_compiled``, ``_prune_tree_np``,
``_tree_gpu_supported``), ``tree_finalize_triton.py`` (``finalize_tree_gpu``,
``dedup_depth_by_depth_triton``), ``specblock.py`` (``_PARETO_DEFAULTS``).
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
MERGE_DEPTH = 3
"""Passes of the official merge (``dedup_depth_by_depth_triton``'s ``max_tree_depth``, as
``finalize_tree_gpu`` calls it): depths 1, 2 and 3-or-more below the root's children."""


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


def merge_duplicates(
    parents: Sequence[int], tokens: Sequence[int], scores: Sequence[float], strict: bool = True
) -> tuple[list[int], list[float]]:
    """The official merge of duplicate siblings in a flat buffer, before pruning.

    Args:
        parents: parent index per node (-1: a child of the root), every parent before its child.
        tokens: token per node.
        scores: cumulative draft log-probability per node (float).
        strict: True (default), the kernel's comparison: only copies strictly below their group's
            best score are merged, so copies tied at the best all stay (``duplicates="merge_strict"``,
            the official default); False (``"merge"``, a departure): tied copies merge too, into the
            first created.

    Returns:
        (parents, scores), new lists: a merged copy scores -inf and keeps its parent; each child of
        a merged copy has the group's winner as its parent.  The depth of node i is its number of
        ancestors, capped at ``MERGE_DEPTH``; pass d = 1..``MERGE_DEPTH`` groups the nodes of depth d
        by (current parent, token); the winner is the best score, then the lowest index; the
        copies merged are the group's others (not already at -inf); children move after the
        grouping, so a duplicate made by a move in the last pass stays.
    Source: SpecBlock@b7938c5 ``benchmarks_hf/algorithms/tree_finalize_triton.py``
    (``dedup_depth_by_depth_triton``, ``_dbd_dedup_kernel``; ``finalize_tree_gpu`` runs it when
    ``TREE_DEDUP_MODE`` is 1, the default).
    """
    parents, scores = [int(p) for p in parents], [float(s) for s in scores]
    depth = []
    for i in range(len(parents)):
        d, j = 0, i
        while d < MERGE_DEPTH and parents[j] >= 0:
            d, j = d + 1, parents[j]
        depth.append(d)
    for d in range(1, MERGE_DEPTH + 1):
        groups: dict[tuple[int, int], list[int]] = {}
        for i, level in enumerate(depth):
            if level == d:
                groups.setdefault((parents[i], int(tokens[i])), []).append(i)
        winner_of: dict[int, int] = {}
        for members in groups.values():
            best = max(scores[i] for i in members)
            winner = min(i for i in members if scores[i] == best)
            for i in members:
                if scores[i] != -np.inf and (scores[i] < best or (not strict and i != winner)):
                    winner_of[i] = winner
        for i in winner_of:
            scores[i] = -np.inf
        parents = [winner_of.get(p, p) for p in parents]
    return parents, scores


LATER_BLOCKS = ("official", "cut")
"""How blocks after the first are built: the official production path, or the lab's earlier reading."""

DUPLICATES = ("official", "merge", "merge_strict", "keep")
"""The finalize: the official code's choice for the configuration, or one rule forced (docs/derivations/specblock_builder.md)."""


@dataclass(frozen=True)
class RankGuided:
    """SpecBlock's rank-guided tree builder (module docstring).

    Args:
        drafter: a ``BlockDrafter``.
        budget: draft tokens after pruning, >= 1.
        blocks: blocks in all (>= 1; the evaluation runs 2).
        beam_width: slot-0 width of block 1 (and, with ``later_blocks="cut"``, seeds per depth), >= 1.
        table: widths per rank class (``SLIM_R2`` or ``CLASS_DEFAULT``).
        adaptive_slot0: slot 0 of block 1 capped by its greedy probability (a shipped default).
        adaptive_all: every other slot capped by its greedy probability (a shipped default).
        rank_head: False for the ablation without it (``fixed_width`` children per slot).
        fixed_width: the width per slot of that ablation, >= 1.
        later_blocks: ``"official"`` (default) or ``"cut"`` (the lab's earlier reading).
        duplicates: ``"official"`` (default: ``"merge_strict"`` where the official code takes its GPU
            path, ``"keep"`` elsewhere; ``merges``), ``"merge_strict"`` (merge duplicate siblings before
            pruning, tied copies kept: the kernel's comparison, ``merge_duplicates``), ``"merge"`` (the
            same, tied copies merged too: a departure) or ``"keep"`` (prune with the copies counted,
            ``TREE_DEDUP_MODE`` = 0).

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
    duplicates: str = "official"

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
        if self.duplicates not in DUPLICATES:
            raise ValueError(f"duplicates: must be one of {', '.join(DUPLICATES)}, got {self.duplicates!r}")

    @property
    def stops_at_give_up(self) -> bool:
        """True when the table's give-up width is 0 (with the rank head): alternatives stop at the
        first class-3 slot, and the official code takes its eager fallback."""
        return self.rank_head and self.table[CLASSES - 1] == 0

    @property
    def merges(self) -> str | None:
        """The finalize's merge: ``"merge"``, ``"merge_strict"`` or None (prune with the copies
        counted).  ``duplicates="official"``: ``"merge_strict"`` (the kernel's comparison: tied copies
        stay) exactly where the official code takes its GPU path (two blocks, a give-up width above 0;
        ``_tree_gpu_supported``), else None."""
        if self.duplicates == "official":
            gpu_path = self.later_blocks == "official" and self.blocks == 2 and not self.stops_at_give_up
            return "merge_strict" if gpu_path else None
        return None if self.duplicates == "keep" else self.duplicates

    def widths(self, block: Block, first: bool, whole: bool = False) -> list[int]:
        """Children per slot by the width rule of docs/derivations/specblock_builder.md, before the give-up
        stop; a 0 ends the list there unless ``whole`` (every slot listed)."""
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

    def official_widths(self, block: Block, first: bool) -> list[int]:
        """The widths of every slot of an official block: ``widths`` with the give-up stop (docs/derivations/specblock_builder.md)
        applied."""
        out = self.widths(block, first, whole=True)
        if self.stops_at_give_up:
            classes = block.classes
            stop = next((k for k in range(1 if first else 0, len(out)) if int(classes[k]) == CLASSES - 1), len(out))
            out = out[:stop] + [0] * (len(out) - stop)
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
        """The tree and, for each of its nodes, the (block, slot) that drafted it (0-based; a node
        kept in several copies: its first copy not merged away)."""
        growth = self._growth(table)
        tree = growth.tree()
        return tree, {path: growth.origin[path] for path in tree.nodes() if path}

    def buffer(self, table: NodeTable) -> list[tuple[int, int, float]]:
        """The finalized flat buffer before the trie: (parent index or -1, token, cumulative log q)
        per kept node in creation order, copies kept (a merged copy scores -inf; the official
        ``tn_parents``, ``tn_tokens``, ``tn_lps`` after ``finalize_tree_gpu`` or ``_prune_tree_np``)."""
        growth = self._growth(table)
        growth.grow()
        growth.merge()
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

    def _blocks(self, seeds: list[int], blocks: list[Block], first: bool) -> list[tuple[int, object]]:
        """Official blocks below ``seeds`` (-1: the root): every chain, then every block's
        alternatives; return the pending seeds (node, state) in the official order."""
        widths = [self.b.official_widths(block, first) for block in blocks]
        chains = []
        for seed, block, w in zip(seeds, blocks, widths):  # the greedy chains
            chain, parent = [], seed
            for k in range(len(w)):
                self.slot = k
                lp = block.logprobs[k]
                top = int(np.argmax(lp))
                if not np.isfinite(lp[top]):
                    break
                parent = self._add(parent, top, lp[top])
                chain.append(parent)
            chains.append(chain)
        active, alternatives, hitchhikers = [], [], []
        for seed, block, w, chain in zip(seeds, blocks, widths, chains):  # the alternatives
            branching = [False] * len(chain)
            for k in range(len(chain)):
                self.slot = k
                lp = block.logprobs[k]
                order = np.argsort(-lp, kind="stable")[: max(w[k], 1)]
                for t in order[1:][np.isfinite(lp[order[1:]])]:
                    alternatives.append((self._add(chain[k - 1] if k else seed, int(t), lp[t]), block.states[k]))
                    branching[k] = True
            active += [(chain[k], block.states[k]) for k in range(len(chain)) if branching[k]]
            K = block.logprobs.shape[0]
            if len(chain) == K and not branching[-1]:  # g_{K-1} hitchhikes
                give_up = bool(np.any(block.classes == CLASSES - 1))
                stopped = self.b.gives_up(block) if first else self.b.stops_at_give_up and give_up
                if not stopped:
                    hitchhikers.append((chain[-1], block.states[K - 1]))
        return active + alternatives + hitchhikers

    def _expand(self, seed: int, block: Block, first: bool) -> list[tuple[int, object]]:
        """``later_blocks="cut"``: add a block below node ``seed`` (-1: the root); return its pending
        seeds (node, state)."""
        widths = self.b.widths(block, first)
        limit = len(widths) if first else min(len(widths), self.b.valid_length(block))
        stopped = bool(widths) and widths[-1] == 0
        pending, parent, last = [], seed, -1
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
        if parent != seed and not stopped:
            pending.append((parent, block.states[last]))
        return pending

    def grow(self) -> None:
        b, K = self.b, self.b.drafter.K
        block = b.drafter.first_block(self.table)
        self.forwards.append(DraftForward(K, 0, "block"))
        pending = self._blocks([-1], [block], True) if self.official else self._expand(-1, block, first=True)
        for block_index in range(1, b.blocks):
            self.block = block_index
            seeds = self._chosen(pending)
            if not seeds:
                break
            self.forwards.append(DraftForward(K * len(seeds), 0, "block"))
            blocks = b.drafter.next_blocks(self.table, [(self.path[node], state) for node, state in seeds])
            if self.official:
                pending = self._blocks([seed for seed, _ in seeds], blocks, False)
            else:
                pending = [p for (seed, _), block in zip(seeds, blocks) for p in self._expand(seed, block, first=False)]

    def _chosen(self, pending) -> list[tuple[int, object]]:
        """The seeds that get a block: every pending one for block 2 (official; beyond it the eager
        path's beam of docs/derivations/specblock_builder.md), or ``_seeds`` (cut)."""
        if not self.official:
            return self._seeds(pending)
        if self.block < 2:
            return pending
        beam = min(self.b.beam_width, max(1, (self.b.budget - len(self.path)) // self.b.drafter.K))
        best = sorted(range(len(pending)), key=lambda i: (-self.score[pending[i][0]], i))[:beam]
        return [pending[i] for i in sorted(best)]

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

    def merge(self) -> None:
        """The finalize's merge of duplicate siblings (``RankGuided.merges``), in place."""
        rule = self.b.merges
        if rule is not None:
            self.parent, self.score = merge_duplicates(self.parent, self.token, self.score, strict=rule == "merge_strict")

    def kept(self) -> list[int]:
        """The ``budget`` best nodes by score (ties: creation order), in creation order."""
        ranked = sorted(range(len(self.path)), key=lambda n: (-self.score[n], n))
        kept = sorted(ranked[: self.b.budget])
        chosen = set(kept)
        assert all(self.parent[n] < 0 or self.parent[n] in chosen for n in kept), "ancestor closure"
        return kept

    def tree(self) -> DraftTree:
        self.grow()
        self.merge()
        kept = self.kept()
        children: dict[Path, tuple[int, ...]] = {}
        for n in sorted(kept, key=lambda n: (self.score[n] == -np.inf, n)):  # the trie: copies become one node
            path = self.path[n]
            if path not in self.origin:
                self.origin[path] = self.where[n]
                children[path[:-1]] = children.get(path[:-1], ()) + (path[-1],)
        cost = DraftCost(tuple(self.forwards), len(kept))
        return DraftTree(self.table, children, Drafting.DETERMINISTIC, cost=cost).fill()
