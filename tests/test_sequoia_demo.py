"""Sequoia's shipped demo files read as shipped, and the DP's values on its demo acceptance vector
pinned and cross-checked against the official code (issue 24, item 5)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from analyses import sequoia_tree
from conftest import one_error_line
from simlab.builders.sequoia import sequoia_size, tree_dp

DEMO_VECTOR = [
    0.0,
    0.6341829299926758,
    0.10794602334499359,
    0.056971512734889984,
    0.022488756105303764,
    0.019490255042910576,
    0.014992503449320793,
    0.004497751127928495,
    0.002998500829562545,
    0.01199400331825018,
    0.004497751127928495,
    0.007496251724660397,
    0.004497751127928495,
    0.00599700165912509,
    0.002998500829562545,
    0.0014992504147812724,
    0.002998500829562545,
    0.0014992504147812724,
    0.002998500829562545,
    0.0,
    0.002998500829562545,
    0.002998500829562545,
    0.002998500829562545,
    0.0,
    0.0014992504147812724,
    0.0,
    0.0014992504147812724,
    0.0,
    0.0,
    0.0,
    0.0014992504147812724,
    0.0014992504147812724,
    0.0014992504147812724,
    0.07346326857805252,
]
"""Sequoia@0ff3ff7 ``acceptance-rate-vector.pt`` as shipped: a float32 tensor of 34 entries
[0, p_1..p_32, p_none] (saved from a CUDA device), its values printed exactly in float64 (data,
read with ``torch.load(..., map_location="cpu", weights_only=True)``)."""

DEMO_CONFIG = {
    "acceptance_rate_vector": "acceptance-rate-vector.pt",
    "max_depth": 10,
    "max_budget": 128,
    "draft_time": 0.3,
    "valid_budget": [1, 2, 4, 8, 16, 32],
    "target_time": [10, 10, 10, 12, 14, 18],
    "dst": "demo_tree.pt",
}
"""Sequoia@0ff3ff7 ``demo-config.json`` as shipped."""

LAB_BEST = {
    1: 1.0,
    2: 1.6341829299926758,
    4: 2.2914316757646533,
    8: 2.732172775609381,
    16: 3.130289344659335,
    32: 3.5007385477189357,
}
OFFICIAL_BEST = {
    1: 1.0,
    2: 1.6341829299926758,
    4: 2.291431427001953,
    8: 2.732172727584839,
    16: 3.130289316177368,
    32: 3.5007388591766357,
}
OFFICIAL_TREE_M32 = (
    (0,),
    (1,),
    (2,),
    (3,),
    (4,),
    (5,),
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (2, 0),
    (0, 0, 0),
    (0, 0, 1),
    (0, 0, 2),
    (0, 1, 0),
    (0, 2, 0),
    (1, 0, 0),
    (2, 0, 0),
    (0, 0, 0, 0),
    (0, 0, 0, 1),
    (0, 0, 1, 0),
    (0, 1, 0, 0),
    (0, 2, 0, 0),
    (1, 0, 0, 0),
    (2, 0, 0, 0),
    (0, 0, 0, 0, 0),
    (0, 0, 0, 0, 1),
    (0, 0, 0, 1, 0),
    (0, 0, 1, 0, 0),
    (0, 1, 0, 0, 0),
    (1, 0, 0, 0, 0),
)


@pytest.fixture()
def demo(tmp_path):
    """The demo files as shipped, in a folder of their own: the vector as a float32 .pt, the config."""
    torch.save(torch.tensor(DEMO_VECTOR, dtype=torch.float32), tmp_path / "acceptance-rate-vector.pt")
    (tmp_path / "demo-config.json").write_text(json.dumps(DEMO_CONFIG))
    return tmp_path


def test_demo_dp_values_and_tree_match_the_official_code(demo, capsys):
    """The DP on Sequoia's demo vector: best expected accepted tokens (root included) by valid
    budget m (nodes, root included) at max_depth = 10 levels, the chosen (m, l) and tree.

    ``LAB_BEST`` are the lab's float64 values.  Cross-check (Sequoia@0ff3ff7, run on this CPU with
    torch 2.13 outside the repository): ``tree_search.py --config demo-config.json`` as shipped,
    its ``torch.load`` given ``map_location="cpu"`` (the shipped vector was saved on CUDA; the
    algorithm untouched), prints ``tensor(4.8878) tensor(2.0459) (4, 4)``: the time per token
    (l t_draft + t_target(m)) / T[m][l] = 4.8878, the speedup 10 / 4.8878 = 2.0459 and (m, l) =
    (4, 4), whose tree (its ``grow_map``) is the chain root -> 0 -> 0 -> 0, as the shipped
    ``demo_tree.pt`` (``Successors`` [[1], [2], [3], []]).  Its float32 ``results = T.max(dim=2)``
    read from the script's globals at full precision gave ``OFFICIAL_BEST`` (row m, column l = 10;
    the same run with max_budget 32, which leaves rows m <= 32 unchanged), within 5e-7 of the lab's.
    With ``valid_budget`` [32] and ``target_time`` [18] it chose (32, 6) (time 5.8025) and its
    ``grow_map`` ``Successors``, as child ranks, give ``OFFICIAL_TREE_M32``, equal to the lab's tree."""
    vector, rule = sequoia_tree.read_acceptance(str(demo / "demo-config.json"))
    assert vector == DEMO_VECTOR[1:-1] and rule == {k: DEMO_CONFIG[k] for k in (*sequoia_tree.SIZE_RULE, "max_budget")}
    facts = sequoia_tree.sequoia_rule(vector, rule)
    assert facts["best_by_budget"] == pytest.approx(LAB_BEST, rel=1e-12, abs=0)
    assert facts["best_by_budget"] == pytest.approx(OFFICIAL_BEST, abs=1e-6)
    assert (facts["nodes"], facts["levels"]) == (4, 4) and facts["spec"] == ((0,), (0, 0), (0, 0, 0))
    assert facts["time_per_token"] == pytest.approx(4.8878, abs=5e-5) and facts["speedup"] == pytest.approx(2.0459, abs=5e-5)
    assert facts["expected_tokens"] == pytest.approx(LAB_BEST[4], rel=1e-12)
    table = tree_dp(vector, 32, 10)
    assert sequoia_size(table, draft_time=0.3, budgets=[32], target_times=[18], levels=10)[:2] == (32, 6)
    assert table.spec(32, 6) == OFFICIAL_TREE_M32
    assert sequoia_tree.main(["--acceptance", str(demo / "demo-config.json")]) == 0
    out = capsys.readouterr().out
    assert "m = 4 nodes, l = 4 levels" in out and "speedup 2.0459" in out and "[[0], [0, 0], [0, 0, 0]]" in out


def test_the_pt_vector_alone_goes_through_the_labs_latency_model(demo, capsys):
    """The .pt file alone: p_1..p_32 with the lab's size rule (default cost ratio 0.1, context 64)."""
    from simlab.builders.sequoia import choose
    from simlab.latency import LatencyModel

    assert sequoia_tree.main(["--acceptance", str(demo / "acceptance-rate-vector.pt"), "--budgets", "3", "--depth", "3"]) == 0
    out = capsys.readouterr().out
    spec, _ = choose(DEMO_VECTOR[1:-1], LatencyModel.from_cost_ratio(0.1), context=64, budgets=[3], levels=3)
    assert len(spec) == 3 and f"tree (tuple notation): {[list(n) for n in spec]}" in out


def bad_tensor_files(folder):
    """(file, expected message) for tensor files the loader must refuse."""
    cases = {
        "dict.pt": ({"v": torch.tensor(DEMO_VECTOR)}, "1-D float tensor"),
        "two_d.pt": (torch.tensor([DEMO_VECTOR]), "1-D float tensor"),
        "ints.pt": (torch.tensor([0, 1, 0]), "1-D float tensor"),
        "short.pt": (torch.tensor([0.0, 1.0]), "1-D float tensor"),
        "negative.pt": (torch.tensor([0.0, 1.2, -0.2]), "probabilities"),
        "nan.pt": (torch.tensor([0.0, float("nan"), 1.0]), "probabilities"),
        "first.pt": (torch.tensor([0.5, 0.25, 0.25]), "first 0"),
        "sum.pt": (torch.tensor([0.0, 0.5, 0.2]), "summing to 1"),
    }
    out = []
    for name, (value, message) in cases.items():
        torch.save(value, folder / name)
        out.append((name, message))
    (folder / "garbage.pt").write_bytes(b"not a torch file")
    out.append(("garbage.pt", "cannot load"))
    torch.save(np.float64(0.5), folder / "numpy.pt")  # not allowed by the weights-only unpickler
    out.append(("numpy.pt", "cannot load"))
    return out


def test_bad_tensor_files_exit_2_with_one_line(tmp_path, capsys):
    for name, message in bad_tensor_files(tmp_path):
        with pytest.raises(SystemExit) as exc:
            sequoia_tree.main(["--acceptance", str(tmp_path / name)])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and one_error_line(err) and "--acceptance" in err and message in err, (name, err)


@pytest.mark.parametrize(
    "change, flags, message",
    [
        ({"acceptance_rate_vector": "missing.pt"}, [], "not a file next to it"),
        ({"draft_time": None}, [], "part of Sequoia's size rule"),
        ({"valid_budget": [1, 2], "target_time": [10]}, [], "one length"),
        ({"valid_budget": [256], "target_time": [10]}, [], "exceeds max_budget"),
        ({"draft_time": -1}, [], "draft_time"),
        ({}, ["--budgets", "4"], "--budgets"),
        ({}, ["--cost-ratio", "0.2"], "--cost-ratio"),
    ],
)
def test_bad_configs_exit_2_with_one_line(demo, change, flags, message, capsys):
    config = {k: v for k, v in {**DEMO_CONFIG, **change}.items() if v is not None}
    (demo / "demo-config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as exc:
        sequoia_tree.main(["--acceptance", str(demo / "demo-config.json"), *flags])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and message in err, err
