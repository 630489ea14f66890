"""The capture settings ``scripts/capture_memory.py --pair`` and ``benchmarks/test_capture.py`` build
for a named pair: the pair's own default draft (``backends.pretrained.default_draft``) and prompt
set (``pair_study_defaults``' ``prompts``, else ``workloads`` / the benchmark's own texts).  No model
loads: ``named_pair`` and ``capture_group`` are replaced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


class FakePair:
    vocab_size, max_batch, forest_tokens = 10, 1, 1

    def encode(self, text):
        return np.array([1, 2, 3])


@pytest.fixture
def memory_run(monkeypatch):
    """``main(["--pair", name])`` of the memory script with nothing loaded: (settings given to
    ``capture_group``, draft given to ``named_pair``, prompt records read)."""
    from backends import capture, pretrained, roots

    seen = {}

    def named_pair(name, draft=None, **options):
        seen["draft"] = draft
        return FakePair()

    def capture_group(pair, settings, group, *args):
        seen["settings"] = settings
        return [([], None, None, [])]

    real_read = roots.read_prompt_records

    def read_prompt_records(name):
        seen["prompts"] = name
        return real_read("workloads")

    monkeypatch.setattr(pretrained, "named_pair", named_pair)
    monkeypatch.setattr(capture, "capture_group", capture_group)
    monkeypatch.setattr(roots, "read_prompt_records", read_prompt_records)
    monkeypatch.setattr(roots, "prompt_texts", lambda pair, records: [r.text for r in records])
    module = load_script(ROOT / "scripts" / "capture_memory.py")

    def run(name):
        assert module.main(["--pair", name, "--depth", "1", "--samples", "1"]) == 0
        return seen["settings"], seen["draft"], seen["prompts"]

    return run


@pytest.mark.parametrize(
    "name, draft, prompts", [("qwen2.5-coder", "qwen2.5-coder-0.5b", "workloads"), ("smollm2", "quant:4:64", "workloads")]
)
def test_the_memory_script_takes_the_pairs_own_draft_and_prompts(memory_run, name, draft, prompts):
    settings, opened, read = memory_run(name)
    assert (settings.draft, settings.prompts, settings.pair, settings.target) == (draft, prompts, name, "")
    assert opened == draft and read == prompts


def test_the_memory_script_takes_a_prompt_set_the_pair_declares(memory_run, monkeypatch):
    from backends import pretrained, qwen_pair

    monkeypatch.setattr(qwen_pair, "STUDY_DEFAULTS", {**qwen_pair.STUDY_DEFAULTS, "prompts": "code"})
    assert pretrained.pair_study_defaults("qwen2.5-coder")["prompts"] == "code"
    settings, _, read = memory_run("qwen2.5-coder")
    assert settings.prompts == read == "code"
    settings, _, read = memory_run("smollm2")
    assert settings.prompts == read == "workloads"


def bench(monkeypatch, name):
    monkeypatch.setenv("SIMLAB_PAIR", name)
    return load_script(ROOT / "benchmarks" / "test_capture.py", "capture_bench")


@pytest.mark.parametrize("name, draft", [("qwen2.5-coder", "qwen2.5-coder-0.5b"), ("smollm2", "quant:4:64")])
def test_the_benchmark_takes_the_pairs_own_draft(monkeypatch, name, draft):
    module = bench(monkeypatch, name)
    settings = module.capture_settings(labels="specinfer", evaluation="forward")
    assert (settings.draft, settings.pair, settings.target, settings.prompts) == (draft, name, "", "")
    assert (settings.labels, settings.evaluation, settings.width, settings.depth) == ("specinfer", "forward", 4, 4)
    assert module.root_texts(FakePair()) == module.TEXTS


def test_the_benchmark_takes_a_prompt_set_the_pair_declares(monkeypatch):
    from backends import qwen_pair, roots

    monkeypatch.setattr(qwen_pair, "STUDY_DEFAULTS", {**qwen_pair.STUDY_DEFAULTS, "prompts": "code"})
    monkeypatch.setattr(roots, "prompt_texts", lambda pair, records: [r.text for r in records])
    module = bench(monkeypatch, "qwen2.5-coder")
    assert module.capture_settings().prompts == "code"
    assert module.root_texts(FakePair()) == [r.text for r in roots.read_prompt_records("code")[:4]]
    assert bench(monkeypatch, "smollm2").capture_settings().prompts == ""


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, function):
        self.calls.append(("calibrated", None))
        return function()

    def pedantic(self, function, rounds, iterations):
        self.calls.append(("pedantic", rounds))
        return function()


class Config:
    def __init__(self, rounds):
        self.rounds = rounds

    def getoption(self, name):
        assert name == "benchmark_min_rounds"
        return self.rounds


@pytest.mark.parametrize(
    "name, rounds, most, expected",
    [
        ("qwen2.5-coder", 1, None, ("pedantic", 1)),
        ("qwen2.5-coder", 1, 3, ("pedantic", 1)),
        ("qwen2.5-coder", 5, 3, ("pedantic", 3)),
        ("smollm2", 5, None, ("pedantic", 5)),
        ("/nonexistent/pair", 5, None, ("calibrated", None)),
        ("/nonexistent/pair", 5, 3, ("pedantic", 3)),
    ],
)
def test_the_benchmark_runs_a_named_pair_once_per_round(monkeypatch, name, rounds, most, expected):
    module = bench(monkeypatch, name)
    recorder = Recorder()
    assert module.timed(recorder, Config(rounds), lambda: 7, most) == 7
    assert recorder.calls == [expected]
