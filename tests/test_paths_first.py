"""Paths and seeds are checked before anything is loaded or created, and the long steps say so.

Every study that takes source flags refuses a missing model folder, prompt file, capture folder or
latency profile file with one line naming the flag, before it loads a model or creates its output
folder (``analyses._flags.check_paths``); ``backends.draft_acceptance`` and
``backends.train_draft`` refuse a seed torch cannot take before the target loads, and the
acceptance tool reports its progress on stderr while it measures.
"""

from __future__ import annotations

import contextlib

import pytest

import backends.cli

from analyses import (
    block_efficiency_grid,
    compare_builders,
    compare_verifiers,
    ddte_audit,
    divergence_by_depth,
    parallel_drafters,
    specblock,
    sweep,
    train_selector,
    treegraft,
)
from backends import draft_acceptance, pretrained, train_draft
from backends.sources import live, recorded
from conftest import one_error_line

STUDIES = {
    "divergence_by_depth": divergence_by_depth,
    "block_efficiency_grid": block_efficiency_grid,
    "compare_builders": compare_builders,
    "compare_verifiers": compare_verifiers,
    "ddte_audit": ddte_audit,
    "parallel_drafters": parallel_drafters,
    "specblock": specblock,
    "sweep": sweep,
    "train_selector": train_selector,
    "treegraft": treegraft,
}
TIMED = sorted(set(STUDIES) - {"block_efficiency_grid", "divergence_by_depth"})
"""The studies with the latency flags (``--latency``)."""
REPLAYING = ["block_efficiency_grid", "compare_verifiers", "divergence_by_depth", "sweep", "train_selector"]
"""The studies that replay captures (the others build their own trees and refuse ``--capture``)."""


def _never(*args, **kwargs):
    raise AssertionError("a model was loaded or a capture started before the paths were checked")


@pytest.fixture()
def nothing_loads(monkeypatch):
    """Loading a model (either source path) or starting the main job's live capture fails the test."""
    monkeypatch.setattr(live, "open_pair", _never)
    monkeypatch.setattr(pretrained, "named_pair", _never)
    monkeypatch.setattr(pretrained, "target_folder", _never)
    monkeypatch.setattr(recorded, "run", _never)


@pytest.fixture()
def model_folder(tmp_path):
    """A folder that passes as a model folder without loading one (it holds a config.json)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return str(folder)


def refused(module, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and one_error_line(err), err
    return err


@pytest.mark.parametrize("study", sorted(STUDIES))
@pytest.mark.parametrize("which", ["target", "draft"])
def test_a_missing_model_folder_is_refused_before_any_load_or_folder(study, which, nothing_loads, model_folder, tmp_path, capsys):
    out = tmp_path / "out"
    folders = {"target": model_folder, "draft": model_folder, which: str(tmp_path / "no" / "such")}
    argv = ["--backend", "hf", "--target", folders["target"], "--draft", folders["draft"], "--out", str(out), "--quiet"]
    err = refused(STUDIES[study], argv, capsys)
    assert f"--{which}: model folder" in err and "does not exist" in err, err
    assert not out.exists()


def test_the_main_job_without_a_draft_names_draft_and_creates_nothing(nothing_loads, model_folder, tmp_path, capsys):
    out = tmp_path / "out"
    err = refused(divergence_by_depth, ["--backend", "hf", "--target", model_folder, "--out", str(out)], capsys)
    assert "--draft: --backend hf needs --target and --draft" in err and not out.exists()


@pytest.mark.parametrize("study", sorted(STUDIES))
def test_a_missing_prompt_file_is_refused_before_any_load_or_folder(study, nothing_loads, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--pair", "smollm2", "--prompts", str(tmp_path / "missing.txt"), "--out", str(out), "--quiet"]
    err = refused(STUDIES[study], argv, capsys)
    assert "--prompts: no such file" in err and not out.exists()


@pytest.mark.parametrize("study", REPLAYING)
def test_a_missing_capture_folder_is_refused_before_any_folder(study, tmp_path, capsys):
    out = tmp_path / "out"
    err = refused(STUDIES[study], ["--capture", str(tmp_path / "none"), "--out", str(out), "--quiet"], capsys)
    assert "--capture:" in err and "is not a folder" in err and not out.exists()


@pytest.mark.parametrize("study", TIMED)
def test_a_missing_latency_file_is_refused_before_the_models_load(study, nothing_loads, model_folder, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--backend", "hf", "--target", model_folder, "--draft", model_folder, "--latency", str(tmp_path / "t.json")]
    err = refused(STUDIES[study], argv + ["--out", str(out), "--quiet"], capsys)
    assert "--latency: no such profile file" in err and not out.exists()


@pytest.mark.parametrize("tool", [draft_acceptance, train_draft])
@pytest.mark.parametrize("seed", [-1, 2**63, 2**70])
def test_a_seed_torch_cannot_take_is_refused_before_the_target_loads(tool, seed, nothing_loads, capsys):
    extra = ["--layers", "3", "--variant", "x"] if tool is train_draft else []
    err = refused(tool, [*extra, "--seed", str(seed), "--quiet"], capsys)
    assert err.startswith(f"{tool.PROG}: error: --seed: must be an integer in [0, {2**63 - 1}], got {seed}"), err


@contextlib.contextmanager
def immediate_step(prog, message, quiet=False, after=0.0):
    """``backends.cli.slow_step`` as if the step had already run past its threshold."""
    backends.cli.progress(prog, f"{message}...", quiet)
    yield


@pytest.fixture(scope="module")
def two_layers(smollm2_folder):
    import torch

    torch.set_num_threads(1)
    return pretrained.load_target(smollm2_folder, layers=2)


def test_the_acceptance_tool_reports_progress_and_the_numbers_do_not_depend_on_it(two_layers, capsys, monkeypatch):
    from backends.drafts import quant

    model, tokenizer = two_layers
    draft = quant.build(model, "quant:8:32")
    prompts = ["Name a colour.", "Count to three."]
    quiet = draft_acceptance.measure(model, draft, tokenizer, prompts, 2, 3, 5)
    assert capsys.readouterr().err == ""
    loud = draft_acceptance.measure(model, draft, tokenizer, prompts, 2, 3, 5, False)
    err = capsys.readouterr().err
    assert loud == quiet
    for sampler in ("target", "draft"):  # each prompt's paths sampled, then scored: 2 x 2 steps per sampler
        assert f"{sampler}-sampled paths: prompts sampled, then scored" in err and "4/4" in err, err
    # the tool: a line before the slow load (slow_step after 2 s, made immediate here), then the bars
    monkeypatch.setattr(pretrained, "target_folder", lambda log=None: None)
    monkeypatch.setattr(pretrained, "load_target", lambda folder, *a, **k: two_layers)
    monkeypatch.setattr(draft_acceptance, "measure", lambda *a: {"target": [0.5], "draft": [0.5]})
    monkeypatch.setattr(backends.cli, "slow_step", immediate_step)
    assert draft_acceptance.main(["--draft", "quant:8:32", "--depth", "1", "--prompts", "long-context"]) == 0
    err = capsys.readouterr().err
    assert "loading the target and the draft quant:8:32..." in err, err
    assert "quant:8:32: 12 prompts x 4 paths, depths 0..0, target- then draft-sampled" in err, err
