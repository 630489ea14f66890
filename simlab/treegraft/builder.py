"""TreeGraft (arXiv 2608.26112): a small n-gram drafter and a mid drafter build one tree together.

The tree is a **trie** (a token that is already a child is reused, never duplicated) grown in
``depth`` = D layers (``GraftState``).  At each layer a schedule decides:

* **skip** (the small drafter, ``simlab.treegraft.ngram``): every frontier node gets the chains
  its context matches propose (scores from the target's prompt cache; deeper chain tokens
  -inf; a chain whose whole path exists attaches nothing, an existing first token keeps
  max(old, new)); a node whose coverage (its children plus the proposed first tokens) stays
  below ``top_k`` is terminated; the next frontier is every child of the other frontier nodes,
  sorted by (this layer's match length, score, id), cut to ``top_k`` from layer 2 on (layer 1
  keeps all);
* **call** (the mid drafter = the pair's draft q): one mid forward over the whole tree
  **rescores every node** (cum(v) = cum(parent) + log q(v)); the **graft pool** is every node
  whose depth lies within ``lookback`` of a frontier depth (root and earlier layers included);
  its ``top_k`` best are the graft positions, each takes q's top-k as children (an existing
  same-token child is reused and rescored; nothing is deleted); the next frontier is those
  children by score, cut to ``top_k`` from layer 2 on.

The official code's stops end the layer loop (``GraftState.stop``; later layers of the schedule
do not run and cost nothing): an **empty frontier** (every parent terminated: no later layer, no
later graft); the **layer-1 fallback** (a skip at layer 1 leaves the root childless: the root
takes the most frequent context token, ties to the most recent, score 0.0, and the loop stops);
the **node cap** max(B + 1, 1 + k + D k^2) (a chain or graft stops at it, then the loop).  The
lab's earlier rules are options (``rules``: ``"lab"`` or departure names, ``simlab.treegraft.rules``;
``docs/departures.md``).

Finally the tree is **pruned** to ``budget`` draft tokens: nodes ranked by (score desc, depth
asc, id asc) are added with their missing ancestors while the total fits, a node whose ancestors
do not fit is skipped and the scan continues.  Children are deterministic given the context
(``Drafting.DETERMINISTIC``): verified by the one-hot rule at T > 0 and greedily at T = 0.

Options for the paper's ablations (``pool``, ``grafting``, ``mode``): ``docs/derivations/treegraft_builder.md``.

Cost (``simlab.latency``): a skip is one forward of the drafter named ``"small"`` (one token: the
n-gram step's time is constant), a call one ``"draft"`` (mid) forward over every node of the
tree.  Defaults follow the main evaluation (``scripts/run_main_eval.sh``): budget 63 (B_ver),
D = 5, top-k 10, lookback 5, schedule [1, 0, 1, 0, 1] (the ablation's fixed schedule), N = 5.
Source: TreeGraft (arXiv 2608.26112); fjm9933/TreeGraft@f53e3a8 ``graft/combine_tree/generator.py``
(``CombineDraftGenerator._topK_genrate_combine``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from simlab.checks import check_int
from simlab.drafting import Drafting, top_tokens
from simlab.builders.cost import DraftCost, DraftForward
from simlab.treegraft.ngram import NGramDrafter, NGramIndex, ScoreCache, prompt_cache
from simlab.treegraft.rules import Rules
from simlab.trees import DraftTree, NodeTable

NEG = -math.inf


@dataclass
class Node:
    """One trie node: its token (None at the root), parent id, depth, cumulative log score, the
    n-gram match length that attached it (0 for a mid graft), children (token -> id), path."""

    token: int | None
    parent: int
    depth: int
    score: float
    match: int
    path: tuple[int, ...]
    children: dict = field(default_factory=dict)


@dataclass(frozen=True)
class GraftRoot:
    """What every schedule at one root shares: the table (p, q), the context's n-gram index and score cache."""

    table: NodeTable
    index: NGramIndex
    cache: ScoreCache


class GraftState:
    """The tree after some layers (see the module docstring); ``step(call)`` runs one more."""

    def __init__(self, builder: "TreeGraft", root: GraftRoot):
        self.builder, self.root = builder, root
        self.nodes: list[Node] = [Node(None, -1, 0, 0.0, 0, ())]
        self.frontier: list[int] = [0]
        self.frontier_depths: set[int] = {0}
        self.calls: list[int] = []
        self.forwards: list[DraftForward] = []
        self.pool_sizes: list[int] = []
        self.graft_positions = 0
        self.graft_from_earlier = 0
        self.size = 1  # live nodes, root included
        self.ran = 0  # layers that ran (the rest were cut by a stop)
        self.stop: str | None = None  # why the layer loop stopped: "empty frontier", "fallback", "node cap"

    def copy(self) -> "GraftState":
        other = copy.copy(self)
        other.nodes = [Node(n.token, n.parent, n.depth, n.score, n.match, n.path, dict(n.children)) for n in self.nodes]
        other.frontier, other.calls, other.forwards = list(self.frontier), list(self.calls), list(self.forwards)
        other.frontier_depths = set(self.frontier_depths)
        other.pool_sizes = list(self.pool_sizes)
        return other

    @property
    def layer(self) -> int:
        """Layers decided so far (run or cut by a stop)."""
        return len(self.calls)

    @property
    def stopped_early(self) -> bool:
        """Whether a stop cut at least one layer of the schedule."""
        return self.ran < self.builder.depth and self.stop is not None

    # -- tree edits ----------------------------------------------------------------------------
    def _full(self) -> bool:
        return self.size >= self.builder.node_cap

    def _child(self, parent: int, token: int, score: float, match: int, overwrite: bool) -> int | None:
        """The child ``token`` of ``parent``: reused (rescored if ``overwrite``) or appended with
        ``score``; None when the node cap forbids a new node."""
        node = self.nodes[parent]
        if token in node.children:
            child = node.children[token]
            if overwrite:
                self.nodes[child].score, self.nodes[child].match = score, match
            return child
        if self._full():
            return None
        self.nodes.append(Node(int(token), parent, node.depth + 1, score, match, node.path + (int(token),)))
        node.children[int(token)] = len(self.nodes) - 1
        self.size += 1
        return len(self.nodes) - 1

    def _delete(self, node: int) -> None:
        for child in list(self.nodes[node].children.values()):
            self._delete(child)
        self.nodes[node].children = {}
        self.nodes[node].parent = -2  # detached: skipped by every scan
        self.size -= 1

    def _alive(self) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.parent != -2]

    def _ranked(self, ids, key="score") -> list[int]:
        return sorted(ids, key=lambda i: (-self.nodes[i].score, i))

    def _has_path(self, parent: int, tokens) -> bool:
        for token in tokens:
            parent = self.nodes[parent].children.get(token)
            if parent is None:
                return False
        return True

    # -- the layers ----------------------------------------------------------------------------
    def step(self, call: bool) -> None:
        """Decide the next layer: the mid drafter (``call``) or the n-gram drafter.  After a stop
        (empty frontier, the layer-1 fallback, the node cap) the layer does not run."""
        b = self.builder
        if self.layer >= b.depth:
            raise ValueError(f"schedule: the tree has {b.depth} layers, all run")
        layer = self.layer + 1
        if not self.frontier and "continue_after_empty_frontier" not in b.rules and b.mode == "tree":
            self.stop = self.stop or "empty frontier"
        if self.stop is None:
            if b.mode == "sequence":
                self._sequence_step(call, layer)
            elif call:
                self._graft(layer)
            else:
                self._skip(layer)
            self.ran += 1
            if self.stop is None and self._full():
                self.stop = "node cap"
        self.calls.append(int(bool(call)))

    def _skip(self, layer: int) -> None:
        b, root, rules = self.builder, self.root, self.builder.rules
        context = root.table.context
        if b.ngram.scoring == "clean":
            root.table.fetch([self.nodes[u].path for u in self.frontier])
        candidates: dict[int, int] = {}  # child -> match length in this layer (0: not matched)
        reached: set[int] = set()
        terminated = 0
        for u in self.frontier:
            node = self.nodes[u]
            found = b.ngram.collect(root.index, context + node.path, b.top_k, layer, node.children, rules)
            scored: set[int] = set()
            for chain in found.chains:
                if "overwrite_scores" not in rules and self._has_path(u, chain.tokens):
                    continue  # the official code attaches nothing for an existing path
                token = chain.tokens[0]
                score = node.score + (
                    root.cache.score(chain.position, token) if b.ngram.scoring == "code" else _log(root.table.p(node.path)[token])
                )
                self._attach(u, chain, score, scored)
            if found.match:
                reached.add(node.depth + 1)
            if not found.covered:
                terminated += 1  # a parent covering fewer than top_k tokens is terminated
                continue
            tokens = found.match if "frontier_attached_only" in rules else node.children
            for token in tokens:
                child = node.children.get(token)
                if child is not None:
                    candidates[child] = max(candidates.get(child, 0), found.match.get(token, 0))
        self.forwards.append(DraftForward(1, 0, "small"))
        if layer == 1 and not self.nodes[0].children and terminated == len(self.frontier):
            if "top_k_fallback" in rules:
                self._frequency_fallback()
                candidates = dict.fromkeys(self.nodes[0].children.values(), 0)
            else:
                self._fallback()
                self.frontier, self.stop = [], "fallback"
                return
        frontier = sorted(candidates, key=lambda i: (-candidates[i], -self.nodes[i].score, i))
        self.frontier = frontier if layer == 1 else frontier[: b.top_k]
        depths = {self.nodes[f].depth for f in self.frontier}
        if "continue_after_empty_frontier" in rules:
            depths = depths or reached or self.frontier_depths
        self.frontier_depths = depths

    def _attach(self, parent: int, chain, score: float, scored: set[int]) -> None:
        """Merge ``chain`` below ``parent`` (trie): its first token gets ``score`` (a new child), or
        max(old, score) (an existing one; ``overwrite_scores``: the layer's first chain to reach it
        sets it); deeper new tokens score -inf.  A new node beyond the node cap ends the chain."""
        overwrite = "overwrite_scores" in self.builder.rules
        for j, token in enumerate(chain.tokens):
            existing = self.nodes[parent].children.get(token)
            if j > 0 or existing is None:
                child = self._child(parent, token, score if j == 0 else NEG, chain.n, overwrite=False)
                if child is None:
                    return
            else:
                child, node = existing, self.nodes[existing]
                if overwrite and token not in scored:
                    node.score, node.match = score, chain.n
                elif not overwrite:
                    node.score, node.match = max(node.score, score), max(node.match, chain.n)
            if j == 0:
                scored.add(token)
            parent = child

    def _fallback(self) -> None:
        """The official layer-1 fallback: the most frequent context token (ties: the most recent), score 0.0."""
        context = self.root.table.context
        last = {t: i for i, t in enumerate(context)}
        counts: dict[int, int] = {}
        for t in context:
            counts[t] = counts.get(t, 0) + 1
        token = min(counts, key=lambda t: (-counts[t], -last[t], t))
        self._child(0, int(token), 0.0, 0, overwrite=False)

    def _frequency_fallback(self) -> None:
        """The lab's ``top_k_fallback``: the ``top_k`` most frequent context tokens (ties: smaller id),
        each scored by its log relative frequency."""
        context = self.root.table.context
        tokens, counts = np.unique(np.asarray(context, dtype=np.int64), return_counts=True)
        order = sorted(range(tokens.size), key=lambda i: (-counts[i], tokens[i]))[: self.builder.top_k]
        for i in order:
            self._child(0, int(tokens[i]), float(np.log(counts[i] / len(context))), 0, overwrite=False)

    def _rescore(self) -> None:
        """The mid forward over the whole tree: every node's cumulative log q."""
        alive = self._alive()
        self.root.table.fetch([self.nodes[i].path for i in alive])
        for i in alive:  # ids grow from parent to child
            node = self.nodes[i]
            if node.parent >= 0:
                parent = self.nodes[node.parent]
                node.score = parent.score + _log(self.root.table.q(parent.path)[node.token])

    def pool(self) -> list[int]:
        """The graft pool under the current scores: nodes within ``lookback`` of a frontier depth
        (``pool="window"``), or the frontier itself (``pool="frontier"``)."""
        b = self.builder
        if b.pool == "frontier":
            return list(self.frontier)
        depths = self.frontier_depths
        return [i for i in self._alive() if any(d - b.lookback <= self.nodes[i].depth <= d for d in depths)]

    def positions(self) -> list[int]:
        """The ``top_k`` best of the pool (ties by id): the graft positions (at current scores)."""
        return self._ranked(self.pool())[: self.builder.top_k]

    def _graft(self, layer: int) -> None:
        b, table = self.builder, self.root.table
        self._rescore()
        forwarded = len(self._alive())  # the mid forward runs over the tree as it stands
        pool = self.pool()
        positions = self._ranked(pool)[: b.top_k]
        depths = self.frontier_depths
        self.pool_sizes.append(len(pool))
        self.graft_positions += len(positions)
        self.graft_from_earlier += sum(self.nodes[g].depth not in depths for g in positions)
        produced: list[int] = []
        for g in positions:
            if self.nodes[g].parent == -2:  # deleted by an earlier destructive graft of this layer
                continue
            q = table.q(self.nodes[g].path)
            top = top_tokens(q, min(b.top_k, int(np.count_nonzero(q))))
            if b.grafting == "destructive":
                for token, child in list(self.nodes[g].children.items()):
                    if token not in set(top.tolist()):
                        self._delete(child)
                        del self.nodes[g].children[token]
            for token in top.tolist():
                child = self._child(g, token, self.nodes[g].score + _log(q[token]), 0, overwrite=True)
                if child is None:  # the node cap: this position takes no more new children
                    break
                produced.append(child)
        frontier = self._ranked(dict.fromkeys(produced))
        self.frontier = frontier if layer == 1 else frontier[: b.top_k]
        self.frontier_depths = {self.nodes[f].depth for f in self.frontier} or self.frontier_depths
        self.forwards.append(DraftForward(forwarded, 0, "draft"))

    def _sequence_step(self, call: bool, layer: int) -> None:
        """CSD-style: extend the one path at its end with the layer's drafter's top token."""
        end = max(self._alive(), key=lambda i: self.nodes[i].depth)
        node, table = self.nodes[end], self.root.table
        if call:
            self.forwards.append(DraftForward(len(self._alive()), 0, "draft"))
            table.fetch([node.path])
            q = table.q(node.path)
            if np.count_nonzero(q):
                token = int(top_tokens(q, 1)[0])
                self._child(end, token, node.score + _log(q[token]), 0, overwrite=True)
            return
        chains = self.builder.ngram.collect(self.root.index, table.context + node.path, 1, layer, (), self.builder.rules).chains
        if chains:
            n, position, token = chains[0].n, chains[0].position, chains[0].tokens[0]
            self._child(end, token, node.score + self.root.cache.score(position, token), n, overwrite=True)
        self.forwards.append(DraftForward(1, 0, "small"))

    # -- the final tree ------------------------------------------------------------------------
    def kept(self) -> list[int]:
        """The nodes that survive pruning to the budget (ancestor-closed, root first)."""
        b = self.builder
        alive = self._alive()
        keep = {0}
        for i in sorted((i for i in alive if i != 0), key=lambda i: (-self.nodes[i].score, self.nodes[i].depth, i)):
            if len(keep) >= b.budget + 1:
                break
            missing, j = [], i
            while j not in keep:
                missing.append(j)
                j = self.nodes[j].parent
            if len(keep) + len(missing) <= b.budget + 1:
                keep.update(missing)
        return sorted(keep)

    def finish(self) -> DraftTree:
        """The pruned tree, with its drafting cost."""
        kept = self.kept()
        children: dict[tuple[int, ...], tuple[int, ...]] = {}
        for i in kept[1:]:
            node = self.nodes[i]
            parent = self.nodes[node.parent].path
            children[parent] = children.get(parent, ()) + (node.token,)
        cost = DraftCost(tuple(self.forwards), len(kept) - 1)
        return DraftTree(self.root.table, children, Drafting.DETERMINISTIC, cost=cost).fill()


def _log(value: float) -> float:
    return float(np.log(value)) if value > 0 else NEG


@dataclass(frozen=True)
class TreeGraft:
    """TreeGraft's builder with a fixed schedule (module docstring).

    Args:
        schedule: D calls (1) or skips (0) of the mid drafter, one per layer; or ``"small"``
            (all skips), ``"mid"`` (all calls).
        budget: draft tokens after pruning (B_ver), >= 1.
        depth: layers D (1..16).
        top_k: frontier size and proposals per node, >= 1.
        lookback: depths below a frontier depth in the graft pool, >= 0.
        ngram: the small drafter (``simlab.treegraft.ngram.NGramDrafter``).
        pool: ``"window"`` or ``"frontier"`` (ablation: no expanded graft positions).
        grafting: ``"non_destructive"`` or ``"destructive"`` (ablation).
        mode: ``"tree"`` or ``"sequence"`` (ablation: CSD-style sequence-level drafting).
        cached: positions of the context in the n-gram score cache (None: the whole root context).
        rules: ``"official"`` (default), ``"lab"`` (the lab's earlier rules, issue 13), or departure
            names (``simlab.treegraft.rules.DEPARTURES``, comma-separated or an iterable).

    Raises:
        ValueError: naming the argument.
    """

    schedule: tuple[int, ...] | str = (1, 0, 1, 0, 1)
    budget: int = 63
    depth: int = 5
    top_k: int = 10
    lookback: int = 5
    ngram: NGramDrafter = NGramDrafter()
    pool: str = "window"
    grafting: str = "non_destructive"
    mode: str = "tree"
    cached: int | None = None
    rules: Rules | str = "official"

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "TreeGraft":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(schedule=(1, 0), budget=3, depth=2, top_k=2, lookback=2)

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 1, 16))
        object.__setattr__(self, "top_k", check_int(self.top_k, "top_k", 1))
        object.__setattr__(self, "lookback", check_int(self.lookback, "lookback", 0))
        if self.schedule == "small":
            object.__setattr__(self, "schedule", (0,) * self.depth)
        elif self.schedule == "mid":
            object.__setattr__(self, "schedule", (1,) * self.depth)
        object.__setattr__(self, "schedule", check_schedule(self.schedule, self.depth))
        if not isinstance(self.ngram, NGramDrafter):
            raise ValueError(f"ngram: must be a simlab.treegraft.ngram.NGramDrafter, got {self.ngram!r}")
        for name, allowed in (
            ("pool", ("window", "frontier")),
            ("grafting", ("non_destructive", "destructive")),
            ("mode", ("tree", "sequence")),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.cached is not None:
            object.__setattr__(self, "cached", check_int(self.cached, "cached", 0))
        object.__setattr__(self, "rules", Rules.parse(self.rules))

    @property
    def node_cap(self) -> float:
        """The most nodes (root included) built before pruning: max(B + 1, 1 + k + D k^2) (the
        official ``max_nodes``; 511 at the preset), unbounded under ``no_node_cap``."""
        if "no_node_cap" in self.rules:
            return math.inf
        return max(self.budget + 1, 1 + self.top_k + self.depth * self.top_k**2)

    def prepare(self, table: NodeTable) -> GraftRoot:
        """The root's n-gram index and score cache (shared by every schedule at that root; the cache
        is kept with the table's plans, ``NodeTable.memo``, for every builder of that table)."""
        last_row = "cache_without_last_row" not in self.rules
        cache = table.memo(
            ("treegraft prompt cache", self.cached, last_row),
            lambda: prompt_cache(table.pair, table.context, self.cached, last_row=last_row),
        )
        return GraftRoot(table, NGramIndex(table.context, self.ngram.max_n), cache)

    def start(self, root: GraftRoot) -> GraftState:
        return GraftState(self, root)

    def build(self, root: GraftRoot, schedule: Sequence[int] | None = None) -> DraftTree:
        """The tree at a prepared root under ``schedule`` (default: the builder's)."""
        state = self.start(root)
        for call in check_schedule(self.schedule if schedule is None else schedule, self.depth):
            state.step(bool(call))
        return state.finish()

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used)."""
        return self.build(self.prepare(table))

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield self.sample(table), 1.0


def check_schedule(schedule, depth: int) -> tuple[int, ...]:
    """A schedule: ``depth`` entries, each 0 (skip) or 1 (call the mid drafter).

    Raises:
        ValueError: ``schedule: ...``.
    """
    try:
        out = tuple(int(c) for c in schedule)
    except (TypeError, ValueError):
        raise ValueError(f"schedule: must be {depth} entries of 0 or 1, got {schedule!r}") from None
    if len(out) != depth or any(c not in (0, 1) for c in out) or isinstance(schedule, str):
        raise ValueError(f"schedule: must be {depth} entries of 0 or 1, got {schedule!r}")
    return out
