"""The latency model: tables, DDTE's T-hat, the no-draft action, profile files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simlab.latency import ForwardTime, LatencyModel, delayed_levels

# Context- and size-dependent times: a 3 x 3 table that is not affine, so interpolation matters.
DRAFT = ForwardTime((0, 32, 128), (1, 8, 64), ((1.0, 1.2, 2.0), (1.1, 1.4, 2.5), (1.5, 1.9, 3.5)))
TARGET = ForwardTime((0, 32, 128), (1, 8, 64), ((10.0, 11.0, 16.0), (11.0, 12.5, 18.0), (14.0, 16.0, 25.0)))
MODEL = LatencyModel(DRAFT, TARGET)


@pytest.mark.parametrize("L1, L2", [(0, 0), (3, 0), (0, 5), (2, 4), (8, 8)])
@pytest.mark.parametrize("context", [5, 40, 300])
def test_k1_reduces_to_the_chain_formula(L1, L2, context):
    L = L1 + L2
    chain = sum(DRAFT(context + j, 1) for j in range(L)) + TARGET(context + L, 1 + L)
    assert MODEL.delayed_time(1, L1, L2, context) == pytest.approx(chain, rel=1e-12)


@pytest.mark.parametrize("K, L1, L2", [(2, 0, 3), (3, 2, 4), (4, 8, 8), (4, 3, 0)])
def test_ddte_formula_with_context_only_times(K, L1, L2):
    t_q = ForwardTime((0, 100), (1,), ((1.0,), (3.0,)))
    t_p = ForwardTime((0, 100), (1,), ((10.0,), (30.0,)))
    model, l = LatencyModel(t_q, t_p), 17
    ddte = sum(t_q(l + j) for j in range(L1)) + sum(t_q(l + L1 + j * K) for j in range(L2)) + t_p(l + L1 + K * L2)
    assert model.delayed_time(K, L1, L2, l) == pytest.approx(ddte, rel=1e-12)


def test_generic_tree_counts_one_draft_forward_per_level():
    model = LatencyModel.from_cost_ratio(0.25, target_seconds=2.0)
    assert model.tree_time(10, (2, 3, 3)) == pytest.approx(3 * 0.5 + 2.0)
    assert model.tree_time(10, delayed_levels(4, 2, 3)) == pytest.approx(5 * 0.5 + 2.0)


@pytest.mark.parametrize("K", [1, 4])
def test_no_draft_costs_one_target_forward(K):
    assert MODEL.delayed_time(K, 0, 0, 50) == TARGET(50, 1)


def test_no_draft_throughput_is_one_over_t_p():
    from analyses._labels import Grid, label_root
    from backends.sources import SyntheticSource
    from simlab.sampling import SamplingSettings

    root = next(SyntheticSource(vocab=6, trajectories=1, roots_per_trajectory=1).roots(SamplingSettings()))
    rows = label_root(root, ["specinfer", "bv"], Grid((1, 2), (0, 1), (0, 1), samples=2), MODEL)
    empty = [r for r in rows if r["L1"] == 0 and r["L2"] == 0]
    assert len(empty) == 3
    for r in empty:
        assert r["E"] == 1.0 and r["E"] / r["T"] == 1.0 / TARGET(len(root.context), 1)


def test_affine_is_exact_everywhere():
    t = ForwardTime.affine(2.0, per_token=0.1, per_context=0.01)
    for l, n in [(0, 1), (5, 3), (400, 41), (3, 100)]:
        assert t(l, n) == pytest.approx(2.0 * (1 + 0.1 * (n - 1) + 0.01 * l), rel=1e-12)


def test_table_points_interpolation_and_floor():
    for i, l in enumerate(DRAFT.contexts):
        for j, n in enumerate(DRAFT.tokens):
            assert DRAFT(l, n) == DRAFT.seconds[i][j]
    assert DRAFT(16, 1) == pytest.approx(1.05)
    falling = ForwardTime((0, 10), (1,), ((2.0,), (1.0,)))
    assert falling(1000) == 1.0  # extrapolation never goes below the smallest measured time


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(contexts=(0, 0), tokens=(1,), seconds=((1.0,), (1.0,))), "contexts"),
        (dict(contexts=(0,), tokens=(0,), seconds=((1.0,),)), "tokens"),
        (dict(contexts=(0,), tokens=(1, 2), seconds=((1.0,),)), "seconds"),
        (dict(contexts=(0,), tokens=(1,), seconds=((0.0,),)), "seconds"),
        (dict(contexts=(0,), tokens=(1,), seconds=((float("nan"),),)), "seconds"),
        (dict(contexts="16", tokens=(1,), seconds=((1.0,),)), "contexts"),
    ],
)
def test_bad_tables(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ForwardTime(**kwargs)


def test_bad_cost_ratio_and_levels():
    with pytest.raises(ValueError, match="c:"):
        LatencyModel.from_cost_ratio(0.0)
    with pytest.raises(ValueError, match="per_token"):
        LatencyModel.from_cost_ratio(0.1, per_token=-1)
    with pytest.raises(ValueError, match="levels"):
        MODEL.tree_time(3, (1, 0))


def test_json_round_trip_and_toml(tmp_path):
    MODEL.save(tmp_path / "p.json")
    assert LatencyModel.load(tmp_path / "p.json") == MODEL
    (tmp_path / "p.toml").write_text(
        'unit = "seconds"\nsource = "hand"\n[draft]\ncontexts = [0]\ntokens = [1]\nseconds = [[0.002]]\n'
        "[target]\ncontexts = [0, 64]\ntokens = [1]\nseconds = [[0.02], [0.03]]\n"
    )
    model = LatencyModel.load(tmp_path / "p.toml")
    assert model.source == "hand" and model.target(32) == pytest.approx(0.025)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("a.json", "{", "cannot parse"),
        ("a.yaml", "{}", "json or .toml"),
        ("a.json", json.dumps({"draft": {}}), "'draft' and a 'target'"),
        ("a.json", json.dumps({"unit": "ms", "draft": {}, "target": {}}), "unit"),
        ("a.json", json.dumps({"draft": {"contexts": [0], "tokens": [1]}, "target": {}}), "draft: must be a table"),
        ("a.json", json.dumps({"draft": {"contexts": [0], "tokens": [1], "seconds": [[-1]]}, "target": {}}), "draft.seconds"),
    ],
)
def test_bad_profiles(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        LatencyModel.load(tmp_path / name)
    with pytest.raises(ValueError, match="no such profile"):
        LatencyModel.load(tmp_path / "missing.json")


def test_times_are_float64_seconds():
    assert isinstance(MODEL.delayed_time(2, 1, 2, 10), float) and np.isfinite(MODEL.delayed_time(4, 8, 8, 10**6))


def test_bad_calls():
    with pytest.raises(ValueError, match="context"):
        DRAFT(-1, 1)
    with pytest.raises(ValueError, match="tokens"):
        DRAFT(3, 0)
    with pytest.raises(ValueError, match="levels"):
        MODEL.tree_time(3, "12")
    with pytest.raises(ValueError, match="L1"):
        MODEL.delayed_time(2, -1, 2, 0)
    with pytest.raises(ValueError, match="latency"):
        LatencyModel.load(None)


def test_draw_grid_checks_its_arguments():
    from simlab.grid import draw_grid
    from simlab.pairs import ContextFreePair
    from simlab.trees import NodeTable

    table = NodeTable(ContextFreePair([0.5, 0.5], [0.5, 0.5]), [0])
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="L1_values"):
        draw_grid(table, L1_values=(), rng=rng)
    with pytest.raises(ValueError, match="L1_values"):
        draw_grid(table, L1_values=(1, 1), rng=rng)
    with pytest.raises(ValueError, match="rng"):
        draw_grid(table, rng=0)
    assert len(draw_grid(table, K_max=2, L1_values=(0, 1), L2_max=1, samples=np.int64(2), rng=rng)) == 4
