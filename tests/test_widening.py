"""simlab.widening: rank statistics along the greedy chain, widening gains, rejection sampling vs argmax matching.

Every value is checked against an independent computation: the rank law against brute-force
enumeration of the target's token sequences (``target_sequence_law``) with the draft's ranks
sorted here; the widening gains against the rank formula and against hand-built trees valued by
the tree verifiers; the temperature grid against ``expected_block_efficiency`` and closed forms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from backends.synthetic import DepthProfileWorld, LinearProfile
from simlab import tree_verifiers, widening
from simlab.builders import Static, chain
from simlab.drafting import Drafting
from simlab.efficiency import expected_block_efficiency, target_sequence_law
from simlab.pairs import MarkovPair
from simlab.sampling import SamplingSettings
from simlab.trees import DraftTree, NodeTable


def _pair(seed=3, vocab=5, closeness=0.4):
    return MarkovPair.random(vocab, np.random.default_rng(seed), closeness=closeness)


def _ranked(q):
    """The draft's candidates by rank, sorted here: q descending, ties to the lowest id, q > 0 only."""
    return [t for t in sorted(range(q.size), key=lambda t: (-q[t], t)) if q[t] > 0]


def _chain_tokens(ranking, context, depth):
    """The greedy chain on the ranking pair's q."""
    tokens = []
    for _ in range(depth):
        _, q = ranking.distributions([tuple(context) + tuple(tokens)])
        tokens.append(_ranked(q[0])[0])
    return tokens


def _worlds():
    """(pair, the pair its candidates are ranked by under draft_law="raw", context): a pair without
    settings (one law) and a tempered, truncated world (ranked by its untempered law)."""
    world = DepthProfileWorld(5, seed=6, settings=SamplingSettings(0.6, top_k=4)).rooted(1)
    return [(_pair(0), _pair(0), (1,)), (_pair(7), _pair(7), (3,)), (world, world.with_settings(SamplingSettings()), (2,))]


def _by_key(rows, *keys):
    return {tuple(r[k] for k in keys): r for r in rows}


@pytest.mark.parametrize("case", range(3))
def test_rank_statistics_match_enumeration(case):
    pair, ranking, context = _worlds()[case]
    depth, ranks = 3, 4
    rows = _by_key(widening.rank_statistics(pair, context, depth, ranks), "position", "rank")
    law = target_sequence_law(pair, context, depth)  # every target sequence y_1..y_D with its probability
    chain_tokens = _chain_tokens(ranking, context, depth)
    for k in range(1, depth + 1):
        _, q = ranking.distributions([tuple(context) + tuple(chain_tokens[: k - 1])])
        order = _ranked(q[0])
        joint = np.zeros(len(order))
        for seq, prob in law.items():
            if list(seq[: k - 1]) == chain_tokens[: k - 1]:
                joint[order.index(seq[k - 1])] += prob
        reach = joint.sum()
        for r in range(1, min(ranks, len(order)) + 1):
            row = rows[(k, r)]
            assert row["token"] == order[r - 1] and row["q"] == q[0][order[r - 1]]
            assert row["reach"] == pytest.approx(reach, abs=1e-12)
            assert row["joint"] == pytest.approx(joint[r - 1], abs=1e-12)
            assert row["p"] == pytest.approx(joint[r - 1] / reach, abs=1e-12)
            assert row["conditional"] == pytest.approx(joint[r - 1] / joint[r - 1 :].sum(), abs=1e-12)
            assert row["beyond"] == pytest.approx(joint[r:].sum() / reach, abs=1e-12)
    assert set(rows) == {(k, r) for k in range(1, depth + 1) for r in range(1, ranks + 1)}


def test_rank_statistics_ties_lowest_id_and_support_only():
    p = np.array([0.1, 0.3, 0.2, 0.4])
    q = np.array([0.0, 0.4, 0.4, 0.2])  # tokens 1 and 2 tie: 1 is rank 1; token 0 (q = 0) has no rank
    from simlab.pairs import ContextFreePair

    rows = widening.rank_statistics(ContextFreePair(p, q), (), 1, ranks=8)
    assert [r["token"] for r in rows] == [1, 2, 3]
    assert [r["conditional"] for r in rows] == pytest.approx([0.3, 0.2 / 0.7, 0.4 / 0.5])


def test_rank_statistics_from_a_node_table_and_nan_for_greedy_target():
    pair, context = _pair(), (2,)
    table = NodeTable(pair, context)
    assert widening.rank_statistics(table, None, 3, 3) == widening.rank_statistics(pair, context, 3, 3)
    world = DepthProfileWorld(6, seed=1, settings=SamplingSettings(0.0))
    rows = widening.rank_statistics(world, (0,), 2, 3)  # ranked by the untempered q: three candidates
    first = [r for r in rows if r["position"] == 1]
    assert len(first) == 3 and first[0]["p"] == 1.0 and all(math.isnan(r["conditional"]) for r in first[1:])
    assert len(widening.rank_statistics(world, (0,), 2, 3, draft_law="setting")) == 2  # one-hot q: one candidate


def _hand_tree(pair, context, depth, width, positions, ranking=None):
    """The widened chain built by hand: chain tokens, and ranks 2..w below the chain nodes at ``positions``
    (ranked on ``ranking``, default ``pair``), on a table of ``pair``."""
    ranking = pair if ranking is None else ranking
    tokens = _chain_tokens(ranking, context, depth)
    children = {}
    for k in range(1, depth + 1):
        parent = tuple(tokens[: k - 1])
        _, q = ranking.distributions([tuple(context) + parent])
        children[parent] = tuple(_ranked(q[0])[:width]) if k in positions else (tokens[k - 1],)
    return DraftTree(NodeTable(pair, context), children, Drafting.DETERMINISTIC)


@pytest.mark.parametrize("verifier, case", [("onehot", 0), ("exact_match", 1), ("nss", 2), ("onehot", 2)])
def test_widening_gains_match_hand_built_trees_and_rank_formula(verifier, case):
    pair, ranking, context = _worlds()[case]
    depth = 3
    rows = widening.widening_gains(pair, context, depth, (2, 3, 4), verifier=verifier)
    ranks = _by_key(widening.rank_statistics(pair, context, depth, 4), "position", "rank")
    rule = tree_verifiers.get(verifier)
    chain_value = rule.expected_block_efficiency(_hand_tree(pair, context, depth, 1, [], ranking))
    assert len(rows) == (depth + 1) * 3
    for row in rows:
        positions = [row["position"]] if row["mode"] == "one_position" else list(range(1, depth + 1))
        tree = _hand_tree(pair, context, depth, row["width"], positions, ranking)
        assert row["value"] == pytest.approx(rule.expected_block_efficiency(tree), abs=1e-12)
        assert row["chain"] == pytest.approx(chain_value, abs=1e-12)
        formula = sum(ranks[(k, r)]["joint"] for k in positions for r in range(2, row["width"] + 1))
        assert row["gain"] == pytest.approx(formula, abs=1e-12)
        assert row["tokens"] == depth + len(positions) * (row["width"] - 1) and row["lossless"]


def test_widening_at_temperature_zero_uses_greedy_and_matches_formula():
    world = DepthProfileWorld(8, seed=2, settings=SamplingSettings(0.0), profile=LinearProfile(0.3, 0.8, 3))
    context = (1, 4)
    rows = widening.widening_gains(world, context, 3, (2, 3), modes=["every_position"])
    ranks = _by_key(widening.rank_statistics(world, context, 3, 3), "position", "rank")
    for row in rows:
        assert row["verifier"] == "greedy" and row["position"] is None
        formula = sum(ranks[(k, r)]["joint"] for k in (1, 2, 3) for r in range(2, row["width"] + 1))
        assert row["gain"] == pytest.approx(formula, abs=1e-12)
    rooted = world.rooted(len(context))
    tree = _hand_tree(rooted, context, 3, 2, [1, 2, 3], rooted.with_settings(SamplingSettings()))
    assert rows[0]["value"] == pytest.approx(tree_verifiers.get("greedy").expected_block_efficiency(tree), abs=1e-12)


def test_widening_ranked_by_the_setting_is_expected_block_efficiency_of_static():
    world = DepthProfileWorld(6, seed=3, settings=SamplingSettings(0.7, top_p=0.95))
    context = (2, 5)
    rows = widening.widening_gains(world, context, 2, (2, 3), verifier="exact_match", draft_law="setting")
    for row in rows:
        positions = [row["position"]] if row["mode"] == "one_position" else [1, 2]
        spec = [(0,), (0, 0)] + [(0,) * (k - 1) + (r,) for k in positions for r in range(1, row["width"])]
        est = expected_block_efficiency(world.rooted(2), context, Static(spec), "exact_match")
        assert row["value"] == est.mean and row["lossless"] is est.lossless


def _chain_closed_forms(pair, context, depth):
    """(argmax chain with exact match, sampled chain with speculative sampling): E[tau + 1] by recursion."""
    argmax, reach, path = 1.0, 1.0, ()
    for _ in range(depth):
        p, q = (a[0] for a in pair.distributions([tuple(context) + path]))
        top = _ranked(q)[0]
        reach *= p[top]
        argmax += reach
        path += (top,)

    def speculative(path, left):
        if left == 0:
            return 1.0
        p, q = (a[0] for a in pair.distributions([tuple(context) + path]))
        keep = np.minimum(p, q)
        return 1.0 + sum(keep[x] * speculative(path + (x,), left - 1) for x in np.flatnonzero(keep > 0))

    return argmax, speculative((), depth)


def test_rejection_sampling_gain_matches_lab_and_closed_forms():
    world = DepthProfileWorld(5, seed=4, settings=SamplingSettings(0.7, top_k=4))
    context, depth, temps = (2,), 3, [0.0, 0.5, 1.0, 1.5]
    rows = widening.rejection_sampling_gain(world, context, depth, temps, lossy=True)
    table = _by_key(rows, "temperature", "draft", "verifier")
    assert len(rows) == len(temps) * 5
    for t in temps:
        settings = SamplingSettings(t, top_k=4)
        tempered = world.with_settings(settings).rooted(len(context))
        argmax, speculative = _chain_closed_forms(tempered, context, depth)
        assert table[(t, "argmax", "exact_match")]["value"] == pytest.approx(argmax, abs=1e-12)
        assert table[(t, "argmax", "onehot")]["value"] == pytest.approx(argmax, abs=1e-12)
        assert table[(t, "sampled", "naive")]["value"] == pytest.approx(speculative, abs=1e-12)
        assert table[(t, "sampled", "naive")]["gain"] == pytest.approx(speculative / argmax, abs=1e-12)
        for draft, name in widening.PAIRINGS + (widening.LOSSY_PAIRING,):
            row = table[(t, draft, name)]
            shape = Static([(0,), (0, 0), (0, 0, 0)]) if draft == "argmax" else chain(depth)
            lossy = (draft, name) == widening.LOSSY_PAIRING
            est = expected_block_efficiency(tempered, context, shape, name, allow_lossy=lossy)
            assert row["value"] == pytest.approx(est.mean, abs=1e-12)
            assert row["lossless"] is (not lossy) and row["setting"] == settings.name
    assert len({round(r["value"], 12) for r in rows if r["temperature"] == 0.0}) == 1  # one-hot p and q at T = 0


def test_rejection_sampling_gain_fetches_each_node_once_per_setting(monkeypatch):
    """Every pairing at a setting reads one table: a node's p and q are fetched once (a live pair
    paid a model call per pairing), and the values are those of separate tables."""
    world = DepthProfileWorld(5, seed=4, settings=SamplingSettings(1.0, top_k=3))
    fetched = []
    plain = DepthProfileWorld.distributions

    def counting(self, contexts):
        contexts = [tuple(c) for c in contexts]
        fetched.extend(contexts)
        return plain(self, contexts)

    monkeypatch.setattr(DepthProfileWorld, "distributions", counting)
    rows = widening.rejection_sampling_gain(world, (2,), 3, None, lossy=True)
    assert fetched and len(fetched) == len(set(fetched))  # no node fetched twice
    monkeypatch.setattr(DepthProfileWorld, "distributions", plain)
    tempered = world.rooted(1)
    for r in rows:
        shape = Static([(0,), (0, 0), (0, 0, 0)]) if r["draft"] == "argmax" else chain(3)
        lossy = (r["draft"], r["verifier"]) == widening.LOSSY_PAIRING
        est = expected_block_efficiency(tempered, (2,), shape, r["verifier"], allow_lossy=lossy)
        assert r["value"] == est.mean


def test_a_table_of_another_pair_or_context_is_refused():
    world = DepthProfileWorld(5, seed=4, settings=SamplingSettings(1.0))
    with pytest.raises(ValueError, match="table"):
        expected_block_efficiency(world, (2,), chain(2), "naive", table=NodeTable(world, (1,)))
    with pytest.raises(ValueError, match="table"):
        expected_block_efficiency(world, (2,), chain(2), "naive", table=NodeTable(world.rooted(1), (2,)))


def test_rejection_sampling_at_t1_is_the_world_profile():
    profile = LinearProfile(0.1, 0.5, 8)
    world = DepthProfileWorld(6, seed=1, settings=SamplingSettings(1.0), profile=profile)
    rows = widening.rejection_sampling_gain(world, (0,), 3, [1.0])
    value = _by_key(rows, "draft", "verifier")[("sampled", "naive")]["value"]
    accept = [1 - profile(d) for d in range(3)]  # 1 - TV(p, q) at depths 0, 1, 2
    assert value == pytest.approx(1 + accept[0] + accept[0] * accept[1] + accept[0] * accept[1] * accept[2], abs=1e-12)
    assert not any(r["verifier"] == "naive" and r["draft"] == "argmax" for r in rows)  # lossy only when asked


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda p: widening.rank_statistics(p, (0,), 0), "depth"),
        (lambda p: widening.rank_statistics(p, (0,), 2, ranks=0), "ranks"),
        (lambda p: widening.rank_statistics(p, (0,), 2, ranks=2.0), "ranks"),
        (lambda p: widening.rank_statistics("pair", (0,), 2), "source"),
        (lambda p: widening.rank_statistics(p, None, 2), "context"),
        (lambda p: widening.rank_statistics(p, (9,), 2), "context"),
        (lambda p: widening.rank_statistics(NodeTable(p, (1,)), (0,), 2), "context"),
        (lambda p: widening.widening_gains(p, (0,), 2, (1,)), "widths"),
        (lambda p: widening.widening_gains(p, (0,), 2, ()), "widths"),
        (lambda p: widening.widening_gains(p, (0,), 2, (6,)), "widths"),
        (lambda p: widening.widening_gains(p, (0,), 2, modes=["tree"]), "modes"),
        (lambda p: widening.widening_gains(p, (0,), 2, modes="one_position"), "modes"),
        (lambda p: widening.widening_gains(p, (0,), 2, verifier="naive"), "verifier"),
        (lambda p: widening.widening_gains(p, (0,), 2, verifier="greedy"), "verifier"),
        (lambda p: widening.widening_gains(p, (0,), 2, draft_law="tempered"), "draft_law"),
        (lambda p: widening.rank_statistics(p, (0,), 2, draft_law=None), "draft_law"),
        (lambda p: widening.rejection_sampling_gain(p, (0,), 2, [1.0]), "pair"),
        (lambda p: widening.rejection_sampling_gain("pair", (0,), 2, None), "pair"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}:"):
        call(_pair())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperatures": [-1.0]}, "temperatures"),
        ({"temperatures": []}, "temperatures"),
        ({"temperatures": "1.0"}, "temperatures"),
        ({"temperatures": [True]}, "temperatures"),
        ({"temperatures": [1.0], "lossy": 1}, "lossy"),
        ({"temperatures": [1.0], "depth": 0}, "depth"),
        ({"temperatures": [1.0], "context": "ab"}, "context"),
    ],
)
def test_rejection_sampling_bad_input_names_the_argument(kwargs, name):
    args = {"pair": DepthProfileWorld(4, seed=0), "context": (0,), "depth": 2, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}:"):
        widening.rejection_sampling_gain(**args)


@pytest.mark.parametrize("eos_position", [1, 2])
def test_widening_with_an_eos_id_counts_nothing_after_it(eos_position):
    base, context, depth = _pair(seed=5, vocab=6), (0,), 3
    eos = _chain_tokens(base, context, depth)[eos_position - 1]
    pair = MarkovPair(base.target, base.draft, eos_id=eos)
    ranks = _by_key(widening.rank_statistics(pair, context, depth, 4), "position", "rank")
    assert all(ranks[(k, 1)]["reach"] == 0.0 for k in range(eos_position + 1, depth + 1))
    rule = tree_verifiers.get("exact_match")
    for row in widening.widening_gains(pair, context, depth, (2, 3, 4), verifier="exact_match"):
        positions = [row["position"]] if row["mode"] == "one_position" else list(range(1, depth + 1))
        tree = _hand_tree(pair, context, depth, row["width"], positions)
        assert row["value"] == pytest.approx(rule.expected_block_efficiency(tree), abs=1e-12)
        terms = [ranks[(k, r)] for k in positions for r in range(2, row["width"] + 1)]
        assert row["gain"] == pytest.approx(sum(t["joint"] for t in terms if t["token"] != eos), abs=1e-12)


def test_rejection_sampling_on_a_pair_as_it_is():
    pair, context = _pair(seed=2, vocab=4), (1,)
    rows = _by_key(widening.rejection_sampling_gain(pair, context, 3, None), "draft", "verifier")
    argmax, speculative = _chain_closed_forms(pair, context, 3)
    assert rows[("argmax", "exact_match")]["value"] == pytest.approx(argmax, abs=1e-12)
    assert rows[("sampled", "naive")]["value"] == pytest.approx(speculative, abs=1e-12)
    assert rows[("sampled", "naive")]["temperature"] is None and rows[("sampled", "naive")]["setting"] is None
    world = DepthProfileWorld(4, seed=1, settings=SamplingSettings(0.8))
    assert widening.rejection_sampling_gain(world, (0,), 2, None) == widening.rejection_sampling_gain(world, (0,), 2, [0.8])
