"""Draft trees evaluated incrementally on kept KV caches: every node goes through a model once.

``CachedTree(pair, model, roots)`` runs one or several root contexts once for their KV cache
(one row of the batch each; contexts of different lengths are left-padded under a 4-D mask so
that every context ends in the same column), then takes tree nodes in calls to ``feed``: each
call appends every root's new nodes to the cache, in chunks, under a 4-D tree mask (a node sees
its context, its ancestors, wherever in the cache they are, and itself; a padding token sees
itself only) with position ids = context length + depth - 1, and returns the logits of the rows
asked for.  One call with every node of one root's tree is ``HFPair.node_logits``'s tree
forward (the same chunks, the same bits); several calls are what a drafting loop needs, level
after level, without running the ancestors again.

``TreeSession(pair, roots)`` holds both models' ``CachedTree`` over the roots.  ``logits`` takes
each root's nodes and evaluates, in one forward per model and chunk for all roots, only those
(and missing ancestors) it has not evaluated yet; ``member(b)`` is root b's view as a
``simlab.pairs.NodeLogits`` pair for a ``simlab.trees.NodeTable`` (its own calls pad the other
rows).  A node asked for again is evaluated again, as a copy its descendants do not see (a
table asks for each node once).  The logits of a node depend in their last float32 bits on the
rows and chunks it was evaluated with (the capture's groups are fixed by root id for that
reason).  Without tree attention (the pair's probe failed) the session is the pair's path
batching.  Used by the capture's ``--evaluation cached``.

``RootCache(pair, root)`` is one root's session as a pair for ``simlab.trees.NodeTable``: every
node's logits are kept once evaluated, so every table of that root (the drafting table under the
untempered settings, the valuation tables under each setting: ``with_settings`` shares the
caches) and every tree built there (TreeGraft's 2^D schedules share most nodes) reads each node
through each model once, on the root's context prefilled once; TreeGraft's prompt score cache (the
target's rows at every context position) comes from that same prefill when it is asked for first.  ``node_table(pair, context,
evaluation)`` picks it (``"cached"``) or the pair's own tree forwards per fetch (``"plain"``, the
reference: each fetch prefills the context again).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import numpy as np

from simlab.checks import check_int
from simlab.device_rows import to_host
from simlab.pairs import check_contexts

Node = tuple[int, ...]


def cache_kwarg(model) -> str:
    """The keyword a model's forward takes its KV cache by (``cache`` or ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def last_only(model) -> dict:
    """``{"logits_to_keep": 1}`` for a model whose forward takes it (the LM head on the last
    position only: at V = 49,152 most of a short prefix's time), else ``{}``."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def cache_of(output):
    """The KV cache a model's output carries."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def closed_nodes(paths: Sequence[Node], seen=()) -> list[Node]:
    """The non-root nodes of ``paths`` and their ancestors, less the ancestors in ``seen`` (a
    container of nodes already evaluated; a requested path is kept even when seen), sorted by
    depth, then by tokens: the order a tree forward feeds them in (a parent before its children)."""
    nodes = {path[:d] for path in paths for d in range(1, len(path)) if path[:d] not in seen}
    return sorted(nodes | {path for path in paths if path}, key=lambda node: (len(node), node))


def left_padded(roots: Sequence[tuple[int, ...]], width: int):
    """Root contexts as the rows of one batch, left-padded so that every context ends at column
    C - 1 (C = the longest): numpy ids (rows, width) int64, positions (rows, width) int64 and
    ``allowed`` (rows, width, width) bool, with the context block causal (a context token sees its
    context before it and itself) and every padding column seeing itself only (no empty softmax
    row).  Columns C .. width - 1 are left for the caller (tree nodes, or nothing: width = C)."""
    C = max(len(root) for root in roots)
    ids = np.zeros((len(roots), width), dtype=np.int64)
    positions = np.zeros((len(roots), width), dtype=np.int64)
    allowed = np.zeros((len(roots), width, width), dtype=bool)
    allowed[:, np.arange(width), np.arange(width)] = True
    for b, root in enumerate(roots):
        L, start = len(root), C - len(root)
        ids[b, start:C] = root
        positions[b, start:C] = np.arange(L)
        allowed[b, start:C, start:C] = np.tril(np.ones((L, L), dtype=bool))
    return ids, positions, allowed


def additive_mask(allowed: np.ndarray, dtype, device):
    """The 4-D additive attention mask (rows, 1, queries, keys) of ``dtype`` on ``device`` from a
    boolean ``allowed`` (rows, queries, keys): 0 where allowed, the dtype's minimum elsewhere."""
    import torch

    mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype, device=device)
    return mask.masked_fill_(~torch.from_numpy(allowed).to(device)[:, None], torch.finfo(dtype).min)


class CachedTree:
    """One model's KV cache over root contexts (one batch row each) and the nodes fed so far.

    Args:
        pair: the ``backends.hf.HFPair`` (device).
        model: its target or draft model.
        roots: the root contexts (non-empty token ids, checked by the caller).
        every_position: keep the prefill's logits at every context position of the one root,
            ``prefix_logits`` (V_model columns, on the device), until the caller takes them; else
            (the default) the LM head runs on the last position only.

    Raises:
        ValueError: ``every_position`` with more than one root.
    """

    def __init__(self, pair, model, roots: Sequence[tuple[int, ...]], every_position: bool = False):
        import torch

        self.device, self.model = pair.device, model
        self.dtype = next(model.parameters()).dtype
        self.lengths = [len(r) for r in roots]
        self.length = max(self.lengths)  # every context ends at column length - 1
        ids, positions, allowed = left_padded(roots, self.length)
        options = {}
        if len(set(self.lengths)) > 1:  # equal lengths need no mask: the model's own causal attention
            options = {
                "attention_mask": additive_mask(allowed, self.dtype, self.device),
                "position_ids": torch.from_numpy(positions).to(self.device),
            }
        if every_position and len(roots) != 1:
            raise ValueError(f"roots: every_position keeps the logits of one root, got {len(roots)}")
        if not every_position:
            options.update(last_only(model))  # only the last column's logits are kept
        with torch.no_grad():
            prefix = model(torch.from_numpy(ids).to(self.device), use_cache=True, **options)
        self.root_logits = prefix.logits[:, -1].clone()  # (rows, V_model) on the device; not a view that keeps
        self.cache = cache_of(prefix)  # the prefix logits alive
        self.prefix_logits = prefix.logits[0] if every_position else None  # (length, V_model)
        del prefix
        self.width = self.length  # columns in the cache: the contexts, then every chunk fed
        self.column: list[dict[Node, int]] = [{} for _ in roots]

    def feed(self, blocks: Sequence[Sequence[Node]], chunk: int, takes: Sequence[Sequence[Node]]):
        """Append each root's nodes (``blocks[b]``, sorted by depth; a node's ancestors fed before or
        earlier in its list), at most ``chunk`` per root and forward, and return per root the logits
        (len(takes[b]), V_model) on the device at the nodes of ``takes[b]`` (``()``: the root; each
        must be the root or in ``blocks[b]``).  Only the requested rows and one chunk's logits are
        alive at once.

        Raises:
            ValueError: a taken node that is not in its block.
        """
        import torch

        rows = len(self.column)
        wanted = [{} for _ in range(rows)]
        outs = []
        for b, take in enumerate(takes):
            for out_row, node in enumerate(take):
                wanted[b].setdefault(tuple(node), []).append(out_row)
            outs.append(torch.empty((len(take), self.root_logits.shape[-1]), dtype=self.root_logits.dtype, device=self.device))
            if () in wanted[b]:
                outs[b][wanted[b].pop(())] = self.root_logits[b]
        steps = max((-(-len(block) // chunk) for block in blocks), default=0)
        with torch.no_grad():
            for step in range(steps):
                parts = [list(block[step * chunk : (step + 1) * chunk]) for block in blocks]
                n = max(len(part) for part in parts)
                width = self.width + n
                allowed = np.zeros((rows, n, width), dtype=bool)  # numpy: per-element writes cost ns, not us
                tokens = np.zeros((rows, n), dtype=np.int64)
                positions = np.zeros((rows, n), dtype=np.int64)
                for b, part in enumerate(parts):
                    allowed[b, range(n), range(self.width, width)] = True  # itself (padding: itself only)
                    allowed[b, : len(part), self.length - self.lengths[b] : self.length] = True  # its context
                    for i, node in enumerate(part):
                        for d in range(1, len(node)):
                            allowed[b, i, self.column[b][node[:d]]] = True  # its ancestors, wherever they are
                        self.column[b].setdefault(node, self.width + i)  # a node fed again: a copy nobody sees
                        tokens[b, i] = node[-1]
                        positions[b, i] = self.lengths[b] + len(node) - 1
                output = self.model(
                    torch.from_numpy(tokens).to(self.device),
                    attention_mask=additive_mask(allowed, self.dtype, self.device),
                    position_ids=torch.from_numpy(positions).to(self.device),
                    use_cache=True,
                    **{cache_kwarg(self.model): self.cache},
                )
                self.cache = cache_of(output)
                for b, part in enumerate(parts):
                    for i, node in enumerate(part):
                        if node in wanted[b]:
                            outs[b][wanted[b].pop(node)] = output.logits[b, i]
                self.width = width
                del output
        for b, left in enumerate(wanted):
            if left:
                raise ValueError(f"takes: node {next(iter(left))} of root {b} was not fed in this call")
        return outs


class TreeSession:
    """Both models' KV caches over ``roots``, kept from call to call (see the module docstring).

    Args:
        pair: a ``backends.hf.HFPair`` (its models, settings, vocabulary, EOS, device, residency).
        roots: the root contexts, one batch row each.
        max_batch: tree tokens per root and forward (default: the pair's).

    Raises:
        ValueError: no roots, an empty root, a root longer than the model's context, ids outside
            [0, V), a bad max_batch.
    """

    def __init__(self, pair, roots: Sequence[Sequence[int]], max_batch: int | None = None):
        self.roots = check_contexts(roots, pair.vocab_size)
        if not self.roots or any(not r for r in self.roots):
            raise ValueError(
                "roots: at least one, each non-empty (a real model needs at least one token, for example a BOS token)"
            )
        for root in self.roots:
            pair._check_length(len(root))
        self.pair = pair
        self.max_batch = pair.max_batch if max_batch is None else check_int(max_batch, "max_batch", 1)
        self._trees: tuple[CachedTree, CachedTree] | None = None

    def logits(self, requests: Sequence[Sequence[Node]]) -> list[tuple]:
        """Per root b, the float32 (len(requests[b]), V) target and draft logits at
        ``roots[b] + path`` for each path of ``requests[b]`` (host arrays, or device tensors for a
        resident pair), evaluating only the nodes not evaluated yet, all roots together.

        Raises:
            ValueError: one request per root is needed; ids outside [0, V); a tree deeper than the context.
        """
        if len(requests) != len(self.roots):
            raise ValueError(f"requests: one list of paths per root ({len(self.roots)}), got {len(requests)}")
        requests = [check_contexts(paths, self.pair.vocab_size) for paths in requests]
        if not self.pair.tree_attention:
            return [self.pair.node_logits(root, paths, self.max_batch) for root, paths in zip(self.roots, requests)]
        if self._trees is None:
            self._trees = tuple(CachedTree(self.pair, model, self.roots) for model in (self.pair.target, self.pair.draft))
        blocks = []
        for b, (root, paths) in enumerate(zip(self.roots, requests)):
            blocks.append(closed_nodes(paths, seen=self._trees[0].column[b]))
            self.pair._check_length(len(root) + max((len(n) for n in blocks[-1]), default=0))
        rows = [tree.feed(blocks, self.max_batch, requests) for tree in self._trees]
        return [(self.pair._logits(p), self.pair._logits(q)) for p, q in zip(*rows)]

    def take_prefix_logits(self, last: int):
        """The target's logits (``last``, V_model) at the first ``last`` positions of the one root
        context (row i: the logits after ``root[: i + 1]``), from the prefill that builds the
        caches, so no other forward runs over the context; afterwards the session keeps none of
        them.  None (nothing run) where the caches exist already, the session has several roots
        or the pair has no tree attention: the caller then runs its own forward."""
        if self._trees is not None or len(self.roots) != 1 or not self.pair.tree_attention:
            return None
        target = CachedTree(self.pair, self.pair.target, self.roots, every_position=True)
        self._trees = (target, CachedTree(self.pair, self.pair.draft, self.roots))
        rows, target.prefix_logits = target.prefix_logits, None
        return rows[:last]

    def member(self, b: int) -> "SessionMember":
        """Root b's view: ``node_logits(roots[b], paths)`` for a ``simlab.trees.NodeTable``."""
        return SessionMember(self, b)


class SessionMember:
    """One root of a ``TreeSession`` as a ``simlab.pairs.NodeLogits`` pair (its settings,
    vocabulary and EOS are the pair's); ``distributions`` is the pair's plain forward."""

    def __init__(self, session: TreeSession, b: int):
        self.session, self.b = session, int(b)
        pair = session.pair
        self.settings, self.vocab_size, self.eos_id = pair.settings, pair.vocab_size, pair.eos_id

    def distributions(self, contexts):
        return self.session.pair.distributions(contexts)

    def node_logits(self, root: Sequence[int], paths: Sequence[Node]):
        """As ``HFPair.node_logits`` at this root, on the session's caches (the other roots' rows padded).

        Raises:
            ValueError: another root context, or what ``TreeSession.logits`` raises.
        """
        if tuple(root) != self.session.roots[self.b]:
            raise ValueError("root: this session member evaluates the tree of another root context")
        requests = [[] for _ in self.session.roots]
        requests[self.b] = list(paths)
        return self.session.logits(requests)[self.b]


class RootCache:
    """One root's nodes on a ``TreeSession``, each evaluated once and kept (see the module
    docstring): a ``simlab.pairs`` ``NodeBatch`` and ``NodeLogits`` pair for ``NodeTable``s of
    this root only, under the pair's settings (``with_settings``: other settings, the same caches).

    Args:
        pair: a ``backends.hf.HFPair``.
        root: the root context (token ids).
        max_batch: tree tokens per forward (default: the pair's).

    Raises:
        ValueError: what ``TreeSession`` raises (an empty root, ids outside [0, V), too long).
    """

    def __init__(self, pair, root: Sequence[int], max_batch: int | None = None):
        self.session = TreeSession(pair, [root], max_batch)
        self.root = self.session.roots[0]
        self.pair = pair
        self.settings, self.vocab_size, self.eos_id = pair.settings, pair.vocab_size, pair.eos_id
        self.max_context = pair.max_context
        self.kept: dict[Node, tuple] = {}  # node -> (target, draft) float32 (V,) logits, host arrays

    def with_settings(self, settings) -> "RootCache":
        """The same root and kept logits under other sampling settings (a new view)."""
        other = copy.copy(self)
        other.pair = self.pair.with_settings(settings)
        other.settings = other.pair.settings
        return other

    def distributions(self, contexts):
        """The pair's plain forwards (``HFPair.distributions``)."""
        return self.pair.distributions(contexts)

    def prefix_distributions(self, context: Sequence[int], last: int) -> np.ndarray:
        """The pair's ``prefix_distributions`` under this view's settings (``simlab.pairs.PrefixRows``):
        float64 (last, V).  At this root, asked before any node is evaluated, the rows come from
        the prefill that builds the caches (``TreeSession.take_prefix_logits``: one forward over
        the context instead of two; equal to the pair's own rows to float32 rounding, as is the
        root's logits row then, its LM head run over every position); else from the pair's forward.

        Raises:
            ValueError: what ``HFPair.prefix_distributions`` raises.
        """
        in_range = isinstance(last, int) and not isinstance(last, bool) and 1 <= last <= len(self.root)
        rows = self.session.take_prefix_logits(last) if in_range and tuple(context) == self.root else None
        if rows is None:
            return self.pair.prefix_distributions(context, last)
        return self.pair.prefix_rows(rows)

    def node_logits(self, root: Sequence[int], paths: Sequence[Node]) -> tuple[np.ndarray, np.ndarray]:
        """float32 (len(paths), V) target and draft logits at ``root + path`` (host arrays), the
        nodes not kept yet evaluated on the session's caches (with their missing ancestors).

        Raises:
            ValueError: another root context, or what ``TreeSession.logits`` raises.
        """
        if tuple(root) != self.root:
            raise ValueError("root: this cache holds the tree of another root context")
        paths = [tuple(path) for path in paths]
        missing = [path for path in dict.fromkeys(paths) if path not in self.kept]
        if missing:
            p, q = (to_host(z) for z in self.session.logits([missing])[0])
            for i, path in enumerate(missing):
                self.kept[path] = (p[i], q[i])
        if not paths:
            return (np.empty((0, self.vocab_size), dtype=np.float32),) * 2
        return tuple(np.stack([self.kept[path][w] for path in paths]) for w in (0, 1))

    def node_distributions(self, root: Sequence[int], paths: Sequence[Node]) -> tuple[np.ndarray, np.ndarray]:
        """float64 (len(paths), V) p and q at ``root + path`` under this view's settings."""
        logits_p, logits_q = self.node_logits(root, paths)
        return self.settings.probabilities(logits_p), self.settings.probabilities(logits_q)


EVALUATIONS = ("cached", "plain")
"""How a study's live node tables evaluate their nodes: ``RootCache`` or the pair's own tree forward per fetch."""


def node_table(pair, context: Sequence[int], evaluation: str = "cached"):
    """A ``simlab.trees.NodeTable`` of ``context``: on a ``RootCache`` for ``"cached"`` when the
    pair evaluates trees on kept caches (``backends.hf.HFPair``: it has ``session``), else on
    ``pair`` itself (``"plain"``, and every other pair: synthetic worlds, captures).

    Raises:
        ValueError: ``evaluation`` not one of ``EVALUATIONS``.
    """
    from simlab.trees import NodeTable

    if evaluation not in EVALUATIONS:
        raise ValueError(f"evaluation: must be one of {', '.join(EVALUATIONS)}, got {evaluation!r}")
    if evaluation == "cached" and hasattr(pair, "session"):
        return NodeTable(RootCache(pair, context), context)
    return NodeTable(pair, context)
