"""Every fast path agrees with a plain reference implementation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checks import applicable, check_children_mass, pairs
from tree_checks import law_block_efficiency
from simlab import tree_verifiers, verifiers
from simlab.distributions import inner, residual
from simlab.drafting import hit_probability
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.builders import Delayed, chain, iid
from simlab.trees import SPECULATIVE, NodeTable
from simlab.verifiers import get
from simlab.verifiers.khisti import _top_s
from simlab.verifiers.spectr import _p_acc, optimal_rho


def plain_bisection_rho(p, q, k, tol=1e-12):
    def g(rho):
        beta = np.minimum(q, p / rho).sum()
        return _p_acc(beta, k) - rho * beta

    lo, hi = 1.0, float(k)
    if k == 1 or g(lo) <= 8 * np.finfo(float).eps:
        return 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if g(mid) <= 0 else (mid, hi)
    return hi


def random_pairs(count, seed):
    rng = np.random.default_rng(seed)
    for i in range(count):
        vocab = int(rng.integers(2, 300))
        p, q = rng.dirichlet(np.full(vocab, 0.3)), rng.dirichlet(np.full(vocab, 0.3))
        if i % 4 == 0:
            q[rng.integers(vocab)] = 0.0
            q /= q.sum()
        yield p, q, int(rng.integers(1, 7))


def test_spectr_rho_matches_plain_bisection():
    for p, q, k in random_pairs(300, seed=1):
        assert optimal_rho(p, q, k) == pytest.approx(plain_bisection_rho(p, q, k), abs=1e-9)


def test_spectr_rho_makes_the_residual_valid():
    for p, q, k in random_pairs(100, seed=2):
        rho = optimal_rho(p, q, k)
        beta = np.minimum(q, p / rho).sum()
        c = _p_acc(beta, k) / beta if beta > 0 else k
        assert c <= rho * (1 + 1e-12)


def test_spectr_residual_needs_no_clipping_at_a_valid_rho():
    """The plan subtracts (c / rho) min(rho q, p): at c <= rho that is <= p in floating point, so
    the residual is nonnegative unclipped; its mass, its law and its entries at the children are
    one expression, so the law sums to 1 and agrees with the children's entries bit for bit."""
    clipped = 0
    for p, q, k in random_pairs(200, seed=4):
        for rho in ("optimal", "four_step"):
            plan = get("spectr", rho=rho).prepare(p, q, k)
            clipped += plan.c > plan.rho
            assert plan.c <= plan.rho * (1 + 4 * np.finfo(float).eps)
            unclipped = p - (plan.c / plan.rho) * np.minimum(plan.rho * q, p)
            if plan.c <= plan.rho:
                assert unclipped.min() >= 0.0
            if plan.excess > 0.0:
                tokens = np.arange(p.size)
                np.testing.assert_array_equal(plan._correction_at(tokens), plan.correction)
                assert plan.correction.sum() == pytest.approx(1.0, abs=1e-12)
                assert plan.excess == pytest.approx(np.maximum(unclipped, 0.0).sum(), abs=1e-15)
    assert clipped <= 20  # rounding only (an ulp of c); the planted rho = 1 fault clips at will


def test_specinfer_closed_form_chain_matches_iterated_residuals():
    for p, q, k in random_pairs(100, seed=3):
        plan = get("specinfer").prepare(p, q, k)
        current = p
        tokens = np.arange(p.size)
        for trial in range(k):
            if plan.reject_all == 0.0:
                break
            np.testing.assert_allclose(plan.target_at(trial, tokens), current, atol=1e-12)
            current = residual(current, q)
        else:
            np.testing.assert_allclose(plan.final, current, atol=1e-12)


def test_hit_probability_matches_the_formula():
    q = np.random.default_rng(4).dirichlet(np.ones(50))
    for n in range(8):
        np.testing.assert_allclose(hit_probability(q, n), 1 - (1 - q) ** n, atol=1e-15)


def test_top_s_matches_a_stable_sort():
    rng = np.random.default_rng(5)
    for _ in range(50):
        vocab = int(rng.integers(6, 100))
        p, c, q = (rng.dirichlet(np.ones(vocab)) for _ in range(3))
        p[: vocab // 3] = p[0]  # ties
        key = p - c * q
        expected = np.argsort(-key, kind="stable")[:5]
        assert _top_s(p, c, q, 5).tolist() == expected.tolist()


# -- children-only branch mass, the shared single-child plan, prepared-once inputs (issue 16) -----


NODE_VERIFIERS = [verifiers.get(n) for n in verifiers.names()] + [
    verifiers.get("specinfer", order="fixed"),
    verifiers.get("spectr", rho="four_step"),
    verifiers.get("khisti", mode="truncated", s=2),
]
EDGES = [
    ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
    ([0.0, 1.0, 0.0, 0.0], [0.4, 0.3, 0.2, 0.1]),
    ([0.4, 0.3, 0.2, 0.1], [0.0, 0.0, 1.0, 0.0]),
    ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.3, 0.7]),
    ([0.3, 0.3, 0.4], [0.0, 0.5, 0.5]),
    ([1.0, 1e-300, 1e-300, 0.0], [0.5, 0.5, 1e-300, 1e-300]),
    ([0.25, 0.25, 0.25, 0.25], [1.0, 1e-300, 1e-300, 1e-300]),
    ([0.4, 0.4, 0.2], [0.4, 0.2, 0.4]),  # ties
]


@pytest.mark.parametrize("verifier", NODE_VERIFIERS, ids=lambda v: repr(v))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_children_mass_equals_the_full_law_on_edge_cases(verifier, k):
    for p, q in EDGES:
        p, q = np.array(p), np.array(q)
        if applicable(verifier, q, k, p):
            check_children_mass(verifier, p, q, k)


@pytest.mark.parametrize("verifier", NODE_VERIFIERS, ids=lambda v: repr(v))
@settings(max_examples=25, deadline=None)
@given(pq=pairs(), k=st.integers(1, 3))
def test_children_mass_equals_the_full_law(verifier, pq, k):
    p, q = pq
    if applicable(verifier, q, k, p):
        check_children_mass(verifier, p, q, k)


def test_children_mass_at_a_large_vocabulary():
    rng = np.random.default_rng(11)
    p, q = rng.dirichlet(np.full(5000, 0.1)), rng.dirichlet(np.full(5000, 0.1))
    for name in ("nss", "naive", "spectr", "specinfer"):
        for k in (1, 2, 4):
            plan = verifiers.get(name).prepare(p, q, k)
            for _ in range(5):
                x = rng.choice(p.size, size=k, p=q)
                np.testing.assert_allclose(plan.children_mass(x), plan.output_distribution(x)[x], rtol=0, atol=1e-12)


SPECULATIVE_AT_ONE = [v for v in NODE_VERIFIERS if v.speculative_at_one]


def test_the_declared_speculative_verifiers():
    assert {v.name for v in SPECULATIVE_AT_ONE} == {"naive", "spectr", "specinfer", "rrs_wor", "ot_walk", "ot_exact"}


@pytest.mark.parametrize("verifier", SPECULATIVE_AT_ONE, ids=lambda v: repr(v))
@settings(max_examples=25, deadline=None)
@given(pq=pairs())
def test_speculative_at_one_is_speculative_sampling(verifier, pq):
    """What ``speculative_at_one`` declares: with one child the law is NaiveTree's, to 1e-12."""
    p, q = pq
    own, shared = verifier.prepare(p, q, 1), SPECULATIVE.prepare(p, q, 1)
    for x in np.flatnonzero(q > 0):
        np.testing.assert_allclose(own.output_distribution([x]), shared.output_distribution([x]), rtol=0, atol=1e-12)


def test_single_child_nodes_share_one_plan():
    table = NodeTable(MarkovPair.random(4, np.random.default_rng(2)), (0,))
    plans = {table.plan(verifiers.get(n), (), 1) for n in ("naive", "spectr", "specinfer", "rrs_wor")}
    assert len(plans) == 1 and table.plan(verifiers.get("nss"), (), 1) not in plans
    assert table.plan(verifiers.get("spectr"), (), 2) is not table.plan(verifiers.get("specinfer"), (), 2)


@pytest.mark.parametrize("name", ["nss", "naive", "spectr", "specinfer", "khisti", "naive_chain", "optimal", "traversal"])
@pytest.mark.parametrize("eos", [None, 1])
def test_topdown_block_efficiency_from_children_mass_equals_the_outcome_law(name, eos):
    """The fast E[tau + 1 | tree] (children masses only; Traversal's mass recursion) against the
    outcome-law reference."""
    base = MarkovPair.random(4, np.random.default_rng(5), concentration=0.6, closeness=0.4)
    pair = MarkovPair(base.target, base.draft, eos_id=eos)
    verifier = tree_verifiers.get(name)
    rng = np.random.default_rng(6)
    for shape in (chain(3), iid(3, 2), Delayed(3, 1, 2), Delayed(2, 2, 1)):
        for _ in range(4):
            tree = shape.sample(NodeTable(pair, (0,)), rng)
            fast = verifier.expected_block_efficiency(tree)
            reference = law_block_efficiency(verifier, tree)
            assert abs(fast - reference) <= 1e-12, (name, shape, fast, reference)


def test_inner_equals_the_dot_product():
    a, b = np.random.default_rng(3).random((2, 1000))
    assert inner(a, b) == pytest.approx(float(np.dot(a, b)), rel=1e-14)


def test_spectr_rho_is_one_for_equal_distributions_at_large_vocabularies():
    """p == q: beta(1) = sum p exactly (pairwise sums), so rho* = 1 and every child is accepted."""
    for vocab in (5000, 128_000):
        p = np.full(vocab, 1 / vocab)
        for k in (2, 5):
            assert optimal_rho(p, p.copy(), k) == 1.0
    mass = verifiers.get("spectr").prepare(np.full(5000, 1 / 5000), np.full(5000, 1 / 5000), 5).children_mass([0, 1, 2, 3, 4])
    np.testing.assert_array_equal(mass, [1.0, 0, 0, 0, 0])


def test_spectr_rho_shortcut_agrees_with_plain_bisection_near_its_threshold():
    """The rho = 1 shortcut uses the same p_acc as the plain bisection (review: b near 1.75e-15 flipped).
    Overlaps of 1e-14 and below leave g flat at rounding level (rho* ill-conditioned; both paths
    give valid laws there, differing on masses of that size), so they are not compared."""
    for b in (1.70e-15, 1.72e-15, 1.75e-15, 1e-12, 1e-9, 1e-6):
        p, q = np.array([b, 1 - b, 0.0]), np.array([b, 0.0, 1 - b])
        assert optimal_rho(p, q, 2) == pytest.approx(plain_bisection_rho(p, q, 2), abs=1e-9), b


@pytest.mark.parametrize("name", ["spectr", "specinfer"])
def test_a_child_with_zero_draft_mass_is_refused_not_nan(name):
    """A deterministic child with q = 0 (a lossy pairing asked for explicitly) cannot be tested by p / q."""
    plan = verifiers.get(name).prepare([0.5, 0.5, 0.0], [0.5, 0.5, 0.0], 2, law=verifiers.base.Drafting.DETERMINISTIC)
    with pytest.raises(ValueError, match="children"):
        plan.output_distribution([0, 2])
    with pytest.raises(ValueError, match="children"):
        plan.children_mass([0, 2])


def _check_traversal_masses(tree):
    """Traversal's mass recursion against its outcome law: per accepted path, P(tau = j), E."""
    from simlab.tree_verifiers.base import accepted_lengths

    verifier = tree_verifiers.get("traversal")
    law = {path: float(vector.sum()) for path, vector in verifier.outcome_law(tree).items()}
    masses = verifier.accept_masses(tree)
    for path in set(law) | set(masses):  # a path one of them gives a rounding-level mass may be absent from the other
        assert abs(masses.get(path, 0.0) - law.get(path, 0.0)) <= 1e-12, (path, masses.get(path), law.get(path))
    np.testing.assert_allclose(
        verifier.accepted_length_distribution(tree),
        accepted_lengths(verifier.outcome_law(tree), tree.depth()),
        rtol=0,
        atol=1e-12,
    )
    assert abs(verifier.expected_block_efficiency(tree) - law_block_efficiency(verifier, tree)) <= 1e-12


def _distinct_tree(pair, kids_of, drafting):
    from simlab.trees import DraftTree

    return DraftTree(NodeTable(pair, (0,)), {path: tuple(kids) for path, kids in kids_of.items() if kids}, drafting=drafting)


@given(pq=pairs(max_vocab=5), data=st.data())
@settings(max_examples=80, deadline=None)
def test_traversal_masses_equal_the_outcome_law(pq, data):
    """Trees of distinct children up to depth 3 (often every token with q > 0 at a node, so the
    draft's mass runs out), on pairs with exact zeros, ties and small masses."""
    from simlab.drafting import Drafting
    from simlab.pairs import ContextFreePair

    p, q = pq
    support = [int(t) for t in np.flatnonzero(q > 0)]
    kids_of, frontier = {}, [()]
    for _ in range(data.draw(st.integers(1, 3))):
        nxt = []
        for path in frontier:
            kids = data.draw(st.permutations(support))[: data.draw(st.integers(0, len(support)))]
            kids_of[path] = kids
            nxt += [path + (t,) for t in kids]
        frontier = nxt[:4]
    _check_traversal_masses(_distinct_tree(ContextFreePair(p, q), kids_of, Drafting.WITHOUT_REPLACEMENT))


@pytest.mark.parametrize("case", ["p == q", "one-hot p", "one-hot q", "disjoint", "tiny masses", "ties"])
def test_traversal_masses_on_edge_cases(case):
    from simlab.drafting import Drafting
    from simlab.pairs import ContextFreePair

    base = np.array([0.4, 0.3, 0.2, 0.1])
    p, q = {
        "p == q": (base, base),
        "one-hot p": (np.array([0, 1.0, 0, 0]), base),
        "one-hot q": (base, np.array([0, 0, 1.0, 0])),
        "disjoint": (np.array([0.5, 0.5, 0, 0]), np.array([0, 0, 0.5, 0.5])),
        "tiny masses": (np.array([1 - 3e-15, 1e-15, 1e-15, 1e-15]), np.array([1e-15, 1 - 3e-15, 1e-15, 1e-15])),
        "ties": (np.full(4, 0.25), np.array([0.25, 0.25, 0.25, 0.25])),
    }[case]
    support = [int(t) for t in np.flatnonzero(q > 0)]
    kids_of = {(): support, **{(t,): support[::-1] for t in support}}  # every drafted token, twice deep
    _check_traversal_masses(_distinct_tree(ContextFreePair(p, q), kids_of, Drafting.WITHOUT_REPLACEMENT))
    _check_traversal_masses(_distinct_tree(ContextFreePair(p, q), {(): support[:1], (support[0],): support[:1]}, Drafting.IID))


@pytest.mark.parametrize("name", ["nss", "naive", "spectr", "specinfer", "khisti", "optimal", "traversal"])
def test_streamed_grid_equals_the_memoised_grid_bit_for_bit(name):
    """grid_block_efficiency(stream=True): node by node, no plan kept; the same numbers exactly
    (Traversal, not top-down, ignores the flag)."""
    from simlab.grid import draw_grid, grid_block_efficiency

    pair = MarkovPair.random(6, np.random.default_rng(8), concentration=0.6, closeness=0.4)
    drafts = draw_grid(NodeTable(pair, (0,)), K_max=3, L1_values=(0, 1, 2), L2_max=3, samples=2, rng=np.random.default_rng(9))
    verifier = tree_verifiers.get(name)
    options = dict(K_values=(1, 2, 3), L2_values=(0, 1, 2, 3))
    memoised = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, **options)
    streamed = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, stream=True, **options)
    assert memoised.keys() == streamed.keys()
    assert all(memoised[a].mean == streamed[a].mean for a in memoised)


@pytest.mark.parametrize("name", ["nss", "naive", "spectr", "specinfer", "khisti", "naive_chain", "optimal", "rrs_wor"])
@pytest.mark.parametrize("eos", [None, 2])
@pytest.mark.parametrize("trunk", ["shared", "per_path"])
def test_grouped_grid_equals_the_reference_grid_bit_for_bit(name, eos, trunk):
    """The default grid (trees built once per draw, each distinct (node, children) request once, a
    node's child lists in one vectorised call) against the plain per-tree path: the same bits."""
    from simlab.grid import draw_grid, grid_block_efficiency

    base = MarkovPair.random(6, np.random.default_rng(8), concentration=0.6, closeness=0.4)
    pair = MarkovPair(base.target, base.draft, eos_id=eos)
    drafts = draw_grid(NodeTable(pair, (0,)), K_max=3, L1_values=(0, 1, 2), L2_max=3, samples=3, rng=np.random.default_rng(9))
    verifier = tree_verifiers.get(name, allow_lossy=True)
    options = dict(K_values=(1, 2, 3), L2_values=(0, 1, 2, 3), trunk_children=trunk)
    try:
        reference = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, engine="reference", **options)
    except ValueError as exc:  # e.g. repeated children for RRS without replacement: refused alike
        with pytest.raises(ValueError, match=str(exc).split(":")[0]):
            grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, **options)
        return
    grouped = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, **options)
    assert grouped.keys() == reference.keys()
    assert all(
        grouped[a].mean == reference[a].mean
        and grouped[a].stderr == reference[a].stderr
        or np.isnan(grouped[a].stderr)
        and np.isnan(reference[a].stderr)
        for a in grouped
    )


GRID_METRIC_CASES = [
    ("nss", "numpy"),  # simlab.reach_grid
    ("nss", "reference"),
    ("specinfer", "numpy"),  # grouped masses
    ("spectr", "stream"),
    ("specinfer", "torch"),  # simlab.batched
    ("naive", "torch"),
    ("naive_chain", "numpy"),
    ("khisti", "numpy"),  # not top-down: one accept_masses per cut
    ("traversal", "numpy"),
]


@pytest.mark.parametrize("name, engine", GRID_METRIC_CASES)
@pytest.mark.parametrize("eos", [None, 2])
def test_grid_metrics_equal_the_engine_metrics_of_the_same_trees(name, engine, eos):
    """``grid_metrics``' accepted and P(tau >= j) of every action are the means over its drafts of
    ``engine_metrics.tree_metrics`` of the very trees (each cut at L1 + L2), and its E is
    ``grid_block_efficiency``'s bit for bit, for each engine path (EOS counted as the engines do)."""
    if engine == "torch":
        pytest.importorskip("torch")
    _check_grid_metrics(name, engine, eos)


def _check_grid_metrics(name, engine, eos, trunk="shared", device=None):
    from simlab.engine_metrics import tree_metrics
    from simlab.grid import _draft_trees, draw_grid, grid_block_efficiency, grid_metrics

    base = MarkovPair.random(5, np.random.default_rng(8), concentration=0.6, closeness=0.4)
    pair = MarkovPair(base.target, base.draft, eos_id=eos)
    drafts = draw_grid(NodeTable(pair, (0,)), K_max=3, L1_values=(0, 2), L2_max=3, samples=2, rng=np.random.default_rng(9))
    verifier = tree_verifiers.get(name, allow_lossy=True)
    options = dict(K_values=(1, 3), L2_values=(0, 1, 3), trunk_children=trunk, device=device)
    options.update(stream=True) if engine == "stream" else options.update(engine=engine)
    metrics = grid_metrics(NodeTable(pair, (0,)), drafts, verifier, **options)
    plain = grid_block_efficiency(NodeTable(pair, (0,)), drafts, verifier, **options)
    table = NodeTable(pair, (0,))
    for (K, L1, L2), m in metrics.items():
        assert m.E == plain[(K, L1, L2)]
        trees = [_draft_trees(table, d, [K], trunk == "per_path")[K].truncate(L1 + L2) for d in drafts if d.L1 == L1]
        exact = [tree_metrics(tree, verifier) for tree in trees]
        assert m.unconditional.shape == (L1 + L2,)
        np.testing.assert_allclose(m.unconditional, np.mean([e.unconditional for e in exact], axis=0), rtol=0, atol=1e-12)
        np.testing.assert_allclose(m.accepted, np.mean([e.accepted for e in exact]), rtol=0, atol=1e-12)
        np.testing.assert_allclose(m.E.mean, np.mean([e.accept_length for e in exact]), rtol=0, atol=1e-12)
    if eos is not None:  # an accepted EOS occurs (E[tau + 1] - E[tau] = P(no EOS accepted) < 1): the case is exercised
        assert any(m.E.mean - m.accepted < 1 - 1e-3 for m in metrics.values())


def test_grid_metrics_with_repeated_trunk_children_equal_the_engine_metrics():
    """The DDTE audit's convention (each trunk node lists its child K times)."""
    _check_grid_metrics("specinfer", "numpy", 2, trunk="per_path")
    _check_grid_metrics("nss", "reference", None, trunk="per_path")


def test_grid_metrics_agreement_catches_a_dropped_eos():
    """The agreement check fails when the fast grid leaves an accepted EOS out of its position."""
    from simlab import reach_grid

    grid_values = reach_grid.grid_values

    def without_eos(table, drafts, K_values, L2_values, positions=False):
        out = grid_values(table, drafts, K_values, L2_values, positions=positions)
        if positions:
            return out[0], grid_values(
                NodeTable(MarkovPair(table.pair.target, table.pair.draft), (0,)), drafts, K_values, L2_values, True
            )[1]
        return out

    with pytest.MonkeyPatch.context() as m:
        m.setattr(reach_grid, "grid_values", without_eos)
        with pytest.raises(AssertionError):
            _check_grid_metrics("nss", "numpy", 2)


def test_grid_metrics_agreement_catches_a_dropped_eos_in_the_tree_walk(monkeypatch):
    """... and when the tree walk (``TopDown.by_depth_from_masses``) leaves it out."""
    from simlab.tree_verifiers.topdown import TopDown

    walk = TopDown.by_depth_from_masses

    def without_eos(self, tree, depths, mass_of, positions=False):
        values = walk(self, tree, depths, mass_of)
        return (values, np.diff(walk(self, tree, range(tree.depth() + 1), mass_of))) if positions else values

    monkeypatch.setattr(TopDown, "by_depth_from_masses", without_eos)
    with pytest.raises(AssertionError):
        _check_grid_metrics("specinfer", "numpy", 2)


@pytest.mark.parametrize("per_path", [False, True])
def test_draft_trees_are_the_delayed_trees(per_path):
    from simlab.grid import _draft_trees, draw_grid

    table = NodeTable(MarkovPair.random(5, np.random.default_rng(3)), (0,))
    for draft in draw_grid(table, K_max=4, L1_values=(0, 2), L2_max=3, samples=2, rng=np.random.default_rng(4)):
        built = _draft_trees(table, draft, (3, 1, 4, 2), per_path)
        for K in (1, 2, 3, 4):
            expected = Delayed.build(table, draft.trunk, draft.branches[:K], repeats=K if per_path else 1)
            assert built[K].children == expected.children and built[K].node_laws == expected.node_laws
            assert built[K].drafting == expected.drafting


def test_a_bad_child_list_is_refused_by_the_grouped_grid():
    """The grid's drafts are public inputs: a child the table's q cannot have drawn is refused
    (validated once per node and child lists, not skipped)."""
    from simlab.grid import GridDraft, grid_block_efficiency

    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.4, 0.0])
    table = NodeTable(ContextFreePair(p, q), (0,))
    drafts = [GridDraft(1, (0,), ((1, 0), (2, 1)))]
    with pytest.raises(ValueError, match="q = 0"):
        grid_block_efficiency(table, drafts, "specinfer", K_values=(1, 2), L2_values=(0, 1, 2))
    for name in ("specinfer", "nss"):  # NSS's grid (simlab.reach_grid) refuses alike, before any mass
        with pytest.raises(ValueError, match="token 2 has q = 0"):
            grid_block_efficiency(table, drafts, name, K_values=(1, 2), L2_values=(0, 1, 2))
        with pytest.raises(ValueError, match="not a token id"):
            grid_block_efficiency(table, [GridDraft(1, (0,), ((1, 7), (1, 1)))], name, K_values=(1, 2), L2_values=(0, 1, 2))
        with pytest.raises(ValueError, match="not a token id"):
            grid_block_efficiency(table, [GridDraft(1, (True,), ((1, 0), (1, 1)))], name, K_values=(1, 2), L2_values=(0, 1))
        with pytest.raises(ValueError, match="not a token id"):
            grid_block_efficiency(table, [GridDraft(1, (0,), ((1, 0), (1.0, 1)))], name, K_values=(1, 2), L2_values=(0, 1))


@pytest.mark.parametrize("verifier", NODE_VERIFIERS, ids=lambda v: repr(v))
def test_check_children_rows_refuses_what_check_children_refuses(verifier):
    p, q = np.array([0.4, 0.3, 0.2, 0.1]), np.array([0.5, 0.0, 0.3, 0.2])
    plan = verifier.prepare(p, q, 2)
    for rows in ([[0, 2], [2, 2]], [[0, 2], [0, 1]], [[0, 4], [0, 2]], [[2, 0], [-1, 0]], [[0.0, 2.0]], [[0, 2, 3]], [0, 2]):
        try:
            expected = [plan.check_children(x) for x in np.atleast_2d(rows)] if np.ndim(rows) == 2 else None
        except ValueError:
            expected = None
        if expected is None:
            with pytest.raises(ValueError, match="children"):
                plan.check_children_rows(rows)
        else:
            assert np.array_equal(plan.check_children_rows(rows), np.array(expected))


def test_has_excess_is_a_positive_residual_mass():
    from simlab.verifiers.speculative import _BLOCK, SingleDraft

    rng = np.random.default_rng(12)
    q = rng.dirichlet(np.full(3 * _BLOCK + 5, 0.5))
    late = q.copy()
    late[:-3] *= 1 - 1e-12  # p below q everywhere but in the last block
    late[-3:] += (1 - late.sum()) / 3
    for p in (q, q * (1 - 1e-12), late, rng.dirichlet(np.full(q.size, 0.5))):
        single = SingleDraft(p, q)
        assert single.has_excess == (SingleDraft(p, q).excess > 0.0)


def test_one_child_masses_when_p_is_below_q_everywhere():
    """Z = 0 with a(x) < 1: the one-child shortcut must not apply (the correction is p there); the
    check fails on a planted fault that ignores Z = 0."""
    from simlab.verifiers.speculative import SingleDraft

    q = np.array([0.2, 0.3, 0.5])
    p = q * (1 - 1e-11)
    x = np.array([0, 1, 2])

    def agrees(single):
        return np.array_equal(single.masses_at(x, x[:, None])[:, 0], [single.mass_at(int(t), np.array([t]))[0] for t in x])

    assert agrees(SingleDraft(p, q))
    broken = SingleDraft(p, q)
    broken.has_excess = True  # planted: the shortcut taken whatever Z
    assert not agrees(broken)


def _exact_traversal(tree) -> dict:
    """Traversal's acceptance masses in rational arithmetic (an independent transcription of the
    algorithm in simlab.tree_verifiers.traversal's docstring): the reference of both float paths."""
    from fractions import Fraction

    kids = {path: list(dict.fromkeys(tree.child_list(path))) for path in tree.nodes()}
    target = {u: [Fraction(float(x)) for x in tree.table.p(u)] for u in kids}
    draft = {u: [Fraction(float(x)) for x in tree.table.q(u)] for u in kids}
    weight = {(): Fraction(1)}

    def reweight(u):
        for t in kids[u]:
            weight[u + (t,)] = min(Fraction(1), weight[u] * target[u][t] / draft[u][t])
            reweight(u + (t,))

    reweight(())
    out, reach = {}, Fraction(1)
    while reach > 0:
        v = ()
        while kids[v]:
            v = v + (kids[v][0],)
        accept = Fraction(1) if v == () else weight[v]
        if accept > 0:
            out[v] = out.get(v, 0) + reach * accept
        if v == ():
            break
        reach *= 1 - accept
        u, t, w = v[:-1], v[-1], weight[v[:-1]]
        excess = [max(w * a - b, Fraction(0)) for a, b in zip(target[u], draft[u])]
        s = sum(excess)
        if s > 0:
            target[u] = [e / s for e in excess]
        rest = [Fraction(0) if i == t else b for i, b in enumerate(draft[u])]
        total = sum(rest)
        draft[u] = [b / total for b in rest] if total > 0 else rest
        if u != () and s + 1 - w > 0:
            weight[u] = s / (s + 1 - w)
        kids[u].remove(t)
        reweight(u)
    return {v: float(m) for v, m in out.items()}


@pytest.mark.parametrize("seed", range(3))
def test_both_traversal_paths_equal_rational_arithmetic(seed):
    """The reference recursion and the mass recursion against exact rational arithmetic, on
    trees of distinct children drawn from q (softmaxes of Gaussian logits, greedy or tempered
    targets): 1e-12."""
    from simlab.drafting import Drafting
    from simlab.sampling import SamplingSettings
    from simlab.trees import DraftTree

    verifier, rng = tree_verifiers.get("traversal"), np.random.default_rng(seed)
    for _ in range(12):
        n = int(rng.integers(3, 7))
        logits = rng.standard_normal((n, n)) * rng.choice([1.0, 3.0, 6.0])
        target = SamplingSettings(float(rng.choice([0.0, 0.5, 1.0]))).probabilities(logits)
        draft = SamplingSettings().probabilities(logits + rng.standard_normal((n, n)) * rng.choice([0.3, 1.0, 3.0]))
        table = NodeTable(MarkovPair(target, draft), (0,))
        kids_of, frontier = {}, [()]
        for _ in range(int(rng.integers(1, 4))):
            nxt = []
            for path in frontier:
                q = table.q(path)
                size = min(int(rng.integers(1, n)), int((q > 0).sum()))
                kids_of[path] = tuple(int(t) for t in rng.choice(n, size=size, replace=False, p=q))
                nxt += [path + (t,) for t in kids_of[path]]
            frontier = [nxt[i] for i in rng.permutation(len(nxt))[:3]]
        tree = DraftTree(table, kids_of, drafting=Drafting.WITHOUT_REPLACEMENT)
        exact = _exact_traversal(tree)
        law = {path: float(v.sum()) for path, v in verifier.outcome_law(tree).items()}
        masses = verifier.accept_masses(tree)
        for path in set(exact) | set(law) | set(masses):
            assert abs(law.get(path, 0.0) - exact.get(path, 0.0)) <= 1e-12, ("law", path)
            assert abs(masses.get(path, 0.0) - exact.get(path, 0.0)) <= 1e-12, ("masses", path)


def test_traversal_weight_update_keeps_a_small_excess():
    """s / (s + (1 - w)) with w = 1 and s far below one ulp of 1 (a greedy target, a draft with
    tiny masses): the weight stays 1, as in exact arithmetic; s + 1 - w rounded it to ~5e11."""
    from simlab.drafting import Drafting
    from simlab.pairs import ContextFreePair
    from simlab.trees import DraftTree

    q = np.array([0.99882379, 1.35e-12, 0.00117584, 9.48e-11, 3.63e-07])
    q = q / q.sum()
    tree = DraftTree(
        NodeTable(ContextFreePair(np.array([1.0, 0, 0, 0, 0]), q), (0,)),
        {(): (0,), (0,): (2, 3, 4, 1)},
        drafting=Drafting.WITHOUT_REPLACEMENT,
    )
    verifier = tree_verifiers.get("traversal")
    assert _exact_traversal(tree) == {(0,): 1.0}
    assert verifier.accept_masses(tree) == {(0,): 1.0}
    assert {path: float(v.sum()) for path, v in verifier.outcome_law(tree).items()} == {(0,): 1.0}
    assert verifier.expected_block_efficiency(tree) == 2.0


def _walk(table, path, length, rng):
    """``length`` tokens below ``path``, each drawn from q (a child q can have drawn)."""
    from simlab.distributions import sample_categorical

    for _ in range(length):
        path = path + (sample_categorical(table.q(path), rng),)
    return path


def _reach_grid_agrees(V, eos, seed=5) -> bool:
    """``reach_grid.grid_values`` against the tree walk (``TopDown.block_efficiency_by_depth`` on the
    grid's delayed trees) at every cut-off down to the longest branch, bit for bit: hand-built drafts
    with trunks of 0-2 tokens (L1 = the trunk's length or not), 1-6 branches of 0-4 tokens."""
    from simlab import reach_grid
    from simlab.grid import GridDraft, _draft_trees

    rng = np.random.default_rng(seed)
    base = MarkovPair.random(V, rng, closeness=0.5)
    table = NodeTable(MarkovPair(base.target, base.draft, eos_id=eos), (0,))
    drafts = []
    for _ in range(200):
        trunk = _walk(table, (), int(rng.integers(0, 3)), rng)
        lengths = [int(rng.integers(1, 5)) if rng.random() > 0.1 else 0 for _ in range(int(rng.integers(1, 7)))]
        branches = tuple(_walk(table, trunk, n, rng)[len(trunk) :] for n in lengths)
        drafts.append(GridDraft(len(trunk) - int(rng.integers(0, 2)) if trunk else 0, trunk, branches))
    K_values, L2_values = (3, 1, 6, 2, 4), range(7)
    fast, reached = reach_grid.grid_values(NodeTable(table.pair, (0,)), drafts, K_values, L2_values, positions=True)
    walk = tree_verifiers.get("nss")
    for d, draft in enumerate(drafts):
        trees = _draft_trees(table, draft, K_values, per_path=False)
        for j, K in enumerate(K_values):
            depths = [draft.L1 + L2 for L2 in L2_values]
            if not np.array_equal(fast[d, j], walk.block_efficiency_by_depth(trees[K], depths)):
                return False
            # P(tau >= j) of the uncut tree (EOS at its position): the walk's, to rounding
            tree_reach = walk.positions_by_depth(trees[K], [trees[K].depth()])[1][0]
            if (
                not np.allclose(reached[d, j, : tree_reach.size], tree_reach, rtol=0, atol=1e-12)
                or reached[d, j, tree_reach.size :].any()
            ):
                return False
    return True


@pytest.mark.parametrize("V", [3, 12])
@pytest.mark.parametrize("eos", [None, 1])
def test_reach_grid_equals_the_tree_walk_bit_for_bit(V, eos):
    """NSS's grid without trees (``simlab.reach_grid``): duplicated children (V = 3), many nodes per
    depth (V = 12: the walk's summation order matters to the last bit), EOS, uneven branches."""
    assert _reach_grid_agrees(V, eos)


def test_reach_grid_agreement_catches_planted_faults(monkeypatch):
    """The agreement test fails when a node is counted at every copy, or when a depth's nodes are
    added left to right instead of in the walk's order."""
    from simlab import reach_grid

    with monkeypatch.context() as m:
        m.setattr(
            reach_grid, "first_copies", lambda tokens: np.broadcast_to(np.arange(tokens.shape[1])[None, :, None], tokens.shape)
        )
        assert not _reach_grid_agrees(3, None)
    with monkeypatch.context() as m:
        walk_order = reach_grid.walk_order
        m.setattr(reach_grid, "walk_order", lambda first: walk_order(first)[:, ::-1])
        assert not _reach_grid_agrees(12, None)


def test_branch_is_target_declares_p_for_every_child_list():
    """What ``branch_is_target`` declares (the NSS grid relies on it): B(x, .) = p for every child
    list, and lossless for every drafting law."""
    from simlab.verifiers.base import ALL_LAWS

    declared = [v for v in NODE_VERIFIERS if v.branch_is_target]
    assert {v.name for v in declared} == {"nss", "exact_match"}  # exact_match is NSS's class under the engines' name
    p, q = np.array([0.4, 0.3, 0.2, 0.1, 0.0]), np.array([0.1, 0.2, 0.3, 0.0, 0.4])
    for verifier in declared:
        assert verifier.lossless_for == ALL_LAWS
        plan = verifier.prepare(p, q, 3)
        for x in ([0, 0, 0], [4, 1, 2], [2, 4, 2]):
            assert np.array_equal(plan.output_distribution(x), p)
    from simlab import reach_grid

    assert [n for n in tree_verifiers.names() if reach_grid.serves(tree_verifiers.get(n))] == ["nss", "exact_match"]
    assert not reach_grid.serves(tree_verifiers.TopDown(verifiers.get("nss"), first_path_only=True))


@pytest.mark.parametrize("law", ["iid", "without_replacement"])
def test_drawn_children_are_one_categorical_draw_each(law):
    """``draw_children`` (i.i.d.: one cdf for every child) draws what the plain loop draws: one
    ``sample_categorical`` per child from the same generator, the drawn token removed without
    replacement; zeros and subnormal masses in q included."""
    from simlab.distributions import sample_categorical
    from simlab.drafting import Drafting, draw_children

    drafting = Drafting(law)
    for seed in range(30):
        rng = np.random.default_rng(seed)
        q = rng.dirichlet(np.full(6, 0.4))
        q[seed % 6], q[(seed + 1) % 6] = 0.0, 5e-324 if seed % 2 else 0.0
        fast, plain = np.random.default_rng(seed), np.random.default_rng(seed)
        for k in (1, 2, 3):
            current, expected = q.copy(), []
            for _ in range(k):
                expected.append(sample_categorical(current, plain))
                if drafting is Drafting.WITHOUT_REPLACEMENT:
                    current[expected[-1]] = 0.0
            assert draw_children(q, k, drafting, fast).tolist() == expected
