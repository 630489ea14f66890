"""Every fast path refuses the invalid inputs the numpy reference refuses, with the same ValueError.

One table of invalid inputs at a root (a child with q = 0, negative / NaN / unnormalised p or q,
a child id out of range, rows of the wrong length, a child that is no token id), fed unchanged
(through a pair that returns them unvalidated) to every path that values children:

* ``reference``: ``grid_block_efficiency`` with the memoised numpy plans (what the others equal);
* ``stream``: ``grid_block_efficiency(stream=True)`` (``streamed_masses``);
* ``torch``: ``grid_block_efficiency(engine="torch")`` (``simlab.batched.table_masses``);
* ``labels``: ``simlab.labels.grid_labels`` with the torch engine (what a ``--labels`` capture
  stores, and so what a label-only replay reads back);
* ``logits``, ``logits+torch``: the same through a ``NodeTable(rows="logits")`` (inputs given as
  log p, log q);
* ``node``, ``batched``: one node, ``NodePlan.children_mass`` against ``simlab.batched.children_mass``.

Each path must raise ValueError carrying the reference's message (the problem and the argument it
names; a path's own location prefix, "X row 0: " or "p at node (): ", may come before it).
Logits cannot express every invalid row (log of an unnormalised row is valid logits; log of a
negative entry is NaN): the logits paths are fed what logits can carry, and refuse NaN as logits.
"""

from __future__ import annotations

import numpy as np
import pytest

from simlab import batched, verifiers
from simlab.grid import GridDraft, grid_block_efficiency
from simlab.labels import grid_labels
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

GOOD_P, GOOD_Q = np.array([0.2, 0.3, 0.5]), np.array([0.3, 0.3, 0.4])
CASES = {  # name -> (p, q, the root's children, the message the reference gives)
    "q = 0 child": (GOOD_P, np.array([0.5, 0.5, 0.0]), (2,), "children: token 2 has q = 0 and cannot have been drafted"),
    "q = 0 child of two": (GOOD_P, np.array([0.5, 0.5, 0.0]), (0, 2), "children: token 2 has q = 0 and cannot have been drafted"),
    "negative p": (np.array([-0.1, 0.6, 0.5]), GOOD_Q, (1,), "p at node (): contains negative entries (min -0.1)"),
    "negative q": (GOOD_P, np.array([0.6, 0.5, -0.1]), (1,), "q at node (): contains negative entries (min -0.1)"),
    "NaN p": (np.array([np.nan, 0.5, 0.5]), GOOD_Q, (1,), "p at node (): contains NaN or infinite entries"),
    "NaN q": (GOOD_P, np.array([0.5, np.nan, 0.5]), (1,), "q at node (): contains NaN or infinite entries"),
    "unnormalised p": (np.array([0.2, 0.3, 0.4]), GOOD_Q, (1,), "p at node (): sums to 0.9, not 1 within 1e-09"),
    "unnormalised q": (GOOD_P, np.array([0.2, 0.3, 0.6]), (1,), "q at node (): sums to 1.1, not 1 within 1e-09"),
    "child id out of range": (GOOD_P, GOOD_Q, (3,), "tree: node () has child 3, not a token id in [0, 3)"),
    "child not a token id": (GOOD_P, GOOD_Q, (1.0,), "tree: node () has child 1.0, not a token id in [0, 3)"),
    "rows of the wrong length": (np.full(4, 0.25), np.full(4, 0.25), (1,), "p at node (): has length 4, expected 3"),
}


class RowsPair:
    """Gives the same rows at every context, unvalidated (so the path under test must refuse them),
    as distributions or as logits (log p, log q) under T = 1."""

    settings = SamplingSettings()

    def __init__(self, p, q):
        self.p, self.q, self.vocab_size = p, q, 3

    def distributions(self, contexts):
        return np.tile(self.p, (len(contexts), 1)), np.tile(self.q, (len(contexts), 1))

    def node_logits(self, root, paths):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.tile(np.log(self.p), (len(paths), 1)), np.tile(np.log(self.q), (len(paths), 1))


def _grid(p, q, kids, rows="float64", **options):
    drafts = [GridDraft(0, (), tuple((t,) for t in kids))]
    table = NodeTable(RowsPair(p, q), (0,), rows=rows)
    return grid_block_efficiency(table, drafts, "naive", K_values=(len(kids),), L2_values=(1,), **options)


def _labels(p, q, kids):
    drafts = [GridDraft(0, (), tuple((t,) for t in kids))]
    return list(
        grid_labels(NodeTable(RowsPair(p, q), (0,)), drafts, ["naive"], K_values=(len(kids),), L2_values=(1,), engine="torch")
    )


def _node(p, q, kids):
    return verifiers.get("naive").prepare(p, q, len(kids)).children_mass(np.asarray(kids))


def _batched(p, q, kids):
    import torch

    P, Q = torch.tensor(np.atleast_2d(p)), torch.tensor(np.atleast_2d(q))
    return batched.children_mass(verifiers.get("naive"), P, Q, torch.tensor([list(kids)]))


PATHS = {
    "reference": lambda p, q, kids: _grid(p, q, kids),
    "stream": lambda p, q, kids: _grid(p, q, kids, stream=True),
    "torch": lambda p, q, kids: _grid(p, q, kids, engine="torch"),
    "labels": _labels,
    "logits": lambda p, q, kids: _grid(p, q, kids, rows="logits"),
    "logits+torch": lambda p, q, kids: _grid(p, q, kids, rows="logits", engine="torch"),
    "node": _node,
    "batched": _batched,
}
LOGITS_CANNOT_CARRY = {"negative p", "negative q", "unnormalised p", "unnormalised q"}  # log: NaN, or valid logits


def expected(case, path):
    """The message ``path`` must carry: the reference's, after the argument a node-level API names."""
    p, q, kids, message = CASES[case]
    if path in ("node", "batched"):
        argument = {"node": {"p": "p", "q": "q"}, "batched": {"p": "P row 0", "q": "Q row 0"}}[path]
        head, problem = message.split(": ", 1)
        if head.startswith("p at node"):
            return f"{argument['p']}: {problem}"
        if head.startswith("q at node"):
            return f"{argument['q']}: {problem}"
        if case == "child id out of range":
            return "children: token id 3 is outside [0, V) with V = 3"
        if case == "child not a token id":
            return "children: token ids must be integers" if path == "node" else "X: must be an [N, k >= 1] integer tensor"
        return message
    if path.startswith("logits") and case.startswith("NaN"):
        return "logits: contains NaN or +inf entries"
    if path.startswith("logits") and case == "rows of the wrong length":
        return "logits: must be (2, 3) arrays, got (2, 4) and (2, 4)"
    return message


def applies(case: str, path: str) -> bool:
    """Whether ``case`` can be fed to ``path`` at all: logits cannot carry a negative or
    unnormalised row (its log is NaN, or valid logits of another law), and a single node takes
    rows of any one V (there is no other length to compare with)."""
    if path.startswith("logits") and case in LOGITS_CANNOT_CARRY:
        return False
    return not (path in ("node", "batched") and case == "rows of the wrong length")


@pytest.mark.parametrize("case, path", [(c, p) for c in CASES for p in PATHS if applies(c, p)])
def test_every_fast_path_refuses_as_the_reference(case, path):
    p, q, kids, _ = CASES[case]
    with pytest.raises(ValueError) as refused:
        PATHS[path](p, q, kids)
    assert expected(case, path) in str(refused.value), f"{path}: {refused.value}"


def test_the_reference_takes_the_valid_inputs_every_path_takes():
    """The table's valid rows: every path values them, and alike (the refusals above are real)."""
    values = [
        _grid(GOOD_P, GOOD_Q, (0, 2), **options)[(2, 0, 1)].mean
        for options in ({}, {"stream": True}, {"engine": "torch"}, {"rows": "logits"})
    ]
    assert max(values) - min(values) <= 1e-12
    node = _node(GOOD_P, GOOD_Q, (0, 2))
    assert np.abs(_batched(GOOD_P, GOOD_Q, (0, 2)).numpy() - node).max() <= 1e-12


def test_the_torch_grid_refuses_the_impossible_draft_of_the_issue():
    """Issue 28: the torch engine valued a tree whose drafted child has q = 0 (E = 2 reported)."""
    with pytest.raises(ValueError, match="children: token 2 has q = 0 and cannot have been drafted"):
        _grid(GOOD_P, np.array([0.5, 0.5, 0.0]), (2,), engine="torch")


def test_deterministic_children_with_q_zero_are_valued_alike_by_every_path():
    """A deterministic node's children need not come from q: the laws carried by the mass requests
    make the streamed and torch paths accept what the reference accepts (a lossy pairing asked for)."""
    from simlab import tree_verifiers
    from simlab.batched import table_masses
    from simlab.drafting import Drafting
    from simlab.grid import streamed_masses
    from simlab.pairs import ContextFreePair
    from simlab.trees import DraftTree

    table = NodeTable(ContextFreePair(GOOD_P, [0.5, 0.5, 0.0]), (0,))
    tree = DraftTree(table, {(): (2,)}, drafting=Drafting.DETERMINISTIC)
    verifier = tree_verifiers.get("naive", allow_lossy=True)
    reference = verifier.expected_block_efficiency(tree)
    requests = verifier.mass_requests(tree)
    for masses in (streamed_masses(table, requests), table_masses(table, requests)):
        value = verifier.by_depth_from_masses(tree, [1], lambda path, kids: masses[(requests[0][1], path, tuple(kids))])[0]
        assert value == reference
