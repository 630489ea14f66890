"""Grid labels for a verifier whose branch law is the target (NSS), from path products, no tree walk.

When B(x, t) = p_u(t) at every node u whatever its children x (``NodeVerifier.branch_is_target``:
NSS, SpecInfer Sec. 4 and DDTE App. C), top-down verification reaches a node v = u + (t,) with
probability P(reach u) p_u(t): P(reach v) is the product of p along v's path, whatever tree v is
in, and E[tau + 1 | tree cut at depth d] = 1 + the sum of P(reach v) over the tree's distinct
nodes at depths 1..d (``TopDown.by_depth_from_masses``; with an EOS id, nothing at or below an
EOS child).  For the grid's delayed trees (a draft's trunk, then its first K branches:
``simlab.grid.grid_block_efficiency``) that needs p and q at each drafted edge, one entry
each (p for the mass; q to refuse a child q cannot have drawn, the refusal of
``NodePlan.check_children_rows``), and every K and cut-off of every draft follows from a few
array operations over all drafts at once:

* the products along each path (``cumprod``: the same sequential products as the tree walk);
* a node counted once, at its first copy (the lowest branch through it: the first appearance of
  each child in the node's child list);
* the nodes of one depth added in the tree walk's order: right to left in the siblings' order of
  first appearance, i.e. by descending rank of (rank of the parent, first branch through the node);
* the cumulative sum over depths, read at each cut-off.

The same bits as ``grid_block_efficiency(engine="reference")`` (tests), which stays its reference.
With ``positions`` the per-depth sums before the cumulative sum are P(tau >= j) once the accepted
EOS nodes are added back (``simlab.grid.grid_metrics``; equal to the tree walk's to rounding, tests).
"""

from __future__ import annotations

import numpy as np

from simlab.drafting import Drafting
from simlab.trees import NodeTable, check_child
from simlab.verifiers import is_lab_verifier
from simlab.verifiers.base import ALL_LAWS


def serves(verifier) -> bool:
    """True when ``verifier`` is a top-down verifier of every child (not the first path only) whose
    node verifier, for i.i.d. and repeated children (the grid's laws), has B = p
    (``branch_is_target``) and which is lossless for every drafting law (so no pairing of the grid
    is refused), one of the lab's own classes (a user class's ``branch_is_target`` is not trusted:
    ``simlab.verifiers.is_lab_verifier``): ``grid_values`` gives its labels."""
    from simlab.tree_verifiers.topdown import TopDown

    if not isinstance(verifier, TopDown) or verifier.first_path_only or verifier.node.needs_greedy_target:
        return False
    nodes = [verifier.node.for_law(law) for law in (Drafting.IID, Drafting.REPEATED)]
    return all(
        getattr(node, "branch_is_target", False) and is_lab_verifier(node) and node.lossless_for == ALL_LAWS for node in nodes
    )


def grid_values(table: NodeTable, drafts, K_values, L2_values, positions: bool = False):
    """E[tau + 1] of each draft's delayed tree with its first K branches (the trunk's children shared
    or repeated per path alike: B does not depend on the child list), cut at depth L1 + L2, for a
    verifier that ``serves``; float64 (len(drafts), len(K_values), len(L2_values)).

    ``positions``: also P(tau >= j) for j = 1..max trunk + longest branch of each draft's tree with
    its first K branches (uncut: a cut at L1 + L2 keeps j <= L1 + L2 as they are), float64
    (len(drafts), len(K_values), that many): the sum of P(reach v) over the depth-j nodes with no
    EOS above them (an accepted EOS counts at its position, as
    ``simlab.engine_metrics.path_metrics``); returns (values, that).

    Raises:
        ValueError: ``tree: ...`` for a child that is not a token id in [0, V) (as ``DraftTree``),
            ``children: ...`` for a child whose q is 0 (as ``NodePlan.check_children_rows``).
    """
    K_values, L2_values = list(K_values), list(L2_values)
    width = max(K_values, default=0)
    trunks = [tuple(d.trunk) for d in drafts]
    branches = [[tuple(b) for b in d.branches[:width]] for d in drafts]
    D, V, eos = len(drafts), table.vocab_size, table.eos_id
    lt = max(map(len, trunks), default=0)
    kb = max(map(len, branches), default=0)
    lb = max((len(b) for bs in branches for b in bs), default=0)
    # every drafted edge (node, child), trunk first then branch by branch; ids checked as DraftTree does
    edges, nodes = [], {}
    for trunk, bs in zip(trunks, branches):
        for i, path in enumerate([trunk] + [trunk + b for b in bs]):
            for j in range(len(trunk) if i else 0, len(path)):
                node, t = path[:j], path[j]
                if type(t) is not int or not 0 <= t < V:
                    check_child(node, t, V)
                edges.append((node, t))
                nodes[node] = None
                if j == len(path) - 1:
                    nodes[path] = None  # the leaf (fetched as every node of the trees is)
    table.fetch(nodes)
    mass, drawn = np.array([[table.p(node)[t], table.q(node)[t]] for node, t in edges]).reshape(-1, 2).T
    if not drawn.all():
        node, t = edges[int(np.argmin(drawn != 0))]
        raise ValueError(f"children: token {t} has q = 0 and cannot have been drafted")
    # one row per draft: the trunk (lt slots), then kb branches of lb slots; 1.0 and -1 fill the rest
    slot = np.ones((D, lt + kb * lb))
    tokens = np.full((D, lt + kb * lb), -1, dtype=np.int64)
    rows, cols = [], []
    for i, (trunk, bs) in enumerate(zip(trunks, branches)):
        cols += range(len(trunk))
        for b, branch in enumerate(bs):
            cols += range(lt + b * lb, lt + b * lb + len(branch))
        rows += [i] * (len(cols) - len(rows))
    slot[rows, cols] = mass
    tokens[rows, cols] = [t for _, t in edges]
    alive = tokens != eos if eos is not None else np.ones(tokens.shape, dtype=bool)
    trunk_len = np.array([len(t) for t in trunks], dtype=np.int64)
    in_trunk = np.arange(lt) < trunk_len[:, None]
    trunk_reach = np.cumprod(slot[:, :lt], axis=1)
    trunk_alive = np.logical_and.accumulate(alive[:, :lt], axis=1)
    start = trunk_reach[:, -1] if lt else np.ones(D)  # the trunk's end (the 1.0 fill changes no bit)
    start_alive = trunk_alive[:, -1] if lt else np.ones(D, dtype=bool)
    branch_mass = slot[:, lt:].reshape(D, kb, lb)
    branch_tokens = tokens[:, lt:].reshape(D, kb, lb)
    reach = np.cumprod(np.concatenate([np.broadcast_to(start[:, None, None], (D, kb, 1)), branch_mass], axis=2), axis=2)[:, :, 1:]
    live = start_alive[:, None, None] & np.logical_and.accumulate(alive[:, lt:].reshape(D, kb, lb), axis=2)
    live &= branch_tokens >= 0  # a drafted edge, not fill
    first = first_copies(branch_tokens)
    counted = np.where(live & (first == np.arange(kb)[None, :, None]), reach, 0.0)
    order = walk_order(first)
    counted = np.take_along_axis(counted, order, axis=1)
    by_depth = np.zeros((D, len(K_values), 1 + lt + lb))
    by_depth[:, :, 0] = 1.0
    by_depth[:, :, 1 : 1 + lt] = np.where(in_trunk & trunk_alive, trunk_reach, 0.0)[:, None, :]
    K = np.array(K_values)[None, :, None]
    level = np.zeros((D, len(K_values), lb))
    for s in range(kb):  # sequential sums, as the walk adds its nodes one by one
        level = level + np.where(order[:, None, s, :] < K, counted[:, None, s, :], 0.0)
    depth = trunk_len[:, None] + 1 + np.arange(lb)
    by_depth[np.arange(D)[:, None], :, depth] = level.transpose(0, 2, 1)
    cumulative = np.cumsum(by_depth, axis=2)
    cut = np.minimum(np.array([d.L1 for d in drafts])[:, None] + np.array(L2_values)[None, :], by_depth.shape[2] - 1)
    values = np.take_along_axis(cumulative, np.broadcast_to(cut[:, None, :], (D, len(K_values), len(L2_values))), axis=2)
    if not positions:
        return values
    reached = by_depth[:, :, 1:].copy()
    if eos is not None:  # the accepted EOS nodes the sums above leave out, each at its first copy
        before = np.concatenate([np.ones((D, 1), dtype=bool), trunk_alive[:, :-1]], axis=1)  # no EOS above
        reached[:, :, :lt] += np.where(in_trunk & before & (tokens[:, :lt] == eos), trunk_reach, 0.0)[:, None, :]
        above = np.concatenate([np.broadcast_to(start_alive[:, None, None], (D, kb, 1)), live[:, :, :-1]], axis=2)[:, :, :lb]
        ends = above & (branch_tokens == eos) & (first == np.arange(kb)[None, :, None])
        by_branch = np.cumsum(np.where(ends, reach, 0.0), axis=1)  # (D, kb, lb): branches 0..b
        if kb:
            level = by_branch[:, np.minimum(K_values, kb) - 1, :]  # (D, len(K_values), lb); K > kb: every branch
            reached[np.arange(D)[:, None], :, depth - 1] += level.transpose(0, 2, 1)
    return values, reached


def first_copies(tokens: np.ndarray) -> np.ndarray:
    """For branch tokens int64 (D, kb, lb) below each draft's trunk (-1 past a branch's end): the
    lowest branch whose first j + 1 tokens are branch b's, int64 (D, kb, lb) (b itself at the node's
    first copy: the branch that puts the node in its parent's child list first)."""
    same = np.logical_and.accumulate(tokens[:, :, None, :] == tokens[:, None, :, :], axis=3)
    return same.argmax(axis=1)


def walk_order(first: np.ndarray) -> np.ndarray:
    """The order in which ``TopDown.by_depth_from_masses`` visits each depth's branch nodes, int64
    (D, kb, lb): entry [d, s, j] is the branch of the s-th node visited at branch depth j.  Its stack
    visits a depth right to left; siblings are ordered by first appearance (the ``first_copies``
    branch), nodes of different parents as their parents: the rank of (parent's rank, first
    branch), descending."""
    D, kb, lb = first.shape
    rank = np.zeros((D, kb), dtype=np.int64)
    ranks = np.empty((D, kb, lb), dtype=np.int64)
    for j in range(lb):
        key = rank * kb + first[:, :, j]
        rank = (key[:, None, :] < key[:, :, None]).sum(axis=2)
        ranks[:, :, j] = rank
    return np.argsort(-ranks, axis=1, kind="stable")
