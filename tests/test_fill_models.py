"""The studies that reopen a capture's models (``analyses.sweep --fill``, ``analyses.train_selector``)
open the models it was drawn from, as it opened them (issue 40): a model replaced at its recorded
path is refused naming which, a capture records its local model folders as absolute paths (and one
recorded as a relative path is resolved or refused, never silently another folder), and a capture
made with ``--trim-draft-vocab`` is reopened with the trim."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import polars as pl
import pytest
from conftest import capture_flags, one_error_line, write_prompts

from analyses import _engine_valuation, sweep, train_selector
from backends import capture, capture_store as store, pretrained
from backends.capture import main as capture_main

EAGLE = [{"engine": "eagle", "total_token": 4, "depth": 2, "top_k": 2}]  # top-k nodes a T = 1 chain capture lacks


def chain_capture(pair_dir, prompts, out, *extra) -> None:
    """A --full T = 1 chain capture of depth 1 (one root per prompt): EAGLE's top-2 tree needs --fill."""
    assert capture_main(capture_flags(pair_dir, prompts, out, "--full", "--shape", "chain", "--depth", "1", *extra)) == 0


def fill(capture_dir, tmp_path, out_name: str):
    """``sweep --capture capture_dir --fill``: (exit status, stderr lines, per-root rows or None)."""
    config = tmp_path / "engines.json"
    config.write_text(json.dumps(EAGLE))
    out = tmp_path / out_name
    argv = ["--capture", str(capture_dir), "--config", str(config), "--latency", "sequoia-demo", "--device", "cpu"]
    try:
        status = sweep.main([*argv, "--fill", "--quiet", "--out", str(out)])
    except SystemExit as exc:
        status = exc.code
    rows = pl.read_parquet(out / "per_root.parquet").sort(["root", "config", "mode"]) if status == 0 else None
    return status, rows


def retrain(folder) -> None:
    """Change a model folder's weights in place, as retraining into the same path does (seeded noise
    on every tensor, so the model's outputs change too)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name in weights:
        if weights[name].is_floating_point():
            weights[name] = weights[name] + 0.5 * torch.randn(weights[name].shape, generator=generator)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture
def pair_copy(micro_pair_dir, tmp_path):
    copy = tmp_path / "pair"
    shutil.copytree(micro_pair_dir, copy)
    return copy


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts"), 1)


@pytest.mark.parametrize("which", ["draft", "target"])
def test_fill_refuses_a_model_replaced_after_the_capture(pair_copy, prompts, tmp_path, capsys, which):
    """A model retrained in place after the capture was opened by --fill as it is now: the filled
    nodes came from another model than the stored ones, exit 0.  Refused with one line naming it."""
    out = tmp_path / "capture"
    chain_capture(pair_copy, prompts, out)
    status, before = fill(out, tmp_path, "before")
    assert status == 0 and before.height > 0
    retrain(pair_copy / which)
    capsys.readouterr()
    status, _ = fill(out, tmp_path, "after")
    err = capsys.readouterr().err
    assert status == 2 and one_error_line(err), err
    assert f"--capture: the {which} model at the capture's recorded path is not the one it was drawn from" in err, err
    assert err.count("sha256:") == 2, err


def test_the_old_fill_that_opened_the_models_unchecked_is_caught(pair_copy, prompts, tmp_path, capsys, monkeypatch):
    """The planted fault (the fingerprints not compared: the old --fill) fills the capture with the
    retrained model's nodes and exits 0 with other numbers, so the test above fails on it."""
    out = tmp_path / "capture"
    chain_capture(pair_copy, prompts, out)
    _, before = fill(out, tmp_path, "before")
    retrain(pair_copy / "target")
    retrain(pair_copy / "draft")
    monkeypatch.setattr(store, "check_models", lambda stored, now: None)
    status, after = fill(out, tmp_path, "after")
    assert status == 0 and after.select(["root", "config", "mode"]).equals(before.select(["root", "config", "mode"]))
    assert not after["E"].equals(before["E"])


def test_a_capture_records_a_relative_model_folder_as_an_absolute_path(micro_pair_dir, prompts, tmp_path, monkeypatch):
    """A capture made with ``--target pair/target`` recorded the path as typed; a study run later
    from another folder holding another model at ``pair/`` filled the capture with that model's
    nodes, exit 0.  The capture records the absolute path: the same rows from any folder."""
    here, there = tmp_path / "here", tmp_path / "there"
    shutil.copytree(micro_pair_dir, here / "pair")
    shutil.copytree(micro_pair_dir, there / "pair")
    retrain(there / "pair" / "target")
    retrain(there / "pair" / "draft")
    monkeypatch.chdir(here)
    chain_capture("pair", prompts, tmp_path / "capture")
    status, rows_here = fill(tmp_path / "capture", tmp_path, "from-here")
    assert status == 0
    monkeypatch.chdir(there)
    status, rows_there = fill(tmp_path / "capture", tmp_path, "from-there")
    assert status == 0 and rows_there.equals(rows_here)
    stored = store.load_settings(tmp_path / "capture")
    assert (stored.target, stored.draft) == (str(here / "pair" / "target"), str(here / "pair" / "draft"))


def _relative_capture(pair_dir, prompts, out, monkeypatch) -> None:
    """A capture that records its models as typed (``pair/target``): as captures made before the
    absolute paths were (the planted fault: ``absolute_models`` left out)."""
    with monkeypatch.context() as patch:
        patch.chdir(pair_dir.parent)
        patch.setattr(capture, "absolute_models", lambda settings: settings, raising=False)
        chain_capture(pair_dir.name, prompts, out, "--roots-per-forward", "1")
    assert store.load_settings(out).target == f"{pair_dir.name}/target"


def test_a_capture_recorded_with_a_relative_path_is_refused_from_a_folder_where_it_means_another(
    micro_pair_dir, prompts, tmp_path, monkeypatch, capsys
):
    """A capture that recorded ``pair/target`` (made before the absolute paths, or the planted fault
    that records paths as typed): from its own folder --fill gives its rows; from a folder where
    ``pair/`` holds another model it is refused naming the models, and from one without ``pair/``
    refused as a relative path, never filled with other numbers."""
    here, there, elsewhere = tmp_path / "here", tmp_path / "there", tmp_path / "elsewhere"
    shutil.copytree(micro_pair_dir, here / "pair")
    shutil.copytree(micro_pair_dir, there / "pair")
    retrain(there / "pair" / "draft")
    elsewhere.mkdir()
    _relative_capture(here / "pair", prompts, tmp_path / "capture", monkeypatch)
    monkeypatch.chdir(here)
    status, _ = fill(tmp_path / "capture", tmp_path, "from-here")
    assert status == 0
    for folder, says in (
        (there, "--capture: the draft model at the capture's recorded path is not the one it was drawn from (draft 'pair/draft'"),
        (elsewhere, "--capture: the capture records its target model folder as the relative path 'pair/target', which names no"),
    ):
        monkeypatch.chdir(folder)
        capsys.readouterr()
        status, _ = fill(tmp_path / "capture", tmp_path, f"from-{folder.name}")
        err = capsys.readouterr().err
        assert status == 2 and one_error_line(err) and says in err, err


def test_a_capture_recorded_with_a_relative_path_resumes_with_the_absolute_one(micro_pair_dir, prompts, tmp_path, monkeypatch):
    """Resuming a capture that recorded ``pair/target`` from its own folder: the run's absolute path
    names the same folder, so it resumes (the settings.json and the shards' hash unchanged)."""
    here = tmp_path / "here"
    shutil.copytree(micro_pair_dir, here / "pair")
    two = write_prompts(tmp_path, 2)
    out = tmp_path / "capture"
    _relative_capture(here / "pair", two, out, monkeypatch)
    held = (out / "settings.json").read_text()
    store.shard_path(out, 1).unlink()
    monkeypatch.chdir(here)
    chain_capture("pair", two, out, "--roots-per-forward", "1")
    assert (out / "settings.json").read_text() == held and store.shard_path(out, 1).exists()
    drawn_under = store.settings_hash(store.load_settings(out))
    assert all(store.read_nodes(out, root, drawn_under).height > 0 for root in (0, 1))


class _Opened(Exception):
    pass


def _recording(monkeypatch) -> dict:
    """Replace the model loader by one that records its keyword arguments and stops."""
    seen = {}

    def open_pair(pair, target, draft, **options):
        seen.update(options, pair=pair, target=target, draft=draft)
        raise _Opened

    monkeypatch.setattr(pretrained, "open_pair", open_pair)
    monkeypatch.setattr(capture, "open_pair", open_pair)
    return seen


TRIMMED = store.CaptureSettings("/m/target", "/m/draft", "p.txt", temperature=0.5, dtype="float32", trim_draft_vocab=True)


def test_fill_opens_a_trimmed_draft_capture_with_the_trim(monkeypatch):
    """--fill on a --trim-draft-vocab capture opened the models without the trim, and the wide draft
    was refused ("ask for that explicitly"); it opens them as the capture did."""

    class Captured:
        vocab_size = 4

        def holds(self, context):
            return False

    seen = _recording(monkeypatch)
    with pytest.raises(_Opened):
        _engine_valuation.FilledPair(Captured(), TRIMMED, "cpu").distributions([(1, 2)])
    assert seen["trim_draft_vocab"] is True and seen["dtype"] == "float32" and seen["device"] == "cpu"
    assert (seen["target"], seen["draft"]) == ("/m/target", "/m/draft")


def test_train_selector_opens_the_capture_models_as_the_capture_did(monkeypatch):
    class Source:
        name = "capture"
        stored = TRIMMED

    seen = _recording(monkeypatch)
    with pytest.raises(_Opened):
        train_selector.capture_models(Source(), "cpu")
    assert seen["trim_draft_vocab"] is True and seen["settings"] == TRIMMED.sampling()


def test_fill_works_on_a_trim_draft_vocab_capture(micro_pair_dir, prompts, tmp_path, capsys):
    """A real --trim-draft-vocab capture (a draft of 408 ids beside the target's 400) filled by --fill."""
    from test_hf_backend import _variant_draft

    wide = _variant_draft(micro_pair_dir, tmp_path / "wide", vocab_size=408)
    out = tmp_path / "capture"
    chain_capture(micro_pair_dir, prompts, out, "--draft", wide, "--trim-draft-vocab")
    status, rows = fill(out, tmp_path, "filled")
    assert status == 0 and rows.height > 0, capsys.readouterr().err


def test_a_capture_without_fingerprints_is_opened_unchecked_with_a_note(monkeypatch):
    """A capture made before the fingerprints keeps today's behaviour: opened, with one note."""
    opened, notes = object(), []
    monkeypatch.setattr(capture, "open_pair", lambda *args, **options: opened)
    monkeypatch.setattr(capture, "model_fingerprints", lambda settings: pytest.fail("fingerprinted"))
    assert capture.open_captured_pair(replace(TRIMMED, trim_draft_vocab=False), "cpu", note=notes.append) is opened
    assert len(notes) == 1 and "records no model fingerprints" in notes[0]
