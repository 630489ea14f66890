"""TreeGraft (issues 13, 24): the n-gram drafter, the builder on hand-built cases and against a
written-out reference of the official code (``treegraft_checks``), the lab's earlier rules as
options, losslessness, the exact best-schedule oracle, and the learned scheduler."""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.synthetic import RepetitiveWorld
from simlab import tree_verifiers
from simlab.decoding import greedy_decode, speculative_decode
from simlab.efficiency import emitted_sequence_law, target_sequence_law
from simlab.latency import ForwardTime, LatencyModel
from simlab.pairs import ContextFreePair, target_trajectory
from simlab.sampling import SamplingSettings
from simlab.treegraft import DEPARTURES, NGramDrafter, NGramIndex, Rules, TreeGraft, prompt_cache
from treegraft_checks import HAND_CASES, built, check_reference, factory, state_with, sweep_roots
from simlab.treegraft.schedules import FEATURES, all_schedules, best, evaluate_schedules, margins, train
from simlab.trees import NodeTable

LATENCY = LatencyModel.from_cost_ratio(0.3, per_token=0.002).with_drafter("small", ForwardTime.constant(0.01))


# -- the n-gram drafter ---------------------------------------------------------------------------------
def test_index_and_official_collection():
    """Occurrences oldest first; each distinct chain at its first occurrence; chains sorted by
    (match length desc, position desc, tokens); coverage tested after the whole n level."""
    index = NGramIndex((5, 6, 7, 5, 6, 8, 5, 6), 3)
    assert index.matches((5, 6)) == [2, 5] and index.matches((6,)) == [2, 5] and index.matches((9,)) == []
    drafter = NGramDrafter(max_n=3)
    found = drafter.collect(index, (5, 6, 7, 5, 6, 8, 5, 6), k=2, layer=1)
    # n = 3 (8, 5, 6): no earlier occurrence; n = 2 (5, 6) at 0 and 3: chains (7, 5, 6) and (8, 5, 6) covering 2 = k: stop
    assert [(c.n, c.position, c.tokens) for c in found.chains] == [(2, 5, (8, 5, 6)), (2, 2, (7, 5, 6))]
    assert found.match == {7: 2, 8: 2} and found.covered
    assert drafter.chain_length(1) == 3 and drafter.chain_length(3) == 1 and drafter.chain_length(9) == 1
    # existing children count towards coverage: with the child 9 the level n = 2 covers k = 3
    assert drafter.collect(index, (5, 6, 7, 5, 6, 8, 5, 6), k=3, layer=1, existing={9}).covered
    assert not drafter.collect(index, (5, 6, 7, 5, 6, 8, 5, 6), k=3, layer=1).covered  # n = 1 (6,) adds nothing new
    # chains of 3 from (6,) at layer 1: the occurrence at 4 ends at 8 = the context's end: fits; none is truncated
    lab = drafter.collect(index, (5, 6, 7, 5, 6, 8, 5, 6), k=2, layer=1, rules=Rules.parse("lab"))
    assert [(c.n, c.position, c.tokens) for c in lab.chains] == [(2, 5, (8, 5, 6)), (2, 2, (7, 5, 6))]  # recent first


def test_truncated_occurrences_are_skipped():
    """Chains of 2 (N = 2, layer 1): (7,) occurs at 0 (chain (5, 3)) and at 3, whose chain would
    run past the end: skipped (the lab's ``truncated_chains`` attaches (7,))."""
    index, drafter = NGramIndex((7, 5, 3, 7, 7), 2), NGramDrafter(max_n=2)
    found = drafter.collect(index, (7, 5, 3, 7, 7), k=2, layer=1)
    assert [c.tokens for c in found.chains] == [(5, 3)] and found.match == {5: 1} and not found.covered
    lab = drafter.collect(index, (7, 5, 3, 7, 7), k=2, layer=1, rules=Rules.parse("truncated_chains"))
    assert [c.tokens for c in lab.chains] == [(7,), (5, 3)] and lab.covered


def test_cache_scores_follow_the_code():
    pair = ContextFreePair([0.5, 0.2, 0.1, 0.1, 0.05, 0.05] + [0.0] * 6, np.full(12, 1 / 12))
    cache = prompt_cache(pair, (0, 1, 2, 3), length=3)
    assert cache.score(1, 0) == pytest.approx(math.log(0.5)) and cache.score(2, 1) == pytest.approx(math.log(0.2))
    assert cache.score(2, 11) == -math.inf  # outside the top-10 of a row with zeros: the 10th (-inf) minus 5
    assert cache.score(3, 0) == pytest.approx(math.log(0.5))  # the last prompt row, p(. | whole prompt), is cached
    assert cache.score(4, 0) == 0.0 and cache.score(7, 4) == 0.0  # beyond the cached prompt: 0.0, the code's quirk
    old = prompt_cache(pair, (0, 1, 2, 3), length=3, last_row=False)  # the lab's cache_without_last_row
    assert old.score(2, 1) == cache.score(2, 1) and old.score(3, 0) == 0.0


def test_the_score_cache_keeps_the_stable_sorts_top_ten():
    """``ScoreCache.of`` (``top_ranked``: a partition, then a sort of the candidates) keeps what
    the full stable sort keeps, ties at the tenth place and zeros included, at a V where the
    partition path runs."""
    from simlab.treegraft.ngram import CACHE_TOP, ScoreCache

    rng = np.random.default_rng(5)
    rows = rng.dirichlet(np.full(4096, 0.05), size=6)
    rows[1, :40] = rows[1].max()  # 40 tokens tied for first: the ten lowest ids are kept
    rows[2] = 0.0
    rows[2, [7, 900, 3000]] = [0.5, 0.25, 0.25]  # three positive, the rest tied at zero
    rows[3] = np.round(rows[3], 3)  # many ties across the tenth place
    cache = ScoreCache.of(rows, 6)
    for i, row in enumerate(rows, start=1):
        order = np.argsort(-row, kind="stable")[:CACHE_TOP]
        assert list(cache.top[i]) == order.tolist()
        with np.errstate(divide="ignore"):
            assert list(cache.top[i].values()) == np.log(row[order]).tolist()


def test_rules_parse():
    assert Rules.parse("official").name == "official" and Rules.parse("lab").departures == frozenset(DEPARTURES)
    assert Rules.parse("no_node_cap, truncated_chains").name == "truncated_chains+no_node_cap"
    assert TreeGraft().rules == Rules() and TreeGraft(rules="lab").node_cap == math.inf and TreeGraft().node_cap == 511
    with pytest.raises(ValueError, match="^rules: unknown departure nonsense"):
        TreeGraft(rules="nonsense")


# -- the builder on hand-built cases ----------------------------------------------------------------------
def hand_pair():
    """V = 6; q favours 3 then 4 everywhere; p uniform on 0..3."""
    return ContextFreePair([0.25, 0.25, 0.25, 0.25, 0.0, 0.0], [0.05, 0.05, 0.1, 0.5, 0.3, 0.0])


def test_trie_reuse_and_rescoring():
    """Layer 1 (skip): the context's matches of the suffix (1,) attach the chains 2 -> 5 and 3 -> 4
    below the root (most recent first; cache empty: first tokens score 0.0, deeper ones -inf).
    Layer 2 (call): every node is rescored by the mid drafter's cumulative log q; the pool is every
    node of depth <= 1, its best two (the root, then 3) take q's top-2 (3, 4): the root's 3 is
    reused and rescored, 4 appended; below 3, 4 is reused and 3 appended; nothing is deleted."""
    pair, context = hand_pair(), (1, 3, 4, 1, 2, 5, 1)
    builder = TreeGraft(schedule=(0, 1), depth=2, top_k=2, lookback=5, budget=10, ngram=NGramDrafter(max_n=2), cached=0)
    state = builder.start(builder.prepare(NodeTable(pair, context)))
    state.step(False)
    root = state.nodes[0]
    two, three = root.children[2], root.children[3]
    assert list(root.children) == [2, 3] and state.nodes[two].score == state.nodes[three].score == 0.0
    assert state.nodes[state.nodes[three].children[4]].score == -math.inf
    assert state.frontier == [two, three]
    state.step(True)
    log = math.log
    assert list(root.children) == [2, 3, 4]
    assert state.nodes[two].score == pytest.approx(log(0.1)) and state.nodes[state.nodes[two].children[5]].score == -math.inf
    assert state.nodes[three].score == pytest.approx(log(0.5)) and state.nodes[root.children[4]].score == pytest.approx(log(0.3))
    below = state.nodes[three].children
    assert list(below) == [4, 3]
    assert state.nodes[below[4]].score == pytest.approx(log(0.5) + log(0.3)) and state.nodes[below[3]].score == pytest.approx(
        2 * log(0.5)
    )
    assert sorted(state.frontier) == sorted([three, root.children[4], below[4], below[3]])[:2] or len(state.frontier) == 2
    assert state.pool_sizes == [3] and state.graft_from_earlier == 1  # the root lies below the frontier's depth


def test_pruning_skips_a_node_whose_ancestors_do_not_fit_and_continues():
    nodes = [(None, -1, 0.0), (1, 0, -3.0), (2, 1, -3.1), (3, 2, -0.5), (4, 0, -1.0), (5, 0, -2.0), (0, 4, -0.8)]
    # ranked: node 3 (-0.5) needs itself and 2 ancestors: 4 nodes > 1 + budget 2, skipped; node 6
    # (-0.8) comes with its missing parent 4: 3 nodes, full
    state = state_with(TreeGraft(schedule=(1,), depth=1, budget=2), hand_pair(), (1,), nodes, [3], 0)
    assert state.kept() == [0, 4, 6]
    state = state_with(TreeGraft(schedule=(1,), depth=1, budget=3), hand_pair(), (1,), nodes, [3], 0)
    assert state.kept() == [0, 1, 2, 3]  # with room for the chain it goes first
    tree = state.finish()
    assert tree.children == {(): (1,), (1,): (2,), (1, 2): (3,)} and tree.tokens() == 3


def test_pool_is_a_depth_window_around_the_frontier():
    nodes = [(None, -1, 0.0), (1, 0, -1.0), (2, 1, -2.0), (3, 2, -3.0), (0, 0, -0.5), (4, 3, -4.0)]
    for lookback, expected in ((0, [3]), (1, [2, 3]), (5, [0, 1, 2, 3, 4])):
        state = state_with(TreeGraft(schedule=(1,), depth=1, lookback=lookback), hand_pair(), (1,), nodes, [3], 0)
        assert sorted(state.pool()) == expected, lookback
    frontier_only = state_with(TreeGraft(schedule=(1,), depth=1, pool="frontier"), hand_pair(), (1,), nodes, [3, 4], 0)
    assert frontier_only.pool() == [3, 4]


def test_destructive_grafting_deletes_and_non_destructive_keeps():
    pair, context = hand_pair(), (1, 3, 1, 3, 1)
    keep = TreeGraft(schedule=(0, 1), depth=2, top_k=1, budget=20, ngram=NGramDrafter(max_n=2))
    drop = TreeGraft(schedule=(0, 1), depth=2, top_k=1, budget=20, ngram=NGramDrafter(max_n=2), grafting="destructive")
    a, b = keep.sample(NodeTable(pair, context)), drop.sample(NodeTable(pair, context))
    assert set(b.nodes()) <= set(a.nodes()) and b.tokens() <= a.tokens()


def test_destructive_grafting_never_grafts_onto_a_deleted_position():
    """A graft position deleted by an earlier position's destructive graft in the same layer is skipped."""
    world = RepetitiveWorld(vocab=6, seed=0, copy=0.3)
    for seed, k in ((0, 2), (1, 4), (3, 2), (5, 3)):  # cases where a deeper position is deleted first
        context = target_trajectory(world, 30, np.random.default_rng(seed), prefix=(1,))
        builder = TreeGraft(schedule=(0, 1, 1, 1, 1), top_k=k, budget=20, grafting="destructive")
        tree = builder.sample(NodeTable(world, context))
        assert all(path[:-1] in tree.children or len(path) == 1 for path in tree.nodes() if path)


# -- the official rules: hand-built cases and the written-out reference (treegraft_checks.py) -----------
@pytest.mark.parametrize("case", list(HAND_CASES))
def test_hand_case(case):
    HAND_CASES[case](factory())


def test_builder_equals_the_written_out_reference():
    """Trees, kept scores and costs equal the plain re-implementation of the official loop
    (4 roots x 2 settings x 32 schedules; every departure changes one of them: test_treegraft_mutants)."""
    check_reference(factory(), roots=sweep_roots()[:4])


@pytest.mark.slow
def test_builder_equals_the_written_out_reference_on_every_sweep_root():
    check_reference(factory())


def test_stops_are_recorded_and_cost_nothing():
    make = factory()
    state = state_with(make(budget=10, depth=5, top_k=2, N=2), hand_pair(), (5, 1, 2, 5, 1), [(None, -1, 0.0)], [0], 0)
    for call in (0, 1, 1, 0, 1):
        state.step(bool(call))
    assert state.stop == "empty frontier" and state.ran == 1 and state.calls == [0, 1, 1, 0, 1] and state.stopped_early
    builder = make(budget=10, depth=2, top_k=2, N=2)
    state = builder.start(builder.prepare(NodeTable(hand_pair(), (2, 1, 1, 2, 0))))
    state.step(False)
    assert state.stop == "fallback" and state.frontier == [] and state.stopped_early
    # the node cap: k = 1, D = 1, budget 1 -> cap max(2, 1 + 1 + 1) = 3 nodes: the chain of 5 stops after 2 tokens
    builder = make(budget=1, depth=1, top_k=1, N=5)
    state = builder.start(builder.prepare(NodeTable(hand_pair(), (1, 2, 3, 4, 5, 1, 0, 1))))
    state.step(False)
    assert len(state.nodes) == 3 and state.stop == "node cap" and not state.stopped_early
    uncapped = factory(rules="no_node_cap")(budget=1, depth=1, top_k=1, N=5)
    state = uncapped.start(uncapped.prepare(NodeTable(hand_pair(), (1, 2, 3, 4, 5, 1, 0, 1))))
    state.step(False)
    assert len(state.nodes) == 6 and state.stop is None


def test_the_lab_rules_on_the_hand_cases():
    """The lab's earlier rules (``rules="lab"``, issue 13) on two hand cases, written out: the
    fallback gives the root the top_k most frequent tokens (ties: smaller id) scored by log
    frequency and the loop goes on; after an empty frontier the scheduled call still grafts."""
    lab = factory(rules="lab")
    children, scores, forwards = built(lab(budget=10, depth=2, top_k=2, N=2), hand_pair(), (2, 1, 1, 2, 0), (0, 0))
    assert children[()] == (1, 2) and scores[(1,)] == pytest.approx(math.log(2 / 5)) and len(forwards) == 2
    children, _, forwards = built(lab(budget=10, depth=2, top_k=2, N=2), hand_pair(), (5, 1, 2, 5, 1), (0, 1))
    assert forwards == [("small", 1), ("draft", 3)] and len(children[()]) == 3  # 2 (the chain) plus q's top-2 (3, 4)


def test_the_diverse_repetitive_world():
    """``repetitive_diverse``: the repetitive world with flatter rows and less copying (the long-context ablations' world)."""
    from backends.synthetic import DiverseRepetitiveWorld, make_world

    world = make_world("repetitive_diverse", vocab=8, seed=1)
    assert isinstance(world, DiverseRepetitiveWorld) and (world.copy, world.concentration) == (0.5, 0.5)
    tempered = world.with_settings(SamplingSettings(0.0))
    assert isinstance(tempered, DiverseRepetitiveWorld) and tempered.copy == 0.5
    p, _ = world.distributions([(1, 2, 3, 1, 2)])
    base, _ = RepetitiveWorld(vocab=8, seed=1, copy=0.0, concentration=0.5).distributions([(1, 2, 3, 1, 2)])
    assert np.allclose(p[0], 0.5 * base[0] + 0.5 * np.eye(8)[3])  # (1, 2) occurred before, followed by 3


# -- losslessness ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", [(0, 0, 0), (1, 1, 1), (1, 0, 1), (0, 1, 0)])
@pytest.mark.parametrize("verifier", ["onehot", "nss"])
def test_onehot_on_treegraft_trees_emits_the_target_law(schedule, verifier):
    world = RepetitiveWorld(vocab=3, seed=1)
    builder = TreeGraft(schedule=schedule, depth=3, top_k=2, budget=4, ngram=NGramDrafter(max_n=2))
    context = (0, 1, 2, 0, 1)
    law = emitted_sequence_law(world, context, builder, verifier, 3)
    assert max(abs(law.get(s, 0) - v) for s, v in target_sequence_law(world, context, 3).items()) <= 1e-12
    with pytest.raises(ValueError, match="specinfer is not lossless"):
        emitted_sequence_law(world, context, builder, "specinfer", 1)


def test_temperature_zero_treegraft_decoding_is_greedy_decoding():
    world = RepetitiveWorld(vocab=16, seed=2, settings=SamplingSettings(0.0))
    prompt = (3, 5, 7, 3, 5)
    tokens, steps = speculative_decode(world, prompt, TreeGraft(schedule=(0, 1, 0, 1, 0)), "greedy", 40, np.random.default_rng(0))
    assert tokens == greedy_decode(world, prompt, 40) and max(steps) > 1


def test_treegraft_on_the_micro_pair_is_greedy_decoding(micro_pair_dir):
    from backends.hf import HFPair

    pair = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", settings=SamplingSettings(0.0))
    prompt = pair.encode("The for statement is used to iterate over the for statement is")
    tokens, _ = speculative_decode(pair, prompt, TreeGraft(budget=15, top_k=3), "greedy", 10, np.random.default_rng(0))
    assert tokens == greedy_decode(pair, prompt, 10)


# -- the oracle and the scheduler ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repetitive_root():
    world = RepetitiveWorld(vocab=24, seed=3)
    context = target_trajectory(world, 40, np.random.default_rng(5), prefix=(2,))
    return world, context


def test_best_schedule_equals_brute_force(repetitive_root):
    world, context = repetitive_root
    builder = TreeGraft(top_k=4, budget=20)
    values = evaluate_schedules(builder, NodeTable(world, context), "onehot", LATENCY)
    assert list(values) == all_schedules(5)
    verifier = tree_verifiers.get("onehot")
    root = builder.prepare(NodeTable(world, context))
    for schedule, value in values.items():
        tree = builder.build(root, schedule)  # from scratch, no shared prefix states
        assert tree.children == value["tree"].children
        E, T = verifier.expected_block_efficiency(tree), LATENCY.tree_step_time(len(context), tree)
        assert value["E"] == pytest.approx(E, abs=1e-12) and value["TPS"] == pytest.approx(E / T, rel=1e-12)
    top = best(values)
    assert values[top]["TPS"] == max(v["TPS"] for v in values.values())


def test_features_and_margins(repetitive_root):
    world, context = repetitive_root
    builder = TreeGraft(top_k=4, budget=20)
    table = NodeTable(world, context)
    values = evaluate_schedules(builder, table, "onehot", LATENCY)
    rows = margins(builder, table, values, LATENCY, prompt_length=1)
    assert len(rows) == 2**5 - 1 and len(FEATURES) == 17
    z, y, prefix = rows[0]
    assert z.shape == (17,) and np.isfinite(z).all() and prefix == ()
    assert y == pytest.approx(
        max(v["TPS"] for s, v in values.items() if s[0] == 1) - max(v["TPS"] for s, v in values.items() if s[0] == 0)
    )


def test_scheduler_training_is_bit_for_bit_repeatable(repetitive_root):
    import torch

    world, context = repetitive_root
    builder = TreeGraft(top_k=4, budget=20)
    table = NodeTable(world, context)
    rows = margins(builder, table, evaluate_schedules(builder, table, "onehot", LATENCY), LATENCY, 1)
    X, y = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    a, losses_a = train(X, y, epochs=20, seed=3)
    b, losses_b = train(X, y, epochs=20, seed=3)
    assert losses_a == losses_b
    assert all(torch.equal(p, q) for p, q in zip(a.network.state_dict().values(), b.network.state_dict().values()))
    assert sum(p.numel() for p in a.network.parameters()) == 3265
    assert len(a.schedule(builder, table, LATENCY, 1)) == 5


def test_the_schedule_read_from_stored_features_equals_the_one_built_layer_by_layer(repetitive_root):
    """``Scheduler.schedule_from`` (the study's path: the features ``margins`` stored at every
    prefix) against ``Scheduler.schedule`` (the plain path: a fresh tree) for schedulers that skip,
    call and are stopped by the cap; a mutant ignoring the cap or the prefix would differ."""
    from dataclasses import replace

    world, context = repetitive_root
    builder = TreeGraft(top_k=4, budget=20)
    table = NodeTable(world, context)
    rows = margins(builder, table, evaluate_schedules(builder, table, "onehot", LATENCY), LATENCY, 1)
    X, y = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    at = {prefix: z for z, _, prefix in rows}
    trained, _ = train(X, y, epochs=20, seed=5)
    seen = set()
    for shift, cap in ((0.0, 5), (1e9, 5), (-1e9, 5), (1e9, 2), (0.0, 1)):
        scheduler = replace(trained, y_mean=trained.y_mean + shift, calls_cap=cap)
        plain = scheduler.schedule(builder, NodeTable(world, context), LATENCY, 1)
        assert scheduler.schedule_from(at, builder.depth) == plain
        seen.add(plain)
    assert {(1, 1, 0, 0, 0), (0, 0, 0, 0, 0), (1, 1, 1, 1, 1)} <= seen
    with pytest.raises(ValueError, match="features_at"):
        trained.schedule_from({}, builder.depth)


@pytest.mark.parametrize(
    "options, name",
    [
        (dict(budget=0), "budget"),
        (dict(depth=0), "depth"),
        (dict(depth=17), "depth"),
        (dict(top_k=0), "top_k"),
        (dict(schedule=(1, 0)), "schedule"),
        (dict(schedule="sometimes"), "schedule"),
        (dict(pool="all"), "pool"),
        (dict(grafting="maybe"), "grafting"),
        (dict(ngram=5), "ngram"),
    ],
)
def test_bad_options(options, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        TreeGraft(**options)


def test_bad_vocabularies_and_inputs():
    with pytest.raises(ValueError, match="^context: "):
        TreeGraft().sample(NodeTable(RepetitiveWorld(vocab=4), (1, 9)))
    with pytest.raises(ValueError, match="^scoring: "):
        NGramDrafter(scoring="exact")
    with pytest.raises(ValueError, match="^max_n: "):  # an n-gram size < 1
        NGramDrafter(max_n=0)
    with pytest.raises(ValueError, match="^X, y: "):
        train(np.zeros((3, 4)), np.zeros(3))
