"""The action grid of delayed trees: its axes, its sampled drafts and their values (DDTE Sec. 6).

An action a = (K, L1, L2) is the delayed tree ``Delayed(K, L1, L2)`` (DDTE Def. 5.2): a trunk of
L1 tokens, then K branches of L2 tokens.  The grid is the product of three axes (``GridAxes``:
K values, L1 values, L2 values), written once here for every study, the capture (which stores it
as width = max K and depth = max L2, ``GridAxes.from_width_depth``) and the labels.

* ``draw_grid`` / ``draw_grids``: ``samples`` draws of the widest tree ``Delayed(max K, L1, max L2)``
  per L1 (``GridDraft``); the first K branches cut at L2 tokens are a draw of every narrower action;
* ``grid_block_efficiency``: DDTE's unbiased estimator of E[tau + 1] for every action from those
  drafts (per-node work shared; ``streamed_masses`` / ``grouped_masses`` feed it, or
  ``simlab.reach_grid`` without building trees);
* ``action_grid_block_efficiency``: both at one root from a seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simlab import reach_grid, tree_verifiers
from simlab.checks import check_generator, check_int
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.efficiency import Estimate, lossless_over
from simlab.pairs import ModelPair
from simlab.tree_verifiers.base import cut_positions
from simlab.trees import SPECULATIVE, DraftTree, NodeTable
from simlab.verifiers.speculative import accept_probabilities


@dataclass(frozen=True)
class GridAxes:
    """The axes of the action grid: K values (branches, >= 1), L1 values (trunk tokens, >= 0) and
    L2 values (branch tokens, >= 0), each distinct, kept in the given order (DDTE: K in 1..4,
    L1 and L2 in 0..8, the default).

    Raises:
        ValueError: ``K_values: ...``, ``L1_values: ...`` or ``L2_values: ...`` for an empty axis,
            a repeated value or one below its minimum.
    """

    K_values: tuple[int, ...] = (1, 2, 3, 4)
    L1_values: tuple[int, ...] = tuple(range(9))
    L2_values: tuple[int, ...] = tuple(range(9))

    def __post_init__(self):
        for name in ("K_values", "L1_values", "L2_values"):
            values = getattr(self, name)
            if not values or min(values) < (1 if name == "K_values" else 0) or len(set(values)) != len(values):
                raise ValueError(f"{name}: must be distinct integers >= {1 if name == 'K_values' else 0}, got {values!r}")

    @classmethod
    def from_width_depth(cls, width: int, depth: int) -> "GridAxes":
        """The axes a capture stores as width and depth: K in 1..width, L1 and L2 in 0..depth."""
        return cls(
            tuple(range(1, check_int(width, "width", 1) + 1)),
            tuple(range(check_int(depth, "depth", 0) + 1)),
            tuple(range(depth + 1)),
        )

    @property
    def width(self) -> int:
        """The widest K (the drafts' number of branches)."""
        return max(self.K_values)

    @property
    def depth(self) -> int:
        """The longest L2 (the drafts' branch length)."""
        return max(self.L2_values)

    @property
    def largest_tree(self) -> int:
        """Draft tokens of the grid's largest tree: max L1 + max K * max L2."""
        return max(self.L1_values) + self.width * self.depth

    def actions(self, budget: int | None = None, rollouts: bool = False) -> list[tuple[int, int, int]]:
        """Every action (K, L1, L2), K slowest (the order of the selector's logits); with ``budget``
        only those of at most ``budget`` draft tokens (L1 + K L2) and at least one (L1 + L2 > 0);
        ``rollouts``: only L1 = 0 (i.i.d. rollouts)."""
        return [
            (K, L1, L2)
            for K in self.K_values
            for L1 in self.L1_values
            for L2 in self.L2_values
            if (budget is None or (L1 + K * L2 <= budget and L1 + L2 > 0)) and not (rollouts and L1)
        ]


DDTE_AXES = GridAxes()
"""DDTE's action grid (Sec. 6): K in 1..4, L1 and L2 in 0..8; the default axes of every function here."""


@dataclass(frozen=True)
class GridDraft:
    """One sampled delayed tree with the widest K of a grid: ``Delayed(K_max, L1, L2_max)`` as
    its trunk (L1 tokens) and K_max branches (L2_max tokens each).  Its first K branches cut at
    L2 tokens are a draw of ``Delayed(K, L1, L2)`` for every K <= K_max, L2 <= L2_max."""

    L1: int
    trunk: tuple[int, ...]
    branches: tuple[tuple[int, ...], ...]


def draw_grid(
    table: NodeTable,
    *,
    K_max: int = DDTE_AXES.width,
    L1_values=DDTE_AXES.L1_values,
    L2_max: int = DDTE_AXES.depth,
    samples: int = 4,
    rng: np.random.Generator,
) -> list[GridDraft]:
    """``samples`` draws of ``Delayed(K_max, L1, L2_max)`` for each L1 (the trees behind DDTE's labels).

    All draws advance together, one depth level at a time, so p and q are fetched in one
    batched call per level (one tree-attention forward per model for real models) instead of
    one per draft and level.  Each token uses one uniform of ``rng``, in a fixed order.

    Returns:
        the draws, grouped by L1 (in ``L1_values`` order), ``samples`` each.

    Raises:
        ValueError: samples < 1, K_max < 1, or negative lengths.
    """
    return draw_grids([table], [rng], K_max=K_max, L1_values=L1_values, L2_max=L2_max, samples=samples)[0]


def draw_grids(
    tables: Sequence[NodeTable],
    rngs: Sequence[np.random.Generator],
    *,
    fetch=None,
    K_max: int = DDTE_AXES.width,
    L1_values=DDTE_AXES.L1_values,
    L2_max: int = DDTE_AXES.depth,
    samples: int = 4,
) -> list[list[GridDraft]]:
    """``draw_grid`` at several roots in lockstep: at each depth level, ``fetch`` is called once
    with every root's frontier, then each root draws its tokens from its own table and ``rng``
    (the same draws as ``draw_grid`` one root at a time, given the same p and q).

    Args:
        tables: one ``NodeTable`` per root.
        rngs: one ``np.random.Generator`` per root, as many as ``tables``.
        fetch: called as ``fetch([paths of root 0, paths of root 1, ...])`` once per level, with the
            nodes each root reads next and its table lacks; it must add them to the tables (e.g.
            one forward per model for all roots: ``backends.tree_cache.TreeSession``).  Default:
            each table fetches its own.
        K_max: the trees' branches K (>= 1): every draw is ``Delayed(K_max, L1, L2_max)``.
        L1_values: the trunk lengths L1 (tokens, >= 0); the draws are grouped by them, in this order.
        L2_max: the branch length L2 (tokens, >= 0).
        samples: draws per L1 value (>= 1).

    Returns:
        per root, its draws as ``draw_grid`` returns them.

    Raises:
        ValueError: as ``draw_grid``; tables and rngs of different lengths.
    """
    from simlab.builders import Delayed

    samples = check_int(samples, "samples", 1)
    if len(tables) != len(rngs):
        raise ValueError(f"rngs: one per table ({len(tables)}), got {len(rngs)}")
    for table in tables:
        if not isinstance(table, NodeTable):
            raise ValueError(f"table: must be a simlab.trees.NodeTable, got {type(table).__name__}")
    for rng in rngs:
        check_generator(rng)
    try:
        L1_values = [int(v) for v in L1_values]
    except TypeError:
        raise ValueError(f"L1_values: must be a sequence of integers, got {L1_values!r}") from None
    if not L1_values or len(set(L1_values)) != len(L1_values):
        raise ValueError(f"L1_values: must be distinct integers, at least one, got {L1_values!r}")
    for L1 in L1_values:
        Delayed(K_max, L1, L2_max)  # validates the sizes
    width = K_max if L2_max > 0 else 0
    every = [[[L1, (), [() for _ in range(width)]] for L1 in L1_values for _ in range(int(samples))] for _ in tables]
    depth = max(L1_values) + L2_max
    for level in range(depth):
        frontiers = []
        for table, drafts in zip(tables, every):
            frontier = [d[1] for d in drafts if level < d[0]]
            frontier += [d[1] + b for d in drafts if d[0] <= level < d[0] + L2_max for b in d[2]]
            frontiers.append(list(dict.fromkeys(p for p in frontier if not table.known(p))))
        if fetch is None:
            for table, frontier in zip(tables, frontiers):
                table.fetch(frontier)
        else:
            fetch(frontiers)
        for table, rng, drafts in zip(tables, rngs, every):
            for d in drafts:
                if level < d[0]:
                    d[1] = d[1] + (sample_categorical(table.q(d[1]), rng),)
                elif level < d[0] + L2_max:
                    d[2] = [b + (sample_categorical(table.q(d[1] + b), rng),) for b in d[2]]
    return [[GridDraft(L1, trunk, tuple(branches)) for L1, trunk, branches in drafts] for drafts in every]


def streamed_masses(table: NodeTable, requests) -> dict:
    """Answer mass requests (``TopDown.mass_requests``: (path, node verifier, children, law),
    ``simlab.trees.mass_request``) node by node with the numpy plans, reading each node's p and q
    once and keeping no plan: memory bounded by one node's rows and plans, whatever the number of
    nodes (the plans memoised in the table keep every node's rows alive).  The same plans, masses
    and refusals as ``NodeTable.plan`` (bit for bit: the same ``prepare`` with the node's law, and
    a node's child lists in one ``children_masses`` call).

    Returns:
        (node verifier, path, children) -> float64 (k,).

    Raises:
        ValueError: as ``prepare`` and ``children_mass`` (e.g. a drafted child with q = 0).
    """
    from simlab.trees import mass_request

    by_path: dict = {}
    for request in requests:
        path, node, kids, law = mass_request(request)
        by_path.setdefault(path, {}).setdefault((node, len(kids), law), set()).add(kids)
    out = {}
    for path, groups in by_path.items():
        p, q = table.p(path), table.q(path)
        for (node, k, law), children in groups.items():
            children = list(children)
            masses = node.prepare(p, q, k, law, checked=True).children_masses(np.array(children, dtype=np.int64))
            for kids, row in zip(children, masses):
                out[(node, path, kids)] = row
    return out


def _draft_trees(table: NodeTable, draft: GridDraft, K_values, per_path: bool) -> dict[int, DraftTree]:
    """``Delayed.build(table, trunk, branches[:K], repeats=K if per_path else 1)`` for every K of
    ``K_values``, from one pass over the draft: the child lists grow branch by branch, so the K
    trees of a draw share that work (the same trees: tests)."""
    trunk = draft.trunk
    children: dict[tuple, tuple] = {trunk[:j]: (t,) for j, t in enumerate(trunk)}
    out, used = {}, 0
    for K in sorted(set(K_values)):
        for branch in draft.branches[used:K]:
            for j, t in enumerate(branch):
                node = trunk + branch[:j]
                children[node] = children.get(node, ()) + (t,)
        used = max(used, K)
        kids, laws = dict(children), {}
        if per_path and K > 1:
            for j, t in enumerate(trunk):
                kids[trunk[:j]] = (t,) * K
                laws[trunk[:j]] = Drafting.REPEATED
        out[K] = DraftTree(table, kids, Drafting.IID, laws)
    return out


def grouped_masses(table: NodeTable, verifier, trees) -> dict:
    """The children masses every tree of ``trees`` asks of a top-down ``verifier``
    (``TopDown.mass_requests``), each distinct (node, law, child list) answered once: the child
    lists of one (node verifier, node, k, law) are validated together and answered by one
    vectorised call on the table's memoised plan (``NodePlan.children_masses``, row i equal to
    ``children_mass`` of list i bit for bit), instead of one validated call per list and tree.
    The one-child lists of the shared speculative-sampling plan (``simlab.trees.SPECULATIVE``,
    most nodes of a grid's trees) are answered together without a plan (``one_child_masses``),
    the same bits; a node they cannot settle goes through its plan as the others.

    Returns:
        (path, law, children) -> the masses as a list of k Python floats.

    Raises:
        ValueError: as ``NodePlan.check_children_rows`` (e.g. a child with q = 0).
    """
    groups: dict[tuple, dict] = {}
    nodes = {}  # the node verifier is a function of (law, k) for one top-down verifier
    for tree in trees:
        for path, node, kids, law in verifier.mass_requests(tree):
            key = (path, len(kids), law)
            if key not in groups:
                groups[key], nodes[key] = {}, node
            groups[key][tuple(kids)] = None
    singles = [
        (path, kids[0]) for (path, k, law), lists in groups.items() if nodes[(path, k, law)] is SPECULATIVE for kids in lists
    ]
    settled = one_child_masses(table, singles)
    out = {}
    for (path, k, law), lists in groups.items():
        node = nodes[(path, k, law)]
        lists = list(lists)
        if node is SPECULATIVE and all((path, kids[0]) in settled for kids in lists):
            for kids in lists:
                out[(path, law, kids)] = [settled[(path, kids[0])]]
            continue
        masses = table.plan(node, path, k, law).children_masses(np.array(lists, dtype=np.int64)).tolist()
        for kids, row in zip(lists, masses):
            out[(path, law, kids)] = row
    return out


EXCESS_MARGIN = 1e-8
"""q(x) - p(x) above which p > q at some other token of a validated pair of rows (``one_child_masses``)."""


def one_child_masses(table: NodeTable, requests) -> dict:
    """B(x, x) of speculative sampling (``simlab.trees.SPECULATIVE``'s plan, one child x) at many
    (node, x) at once, where it needs no pass over V: (path, x) -> float, for the requests it
    settles (the others are left to the node's plan).

    The plan's one-child mass (``SingleDraft.masses_at``) is a = min(1, p(x) / q(x))
    (``accept_probabilities``, elementwise: the same bits here over all requests) when Z = sum
    (p - q)_+ > 0, and (1 - a) p(x) / sum p + a when Z = 0.  Settled here, with q(x) > 0 (so the
    plan's check of the child passes: an id in [0, V) with q > 0 is refused by no law) and V <= 10^7:

    * a = 1: both formulas give 1.0 exactly (0 times a finite value, plus 1);
    * q(x) - p(x) > ``EXCESS_MARGIN``: then Z > 0.  The rows are validated (``NodeTable``: float64
      sums within 1e-9 of 1, so their exact sums within 1e-9 + V 2^-53 <= 2.2e-9 of 1), so the
      sum of p(t) - q(t) over t != x is at least (q(x) - p(x)) - 4.4e-9 > 0: p > q at some t.

    Any other request (q(x) = 0, an id outside [0, V), or p(x) just below q(x), where Z = 0 is
    possible) is not settled; the plan values or refuses it (tests: the grouped grid against
    ``engine="reference"`` bit for bit, rows with p = q and p just below q).

    Args:
        table: the p and q rows (validated when fetched).
        requests: (path, child token) pairs.

    Returns:
        (path, x) -> the mass, a Python float, for the settled requests.
    """
    if not requests or table.vocab_size > 10**7:
        return {}
    V = table.vocab_size
    ids = [x for _, x in requests]
    usable = [isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) and 0 <= x < V for x in ids]
    p_at = np.array([table.p(path)[x] if ok else 0.0 for (path, x), ok in zip(requests, usable)])
    q_at = np.array([table.q(path)[x] if ok else 0.0 for (path, x), ok in zip(requests, usable)])
    a = accept_probabilities(p_at, q_at)
    settles = np.array(usable) & (q_at > 0.0) & ((a == 1.0) | (q_at - p_at > EXCESS_MARGIN))
    values = a.tolist()
    return {request: values[i] for i, request in enumerate(requests) if settles[i]}


@dataclass(frozen=True)
class GridMetrics:
    """An action's value by DDTE's estimator and the engines' metrics by the same estimator: the
    means over the drafts of its L1 of each tree's exact values (``simlab.engine_metrics``).

    Attributes:
        E: E[tau + 1] (``grid_block_efficiency``'s ``Estimate``).
        accepted: E[tau] (tokens; with an EOS id, the drafts kept up to and including an accepted EOS).
        unconditional: P(tau >= j) for j = 1..L1 + L2, float64 (L1 + L2,): vLLM's per-position
            counter; the papers' conditional rate is ``engine_metrics.conditional_rates`` of it
            (a ratio of the means, as ``engine_metrics.aggregate`` takes it).
    """

    E: Estimate
    accepted: float
    unconditional: np.ndarray


def grid_metrics(table: NodeTable, drafts: Sequence[GridDraft], verifier, **options) -> dict[tuple[int, int, int], GridMetrics]:
    """``grid_block_efficiency`` with the engines' metrics of every action (``GridMetrics``): the
    same E bit for bit, from the same pass (per tree: P(tau >= j) is the sum of P(reach v) over
    its depth-j nodes; ``TreeVerifier.positions_by_depth``, ``reach_grid.grid_values``); each
    per-tree value is exact, so their means over the drafts are unbiased like E's.

    Args:
        options: as ``grid_block_efficiency`` (every engine; the same refusals).
    """
    return _grid(table, drafts, verifier, positions=True, **options)


def grid_block_efficiency(
    table: NodeTable,
    drafts: Sequence[GridDraft],
    verifier,
    *,
    K_values=DDTE_AXES.K_values,
    L2_values=DDTE_AXES.L2_values,
    trunk_children: str = "shared",
    engine: str = "numpy",
    device=None,
    stream: bool = False,
) -> dict[tuple[int, int, int], Estimate]:
    """E[tau + 1] of every action (K, L1, L2) from sampled grid drafts (DDTE's unbiased estimator).

    For each draft the trees of its first K branches are built once for every K (``_draft_trees``)
    and each is cut at every L2 (``block_efficiency_by_depth``); the estimate of an action is the
    mean over the drafts with its L1, with the standard error of that mean (NaN for a single
    draft).  The same drafts serve every verifier (common random numbers).
    ``trunk_children="per_path"``: the DDTE audit convention (each trunk node lists its child K
    times, ``Drafting.REPEATED``; a verifier refused there must be given with ``allow_lossy=True``).

    ``engine="numpy"`` (default): for a top-down verifier whose branch law is the target (NSS:
    ``simlab.reach_grid.serves``) the values come from products of p along the drafts' paths, for
    every draft, K and L2 at once, without building a tree (``reach_grid.grid_values``; ``stream``
    changes nothing there: it keeps no row); for other top-down verifiers the masses of every tree
    come from ``grouped_masses`` (each distinct (node, children) request once, a node's child lists
    in one vectorised call; the pairings checked once per (law, k): ``lossless_depths``), then each
    tree's reach DP runs on them; other verifiers run
    ``block_efficiency_by_depth`` tree by tree.  ``engine="reference"``: the plain path the
    others are tested against, ``block_efficiency_by_depth`` for every tree (a validated
    ``children_mass`` per node and tree); the same numbers bit for bit (tests).

    ``engine="torch"``: every tree's children masses come from the batched torch engine
    (``simlab.batched``, float64, on ``device``) in one pass per (node verifier, k) group
    instead of node by node; for top-down verifiers whose node verifiers it implements (NSS,
    NaiveTree, SpecInfer, SpecTr).  Equal to the numpy path to 1e-12 (tests).

    ``stream=True`` (numpy, top-down verifiers; others ignore it): the masses come from
    ``streamed_masses``, node by node with no plan kept, so memory stays at one node's rows
    (with a ``NodeTable(rows="logits")``, what a vocabulary of 128,000 needs); the same numbers
    bit for bit, without the table's plan sharing across calls.

    Returns:
        (K, L1, L2) -> ``Estimate`` (method ``"mc"``, tokens per step).

    Raises:
        ValueError: a K above the drafts' number of branches, an L2 above their length, an
            unknown ``trunk_children`` or ``engine``, a verifier the torch engine does not
            implement, a child the table's q cannot have drafted, or a pairing the verifier refuses.
    """
    return _grid(
        table,
        drafts,
        verifier,
        K_values=K_values,
        L2_values=L2_values,
        trunk_children=trunk_children,
        engine=engine,
        device=device,
        stream=stream,
        positions=False,
    )


def _grid(
    table,
    drafts,
    verifier,
    *,
    K_values=DDTE_AXES.K_values,
    L2_values=DDTE_AXES.L2_values,
    trunk_children="shared",
    engine="numpy",
    device=None,
    stream=False,
    positions=False,
):
    """``grid_block_efficiency`` (``positions=False``) or ``grid_metrics`` (``positions=True``)."""
    if trunk_children not in ("shared", "per_path"):
        raise ValueError(f"trunk_children: must be 'shared' or 'per_path', got {trunk_children!r}")
    if engine not in ("numpy", "torch", "reference"):
        raise ValueError(f"engine: must be 'numpy', 'torch' or 'reference', got {engine!r}")
    verifier = tree_verifiers.as_verifier(verifier)
    top_down = isinstance(verifier, tree_verifiers.TopDown)
    if engine == "torch" and not top_down:
        raise ValueError(
            f"engine: the torch engine serves top-down verifiers (nss, naive, spectr, specinfer), not {verifier.name}"
        )
    by_L1: dict[int, list[int]] = {}
    for i, draft in enumerate(drafts):
        by_L1.setdefault(draft.L1, []).append(i)
    for L1, group in by_L1.items():
        widest = min(len(drafts[i].branches) for i in group)
        longest = min((len(b) for i in group for b in drafts[i].branches), default=0)
        if any(L2 > 0 and (K > widest or L2 > longest) for K in K_values for L2 in L2_values):
            raise ValueError(f"K_values, L2_values: the drafts at L1 = {L1} have {widest} branches of {longest} tokens")
    if engine == "numpy" and reach_grid.serves(verifier):
        K_values = list(dict.fromkeys(K_values))
        values = reach_grid.grid_values(table, drafts, K_values, L2_values, positions=positions)
        values, reached = values if positions else (values, None)
        depths = {L1: [L1 + L2 for L2 in L2_values] for L1 in by_L1}
        return _estimates(
            {(L1, K): values[group, j] for L1, group in by_L1.items() for j, K in enumerate(K_values)},
            L2_values,
            {(L1, K): lossless_over(verifier, None, depths[L1]) for L1 in by_L1 for K in K_values},
            None
            if reached is None
            else {
                (L1, K): np.broadcast_to(reached[group, j][:, None, :], (len(group), len(L2_values), reached.shape[2]))
                for L1, group in by_L1.items()
                for j, K in enumerate(K_values)
            },
        )
    trees: dict[tuple[int, int], list] = {}
    for L1, indices in by_L1.items():
        group = [drafts[i] for i in indices]
        for K in K_values:
            trees[(L1, K)] = []
        for d in group:
            for K, tree in _draft_trees(table, d, K_values, trunk_children == "per_path").items():
                trees[(L1, K)].append(tree)
    every = [tree for group in trees.values() for tree in group]
    table.fetch(_grid_nodes(every))  # one batched call for every node of every tree
    margins = None  # lossless_depths of every tree, where the top-down numpy path found them
    if engine == "torch" or (stream and top_down):
        requests = {}  # (L1, K, index) -> the tree's requests, asked once
        for key, group in trees.items():
            for i, tree in enumerate(group):
                verifier.check(tree)
                requests[(*key, i)] = verifier.mass_requests(tree)
        flat = [r for rs in requests.values() for r in rs]
        if engine == "torch":
            from simlab.batched import table_masses

            masses = table_masses(table, flat, device=device)
        else:
            masses = streamed_masses(table, flat)

        def from_masses(key, i, tree, depths):
            node_at = {path: node for path, node, *_ in requests[(*key, i)]}
            return verifier.by_depth_from_masses(
                tree, depths, lambda path, kids: masses[(node_at[path], path, tuple(kids))], positions=positions
            )
    elif top_down and engine == "numpy":
        margins = lossless_depths(verifier, every)
        for tree, deepest in zip(every, margins if margins is not None else [None] * len(every)):
            if deepest != math.inf:  # a tree with a lossy node (or no shortcut): refused with its message
                verifier.check(tree)
        grouped = grouped_masses(table, verifier, every)

        def from_masses(key, i, tree, depths):
            return verifier.by_depth_from_masses(
                tree, depths, lambda path, kids: grouped[(path, tree.law(path), kids)], positions=positions
            )
    else:
        from_masses = None

    def by_depth(key, i, tree, depths):
        """float64 (len(depths),), or with ``positions`` that and (len(depths), max(depths))."""
        if from_masses is None:
            return verifier.positions_by_depth(tree, depths) if positions else verifier.block_efficiency_by_depth(tree, depths)
        out = from_masses(key, i, tree, depths)
        return (out[0], cut_positions(out[1], depths)) if positions else out

    per_tree = {
        (L1, K): [by_depth((L1, K), i, tree, [L1 + L2 for L2 in L2_values]) for i, tree in enumerate(group)]
        for (L1, K), group in trees.items()
    }
    return _estimates(
        {key: np.array([v[0] if positions else v for v in rows]) for key, rows in per_tree.items()},
        L2_values,
        _lossless_flags(verifier, trees, L2_values, None if margins is None else dict(zip(map(id, every), margins))),
        {key: np.array([v[1] for v in rows]) for key, rows in per_tree.items()} if positions else None,
    )


def lossless_depths(verifier, trees) -> list | None:
    """``verifier.lossless_depth(tree)`` of every tree (``math.inf`` where every node's pairing is
    lossless), each node's pairing decided once per (law, number of children) by the verifier's own
    ``node_lossless``, for the lab's ``TopDown`` class itself, whose ``node_lossless`` depends on
    those two alone, and without a greedy target (``needs_greedy_target``, which reads p); None for
    any other verifier (the caller then asks the verifier tree by tree).  The grid's 144 trees hold
    about 6,500 nodes and a handful of (law, k) pairs."""
    if type(verifier) is not tree_verifiers.TopDown or verifier.needs_greedy_target:
        return None
    known: dict = {}
    out = []
    for tree in trees:
        deepest = math.inf
        for path, kids in tree.children.items():
            if kids and len(path) < deepest:
                key = (tree.law(path), len(kids))
                if key not in known:
                    known[key] = verifier.node_lossless(tree, path)
                if not known[key]:
                    deepest = len(path)
        out.append(deepest)
    return out


def _lossless_flags(verifier, trees: dict, L2_values, margins: dict | None) -> dict:
    """(L1, K) -> ``lossless_over`` of its trees at the cuts L1 + L2; every flag True without asking
    it where ``margins`` (id(tree) -> ``lossless_depths``) says each tree of the group is lossless
    at every cut."""
    out = {}
    for (L1, K), group in trees.items():
        if margins is not None and all(margins[id(tree)] == math.inf for tree in group):
            out[(L1, K)] = [True] * len(L2_values)
        else:
            out[(L1, K)] = lossless_over(verifier, group, [L1 + L2 for L2 in L2_values])
    return out


def _estimates(values: dict, L2_values, flags: dict, reached: dict | None = None) -> dict:
    """(K, L1, L2) -> the mean over drafts and its standard error (``Estimate``), from (L1, K) ->
    float64 (drafts, len(L2_values)) values, each with its ``lossless`` flag from (L1, K) -> one
    bool per L2 (``lossless_over``); with ``reached`` ((L1, K) -> float64 (drafts,
    len(L2_values), >= L1 + max L2): P(tau >= j | tree cut at L1 + L2)) a ``GridMetrics`` instead."""
    out: dict = {}
    for (L1, K), rows in values.items():
        means = rows.mean(axis=0)
        n = len(rows)
        errors = rows.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.full(len(L2_values), np.nan)
        for j, L2 in enumerate(L2_values):
            out[(K, L1, L2)] = Estimate(float(means[j]), float(errors[j]), "mc", n, flags[(L1, K)][j])
            if reached is not None:
                unconditional = reached[(L1, K)][:, j, : L1 + L2].mean(axis=0)
                out[(K, L1, L2)] = GridMetrics(out[(K, L1, L2)], float(unconditional.sum()), unconditional)
    return out


def _grid_nodes(trees) -> list:
    """Every node of ``trees`` (internal nodes and leaves), each once."""
    nodes: dict = {}
    for tree in trees:
        for path, kids in tree.children.items():
            nodes[path] = None
            for t in kids:
                nodes[path + (t,)] = None
    return list(nodes)


def action_grid_block_efficiency(
    pair: ModelPair,
    context: Sequence[int],
    verifier,
    *,
    K_values=DDTE_AXES.K_values,
    L1_values=DDTE_AXES.L1_values,
    L2_values=DDTE_AXES.L2_values,
    samples: int = 4,
    seed: int = 0,
    table: NodeTable | None = None,
) -> dict[tuple[int, int, int], Estimate]:
    """E[tau + 1] for every delayed-tree action (K, L1, L2) of a grid, by DDTE's estimator.

    ``samples`` trees ``Delayed(max K, L1, max L2)`` are drawn per L1 (``draw_grid``, seeded by
    ``seed``); each serves every K (its first K branches) and every L2 (cut-offs), so every
    estimate stays unbiased and drafting plus per-node work are shared (``grid_block_efficiency``).
    ``table``: the root's ``NodeTable`` to draw on (default a new ``NodeTable(pair, context)``);
    pass one table to several calls (one per verifier, the same ``seed``) to draw the same trees
    and evaluate every node once, on whatever evaluation the table uses (a kept-cache one for
    live models: ``backends.tree_cache.node_table``).

    Returns:
        (K, L1, L2) -> ``Estimate`` (method ``"mc"``, tokens per step).

    Raises:
        ValueError: ``table: ...`` for a table of another context; as ``draw_grid``.
    """
    return _action_grid(pair, context, verifier, K_values, L1_values, L2_values, samples, seed, grid_block_efficiency, table)


def action_grid_metrics(
    pair: ModelPair,
    context: Sequence[int],
    verifier,
    *,
    K_values=DDTE_AXES.K_values,
    L1_values=DDTE_AXES.L1_values,
    L2_values=DDTE_AXES.L2_values,
    samples: int = 4,
    seed: int = 0,
) -> dict[tuple[int, int, int], GridMetrics]:
    """``action_grid_block_efficiency`` with the engines' metrics (``grid_metrics``): the same
    drafts, the same E bit for bit."""
    return _action_grid(pair, context, verifier, K_values, L1_values, L2_values, samples, seed, grid_metrics)


def _action_grid(pair, context, verifier, K_values, L1_values, L2_values, samples, seed, value, table=None):
    """``value`` (``grid_block_efficiency`` or ``grid_metrics``) of the drafts drawn at one root
    (on ``table`` when given: a ``NodeTable`` of ``context``)."""
    verifier = tree_verifiers.as_verifier(verifier)
    if table is None:
        table = NodeTable(pair, context)
    elif not isinstance(table, NodeTable) or tuple(table.context) != tuple(int(t) for t in context):
        raise ValueError("table: must be a simlab.trees.NodeTable of the same context")
    drafts = draw_grid(
        table, K_max=max(K_values), L1_values=L1_values, L2_max=max(L2_values), samples=samples, rng=np.random.default_rng(seed)
    )
    return value(table, drafts, verifier, K_values=K_values, L2_values=L2_values)
