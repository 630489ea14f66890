"""What the parallel builders share: the drafter's per-position rows, and the tree they give.

A parallel drafter (``simlab.pairs.ParallelDraft``: DFlash, PARD, P-EAGLE, Medusa heads) gives,
in one forward from the root, one distribution per position: row d is the draft's q at every
node of depth d (the root's children are ranked by row 0).  The builders over it (``Medusa``,
``DDTree``) choose each node's children deterministically from its depth's row, so their trees'
law is ``Drafting.DETERMINISTIC`` (a function of the root, not a draw from q(. | prefix)).

The q a verifier sees at a node is the table's row there; ``parallel_tree`` refuses a pair whose
node rows are not its position rows (a pair that claims to be parallel but is not), so the
verifier always sees the distribution the children were chosen from.
Drafting cost: one draft forward over the positions the tree uses (``DraftForward(depth)``),
whatever the tree's width, against one forward per level for an autoregressive drafter.
"""

from __future__ import annotations

import numpy as np

from simlab.builders.cost import DraftCost, DraftForward
from simlab.drafting import Drafting
from simlab.pairs import ParallelDraft
from simlab.trees import DraftTree, NodeTable, Path


def position_rows(table: NodeTable, depth: int, builder: str) -> np.ndarray:
    """The drafter's rows q_1..q_depth at the table's root: float64 (depth, V).

    Raises:
        ValueError: ``pair: ...`` when the table's pair is not a parallel drafter, or its rows are
            not (depth, V).
    """
    pair = table.pair
    if not isinstance(pair, ParallelDraft):
        raise ValueError(
            f"pair: {builder} drafts from a parallel drafter's per-position distributions (simlab.pairs.ParallelDraft), "
            f"got {type(pair).__name__}, whose q at a node depends on the drafted prefix "
            "(backends.parallel_draft.RootConditioned builds the stand-in)"
        )
    rows = np.asarray(pair.position_distributions(table.context, depth), dtype=np.float64)
    if rows.shape != (depth, table.vocab_size):
        raise ValueError(f"pair: position_distributions gave shape {rows.shape}, expected {(depth, table.vocab_size)}")
    return rows


def parallel_cost(depth: int, tokens: int) -> DraftCost:
    """One draft forward over ``depth`` positions, then ``tokens`` verified."""
    return DraftCost((DraftForward(max(depth, 1)),), tokens)


def parallel_tree(table: NodeTable, children: dict[Path, tuple[int, ...]], rows: np.ndarray) -> DraftTree:
    """The deterministic tree of ``children`` over ``table`` with its parallel cost, every node
    fetched, after checking that the table's q at each node with children is its depth's row.

    Raises:
        ValueError: ``pair: ...`` naming the first node whose q is not its position row.
    """
    tree = DraftTree(table, dict(children), Drafting.DETERMINISTIC)
    depth = tree.depth()
    tree.cost = parallel_cost(depth, tree.tokens())
    tree.fill()
    for path, kids in children.items():
        if kids and not np.array_equal(table.q(path), rows[len(path)]):
            raise ValueError(
                f"pair: the draft's q at node {path} is not its position row {len(path)}: "
                "the pair's node rows depend on the drafted prefix, so it is no parallel drafter"
            )
    return tree
