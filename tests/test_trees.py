"""Draft trees, shapes, and block efficiency: estimators agree, published values reproduce."""

from __future__ import annotations

import numpy as np
import pytest

import simlab
from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.efficiency import expected_block_efficiency
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.builders import MAX_TREES, Delayed, GreedyDraftTree, Static, chain, iid
from simlab.trees import DraftTree, NodeTable, parse_tuples
from simlab.verifiers.base import DISTINCT_LAWS
from variants import lossless_tree_names, renames_another
from tree_checks import check_estimates_agree, check_outcome_law_is_a_law, check_simulation_matches_exact

PAIR = MarkovPair.random(3, np.random.default_rng(11), concentration=0.8, closeness=0.4)
CONTEXT = (2,)
IID_SHAPES = [chain(3), iid(2, 2), Delayed(3, 1, 1)]
WOR_SHAPES = [chain(3), iid(2, 2, Drafting.WITHOUT_REPLACEMENT), Delayed(2, 1, 2, Drafting.WITHOUT_REPLACEMENT)]


GREEDY_DRAFT_SHAPES = [chain(3), GreedyDraftTree(budget=3, depth=1, top_k=2), GreedyDraftTree(budget=5, depth=2, top_k=2)]


def shapes(name: str) -> list:
    """The shapes a verifier is exercised on, by the drafting laws it declares lossless."""
    laws = tree_verifiers.get(name).lossless_for
    if Drafting.IID in laws or not laws:
        return IID_SHAPES
    return GREEDY_DRAFT_SHAPES if Drafting.MIXED in laws else WOR_SHAPES


def distinct_only(name: str) -> bool:
    """The node rule takes distinct children only (it refuses the repeats of i.i.d. trees)."""
    node = getattr(tree_verifiers.get(name), "node", None)
    return node is not None and node.drafting in DISTINCT_LAWS


def cases():
    for name in tree_verifiers.names():
        if renames_another(tree_verifiers.get(name)):  # exact_match: NSS's class, run as nss
            continue
        for shape in shapes(name):
            yield name, shape


@pytest.mark.parametrize("verifier, shape", list(cases()), ids=lambda x: str(x))
def test_exact_mc_and_simulation_agree(verifier, shape):
    """The estimators agree for every verifier (the rules lossless only for a greedy target, lossy
    on this T > 0 pair: ``greedy``, ``hsd_official``; and the declared-lossy rules, included)."""
    declared = tree_verifiers.get(verifier)
    verifier = tree_verifiers.get(verifier, allow_lossy=declared.needs_greedy_target or not declared.lossless_for)
    exact = expected_block_efficiency(PAIR, CONTEXT, shape, verifier)
    mc = expected_block_efficiency(PAIR, CONTEXT, shape, verifier, method="mc", samples=200, seed=3)
    check_estimates_agree(exact, mc)
    check_simulation_matches_exact(PAIR, CONTEXT, shape, verifier, steps=1500, seed=4)


def test_block_verification_toy_example():
    """Sun et al. 2024: p = (1/3, 2/3), q = (2/3, 1/3), gamma = 2: 10/9 vs 11/9 accepted drafts."""
    pair = ContextFreePair([1 / 3, 2 / 3], [2 / 3, 1 / 3])
    token_level = expected_block_efficiency(pair, (), chain(2), "naive_chain").mean - 1
    block = expected_block_efficiency(pair, (), chain(2), "bv").mean - 1
    assert token_level == pytest.approx(10 / 9, abs=1e-12)
    assert block == pytest.approx(11 / 9, abs=1e-12)


@pytest.mark.parametrize("length", [1, 2, 3])
def test_traversal_equals_block_verification_on_chains(length):
    table = NodeTable(PAIR, CONTEXT)
    for tree, _ in chain(length).enumerate(table):
        bv = tree_verifiers.get("bv").outcome_law(tree)
        tr = tree_verifiers.get("traversal").outcome_law(tree)
        zero = np.zeros(table.vocab_size)
        for path in set(bv) | set(tr):
            np.testing.assert_allclose(tr.get(path, zero), bv.get(path, zero), atol=1e-14)


@pytest.mark.parametrize("name", tree_verifiers.names())
def test_width_one_tree_equals_the_chain(name):
    declared = tree_verifiers.get(name)
    lossy = declared.needs_greedy_target or not declared.lossless_for  # greedy, hsd_official on this T > 0 pair; the lossy rules
    if name == "rrs_wor":
        a = expected_block_efficiency(PAIR, CONTEXT, iid(1, 3, Drafting.WITHOUT_REPLACEMENT), name).mean
    else:
        a = expected_block_efficiency(PAIR, CONTEXT, iid(1, 3), name, allow_lossy=lossy).mean
    # The same trees with the same probabilities (up to the rounding of the drafting law).
    assert a == pytest.approx(expected_block_efficiency(PAIR, CONTEXT, chain(3), name, allow_lossy=lossy).mean, abs=1e-14)
    table = NodeTable(PAIR, CONTEXT)
    wide = {tuple(sorted(t.children.items())): pr for t, pr in iid(1, 3).enumerate(table)}
    narrow = {tuple(sorted(t.children.items())): pr for t, pr in chain(3).enumerate(table)}
    assert wide == narrow


@pytest.mark.parametrize("name", [n for n in tree_verifiers.names() if not distinct_only(n)])
def test_outcome_laws_are_laws(name):
    table = NodeTable(PAIR, CONTEXT)
    for tree, _ in Delayed(2, 1, 2).enumerate(table):
        check_outcome_law_is_a_law(tree, tree_verifiers.get(name, allow_lossy=True))  # a law whether or not lossless


def test_accepted_length_distribution_and_block_efficiency():
    table = NodeTable(PAIR, CONTEXT)
    tree = iid(2, 3).sample(table, np.random.default_rng(0))
    verifier = tree_verifiers.get("specinfer")
    dist = verifier.accepted_length_distribution(tree)
    assert dist.shape == (tree.depth() + 1,) and dist.sum() == pytest.approx(1.0, abs=1e-12)
    assert verifier.expected_block_efficiency(tree) == pytest.approx(float(np.dot(np.arange(1, 5), dist)))


def test_no_draft_and_single_path_conventions():
    assert Delayed(3, 0, 0).tokens == 0
    assert expected_block_efficiency(PAIR, CONTEXT, Delayed(3, 0, 0), "specinfer").mean == 1.0
    table = NodeTable(PAIR, CONTEXT)
    tree = Delayed(4, 2, 0).sample(table, np.random.default_rng(0))
    assert len(tree.nodes()) == 3 and tree.depth() == 2  # K is irrelevant when L2 = 0
    tree = Delayed(3, 1, 2).sample(table, np.random.default_rng(1))
    trunk = tree.first_path()[:1]
    assert len(tree.child_list(())) == 1 and len(tree.child_list(trunk)) == 3


def test_duplicates_are_counted_not_dropped():
    pair = ContextFreePair([0.5, 0.5], [1.0, 0.0])  # every draft is token 0
    table = NodeTable(pair, ())
    tree = iid(3, 2).sample(table, np.random.default_rng(0))
    assert tree.child_list(()) == (0, 0, 0) and tree.child_list((0,)) == (0, 0, 0)
    assert tree.nodes() == [(), (0,), (0, 0)]


def test_tuple_notation_round_trip():
    spec = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    table = NodeTable(PAIR, CONTEXT)
    tree = Static(spec).sample(table)
    assert tree.to_tuples() == sorted(spec, key=lambda r: (len(r), r))
    q_root = table.q(())
    assert list(tree.child_list(())) == np.argsort(-q_root, kind="stable")[:2].tolist()


@pytest.mark.parametrize(
    "spec, message",
    [
        ([(1,)], "ranks"),
        ([(0, 0)], "no parent"),
        ([(0,), (0,)], "twice"),
        ([()], "non-empty"),
        ([(0,), (1.9,)], "rank 1.9, not an integer"),  # not truncated to (1,)
        ([(0,), (True,)], "not an integer"),
        ([3], "not a sequence"),
    ],
)
def test_bad_tuple_notation(spec, message):
    with pytest.raises(ValueError, match=f"^spec: .*{message}"):
        parse_tuples(spec)


@pytest.mark.parametrize(
    "kwargs, name", [(dict(K=0, L1=1, L2=1), "K"), (dict(K=1, L1=-1, L2=1), "L1"), (dict(K=1, L1=0, L2=1.5), "L2")]
)
def test_bad_shape(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        Delayed(**kwargs)


def test_bad_method_context_and_limits():
    with pytest.raises(ValueError, match="^method: "):
        expected_block_efficiency(PAIR, CONTEXT, chain(1), "nss", method="fast")
    with pytest.raises(ValueError, match="^context: "):
        expected_block_efficiency(PAIR, (7,), chain(1), "nss")
    with pytest.raises(ValueError, match="^samples: "):
        expected_block_efficiency(PAIR, CONTEXT, chain(1), "nss", method="mc", samples=0)
    with pytest.raises(ValueError, match="^name: "):
        expected_block_efficiency(PAIR, CONTEXT, chain(1), "bogus")
    big = ContextFreePair(np.full(20, 0.05), np.full(20, 0.05))
    with pytest.raises(ValueError, match=f"^shape: .*{MAX_TREES}"):
        expected_block_efficiency(big, (), iid(4, 3), "nss")


@pytest.mark.parametrize("context", [[0.5], ["1"], "12", [True]])
def test_contexts_must_be_integer_ids(context):
    with pytest.raises(ValueError, match="^context: "):
        expected_block_efficiency(PAIR, context, chain(1), "nss")


def test_bad_pair_shape_and_verifier_objects():
    with pytest.raises(ValueError, match="^shape: "):
        expected_block_efficiency(PAIR, CONTEXT, "delayed", "nss")
    with pytest.raises(ValueError, match="^verifier: "):
        expected_block_efficiency(PAIR, CONTEXT, chain(1), None)
    with pytest.raises(ValueError, match="^pair: "):
        expected_block_efficiency(None, CONTEXT, chain(1), "nss")
    with pytest.raises(ValueError, match="^vocab_size: "):
        MarkovPair.random(0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="^rng: "):
        MarkovPair.random(4, 0)


def test_three_line_notebook_cell():
    pair = MarkovPair.random(4, np.random.default_rng(0))
    e = simlab.expected_block_efficiency(pair, [0], simlab.Delayed(2, 1, 2), "specinfer")
    assert 1.0 <= e.mean <= 4.0


def _own_cut_offs(name: str) -> bool:
    """True when the verifier has its own ``block_efficiency_by_depth`` (found by override): the base
    method values each cut separately, so comparing it with separate trees compares it with itself."""
    return type(tree_verifiers.get(name)).block_efficiency_by_depth is not tree_verifiers.TreeVerifier.block_efficiency_by_depth


@pytest.mark.parametrize("name", [n for n in lossless_tree_names(Drafting.IID) if _own_cut_offs(n)])
def test_cut_offs_match_separate_trees(name):
    verifier = tree_verifiers.get(name)
    table = NodeTable(PAIR, CONTEXT)
    tree = Delayed(2, 1, 3).sample(table, np.random.default_rng(9))
    by_depth = verifier.block_efficiency_by_depth(tree, [0, 1, 2, 3, 4, 6])
    expected = [verifier.expected_block_efficiency(tree.truncate(d)) for d in [0, 1, 2, 3, 4, 6]]
    np.testing.assert_allclose(by_depth, expected, atol=1e-12)


def test_action_grid_is_unbiased_against_exact():
    from simlab.grid import action_grid_block_efficiency

    grid = action_grid_block_efficiency(
        PAIR, CONTEXT, "specinfer", K_values=(1, 2), L1_values=(0, 1), L2_values=(0, 1, 2), samples=300, seed=2
    )
    for (K, L1, L2), estimate in grid.items():
        exact = expected_block_efficiency(PAIR, CONTEXT, Delayed(K, L1, L2), "specinfer")
        check_estimates_agree(exact, estimate)


def test_action_grid_on_a_shared_table_equals_fresh_tables_and_evaluates_each_node_once():
    """One ``NodeTable`` passed to the grid of several verifiers (as ``compare_builders``' static fit
    does, on a kept-cache table for live models) draws the same trees as a fresh table per call, so
    every estimate is bit-identical, and a verifier's grid asked again fetches no node."""
    from simlab.grid import action_grid_block_efficiency

    axes = dict(K_values=(1, 2), L1_values=(0, 1), L2_values=(0, 2), samples=3, seed=5)
    shared = NodeTable(PAIR, CONTEXT)
    fetched = []
    fetch = shared.fetch

    def counting(paths):
        paths = [tuple(p) for p in paths]
        fetched.append(sum(not shared.known(p) for p in paths))
        return fetch(paths)

    shared.fetch = counting
    for i, name in enumerate(("specinfer", "traversal", "spectr", "specinfer")):
        fresh = action_grid_block_efficiency(PAIR, CONTEXT, name, **axes)
        before = sum(fetched)
        on_shared = action_grid_block_efficiency(PAIR, CONTEXT, name, table=shared, **axes)
        assert {a: (e.mean, e.stderr) for a, e in on_shared.items()} == {a: (e.mean, e.stderr) for a, e in fresh.items()}
        if i == 3:
            assert sum(fetched) == before  # the same trees again: every node is known already
    with pytest.raises(ValueError, match="table"):
        action_grid_block_efficiency(PAIR, [*CONTEXT, 1], "specinfer", table=shared, **axes)


@pytest.mark.parametrize(
    "law, kids",
    [
        (Drafting.REPEATED, (1, 2)),
        (Drafting.REPEATED, (1, 1, 2)),
        (Drafting.WITHOUT_REPLACEMENT, (1, 1)),
        (Drafting.DETERMINISTIC, (2, 0, 2)),
        (Drafting.MIXED, (0, 0)),
    ],
)
def test_a_child_list_its_law_cannot_produce_is_refused(law, kids):
    """Issue 28: such trees were built, and naive, bv and traversal verified them."""
    table = NodeTable(ContextFreePair([0.2, 0.3, 0.5], [0.4, 0.3, 0.3]), (0,))
    with pytest.raises(ValueError, match=r"children: node \(\) lists"):
        DraftTree(table, {(): kids}, drafting=law)
    with pytest.raises(ValueError, match=r"children: node \(0,\) lists"):  # a node law other than the tree's
        DraftTree(table, {(): (0,), (0,): kids}, drafting=Drafting.IID, node_laws={(0,): law})
    DraftTree(table, {(): kids}, drafting=Drafting.IID)  # i.i.d. children may be anything
    one = (kids[0],) * len(kids) if law is Drafting.REPEATED else tuple(dict.fromkeys(kids))
    DraftTree(table, {(): one}, drafting=law)  # what the law does produce
