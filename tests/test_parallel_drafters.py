"""Parallel drafters (issue 27): the root-conditioned stand-in, Medusa's trees and DDTree's
best-first tree against written-out references, losslessness by enumeration, the refusals, and
the planted faults (``parallel_mutants.py``) caught by these checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from backends.parallel_draft import RootConditioned, parallel_roots
from backends.synthetic import make_world
from parallel_mutants import BUILDER_MUTANTS, PAIR_MUTANTS
from simlab import tree_verifiers
from simlab.builders import DDTree, Medusa, Static, chain, iid
from simlab.builders.medusa import CHOICES
from simlab.drafting import Drafting
from simlab.efficiency import emitted_sequence_law, expected_block_efficiency, target_sequence_law
from simlab.pairs import MarkovPair, ParallelDraft, rooted
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

T1 = SamplingSettings(temperature=1.0)


def tv(a, b):
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def markov(seed=3, vocab=4, round_to=None):
    pair = MarkovPair.random(vocab, np.random.default_rng(seed), concentration=0.6, closeness=0.4)
    if round_to:  # ties (and zeros) in q
        draft = np.round(pair.draft, round_to)
        pair = MarkovPair(pair.target, draft / draft.sum(1, keepdims=True))
    return pair


# ---- checks (each one a planted fault's catcher) ------------------------------------------------


def check_stand_in_rows(pair, root, depth=3):
    """q at every node of depth d (every path) is position row d, and row d is the wrapped draft's
    q after the root and its greedy chain of d tokens; p is the wrapped target's."""
    inner = rooted(pair.pair, len(root))
    rows = pair.position_distributions(root, depth)
    chain_ = ()
    for d in range(depth):
        np.testing.assert_array_equal(rows[d], inner.distributions([tuple(root) + chain_])[1][0])
        chain_ += (int(np.argmax(rows[d])),)
    paths = [p for d in range(depth) for p in itertools.product(range(pair.vocab_size), repeat=d)]
    p, q = pair.node_distributions(root, paths)
    for i, path in enumerate(paths):
        assert np.array_equal(q[i], rows[len(path)]), f"q at {path} is not position row {len(path)}"
        np.testing.assert_array_equal(p[i], inner.distributions([tuple(root) + path])[0][0])


def medusa_reference(rows, spec):
    """Written out: node (r_1..r_d) holds the r_d-th token of row d - 1 (argsort by -q, stable: ties
    to the lowest id)."""
    order = [np.argsort(-row, kind="stable") for row in rows]
    children = {}
    for node in sorted(spec, key=lambda n: (len(n), n)):
        tokens = tuple(int(order[i][r]) for i, r in enumerate(node))
        children.setdefault(tokens[:-1], []).append(tokens[-1])
    return {k: tuple(v) for k, v in children.items()}


def best_first_reference(rows, budget):
    """Written out: every path over the positive tokens of each row, scored by the sum of log q
    along it (added edge by edge), sorted by (-score, rank path); the first ``budget`` of them."""
    order = [np.argsort(-row, kind="stable")[: np.count_nonzero(row)][:budget] for row in rows]
    paths = []
    for d in range(1, len(rows) + 1):
        for ranks in itertools.product(*[range(o.size) for o in order[:d]]):
            score = 0.0
            for i, r in enumerate(ranks):
                score = score + float(np.log(rows[i][order[i][r]]))
            paths.append((-score, ranks))
    kept = sorted(paths)[:budget]
    children = {}
    for _, ranks in sorted(kept, key=lambda k: (len(k[1]), k[1])):
        tokens = tuple(int(order[i][r]) for i, r in enumerate(ranks))
        children.setdefault(tokens[:-1], []).append(tokens[-1])
    return {k: tuple(v) for k, v in children.items()}


def check_medusa_reference(builder, pair, root):
    tree = builder.sample(NodeTable(pair, root))
    rows = pair.position_distributions(root, max(len(n) for n in builder.spec))
    assert tree.children == medusa_reference(rows, builder.spec)


def check_best_first_reference(builder, pair, root):
    tree = builder.sample(NodeTable(pair, root))
    expected = best_first_reference(pair.position_distributions(root, builder.depth), builder.budget)
    assert {k: sorted(v) for k, v in tree.children.items()} == {k: sorted(v) for k, v in expected.items()}


def check_lossless(builder, pair, context, n=3):
    """Every verifier lossless for the builder's declared laws (T > 0) emits the target's n-token law."""
    for verifier in tree_verifiers.lossless_names(builder.laws, T1):
        law = emitted_sequence_law(pair, context, builder, verifier, n)
        assert tv(law, target_sequence_law(pair, context, n)) <= 1e-12, verifier


# ---- the stand-in and the world ----------------------------------------------------------------


def test_stand_in_rows_depend_on_the_root_only():
    check_stand_in_rows(RootConditioned(markov(round_to=1)), (2,))
    world = make_world("parallel", vocab=4, seed=5)
    assert isinstance(world, ParallelDraft)
    check_stand_in_rows(world.rooted(2), (1, 3))


def test_stand_in_agrees_with_itself_across_entry_points():
    """``distributions`` (rooted) and ``node_distributions`` give the same rows; settings pass through."""
    world = make_world("parallel", vocab=6, seed=2)
    root, paths = (4, 1), [(), (0,), (5, 2)]
    p, q = world.node_distributions(root, paths)
    p2, q2 = world.rooted(len(root)).distributions([root + pth for pth in paths])
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(q, q2)
    cold = world.with_settings(SamplingSettings(temperature=0.5))
    assert (
        cold.settings.temperature == 0.5
        and np.argmax(cold.position_distributions(root, 3), 1).tolist()
        == np.argmax(world.position_distributions(root, 3), 1).tolist()
    )


def test_parallel_roots_wrap_every_root():
    from backends.sources import SyntheticSource

    source = SyntheticSource(vocab=5, trajectories=1, roots_per_trajectory=2, spacing=3)
    for root in parallel_roots(source.roots(T1)):
        assert isinstance(root.pair, ParallelDraft) and root.pair.root_length == len(root.context)


# ---- builders against references ----------------------------------------------------------------


@pytest.mark.parametrize("budget", [1, 2, 5, 17, 40, 63])
def test_medusa_equals_the_written_out_tree(budget):
    world = make_world("parallel", vocab=12, seed=7).rooted(2)
    builder = Medusa(budget=budget)
    check_medusa_reference(builder, world, (3, 9))
    tree = builder.sample(NodeTable(world, (3, 9)))
    assert tree.tokens() == budget  # distinct tokens below each parent
    # the same topology as a static top-k tree over the same rows (its second reference)
    assert tree.children == Static(builder.spec).sample(NodeTable(world, (3, 9))).children


@pytest.mark.parametrize("seed, round_to", [(0, None), (1, None), (2, 1), (3, 1)])
def test_ddtree_equals_the_written_out_best_first_tree(seed, round_to):
    pair = RootConditioned(markov(seed, vocab=4, round_to=round_to))
    for budget in (1, 2, 3, 7, 12, 40, 84):
        check_best_first_reference(DDTree(budget=budget, depth=3), pair, (1,))


def test_conventions_are_pinned():
    spec = CHOICES["mc_sim_7b_63"]
    assert len(spec) == 63 and max(map(len, spec)) == 4 and Medusa().budget == 63
    assert (DDTree().budget, DDTree().depth) == (15, 15)
    world = make_world("parallel", vocab=12, seed=7).rooted(1)
    tree = Medusa(((0,), (1,), (0, 0), (1, 0))).sample(NodeTable(world, (3,)))
    a, b = tree.child_list(())
    assert tree.child_list((a,)) == tree.child_list((b,))  # one head: the same token below both
    assert len(tree.cost.forwards) == 1 and tree.cost.verified == 4  # one draft forward per tree
    assert tree.laws() == {Drafting.DETERMINISTIC}


# ---- losslessness and refusals ------------------------------------------------------------------


@pytest.mark.parametrize("builder", [Medusa(((0,), (1,), (0, 0), (0, 1), (1, 0))), DDTree(budget=5, depth=3)])
def test_parallel_trees_are_lossless_under_every_declared_verifier(builder):
    assert set(tree_verifiers.lossless_names(builder.laws, T1)) == {"nss", "exact_match", "onehot", "greedy_draft"}
    world = make_world("parallel", vocab=4, seed=1, eos_id=3)
    check_lossless(builder, world, (0,))
    values = [expected_block_efficiency(world, (0,), builder, v).mean for v in ("nss", "onehot", "greedy_draft")]
    assert max(values) - min(values) <= 1e-12  # deterministic children: a = p(x) on every edge, whichever rule


def test_ddtree_with_greedy_verification_on_a_greedy_target():
    """At T = 0 (one-hot p and q) the greedy rule is lossless on DDTree's trees: the emitted law is
    the target's greedy continuation."""
    rng = np.random.default_rng(8)
    one_hot = np.eye(4)[rng.integers(0, 4, size=(2, 4))]
    pair = RootConditioned(MarkovPair(one_hot[0], one_hot[1]))
    law = emitted_sequence_law(pair, (0,), DDTree(budget=3, depth=3), "greedy", 4)
    assert tv(law, target_sequence_law(pair, (0,), 4)) <= 1e-12 and len(law) == 1


def test_sampled_drafts_from_a_parallel_drafter_are_verified_against_its_rows():
    """A chain or i.i.d. rollouts drawn from the position rows, verified by the sampled verifiers:
    lossless because every node's table row is the row the children were drawn from."""
    pair = RootConditioned(markov(4, vocab=3))
    for builder, verifier in ((chain(3), "naive_chain"), (iid(2, 2), "specinfer"), (iid(2, 2), "traversal")):
        law = emitted_sequence_law(pair, (0,), builder, verifier, 2)
        assert tv(law, target_sequence_law(pair, (0,), 2)) <= 1e-12


def test_refusals():
    ar = markov()
    for builder in (Medusa(), DDTree()):
        with pytest.raises(ValueError, match="^pair: .* parallel drafter"):
            builder.sample(NodeTable(ar, (0,)))
    pair = RootConditioned(ar)
    for verifier in ("specinfer", "naive", "traversal", "rrs_wor"):
        with pytest.raises(ValueError, match=f"^verifier: {verifier} is not lossless"):
            expected_block_efficiency(pair, (0,), DDTree(budget=3, depth=2), verifier)
    with pytest.raises(ValueError, match="^pair: the draft's q at node"):
        DDTree(budget=8, depth=2).sample(NodeTable(PAIR_MUTANTS["stand-in rows follow the drafted prefix"][0](ar), (0,)))
    for options, name in (
        ({"choices": "nope"}, "choices"),
        ({"budget": 0}, "budget"),
        ({"budget": 64}, "budget"),
        ({"choices": ((0,), (0, 1))}, "choices"),
        ({"choices": ()}, "choices"),
        ({"choices": ((0,), (1.9,))}, "choices"),  # a float rank, not truncated to 1
    ):
        with pytest.raises(ValueError, match=f"^{name}: "):
            Medusa(**options)
    for options, name in (({"budget": 0}, "budget"), ({"depth": 0}, "depth"), ({"depth": 65}, "depth")):
        with pytest.raises(ValueError, match=f"^{name}: "):
            DDTree(**options)
    with pytest.raises(ValueError, match="^k: "):  # fewer tokens with q > 0 than the tree ranks
        Medusa(((0,), (1,), (2,))).sample(NodeTable(RootConditioned(MarkovPair(np.eye(3), np.eye(3))), (0,)))


# ---- planted faults ----------------------------------------------------------------------------

CHECKS = {
    "best-first reference": lambda b: check_best_first_reference(b, RootConditioned(markov(2, round_to=1)), (1,)),
    "Medusa reference": lambda b: check_medusa_reference(b, make_world("parallel", vocab=6, seed=3).rooted(1), (2,)),
    "lossless": lambda b: check_lossless(b, RootConditioned(markov(5)), (0,), n=2),
    "stand-in rows": lambda cls: check_stand_in_rows(cls(markov(6)), (1,)),
}


def failing(checks, subject):
    out = []
    for name in checks:
        try:
            CHECKS[name](subject)
        except AssertionError:
            out.append(name)
    return out


@pytest.mark.parametrize("fault", list(BUILDER_MUTANTS) + list(PAIR_MUTANTS))
def test_planted_fault_is_caught(fault):
    subject, expected = {**BUILDER_MUTANTS, **PAIR_MUTANTS}[fault]
    assert expected in failing([expected], subject), f"planted fault '{fault}' not caught by the '{expected}' check"


def test_the_checks_pass_on_the_real_code():
    CHECKS["best-first reference"](DDTree(budget=6, depth=3))
    CHECKS["Medusa reference"](Medusa(((0,), (1,), (0, 0), (1, 0), (0, 1))))
    CHECKS["lossless"](Medusa(((0,), (1,), (0, 0))))
    CHECKS["stand-in rows"](RootConditioned)


# ---- the study ---------------------------------------------------------------------------------


@pytest.mark.slow  # about 14 s: the chart's PNG
def test_study_rows_equal_the_core_values(tmp_path):
    import polars as pl

    from analyses import parallel_drafters
    from backends.sources import SyntheticSource

    flags = ["--vocab", "8", "--trajectories", "1", "--roots-per-trajectory", "1", "--spacing", "3", "--budgets", "4"]
    assert parallel_drafters.main([*flags, "--depth", "3", "--out", str(tmp_path), "--quiet"]) == 0
    rows = pl.read_parquet(tmp_path / "per_root.parquet")
    root = next(SyntheticSource(vocab=8, trajectories=1, roots_per_trajectory=1, spacing=3).roots(T1))
    parallel = RootConditioned(root.pair, len(root.context))
    expected = {
        "ddtree": expected_block_efficiency(parallel, root.context, DDTree(budget=4, depth=3), "onehot").mean,
        "medusa": expected_block_efficiency(parallel, root.context, Medusa(budget=4), "onehot").mean,
        "static": expected_block_efficiency(root.pair, root.context, Static(Medusa(budget=4).spec), "onehot").mean,
    }
    for tree, value in expected.items():
        assert rows.filter(pl.col("tree") == tree)["E"].item() == pytest.approx(value, abs=1e-12)
    forwards = dict(zip(rows["tree"], rows["draft_forwards"]))
    assert forwards["ddtree"] == forwards["medusa"] == 1 and forwards["static"] == 2 and forwards["eagle2"] == 8
    assert {p.name for p in tmp_path.iterdir()} >= {
        "parallel_drafters.parquet",
        "per_root.parquet",
        "throughput.html",
        "throughput.png",
    }


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--budgets", "64"], "--budgets: at most 63"),
        (["--budgets", "0"], "--budgets: every value must be >= 1"),
        (["--budgets", "8,x"], "--budgets: expected comma-separated integers"),
        (["--world", "parallel"], "--world: "),
        (["--depth", "0"], "--depth: "),
        (["--cost-ratio", "0.5"], "--cost-ratio: a latency profile (--latency) is this study's default ('specblock-a100'"),
    ],
)
def test_study_refuses_bad_flags(flags, message, tmp_path, capsys):
    from analyses import parallel_drafters

    with pytest.raises(SystemExit) as exit_:
        parallel_drafters.main([*flags, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x").exists()
