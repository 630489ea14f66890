"""Draft trees: a root context, nodes keyed by their token path, ordered child lists with multiplicity.

* A **node** is the token path from the root, a tuple (the root is ``()``); its context is
  ``root context + path``.
* ``children[path]`` is the node's **ordered child list**: the drafted next tokens, one per
  draft that passes through the node, duplicates kept (two i.i.d. rollouts that agree on a
  token give that child multiplicity 2).  The child node for token t is ``path + (t,)``.
* p and q at every node come from a ``NodeTable`` (a memo over one root context, filled from a
  model pair in batches), which also memoises each verifier's per-node plan by value.

Static trees use the common tuple notation: each node is the tuple of child *ranks* along its
path, e.g. ``[(0,), (1,), (0, 0)]`` = two children of the root, and one child below the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from simlab.device_rows import check_rows, is_tensor, probabilities, to_host
from simlab.checks import check_real_array
from simlab.distributions import SUM_TOLERANCE, check_distribution
from simlab.drafting import Drafting
from simlab.pairs import ModelPair, NodeBatch, NodeLogits, WithSettings, check_context, eos_of
from simlab.sampling import SamplingSettings
from simlab.verifiers import is_lab_verifier
from simlab.verifiers.naive import Naive

SPECULATIVE = Naive()
"""Speculative sampling (NaiveTree with one child): the plan shared by single-child nodes."""


def planning_verifier(verifier, k: int):
    """The node verifier whose plan serves ``verifier`` with k children: the shared
    ``SPECULATIVE`` when k = 1 and the verifier, one of the lab's own classes
    (``simlab.verifiers.is_lab_verifier``), declares ``speculative_at_one``, else itself."""
    if k == 1 and getattr(verifier, "speculative_at_one", False) and is_lab_verifier(verifier):
        return SPECULATIVE
    return verifier


Path = tuple[int, ...]


def mass_request(request) -> tuple:
    """(path, node verifier, children, law) of a mass request (``TopDown.mass_requests``, answered by
    ``simlab.grid.streamed_masses`` and ``simlab.batched.table_masses``); a request of three
    items (path, node verifier, children) has the node verifier's own ``drafting`` as its law.
    The law decides which children must have q > 0 (``simlab.verifiers.base.check_drafted``)."""
    path, node, kids, *law = request
    return tuple(path), node, tuple(kids), law[0] if law else node.drafting


def _same(a, b) -> bool:
    """Equal shape and values, for host arrays and torch tensors alike."""
    if is_tensor(a) and is_tensor(b):
        return a.shape == b.shape and a.device == b.device and bool((a == b).all())
    return np.array_equal(to_host(a), to_host(b))


BLOCK_BYTES = 2**21
"""Bytes of rows per block of ``checked_rows`` (2 MB, at least one row: 8 rows of V = 32,000
float64), so the second reduction over a block reads it from cache."""


def checked_rows(rows, n: int, vocab: int) -> tuple:
    """Validate n rows of a probability matrix at once: (float64 (n, V) array or None, bool (n,)).

    Row i passes when no float64 entry has its sign bit set (the minimum of the entries' bits read
    as int64 is >= 0: no negative entry, no -0.0) and their sum is finite and within
    ``SUM_TOLERANCE / 2`` of 1 (so no NaN or infinite entry), both computed over blocks of
    ``BLOCK_BYTES`` (the second reduction reads the block from cache; an integer minimum is
    cheaper than a float one, which must look for NaN).  Such a row is one that
    ``simlab.distributions.check_distribution`` accepts as it is: that function's sum of the same
    entries (another order of the same pairwise summation) differs by at most V 2^-52, below the
    margin SUM_TOLERANCE / 2 for V <= 10^6 (larger vocabularies, and rows near the bound, go
    through that function), and a passing row holds the values it returns (row i of the float64
    array: a view of ``rows`` when that is one already).  Rows that do not pass, and every row
    when ``rows`` cannot be read as one float64 (n, V) array (ragged rows, masked or non-numeric
    entries, another shape), are False: the caller checks them one by one with
    ``check_distribution``, which refuses them with its message or renormalises a float32 row.

    Args:
        rows: the (n, V) rows, array-like (e.g. a pair's answer).
        n: the expected number of rows.
        vocab: the expected row length V.

    Returns:
        (the float64 array, or None when it could not be read whole; which rows passed).
    """
    if vocab > 10**6:
        return None, np.zeros(n, dtype=bool)
    try:
        arr = check_real_array(rows, "rows")
    except ValueError:
        return None, np.zeros(n, dtype=bool)
    if arr.shape != (n, vocab):
        return None, np.zeros(n, dtype=bool)
    ok = np.empty(n, dtype=bool)
    step = max(1, BLOCK_BYTES // (8 * vocab))
    for start in range(0, n, step):
        block = arr[start : start + step]
        total = block.sum(axis=1)
        # no sign bit set: no negative entry (nor -0.0, which check_distribution then accepts);
        # NaN or an infinite entry makes the sum NaN or infinite, which fails the sum's test
        signed = block.view(np.int64).min(axis=1) < 0
        ok[start : start + step] = ~signed & (np.abs(total - 1.0) <= 0.5 * SUM_TOLERANCE)
    return arr, ok


class NodeTable:
    """p and q at node paths below one root context, fetched from ``pair`` in batches and memoised.

    A ``simlab.pairs.NodeBatch`` pair (``backends.hf.HFPair``) answers a whole batch of nodes at
    once; any other pair is asked ``distributions(root + path ...)``.  ``eos_id`` is the pair's
    end-of-sequence id (``simlab.pairs.eos_of``), or None.

    Local to one computation (a tree, or every tree of one expectation); never global.

    ``rows="logits"`` (pairs with ``node_logits`` and ``settings``: ``simlab.pairs.NodeLogits``,
    e.g. ``backends.hf.HFPair``) keeps each node's float32 logits instead of its float64 p and q
    rows, and computes p and q from them on every access (``settings.probabilities``, the same
    bits as the batched transform), validated once: half the memory of one model's rows, none
    kept for the float64 rows themselves, at the cost of a softmax per access.  What a
    vocabulary of 128,000 needs (the capture tool uses it); plans are memoised in both modes.
    Logits given as torch tensors (``backends.hf.HFPair.with_resident_logits``) stay on their
    device: ``torch_rows`` turns them into p and q there (``simlab.device_rows``) for the batched
    engine, and ``p``, ``q`` and ``logits`` copy a row to the host only when a numpy consumer asks
    (the same float32 bits, so the same p and q as logits kept on the host).

    Args:
        pair: a ``ModelPair``.
        context: the root context (token ids).
        rows: ``"float64"`` (default) or ``"logits"``.

    Raises:
        ValueError: a bad ``rows``, or ``"logits"`` for a pair without ``node_logits`` and ``settings``.
    """

    def __init__(self, pair: ModelPair, context: Sequence[int], *, rows: str = "float64"):
        if rows not in ("float64", "logits"):
            raise ValueError(f"rows: must be 'float64' or 'logits', got {rows!r}")
        if rows == "logits" and not isinstance(pair, NodeLogits):
            raise ValueError(f"rows: 'logits' needs a pair with node_logits and settings, got {type(pair).__name__}")
        self.pair = pair
        self.rows = rows
        self.vocab_size = int(pair.vocab_size)
        self.context = check_context(context, self.vocab_size)
        self.eos_id = eos_of(pair)
        self._p: dict[Path, np.ndarray] = {}
        self._q: dict[Path, np.ndarray] = {}
        self._logits: dict[Path, tuple] = {}  # host arrays or device tensors (float32 rows)
        self._checked: set[Path] = set()
        self._plans: dict[tuple, object] = {}

    def known(self, path: Path) -> bool:
        """True if p and q at ``path`` are in the table (as rows or as logits)."""
        return path in self._p or path in self._logits

    def fetch(self, paths: Iterable[Path]) -> None:
        """Load p and q for every path not yet known, in one call to the pair."""
        missing = list(dict.fromkeys(tuple(pth) for pth in paths if not self.known(tuple(pth))))
        if not missing:
            return
        if self.rows == "logits":
            self.add_logits(missing, *self.pair.node_logits(self.context, missing))
            return
        if isinstance(self.pair, NodeBatch):  # e.g. one tree-attention forward per model
            p, q = self.pair.node_distributions(self.context, missing)
        else:
            p, q = self.pair.distributions([self.context + pth for pth in missing])
        self.add(missing, p, q)

    def add(self, paths: Sequence[Path], p, q, *, method: str = "blocks") -> None:
        """Record p and q rows (shape (len(paths), V)) that the caller evaluated itself, for example a
        capture's one tree-attention forward over every node; each row is validated once here.

        ``method="blocks"`` (default): the rows are checked together (``checked_rows``: a minimum
        and a sum per row over blocks of rows, instead of a validated call per row) and kept as
        views of the float64 arrays; a row the block check does not pass (or arrays it cannot take
        whole) goes through ``check_distribution`` alone, which refuses it or returns it
        renormalised (a float32 row within its rounding).  ``method="reference"``: every row
        through ``check_distribution``, the plain path; the same rows bit for bit and the same
        refusals (tests/test_trees_rows.py).

        Raises:
            ValueError: a row that is not a distribution over V tokens, or a path already known
                with other values (or known as logits: add a node's rows or its logits, not both);
                a number of rows other than len(paths); an unknown ``method``.
        """
        if method not in ("blocks", "reference"):
            raise ValueError(f"method: must be 'blocks' or 'reference', got {method!r}")
        paths = [tuple(pth) for pth in paths]
        for name, given in (("p", p), ("q", q)):
            if len(given) != len(paths):
                raise ValueError(f"{name}: has {len(given)} rows, expected {len(paths)} (one per path)")
        if method == "blocks":
            rows_p, ok_p = checked_rows(p, len(paths), self.vocab_size)
            rows_q, ok_q = checked_rows(q, len(paths), self.vocab_size)
        else:
            rows_p = rows_q = None
            ok_p = ok_q = np.zeros(len(paths), dtype=bool)
        for i, pth in enumerate(paths):
            if pth in self._logits:
                raise ValueError(
                    f"paths: node {pth} is already known as logits (add_logits); add its rows or its logits, not both"
                )
            row_p = rows_p[i] if ok_p[i] else check_distribution(p[i], f"p at node {pth}", size=self.vocab_size)
            row_q = rows_q[i] if ok_q[i] else check_distribution(q[i], f"q at node {pth}", size=self.vocab_size)
            if pth in self._p and not (np.array_equal(self._p[pth], row_p) and np.array_equal(self._q[pth], row_q)):
                raise ValueError(f"paths: node {pth} is already known with other p, q")
            self._p[pth], self._q[pth] = row_p, row_q

    def add_logits(self, paths: Sequence[Path], logits_p, logits_q) -> None:
        """Record target and draft logits (shape (len(paths), V), the pair's ``settings`` turn them
        into p and q) that the caller evaluated itself, for example a capture's tree forward.  With
        ``rows="float64"`` they become rows at once (``add``); with ``"logits"`` the arrays are kept
        (rows of the caller's arrays, which must not change afterwards).

        Raises:
            ValueError: a pair without ``settings``, shapes that do not match, a path already known
                with other values, and (on access, or at once with float64 rows) logits that give
                no distribution.
        """
        settings = getattr(self.pair, "settings", None)
        if settings is None:
            raise ValueError(f"pair: {type(self.pair).__name__} has no sampling settings to turn logits into p and q")
        if is_tensor(logits_p) != is_tensor(logits_q):
            raise ValueError("logits: give target and draft logits both as torch tensors or both as arrays")
        if not is_tensor(logits_p) or self.rows == "float64":
            logits_p, logits_q = to_host(logits_p), to_host(logits_q)
        shape_p, shape_q = tuple(logits_p.shape), tuple(logits_q.shape)
        if shape_p != (len(paths), self.vocab_size) or shape_q != shape_p:
            raise ValueError(f"logits: must be ({len(paths)}, {self.vocab_size}) arrays, got {shape_p} and {shape_q}")
        if self.rows == "float64":
            self.add(paths, settings.probabilities(logits_p), settings.probabilities(logits_q))
            return
        for i, pth in enumerate(paths):
            pth = tuple(pth)
            if pth in self._p:
                raise ValueError(f"paths: node {pth} is already known as rows (add); add its rows or its logits, not both")
            if pth in self._logits and not (
                _same(self._logits[pth][0], logits_p[i]) and _same(self._logits[pth][1], logits_q[i])
            ):
                raise ValueError(f"paths: node {pth} is already known with other logits")
            self._logits[pth] = (logits_p[i], logits_q[i])

    def logits(self, paths: Sequence[Path]) -> tuple[np.ndarray, np.ndarray]:
        """The kept target and draft logits at ``paths``, stacked: two arrays (len(paths), V) (with
        ``rows="logits"``; what a capture stores with ``--full``).

        Raises:
            ValueError: a path whose logits the table does not keep.
        """
        missing = [tuple(pth) for pth in paths if tuple(pth) not in self._logits]
        if missing:
            raise ValueError(f"paths: no logits kept for node {missing[0]} (rows={self.rows!r})")
        rows = [self._logits[tuple(pth)] for pth in paths]
        return np.stack([to_host(r[0]) for r in rows]), np.stack([to_host(r[1]) for r in rows])

    def resident(self, path: Path) -> bool:
        """True if the logits at ``path`` are kept as a torch tensor (on the device that made them)."""
        return path in self._logits and is_tensor(self._logits[path][0])

    def torch_rows(self, paths: Sequence[Path], *, device=None, dtype=None):
        """p and q at ``paths`` as two [n, V] torch tensors of ``dtype`` (default float64) on ``device``.

        Rows whose logits are resident tensors are transformed where they are
        (``simlab.device_rows.probabilities``, in float64, then cast to ``dtype`` as the host rows
        are) and validated there at their first access; the
        others are this table's float64 rows, moved to the device.  ``device`` None: the device
        of the resident logits (the CPU when there are none).

        Raises:
            ValueError: rows that are not distributions, resident logits on several devices, or
                what ``simlab.device_rows.probabilities`` refuses (top-p settings).
        """
        import torch

        paths = [tuple(pth) for pth in paths]
        self.fetch(paths)
        dtype = torch.float64 if dtype is None else dtype
        kept = [i for i, pth in enumerate(paths) if self.resident(pth)]
        devices = {self._logits[paths[i]][0].device for i in kept}
        if len(devices) > 1:
            raise ValueError(f"paths: resident logits on several devices ({', '.join(map(str, sorted(devices, key=str)))})")
        device = torch.device(device) if device is not None else (devices.pop() if devices else torch.device("cpu"))
        P = torch.empty((len(paths), self.vocab_size), dtype=dtype, device=device)
        Q = torch.empty_like(P)
        if kept:
            names = [paths[i] for i in kept]
            # float64 first, as the host rows (validated there at the float64 tolerance), then ``dtype``
            rows = [probabilities(self.pair.settings, torch.stack([self._logits[pth][w] for pth in names])) for w in (0, 1)]
            fresh = [j for j, pth in enumerate(names) if pth not in self._checked]
            if fresh:
                check_rows(rows[0][fresh], rows[1][fresh], [names[j] for j in fresh])
                self._checked.update(names[j] for j in fresh)
            index = torch.tensor(kept, device=device)
            P[index], Q[index] = rows[0].to(device=device, dtype=dtype), rows[1].to(device=device, dtype=dtype)
        other = sorted(set(range(len(paths))) - set(kept))
        if other:
            index = torch.tensor(other, device=device)
            P[index] = torch.from_numpy(np.stack([self.p(paths[i]) for i in other])).to(device=device, dtype=dtype)
            Q[index] = torch.from_numpy(np.stack([self.q(paths[i]) for i in other])).to(device=device, dtype=dtype)
        return P, Q

    def _from_logits(self, path: Path, which: int) -> np.ndarray:
        """p (which = 0) or q (1) at ``path`` from its kept logits; both validated at the first access."""
        probabilities = self.pair.settings.probabilities
        row = probabilities(to_host(self._logits[path][which]))  # a resident row: one transient host copy
        if path not in self._checked:
            other = probabilities(to_host(self._logits[path][1 - which]))
            p, q = (row, other) if which == 0 else (other, row)
            check_distribution(p, f"p at node {path}", size=self.vocab_size)
            check_distribution(q, f"q at node {path}", size=self.vocab_size)
            self._checked.add(path)
        return row

    def untempered(self) -> "NodeTable":
        """A table of the same root under the untempered settings (T = 1, no top-p or top-k): what
        a deterministic builder ranks by when the setting transforms q (EAGLE's and SpecBlock's
        code rank by the drafter's raw log-softmax at every temperature; at T = 0 the tempered q is
        one-hot and every tree a chain).  This table itself when the pair has no other settings
        (``simlab.pairs.WithSettings``) or already uses those; read the tree back with ``DraftTree.on``."""
        raw = SamplingSettings()
        if not isinstance(self.pair, WithSettings) or self.pair.settings == raw:
            return self
        return NodeTable(self.pair.with_settings(raw), self.context, rows=self.rows)

    def without_plans(self) -> "NodeTable":
        """A table with the same p and q already fetched but no memoised plans (for timing)."""
        other = NodeTable(self.pair, self.context, rows=self.rows)
        other._p, other._q, other._logits, other._checked = dict(self._p), dict(self._q), dict(self._logits), set(self._checked)
        return other

    def p(self, path: Path) -> np.ndarray:
        """The target distribution at ``path``, float64 (V,) (with ``rows="logits"``: a new array each call)."""
        if not self.known(path):
            self.fetch([path])
        return self._p[path] if path in self._p else self._from_logits(path, 0)

    def q(self, path: Path) -> np.ndarray:
        """The draft distribution at ``path``, float64 (V,) (with ``rows="logits"``: a new array each call)."""
        if not self.known(path):
            self.fetch([path])
        return self._q[path] if path in self._q else self._from_logits(path, 1)

    def memo(self, key: tuple, compute):
        """``compute()``, evaluated once per ``key`` and kept with the plans (``without_plans`` drops
        both): for values a verifier derives from this table's rows alone, keyed by value, e.g.
        ``("traversal excess", path, w)`` (Traversal's first rejection at a node)."""
        if key not in self._plans:
            self._plans[key] = compute()
        return self._plans[key]

    def plan(self, verifier, path: Path, k: int, law: Drafting | None = None):
        """``verifier.prepare(p, q, k, law)`` at ``path``, memoised by (verifier value, path, k, law).

        p and q were validated when fetched, so the plan skips their validation; with one child a
        verifier that declares ``speculative_at_one`` gets the node's shared speculative-sampling
        plan (NaiveTree's), whichever verifier asks."""
        verifier = planning_verifier(verifier, k)
        key = (verifier, path, k, law)
        if key not in self._plans:
            self._plans[key] = verifier.prepare(self.p(path), self.q(path), k, law, checked=True)
        return self._plans[key]


DISTINCT_CHILDREN = (Drafting.WITHOUT_REPLACEMENT, Drafting.DETERMINISTIC, Drafting.MIXED)
"""The laws that never draft a token twice at one node (``Drafting.REPEATED`` lists one token only)."""


def check_child_list(kids: Sequence[int], law: Drafting, path: Path = ()) -> None:
    """Refuse a child list that ``law`` cannot produce: two different tokens under
    ``Drafting.REPEATED`` (one draw listed k times), a repeated token under a law of distinct
    children (without replacement, deterministic, mixed); i.i.d. children may be anything.

    Raises:
        ValueError: ``children: ...`` naming the node, its children and the law.
    """
    if law is Drafting.REPEATED and len(set(kids)) > 1:
        raise ValueError(f"children: node {path} lists {list(kids)} drafted {law.description}: its copies must be one token")
    if law in DISTINCT_CHILDREN and len(set(kids)) != len(kids):
        raise ValueError(f"children: node {path} lists {list(kids)} drafted {law.description}: a token appears twice")


@dataclass
class DraftTree:
    """A draft tree over a ``NodeTable``.

    Attributes:
        table: p and q for the nodes (and the root context).
        children: node path -> ordered child tokens (with multiplicity); leaves may be absent.
        drafting: how the children were drawn (``simlab.drafting.Drafting``), the same at
            every node unless ``node_laws`` says otherwise.
        node_laws: node path -> the law of that node's children, where it differs from
            ``drafting`` (a greedy-draft tree whose tail was pruned at some nodes).
        cost: the drafting cost (``simlab.builders.cost.DraftCost``: the draft forwards that built
            the tree), or None when unknown.

    Raises:
        ValueError: ``tree: ...`` for a child that is not a token id in [0, V), or a law that
            is not a ``Drafting``; ``children: ...`` for a child list its node's law cannot
            produce (``check_child_list``).
    """

    table: NodeTable
    children: dict[Path, tuple[int, ...]] = field(default_factory=dict)
    drafting: Drafting = Drafting.IID
    node_laws: dict[Path, Drafting] = field(default_factory=dict)
    cost: object = None

    def __post_init__(self):
        vocab = self.table.vocab_size if self.table is not None else None
        for path, kids in self.children.items():
            for t in kids:
                check_child(path, t, vocab)
        if not isinstance(self.drafting, Drafting) or not all(isinstance(v, Drafting) for v in self.node_laws.values()):
            raise ValueError(f"tree: drafting laws must be simlab.drafting.Drafting values, got {self.drafting!r}")
        for path, kids in self.children.items():
            check_child_list(kids, self.law(path), path)

    def law(self, path: Path) -> Drafting:
        """How the children of ``path`` were drawn."""
        return self.node_laws.get(path, self.drafting)

    def laws(self) -> frozenset[Drafting]:
        """The laws of every node that has children."""
        return frozenset(self.law(path) for path, kids in self.children.items() if kids)

    def on(self, table: NodeTable) -> "DraftTree":
        """The same deterministic tree (children, cost) read against another table of the same
        context: a tree ranked by the drafter's untempered law, verified under the setting's p.

        Raises:
            ValueError: ``table: ...`` for another context or vocabulary, or a tree whose children
                were sampled (their law is the law of the table they were drawn from).
        """
        if table.context != self.table.context or table.vocab_size != self.table.vocab_size:
            raise ValueError("table: must have the tree's root context and vocabulary")
        sampled = sorted(law.value for law in self.laws() if law is not Drafting.DETERMINISTIC)
        if sampled:
            raise ValueError(
                f"table: children drawn {', '.join(sampled)} (partly from q) belong to the table they were drawn from"
            )
        return DraftTree(table, dict(self.children), self.drafting, dict(self.node_laws), self.cost)

    def tokens(self) -> int:
        """Draft tokens in the tree (distinct non-root nodes): what a verify budget counts."""
        return len(self.nodes()) - 1

    @property
    def context(self) -> tuple[int, ...]:
        return self.table.context

    def child_list(self, path: Path) -> tuple[int, ...]:
        """The ordered child tokens of ``path`` (empty at a leaf)."""
        return self.children.get(path, ())

    def nodes(self) -> list[Path]:
        """Every node path, root first, in depth-first order of first appearance."""
        out, stack = [], [()]
        child_list = self.child_list
        while stack:
            path = stack.pop()
            out.append(path)
            kids = child_list(path)
            if len(kids) == 1:  # most nodes of a drafted tree: no duplicates to drop
                stack.append((*path, kids[0]))
            elif kids:
                stack.extend([(*path, t) for t in reversed(dict.fromkeys(kids))])
        return out

    def depth(self) -> int:
        """The length of the longest root-to-leaf path (0 for a root alone)."""
        return max(len(pth) for pth in self.nodes())

    def fill(self) -> "DraftTree":
        """Fetch p and q for every node in one batched call; returns self."""
        self.table.fetch(self.nodes())
        return self

    def truncate(self, depth: int) -> "DraftTree":
        """The same tree cut at ``depth`` tokens (nodes deeper than that dropped; the cost is unknown)."""
        return DraftTree(
            self.table,
            {path: kids for path, kids in self.children.items() if len(path) < depth},
            self.drafting,
            {path: law for path, law in self.node_laws.items() if len(path) < depth},
        )

    def first_path(self) -> Path:
        """The path that follows the first child at every node (the "first draft")."""
        path: Path = ()
        while self.child_list(path):
            path = path + (self.child_list(path)[0],)
        return path

    def to_tuples(self) -> list[tuple[int, ...]]:
        """Export the topology in tuple notation (children ranked by first appearance)."""
        out = []
        stack = [((), ())]
        while stack:
            path, ranks = stack.pop(0)
            for rank, t in enumerate(dict.fromkeys(self.child_list(path))):
                out.append(ranks + (rank,))
                stack.append((path + (t,), ranks + (rank,)))
        return sorted(out, key=lambda r: (len(r), r))


def check_child(path: Path, t, vocab: int | None) -> None:
    """Refuse a child ``t`` of node ``path`` that is not a token id in [0, vocab) (a Python or numpy
    integer, not a bool; any integer when ``vocab`` is None).

    Raises:
        ValueError: ``tree: node ... has child ..., not a token id in [0, V)``.
    """
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or (vocab is not None and not 0 <= t < vocab):
        raise ValueError(f"tree: node {path} has child {t!r}, not a token id in [0, {vocab})")


def rank_paths(spec) -> tuple[tuple[int, ...], ...]:
    """A static tree's nodes in tuple notation as int tuples, each rank checked to be an integer
    (a Python or numpy int, not a bool or a float: 1.9 is no rank, and would truncate to 1).

    Raises:
        ValueError: ``spec: ...`` for a node that is not a sequence or a rank that is not an integer.
    """
    out = []
    for node in spec:
        try:
            ranks = tuple(node)
        except TypeError:
            raise ValueError(f"spec: node {node!r} is not a sequence of ranks") from None
        bad = [r for r in ranks if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer))]
        if bad:
            raise ValueError(f"spec: node {node!r} has rank {bad[0]!r}, not an integer")
        out.append(tuple(int(r) for r in ranks))
    return tuple(out)


def parse_tuples(spec: Sequence[Sequence[int]]) -> dict[tuple[int, ...], int]:
    """Validate a static tree in tuple notation; return rank path -> number of children.

    Raises:
        ValueError: a node whose parent is missing, a rank that is not an integer
            (``rank_paths``) or is negative, duplicate nodes, or ranks of siblings that are not 0..n-1.
    """
    nodes = list(rank_paths(spec))
    if len(set(nodes)) != len(nodes):
        raise ValueError("spec: a node appears twice")
    present = set(nodes) | {()}
    counts: dict[tuple[int, ...], int] = {}
    for node in nodes:
        if not node or any(r < 0 for r in node):
            raise ValueError(f"spec: node {node} must be a non-empty tuple of non-negative ranks")
        if node[:-1] not in present:
            raise ValueError(f"spec: node {node} has no parent {node[:-1]}")
        counts[node[:-1]] = counts.get(node[:-1], 0) + 1
    for parent, n in counts.items():
        ranks = sorted(node[-1] for node in nodes if node[:-1] == parent)
        if ranks != list(range(n)):
            raise ValueError(f"spec: the children of {parent} have ranks {ranks}, expected 0..{n - 1}")
    return counts


DRAFT_LAWS = ("raw", "setting")
"""What a deterministic builder ranks tokens by (``drafting_table``): ``"raw"``, the drafters'
untempered (T = 1) law, as EAGLE's, TreeGraft's and SpecBlock's code do; ``"setting"``, the
sampling setting's tempered q."""


def drafting_table(table, draft_law: str):
    """The table a deterministic builder ranks by: ``table.untempered()`` for ``"raw"``, else ``table``
    itself; the tree is read back on ``table`` (``DraftTree.on``) for its value."""
    if draft_law not in DRAFT_LAWS:
        raise ValueError(f"draft_law: must be one of {', '.join(DRAFT_LAWS)}, got {draft_law!r}")
    return table.untempered() if draft_law == "raw" else table
