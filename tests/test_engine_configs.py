"""The sweep's engine mappings (``analyses._engine_configs``) against each engine's own rule.

The rules below are written out from the engines' code, not from the module under test:

* EAGLE, SafeAILab/EAGLE@cb7e084: ``eagle/model/ea_model.py`` (``total_token = -1`` picks one of
  40..60 by timing), ``eagle/model/cnets.py::topK_genrate`` (``total_tokens = total_token - 1``;
  ``torch.topk`` of ``top_k`` at the root, ``range(depth)`` rounds of ``top_k^2`` candidates, then
  ``torch.topk(scores, total_tokens)`` over the ``top_k + depth top_k^2`` scores).
* vLLM, vllm-project/vllm@f19b16d ``vllm/config/speculative.py``: ``num_speculative_tokens`` is a
  ``Field(gt=0)``; no ``speculative_token_tree``: the chain of ``num_speculative_tokens`` tokens.
* SGLang, sgl-project/sglang@d9ccf6a ``arg_groups/speculative_hook.py::_handle_eagle_family``
  (``topk == 1``: ``num_draft_tokens = num_steps + 1``), @fba8ecc ``speculative/eagle_worker.py::
  draft_forward`` (``range(num_steps)`` steps: ``topk`` scores, then ``topk^2`` per step; no step:
  ``torch.cat`` of nothing fails), @263bc85 ``speculative/eagle_utils.py::organize_draft_results``
  (``torch.topk(scores, num_draft_tokens - 1)``).
"""

from __future__ import annotations

import json

import pytest
from conftest import one_error_line
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses import _engine_configs as engines
from analyses import sweep
from backends.sources import SyntheticSource
from simlab import builders
from simlab.latency import LatencyModel
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

FAILS = "the engine raises"
LAB_LIMITS = ("drafts no token", "timed choice", "negative depth", "beyond the lab's levels")
"""Settings the engine runs but the lab refuses, each with its declared one-line reason."""


def eagle_rule(total_token: int, depth: int, top_k: int):
    """(draft tokens, most levels) EAGLE verifies, FAILS, or the lab limit it meets."""
    if total_token == -1:
        return "timed choice"
    drafts = total_token - 1
    if drafts < 0 or top_k < 0:
        return FAILS  # torch.topk with k < 0
    if drafts == 0:
        return "drafts no token"
    if drafts > top_k + max(depth, 0) * top_k**2:  # range(depth) is empty for depth <= 0
        return FAILS
    if depth < 0:
        return "negative depth"
    return drafts, depth + 1


def vllm_rule(num_speculative_tokens: int):
    if num_speculative_tokens <= 0:
        return FAILS  # Field(gt=0)
    return num_speculative_tokens, num_speculative_tokens


def sglang_rule(num_steps: int, topk: int, num_draft_tokens: int):
    if num_steps < 1 or topk < 0:
        return FAILS  # no draft step: torch.cat([]); torch.topk with k < 0
    if topk == 1:
        num_draft_tokens = num_steps + 1
    drafts = num_draft_tokens - 1
    if drafts < 0:
        return FAILS
    if drafts == 0:
        return "drafts no token"
    if drafts > topk + (num_steps - 1) * topk**2:
        return FAILS
    return drafts, num_steps


RULES = {
    "eagle": lambda e: eagle_rule(e["total_token"], e["depth"], e["top_k"]),
    "vllm": lambda e: vllm_rule(e["num_speculative_tokens"]),
    "sglang": lambda e: sglang_rule(e["speculative_num_steps"], e["speculative_eagle_topk"], e["speculative_num_draft_tokens"]),
}
SETTING = SamplingSettings(1.0)
ROOT = next(iter(SyntheticSource("depth_profile", 16, 1, 1, 4, 0, stream="per_trajectory").roots(SETTING)))
LATENCY = LatencyModel.from_cost_ratio(0.1)


def check_against_the_engine(entry: dict) -> None:
    """An accepted configuration's valued tree (the sweep's ``value_root`` row at a root) has the
    engine's draft tokens and at most its levels; a refused one is one the engine cannot run or a declared lab limit, refused in one
    line naming a key as written."""
    rule = RULES[entry["engine"]](entry)
    entry = {**entry, "modes": ["one_hot"]}
    if isinstance(rule, tuple) and rule[1] > engines.MAX_LEVELS:
        rule = "beyond the lab's levels"
    try:
        c = engines.make_config(entry)
    except ValueError as exc:
        message = str(exc).removeprefix("config: ")
        assert rule == FAILS or rule in LAB_LIMITS, f"{entry}: refused ({exc}), but the engine runs it: {rule}"
        assert "\n" not in message and message.startswith(tuple(engines.KEYS[entry["engine"]])), message
        return
    assert isinstance(rule, tuple), f"{entry}: accepted as {c.label}, but the engine cannot run it ({rule})"
    drafts, levels = rule
    builder = sweep.Builders(sweep.Config(), None, None).get(c, ROOT, SETTING)
    rows, missing = sweep.value_root(c, builder, ROOT, SETTING, 0, sweep.Config(), LATENCY, False)
    assert not missing and {r["tokens"] for r in rows} == {drafts}, f"{entry}: the lab values {rows}, the engine {drafts} tokens"
    assert c.budget == drafts and builder.sample(NodeTable(ROOT.pair, ROOT.context)).depth() <= levels
    written = {k: entry[k] for k in engines.KEYS[entry["engine"]]}
    adjusted = getattr(c, "adjusted", ())
    for key, value in c.settings:
        assert value == written[key] or (key, written[key]) in {(k, w) for k, w, _ in adjusted}
    assert all(f"written {w}" in c.label for _, w, _ in adjusted)


ENTRIES = st.one_of(
    st.builds(
        lambda t, d, k: {"engine": "eagle", "total_token": t, "depth": d, "top_k": k},
        st.integers(-1, 12),
        st.integers(-1, 4),
        st.integers(0, 4),
    ),
    st.builds(lambda k: {"engine": "vllm", "num_speculative_tokens": k}, st.integers(-1, 12)),
    st.builds(
        lambda s, k, n: {
            "engine": "sglang",
            "speculative_num_steps": s,
            "speculative_eagle_topk": k,
            "speculative_num_draft_tokens": n,
        },
        st.integers(0, 5),
        st.integers(0, 4),
        st.integers(0, 20),
    ),
)


@settings(max_examples=max(settings().max_examples, 200))
@given(ENTRIES)
def test_every_mapping_values_what_the_engine_runs(entry):
    check_against_the_engine(entry)


# the engines' edges, and the settings the issue names (SGLang: steps 5, topk 1, draft tokens 3 verifies 5 tokens)
EDGES = [
    {"engine": "sglang", "speculative_num_steps": 5, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3},
    {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 0},
    {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 8},
    {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 7},
    {"engine": "sglang", "speculative_num_steps": 66, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
    {"engine": "sglang", "speculative_num_steps": 65, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
    {"engine": "vllm", "num_speculative_tokens": 65},
    {"engine": "vllm", "num_speculative_tokens": 100000000},
    {"engine": "eagle", "total_token": 60, "depth": 3, "top_k": 1},
    {"engine": "eagle", "total_token": 5, "depth": 1, "top_k": 2},
    {"engine": "eagle", "total_token": 8, "depth": 1, "top_k": 2},
    {"engine": "eagle", "total_token": 8, "depth": 65, "top_k": 1},
    {"engine": "eagle", "total_token": -1, "depth": 7, "top_k": 10},
]


@pytest.mark.parametrize("entry", EDGES, ids=lambda e: " ".join(str(v) for v in e.values()))
def test_the_engines_edges(entry):
    check_against_the_engine(entry)


def test_sglang_topk_1_is_valued_as_sglang_resets_it_and_says_so():
    c = engines.make_config(
        {"engine": "sglang", "speculative_num_steps": 5, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3}
    )
    assert c.budget == 5 and c.lab["depth"] == 4 and dict(c.settings)["speculative_num_draft_tokens"] == 6
    assert c.label == (
        "sglang speculative_num_steps=5 speculative_eagle_topk=1 speculative_num_draft_tokens=6 "
        "(written 3: SGLang runs num_steps + 1 at topk 1)"
    )
    named = engines.make_config(
        {
            "engine": "sglang",
            "speculative_num_steps": 5,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 3,
            "name": "x",
        }
    )
    assert named.label.startswith("x (speculative_num_draft_tokens=6, written 3")
    # a setting SGLang runs as written keeps its label (docs/engines.json's pinned rows)
    same = engines.make_config(
        {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    )
    assert same.label == "sglang speculative_num_steps=3 speculative_eagle_topk=1 speculative_num_draft_tokens=4"
    assert not same.adjusted


@pytest.mark.parametrize(
    "entry, key",
    [
        ({"engine": "vllm", "num_speculative_tokens": 100000000}, "num_speculative_tokens"),
        (
            {
                "engine": "sglang",
                "speculative_num_steps": 100000000,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 2,
            },
            "speculative_num_steps",
        ),
        (
            {
                "engine": "sglang",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 4,
                "speculative_num_draft_tokens": 100000000,
            },
            "speculative_num_draft_tokens",
        ),
        ({"engine": "eagle", "total_token": 100000000, "depth": 7, "top_k": 10}, "total_token"),
        ({"engine": "eagle", "total_token": 60, "depth": 100000000, "top_k": 10}, "depth"),
        ({"engine": "sequoia", "budget": 100000000}, "budget"),  # the DP asked for 10^11 bytes (MemoryError)
    ],
)
def test_a_huge_value_is_refused_naming_the_key_written(tmp_path, capsys, entry, key):
    """Item 13: a vLLM chain of 10^8 tokens was refused as ``depth: ...``, a key vLLM has not."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--config", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and f"--config[0]: {key}" in err, err


def test_a_top_k_above_the_vocabulary_is_not_run():
    """EAGLE's and SGLang's first torch.topk takes top_k of the vocabulary: at a root of 8 tokens a
    top_k of 9 is listed as not run, naming the key, instead of valued as a tree the engine cannot draft."""
    root = next(iter(SyntheticSource("depth_profile", 8, 1, 1, 4, 0, stream="per_trajectory").roots(SETTING)))
    for entry, key in (
        ({"engine": "eagle", "total_token": 6, "depth": 2, "top_k": 9}, "top_k"),
        (
            {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 9, "speculative_num_draft_tokens": 6},
            "speculative_eagle_topk",
        ),
        ({"engine": "eagle", "total_token": 6, "depth": 2, "top_k": 8}, None),
    ):
        c = engines.make_config({**entry, "modes": ["one_hot"]})
        builder = sweep.Builders(sweep.Config(), None, None).get(c, root, SETTING)
        rows, missing = sweep.value_root(c, builder, root, SETTING, 0, sweep.Config(), LATENCY, False)
        if key is None:
            assert not missing and rows[0]["tokens"] == 5
        else:
            assert not rows and missing["one_hot"].startswith(f"{key}: 9 exceeds the vocabulary of 8 tokens"), missing


@pytest.mark.parametrize(
    "entries, message",
    [
        ([{"engine": "sequoia", "budget": 8, "modes": ["one_hot", "one_hot"]}], "config[0]: modes lists 'one_hot' twice"),
        (
            [  # SGLang runs both as draft tokens = 4: the same rows twice under two labels
                {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
                {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 9},
            ],
            "config[1]: runs the setting of config[0]",
        ),
        (
            [
                {"engine": "vllm", "num_speculative_tokens": 3, "name": "a"},
                {"engine": "vllm", "num_speculative_tokens": 3, "name": "b"},
            ],
            "config[1]: runs the setting of config[0]",
        ),
    ],
)
def test_repeats_in_a_configuration_file_are_refused(tmp_path, capsys, entries, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps(entries))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--config", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--chain-lengths", "--eagle-depths", "--sequoia-budgets", "--specblock-budgets"])
def test_a_repeated_grid_value_is_refused(tmp_path, capsys, flag):
    """The sweep's list flags go through ``backends.cli.int_list``, which refuses a repeated value."""
    with pytest.raises(SystemExit) as exit:
        sweep.main([flag, "3,4,3", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and err.split("error: ")[1].startswith(flag), err
    assert not (tmp_path / "out").exists()


def test_max_levels_is_the_eagle2_builders_range():
    builders.EAGLE2(budget=engines.MAX_LEVELS, depth=engines.MAX_LEVELS - 1, top_k=1)
    with pytest.raises(ValueError, match="depth"):
        builders.EAGLE2(budget=engines.MAX_LEVELS + 1, depth=engines.MAX_LEVELS, top_k=1)


# -- planted faults: the old SGLang mapping (no topk-1 reset; no candidate limit) ----------------------------------------
@pytest.mark.parametrize("fault", ["no topk-1 reset", "no candidate limit"])
def test_the_old_sglang_mapping_is_caught(monkeypatch, fault):
    if fault == "no topk-1 reset":  # steps 5, topk 1, draft tokens 3: the lab valued 2 draft tokens, SGLang verifies 5
        entry = EDGES[0]
        monkeypatch.setattr(engines, "engine_settings", lambda engine, s: (dict(s), ()))
    else:  # steps 2, topk 2, draft tokens 8: 7 draft tokens of 6 candidates, SGLang's torch.topk fails
        entry, limit = EDGES[2], engines.engine_limit
        monkeypatch.setattr(engines, "engine_limit", lambda engine, lab: limit(engine, lab) if engine == "eagle" else "")
    with pytest.raises(AssertionError):
        check_against_the_engine(entry)
    monkeypatch.undo()
    check_against_the_engine(entry)


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--chain-lengths", "66"], "--chain-lengths"),
        (["--sequoia-budgets", "9000"], "--sequoia-budgets"),
        (["--eagle-depths", "70"], "--eagle-depths"),
        (["--eagle-top-ks", "0"], "--eagle-top-ks"),
    ],
)
def test_a_grid_value_the_lab_refuses_names_its_flag(tmp_path, capsys, flags, flag):
    """The default grid's values come from flags: a refused one names the flag, not the engine key
    under ``config:`` (which names a ``--config`` file's entry)."""
    with pytest.raises(SystemExit) as exit:
        sweep.main(flags + ["--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and f"error: {flag}: " in err and "config" not in err, err


@pytest.mark.parametrize("engine", [["eagle"], {"e": 1}, None, 3])
def test_an_engine_that_is_not_a_name_is_refused_in_one_line(tmp_path, capsys, engine):
    path = tmp_path / "c.json"
    path.write_text(json.dumps([{"engine": engine, "total_token": 8, "depth": 3, "top_k": 4}]))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--config", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and "--config[0]: engine must be one of" in err, err


@pytest.mark.parametrize(
    "entry",
    [
        {
            "engine": "sglang",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 2,
            "speculative_num_draft_tokens": 4,
            "method": "NGRAM",
        },
        {"engine": "eagle", "total_token": 8, "depth": 3, "top_k": 4, "method": "medusa"},
    ],
)
def test_a_method_that_drafts_otherwise_is_refused(tmp_path, capsys, entry):
    """SGLang's and EAGLE's ``method`` was recorded but never checked: an n-gram or Medusa drafter
    was valued as an EAGLE tree under the user's label."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--config", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and f"method {entry['method']!r} is not a drafter" in err, err
    entry = {**entry, "method": entry["method"] and ("EAGLE3" if entry["engine"] == "sglang" else "eagle3")}
    assert engines.make_config(entry).method in ("EAGLE3", "eagle3")
