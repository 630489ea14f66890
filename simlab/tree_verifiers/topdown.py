"""Top-down tree verification with a node-level verifier (DDTE Sec. 3, "OT-based verification").

Start at the root.  At node u with children x = ch(u) run the node verifier f on (p_u, q_u, x):
if its output t is a child, move to u + (t,); otherwise stop, t being the correction token.  At
a leaf emit the bonus token by f's leaf rule (``NodeVerifier.leaf_law``: a draw from p_u, the
argmax of p_u for the greedy rule).  Reaching node v has probability prod of B(f, ch(c), t)
along its path, so E[tau + 1 | tree] = 1 + sum_{v != root} P(reach v).  Lossless when, given
its prefix, every node's children have a law f is lossless for (the next tokens of the m >= 1
drafts through a node are i.i.d. q_u for i.i.d. rollouts); at each node the node verifier for
that node's law runs (``NodeVerifier.for_law``: the greedy-draft verifier runs the one-hot rule
where a tail was pruned).

What a node verifier is lossless for is what it declares (``lossless_for``) for the lab's own
classes; for any other class (a user's, ``simlab.verifiers.register``), only the declared laws its
exact check confirms (``simlab.conformance.certified_lossless_for``), and a refused pairing names
the exact bias that check found.

``first_path_only=True`` gives the single-path methods run on the first draft of a tree: with
``naive`` this is standard speculative sampling on the first path ("naive_chain").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simlab.conformance import certified_lossless, certified_lossless_for, refutation
from simlab.drafting import SAMPLED, Drafting
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.naive import Naive
from simlab.tree_verifiers.base import TreeVerifier, cut_positions


@dataclass(frozen=True)
class TopDown(TreeVerifier):
    """Top-down lifting of a node verifier.

    Args:
        node: the node-level verifier (``simlab.verifiers.get(name)``).
        first_path_only: verify only the first child of every node (single-path methods).
        allow_lossy: see ``TreeVerifier``.
    """

    node: NodeVerifier
    first_path_only: bool = False

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.node.name}_chain" if self.first_path_only else self.node.name

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.node.display_name()

    @property
    def single_path(self) -> bool:  # type: ignore[override]
        return self.first_path_only

    @property
    def lossless_for(self) -> frozenset[Drafting]:  # type: ignore[override]
        # The first child of a node is a draw from q under either sampled law, and only it is used.
        # A node class not of the lab's own counts only the declared laws its exact check confirms.
        laws = certified_lossless_for(self.node)
        return laws & SAMPLED if self.first_path_only else laws

    @property
    def needs_greedy_target(self) -> bool:  # type: ignore[override]
        return self.node.needs_greedy_target

    def node_lossless(self, tree, path) -> bool:
        kids = self._children(tree, path)
        return certified_lossless(self.node.for_law(tree.law(path)), tree.law(path), len(kids))

    @property
    def no_lossless_law(self) -> str:  # type: ignore[override]
        if refutation(self.node) is not None:
            return "it is lossless for no drafting law"
        return TreeVerifier.no_lossless_law

    def mismatch(self, tree):
        """``TreeVerifier.mismatch``, naming the exact bias ``simlab.conformance`` found where the node
        class declares a law lossless that its exact check refutes."""
        reason = super().mismatch(tree)
        report = refutation(self.node)
        if reason is not None and report is not None:
            refuted = ", ".join(law.value for law in sorted(report.refuted_laws(), key=list(Drafting).index))
            reason += f"; it declares itself lossless for {refuted}, refuted by simlab.conformance: {report.summary()}"
        return reason

    def _children(self, tree, path):
        kids = tree.child_list(path)
        return kids[:1] if self.first_path_only else kids

    def _plan(self, tree, path, kids):
        law = tree.law(path)
        return tree.table.plan(self.node.for_law(law), path, len(kids), law)

    def _children_law(self, tree, path, kids) -> np.ndarray:
        """The node plan's ``output_distribution(kids)`` at ``path``, once per (verifier, path, law,
        children) on the tree's table (the trees an expectation enumerates share nodes); read-only
        (a write raises), since every tree of the table shares it."""

        def law():
            out = self._plan(tree, path, kids).output_distribution(np.asarray(kids))
            out.flags.writeable = False
            return out

        return tree.table.memo(("top-down children law", self, path, tree.law(path), tuple(kids)), law)

    def _outcome_law(self, tree):
        out = {}
        stack = [((), 1.0)]
        while stack:
            path, reach = stack.pop()
            kids = self._children(tree, path)
            if not kids:
                out[path] = reach * self.node.leaf_law(tree.table.p(path))
                continue
            law = self._children_law(tree, path, kids)  # read only: memoised on the table
            stop = reach * law
            for t in dict.fromkeys(kids):
                stop[t] = 0.0
                if law[t] > 0.0:
                    stack.append((path + (t,), reach * law[t]))
            out[path] = stop
        return out

    def block_efficiency_by_depth(self, tree, depths):
        """One pass: cutting the tree does not change P(reach v) above the cut, so
        E[tau + 1 | cut at d] = 1 + sum of P(reach v) over nodes at depths 1..d.  With an EOS
        id, nodes whose path holds an EOS add nothing (no token after an EOS is kept).  Reads
        only the children's branch masses (``NodePlan.children_mass``), never a V-vector per node."""
        self.check(tree)
        return self.by_depth_from_masses(
            tree, depths, lambda path, kids: self._plan(tree, path, kids).children_mass(np.asarray(kids))
        )

    def mass_requests(self, tree):
        """What ``block_efficiency_by_depth`` asks of the node plans: (path, node verifier, children,
        law) for every node with children, the node verifier being the one
        ``simlab.trees.NodeTable.plan`` prepares there (``for_law``, and the shared
        speculative-sampling plan for one child), and the law of the node's children
        (``simlab.trees.mass_request``).
        A batched engine answers them all at once (``simlab.grid.grid_block_efficiency``)."""
        from simlab.trees import planning_verifier

        out = []
        for path in tree.nodes():
            kids = self._children(tree, path)
            if kids:
                law = tree.law(path)
                out.append((path, planning_verifier(self.node.for_law(law), len(kids)), kids, law))
        return out

    def positions_by_depth(self, tree, depths):
        """One pass, as ``block_efficiency_by_depth``: cutting the tree changes no P(reach v) above
        the cut, so P(tau >= j | cut at d) is the whole tree's for j <= d and 0 below."""
        self.check(tree)
        values, reached = self.by_depth_from_masses(
            tree, depths, lambda path, kids: self._plan(tree, path, kids).children_mass(np.asarray(kids)), positions=True
        )
        return values, cut_positions(reached, depths)

    def by_depth_from_masses(self, tree, depths, mass_of, positions: bool = False):
        """``block_efficiency_by_depth`` with the children's masses given by ``mass_of(path, kids)``
        (float64 (k,)); the caller has checked the pairing.  ``positions``: also P(tau >= j) for
        j = 1..depth of the whole tree, float64 (tree.depth(),): the sum of P(reach v) over the
        depth-j nodes with no EOS above them (an accepted EOS counts at its position, as
        ``simlab.engine_metrics.path_metrics`` counts it); returns (values, that)."""
        eos = tree.table.eos_id
        reach_at = [0.0] * (len(tree.children) + 1)  # deeper than any node (the children's keys are its internal nodes)
        eos_at = [0.0] * (len(tree.children) + 1)  # accepted EOS children by depth (positions only)
        deepest = 0
        stack = [((), 1.0)]
        while stack:
            path, reach = stack.pop()
            reach_at[len(path)] += reach
            deepest = max(deepest, len(path))
            kids = self._children(tree, path)
            if not kids:
                continue
            mass = mass_of(path, kids)
            for t, j in _first_copies(kids):
                if mass[j] > 0.0 and t != eos:
                    stack.append((path + (t,), reach * mass[j]))
                elif positions and mass[j] > 0.0:
                    eos_at[len(path) + 1] += reach * mass[j]
        cumulative = np.cumsum(reach_at[: deepest + 1])  # constant below the deepest node reached
        values = np.array([cumulative[min(d, cumulative.size - 1)] for d in depths])
        if not positions:
            return values
        depth = tree.depth()
        return values, np.add(reach_at[1 : depth + 1], eos_at[1 : depth + 1])

    def expected_block_efficiency(self, tree):
        """E[tau + 1 | tree] from the children's branch masses only (``block_efficiency_by_depth``
        at the tree's depth; the outcome-law route of ``TreeVerifier`` is the reference, and
        tests assert the two agree)."""
        return float(self.block_efficiency_by_depth(tree, [tree.depth()])[0])

    def _verify(self, tree, rng):
        path = ()
        while True:
            kids = self._children(tree, path)
            if not kids:
                return path, self.node.leaf_draw(tree.table.p(path), rng)
            t = self._plan(tree, path, kids).sample(np.asarray(kids), rng)
            if t not in kids:
                return path, t
            path = path + (t,)


def _first_copies(kids):
    """(token, index of its first copy) for each distinct child, in order of first appearance."""
    first: dict[int, int] = {}
    for j, t in enumerate(kids):
        first.setdefault(t, j)
    return first.items()


@dataclass(frozen=True)
class NaiveChain(TopDown):
    """Standard speculative sampling on the first path (DDTE's "Naive"): NaiveTree's node rule
    on each node's first child only."""

    name = "naive_chain"
    label = "first-path SD (DDTE's Naive)"
    node: NodeVerifier = field(default_factory=Naive)
    first_path_only: bool = True
