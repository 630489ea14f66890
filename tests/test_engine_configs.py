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
* llama.cpp, ggml-org/llama.cpp@00efb3e ``tools/server/server-task.cpp::params_from_json_cmpl``
  (``n_min = max(min(n_max, n_min), 0)``, ``n_max = max(n_max, 0)``), @6c8a045
  ``tools/server/server-context.cpp`` (``get_n_draft_max``: no speculation when ``n_max < n_min``,
  i.e. at ``n_max = 0``; a draft shorter than ``n_min`` is ignored) and
  ``common/speculative.cpp::common_speculative_use_draft_model`` (the draft's top-10 sampler, the
  first candidate pushed, break at ``n_draft`` tokens or ``p < p_min``).
* TensorRT-LLM, NVIDIA/TensorRT-LLM@0004396 ``tensorrt_llm/llmapi/llm_args.py``
  (``max_draft_len: NonNegativeInt``, ``== 0`` raises; ``use_dynamic_tree`` needs
  ``dynamic_tree_max_topK > 0``, ``max_total_draft_tokens`` defaults to ``K max_draft_len`` and must lie in
  ``[max_draft_len, K max_draft_len]``; without ``use_dynamic_tree`` the topK is ignored with a
  warning and the chain has ``max_draft_len`` tokens), @057c8a6
  ``_torch/speculative/eagle3_dynamic_tree.py`` (``max_draft_len`` layers; the final
  ``topk(history_scores, max_total_draft_tokens)``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import one_error_line
from hypothesis import given, settings
from hypothesis import strategies as st

from analyses import _engine_configs as engines
from analyses import _engine_valuation as valuation
from analyses import sweep
from backends.sources import SyntheticSource
from simlab.trees import drafting_table
from simlab import builders
from simlab.latency import LatencyModel
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

FAILS = "the engine raises"
LAB_LIMITS = ("drafts no token", "timed choice", "negative depth", "beyond the lab's levels", "ignored key")
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


def llama_chain_at_root(n_max: int, n_min: int, p_min: float) -> int:
    """Draft tokens llama.cpp verifies at ``ROOT``: its greedy chain on the draft's untempered q
    (``argsort``; the top 10 renormalised), the token below ``p_min`` kept, dropped if shorter than
    ``n_min``."""
    table = drafting_table(NodeTable(ROOT.pair, ROOT.context), "raw")
    tokens: list[int] = []
    while True:
        table.fetch([tuple(tokens)])
        q = table.q(tuple(tokens))
        kept = np.argsort(-q, kind="stable")[:10]
        tokens.append(int(kept[0]))
        if len(tokens) >= n_max or q[kept[0]] / q[kept].sum() < p_min:
            break
    return len(tokens) if len(tokens) >= n_min else 0


def llama_rule(draft_max: int, draft_min: int, draft_p_min: float):
    n_min = max(min(draft_max, draft_min), 0)  # params_from_json_cmpl
    n_max = max(draft_max, 0)
    if n_max < 1:  # get_n_draft_max: 0 -> no speculation
        return "drafts no token"
    return llama_chain_at_root(n_max, n_min, draft_p_min), n_max


def trtllm_rule(e: dict):
    n = e["max_draft_len"]
    if n < 1:
        return FAILS  # NonNegativeInt; "max_draft_len must be > 0 for Eagle"
    if not e.get("use_dynamic_tree", False):
        if "dynamic_tree_max_topK" in e or "max_total_draft_tokens" in e:
            return "ignored key"  # TensorRT-LLM drops the topK with a warning: the lab asks for it to be dropped
        return n, n
    k = e.get("dynamic_tree_max_topK")
    if k is None or k <= 0:
        return FAILS
    total = e.get("max_total_draft_tokens", k * n)
    if not n <= total <= k * n:
        return FAILS
    return total, n  # topk of the K + (n - 1) K^2 history: total <= K n never exceeds it


RULES = {
    "llama.cpp": lambda e: llama_rule(e["draft_max"], e["draft_min"], e["draft_p_min"]),
    "tensorrt-llm": trtllm_rule,
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
    if isinstance(rule, tuple) and rule[1] > engines.MAX_LEVELS and entry["engine"] != "llama.cpp":
        rule = "beyond the lab's levels"  # llama.cpp's chains beyond it are ConfidentChain's, which has no level limit
    keys = engines.KEYS[entry["engine"]] + engines.ENGINE_OPTIONAL.get(entry["engine"], ())
    try:
        c = engines.make_config(entry)
    except ValueError as exc:
        message = str(exc).removeprefix("config: ")
        assert rule == FAILS or rule in LAB_LIMITS, f"{entry}: refused ({exc}), but the engine runs it: {rule}"
        assert "\n" not in message and message.startswith(keys), message
        return
    assert isinstance(rule, tuple), f"{entry}: accepted as {c.label}, but the engine cannot run it ({rule})"
    drafts, levels = rule
    builder = valuation.Builders(sweep.Config(), None, None).get(c, ROOT, SETTING)
    rows, missing = valuation.value_root(c, builder, ROOT, SETTING, 0, sweep.Config(), LATENCY, False)
    assert not missing and {r["tokens"] for r in rows} == {drafts}, f"{entry}: the lab values {rows}, the engine {drafts} tokens"
    assert c.budget == drafts or entry["engine"] == "llama.cpp", f"{entry}: budget {c.budget}, the engine verifies {drafts}"
    assert builder.sample(NodeTable(ROOT.pair, ROOT.context)).depth() <= levels and c.levels == levels
    written = {k: entry[k] for k in keys if k in entry}
    adjusted = getattr(c, "adjusted", ())
    for key, value in c.settings:
        if key not in written:  # a default the engine fills in (TensorRT-LLM's max_total_draft_tokens)
            assert entry["engine"] == "tensorrt-llm" and key == "max_total_draft_tokens" and value == drafts
            continue
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
    st.builds(
        lambda n, m, p: {"engine": "llama.cpp", "draft_max": n, "draft_min": m, "draft_p_min": p},
        st.integers(-1, 10),
        st.integers(-2, 12),
        st.one_of(st.sampled_from([0, 0.0, 0.5, 0.75, 1.0, 1.5, -0.25]), st.floats(-0.5, 1.5)),
    ),
    st.builds(
        lambda n, dyn, k, t: (
            {"engine": "tensorrt-llm", "max_draft_len": n}
            | ({"use_dynamic_tree": dyn} if dyn is not None else {})
            | ({"dynamic_tree_max_topK": k} if k is not None else {})
            | ({"max_total_draft_tokens": t} if t is not None else {})
        ),
        st.integers(-1, 6),
        st.sampled_from([None, False, True]),
        st.one_of(st.none(), st.integers(-1, 5)),
        st.one_of(st.none(), st.integers(0, 30)),
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
    {"engine": "llama.cpp", "draft_max": 16, "draft_min": 0, "draft_p_min": 0.75},  # llama.cpp's defaults
    {"engine": "llama.cpp", "draft_max": 16, "draft_min": 20, "draft_p_min": 0.0},  # clamped to 16: the whole chain
    {"engine": "llama.cpp", "draft_max": 8, "draft_min": 8, "draft_p_min": 0.99},  # a short chain dropped: 0 tokens
    {"engine": "llama.cpp", "draft_max": 0, "draft_min": 0, "draft_p_min": 0.5},
    {"engine": "llama.cpp", "draft_max": 66, "draft_min": 0, "draft_p_min": 0.0},  # beyond EAGLE2's levels: ConfidentChain
    {"engine": "tensorrt-llm", "max_draft_len": 3},
    {"engine": "tensorrt-llm", "max_draft_len": 0},
    {"engine": "tensorrt-llm", "max_draft_len": 66},
    {"engine": "tensorrt-llm", "max_draft_len": 4, "use_dynamic_tree": True, "dynamic_tree_max_topK": 3},
    {
        "engine": "tensorrt-llm",
        "max_draft_len": 4,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 3,
        "max_total_draft_tokens": 13,
    },
    {
        "engine": "tensorrt-llm",
        "max_draft_len": 4,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 3,
        "max_total_draft_tokens": 4,
    },
    {"engine": "tensorrt-llm", "max_draft_len": 4, "use_dynamic_tree": True},
    {"engine": "tensorrt-llm", "max_draft_len": 4, "dynamic_tree_max_topK": 3},
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
            {"engine": "tensorrt-llm", "max_draft_len": 2, "use_dynamic_tree": True, "dynamic_tree_max_topK": 9},
            "dynamic_tree_max_topK",
        ),
        (
            {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 9, "speculative_num_draft_tokens": 6},
            "speculative_eagle_topk",
        ),
        ({"engine": "eagle", "total_token": 6, "depth": 2, "top_k": 8}, None),
    ):
        c = engines.make_config({**entry, "modes": ["one_hot"]})
        builder = valuation.Builders(sweep.Config(), None, None).get(c, root, SETTING)
        rows, missing = valuation.value_root(c, builder, root, SETTING, 0, sweep.Config(), LATENCY, False)
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


# -- llama.cpp and TensorRT-LLM: refusals name the key; planted faults in their mappings -----------------------------------
@pytest.mark.parametrize(
    "entry, key",
    [
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "eagle_choices": [[0], [1]]}, "eagle_choices"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "posterior_threshold": 0.09}, "posterior_threshold"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "draft_len_schedule": {"4": 3}}, "draft_len_schedule"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "greedy_sampling": False}, "greedy_sampling"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "use_rejection_sampling": True}, "use_rejection_sampling"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "use_dynamic_tree": 1}, "use_dynamic_tree"),
        ({"engine": "tensorrt-llm", "max_draft_len": 3, "decoding_type": "DraftTarget"}, "decoding_type"),
        ({"engine": "llama.cpp", "draft_max": 8, "draft_min": 0, "draft_p_min": "0.5"}, "draft_p_min"),
        ({"engine": "llama.cpp", "draft_max": 8, "draft_min": 0, "draft_p_min": 0.5, "draft_p_split": 0.1}, "draft_p_split"),
        ({"engine": "llama.cpp", "draft_max": 8, "draft_min": 0, "draft_p_min": 0.5, "method": "ngram_simple"}, "method"),
    ],
)
def test_what_the_lab_does_not_value_is_refused_in_one_line_naming_the_key(entry, key):
    with pytest.raises(ValueError) as caught:
        engines.make_config(entry)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"config: {key}"), message


def test_tensorrt_llm_defaults_are_accepted_and_its_decoding_type_is_its_method():
    plain = engines.make_config({"engine": "tensorrt-llm", "max_draft_len": 3})
    explicit = engines.make_config(
        {
            "engine": "tensorrt-llm",
            "max_draft_len": 3,
            "use_rejection_sampling": False,
            "greedy_sampling": True,
            "decoding_type": "Eagle3",
        }
    )
    assert plain.lab == explicit.lab == {"kind": "eagle2", "budget": 3, "depth": 2, "top_k": 1} and explicit.method == "Eagle3"
    tree = engines.make_config(
        {"engine": "tensorrt-llm", "max_draft_len": 4, "use_dynamic_tree": True, "dynamic_tree_max_topK": 3}
    )
    assert tree.lab == {"kind": "eagle2", "budget": 12, "depth": 3, "top_k": 3}
    assert tree.label.endswith("max_total_draft_tokens=12")


def test_llama_cpp_clamp_is_applied_and_labelled():
    c = engines.make_config({"engine": "llama.cpp", "draft_max": 6, "draft_min": 9, "draft_p_min": 0.8})
    assert c.lab == {"kind": "confident_chain", "budget": 6, "p_min": 0.8, "n_min": 6, "top_k": 10}
    assert (
        c.label
        == "llama.cpp draft_max=6 draft_min=6 draft_p_min=0.8 (written 9: llama.cpp's server clamps draft_min to [0, draft_max])"
    )
    chain = engines.make_config({"engine": "llama.cpp", "draft_max": 6, "draft_min": -3, "draft_p_min": 0})
    assert chain.lab == {"kind": "eagle2", "budget": 6, "depth": 5, "top_k": 1} and dict(chain.settings)["draft_min"] == 0


LLAMA_STOPS = {"engine": "llama.cpp", "draft_max": 8, "draft_min": 0, "draft_p_min": 0.9}
"""At ``ROOT`` the chain stops before 8 tokens (asserted below), so a mapping to the plain chain is caught."""


def test_the_llama_cpp_root_stops_early():
    assert 1 <= llama_chain_at_root(8, 0, 0.9) < 8


@pytest.mark.parametrize("fault", ["no draft_min clamp", "p_min ignored", "dynamic depth off by one", "topK ignored"])
def test_a_planted_fault_in_the_new_mappings_is_caught(monkeypatch, fault):
    if fault == "no draft_min clamp":  # draft_min 9 > draft_max 4: refused (ConfidentChain's n_min range), llama.cpp runs 4
        entry = {"engine": "llama.cpp", "draft_max": 4, "draft_min": 9, "draft_p_min": 0.9}
        settings = engines.engine_settings
        monkeypatch.setattr(engines, "engine_settings", lambda e, s: (dict(s), ()) if e == "llama.cpp" else settings(e, s))
    elif fault == "p_min ignored":
        entry = LLAMA_STOPS
        monkeypatch.setattr(
            engines,
            "_llama_builder",
            lambda s: {"kind": "eagle2", "budget": s["draft_max"], "depth": s["draft_max"] - 1, "top_k": 1},
        )
    else:
        entry = {"engine": "tensorrt-llm", "max_draft_len": 3, "use_dynamic_tree": True, "dynamic_tree_max_topK": 2}
        built = engines._trtllm_builder
        if fault == "dynamic depth off by one":
            monkeypatch.setattr(engines, "_trtllm_builder", lambda s: built(s) | {"depth": s["max_draft_len"]})
        else:
            monkeypatch.setattr(engines, "_trtllm_builder", lambda s: built(s) | {"top_k": 1})
    with pytest.raises((AssertionError, ValueError)):  # the unclamped draft_min reaches ConfidentChain, which refuses it
        check_against_the_engine(entry)
    monkeypatch.undo()
    check_against_the_engine(entry)


# -- each engine's default grid -------------------------------------------------------------------------------------------
DOCUMENTED_DEFAULTS = {
    "eagle": {"total_token": 60, "depth": 7, "top_k": 10},
    "sglang": {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
    "llama.cpp": {"draft_max": 16, "draft_min": 0, "draft_p_min": 0.75},
    "vllm": {"num_speculative_tokens": 5},
    "tensorrt-llm": {"max_draft_len": 3},
}


def check_default_grid(engine: str) -> None:
    configs = engines.default_configs(engine, modes=("exact_match",))
    assert configs and len({c.label for c in configs}) == len(configs)
    assert len({tuple(sorted(c.lab.items())) for c in configs}) == len(configs), "two points the engine runs as one"
    assert dict(configs[0].settings).keys() >= set(engines.KEYS[engine]) and {c.modes for c in configs} == {("exact_match",)}
    assert any(dict(c.settings).items() >= DOCUMENTED_DEFAULTS[engine].items() for c in configs), "its documented default"
    for c in configs:
        assert not c.unrunnable and not c.adjusted, c.label
        check_against_the_engine({"engine": engine, **dict(c.settings)})


@pytest.mark.parametrize("engine", engines.ENGINES)
def test_each_default_grid_is_valid_and_runnable(engine):
    check_default_grid(engine)


def test_a_default_grid_written_as_sglang_does_not_run_it_is_caught(monkeypatch):
    """Planted fault: the topk-1 points written as the bench script writes them (no reset): the lab
    values 1 draft token where SGLang verifies num_steps + 1."""
    monkeypatch.setattr(engines, "engine_settings", lambda engine, s: (dict(s), ()))
    with pytest.raises(AssertionError):
        check_default_grid("sglang")


def test_default_configs_refuses_an_unknown_engine_and_bad_modes():
    assert engines.ENGINES == ("vllm", "sglang", "llama.cpp", "eagle", "tensorrt-llm")
    for engine in ("sequoia", "vLLM", None):
        with pytest.raises(ValueError, match=r"^engine: must be one of vllm, sglang, llama.cpp, eagle, tensorrt-llm, got"):
            engines.default_configs(engine)
    for modes in ((), ("one_hot", "one_hot"), ("greedy",), "one_hot"):
        with pytest.raises(ValueError, match="^modes: "):
            engines.default_configs("vllm", modes=modes)
    assert {c.modes for c in engines.default_configs("vllm")} == {engines.MODES}
