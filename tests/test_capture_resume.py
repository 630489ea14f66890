"""Resuming a capture (issue 40): the models are part of its settings (their fingerprints), a
damaged root is captured again, a root drawn under other settings stops the run, a capture made
before the fingerprints resumes with a note and one made before the settings hash does not, and
a missing prompt file or model folder creates nothing."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from backends import capture, capture_store as store, pretrained
from backends.capture import main
from conftest import capture_flags, one_error_line, write_prompts


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts"), 2)


def flags(pair_dir, prompts, out, *extra):
    return capture_flags(pair_dir, prompts, out, "--depth", "1", "--width", "2", "--roots-per-forward", "1", *extra)


def exit_2(capsys, call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    return err


@pytest.fixture(scope="module")
def full(micro_pair_dir, prompts, tmp_path_factory):
    """A --full capture of the micro pair's 2 roots."""
    out = tmp_path_factory.mktemp("full")
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    return out


@pytest.fixture
def pair_copy(micro_pair_dir, tmp_path):
    """A copy of the micro pair that a test may retrain (change) in place."""
    copy = tmp_path / "pair"
    shutil.copytree(micro_pair_dir, copy)
    return copy


def retrain(folder) -> None:
    """Change a model folder's weights in place, as retraining into the same path does."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


# -- the models are part of the settings -----------------------------------------------------------------------------
def _resume_after_retraining(pair, prompts, out, capsys, which) -> tuple[int, str]:
    """Capture root 0 of 2, retrain ``which`` models in place, resume: (exit status, stderr)."""
    assert main(flags(pair, prompts, out, "--full")) == 0
    store.shard_path(out, 1).unlink()
    capsys.readouterr()
    for name in which:
        retrain(pair / name)
    try:
        status = main(flags(pair, prompts, out, "--full"))
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    "which, says", [(["draft"], "another draft model (draft sha256:"), (["target", "draft"], "another target and draft model")]
)
def test_a_resume_after_the_models_changed_is_refused_naming_which(pair_copy, prompts, tmp_path, capsys, which, says):
    """Issue 40 item 3: the settings hash covered the model path, not the model: a draft retrained
    at the same path resumed a capture with exit 0, its roots drawn from two models."""
    out = tmp_path / "o"
    status, err = _resume_after_retraining(pair_copy, prompts, out, capsys, which)
    assert status == 2 and one_error_line(err) and says in err and "resume it with the models it began with" in err, err
    assert store.completed_roots(out) == [0]
    stored = json.loads((out / "settings.json").read_text())
    assert stored["target_fingerprint"].startswith("sha256:") and stored["draft_fingerprint"].startswith("sha256:")


def test_the_old_rule_that_hashed_the_model_path_only_is_caught(pair_copy, prompts, tmp_path, capsys, monkeypatch):
    """The planted fault (no fingerprints: the settings name the model paths only) resumes with
    exit 0 after a retraining, so the test above fails on it."""
    monkeypatch.setattr(capture, "model_fingerprints", lambda settings: {})
    status, _ = _resume_after_retraining(pair_copy, prompts, tmp_path / "o", capsys, ["draft"])
    assert status == 0 and store.completed_roots(tmp_path / "o") == [0, 1]


def test_the_fingerprint_covers_config_weights_and_tokenizer_and_not_the_record(micro_pair_dir, tmp_path):
    folder = tmp_path / "target"
    shutil.copytree(micro_pair_dir / "target", folder)
    first = capture.folder_fingerprint(folder)
    assert first == capture.folder_fingerprint(micro_pair_dir / "target") and first.startswith("sha256:")
    (folder / "manifest.json").write_text('{"seconds": 12.5}')  # how it was made, not what it is
    (folder / ".cache").write_text("x")
    (folder / "README.md").write_text("notes")
    assert capture.folder_fingerprint(folder) == first
    seen = {first}
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        with open(folder / name, "ab") as handle:
            handle.write(b" ")
        seen.add(capture.folder_fingerprint(folder))
    assert len(seen) == 4


def test_a_hub_id_is_fingerprinted_by_its_cached_commit(monkeypatch, tmp_path):
    import huggingface_hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    found = {"org/model": f"/cache/models--org--model/snapshots/{commit}/config.json"}
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file: found.get(name))
    monkeypatch.chdir(tmp_path)
    assert capture.hub_fingerprint("org/model", "target") == f"hub:{commit}"
    settings = store.CaptureSettings("org/model", "org/other", "p.txt")
    with pytest.raises(ValueError, match=r"^draft: cannot tell which commit of the hub model 'org/other' was loaded"):
        capture.model_fingerprints(settings)


def test_a_named_pairs_models_are_fingerprinted_by_the_folders_they_load(monkeypatch, tmp_path):
    """The converted target folder; an adapter draft's folder, a user-trained one shadowing the
    shipped one of the same name; the drafts computed from the target's weights by their spec."""
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path))
    target = pretrained.cache_dir() / "float32"
    target.mkdir(parents=True)
    for name, text in (("manifest.json", "{}"), ("config.json", "{}"), ("model.safetensors", "weights")):
        (target / name).write_text(text)
    settings = store.CaptureSettings("", "early-exit:2", "p.txt", pair="smollm2")
    fingerprints = capture.model_fingerprints(settings)
    assert fingerprints == {"target_fingerprint": capture.folder_fingerprint(target), "draft_fingerprint": capture.FROM_TARGET}
    assert capture.model_fingerprints(replace(settings, draft="quant:4:64"))["draft_fingerprint"] == capture.FROM_TARGET
    adapter = replace(settings, draft="adapter:14")
    shipped = capture.model_fingerprints(adapter)["draft_fingerprint"]
    assert shipped == capture.folder_fingerprint(pretrained.SHIPPED_DRAFTS / "adapter-14")
    user = pretrained.cache_dir() / "drafts" / "adapter-14"
    shutil.copytree(pretrained.SHIPPED_DRAFTS / "adapter-14", user)
    assert capture.model_fingerprints(adapter)["draft_fingerprint"] == shipped  # the same files
    (user / "adapter.safetensors").write_bytes(b"trained by the user")  # shadows the shipped adapter:14
    assert capture.model_fingerprints(adapter)["draft_fingerprint"] not in (shipped, "")


def _made_before_the_fingerprints(pair, prompts, out, monkeypatch):
    """A capture of root 0 of 2 as the code before the fingerprints made it: no fingerprint in its
    settings.json, its shards stamped with the hash of the settings without them."""
    with monkeypatch.context() as patch:
        patch.setattr(capture, "model_fingerprints", lambda settings: {})
        assert main(flags(pair, prompts, out, "--full")) == 0
    data = json.loads((out / "settings.json").read_text())
    del data["format"]  # format 0: a settings.json from before the number
    for key in store.MODEL_KEYS:
        assert data.pop(key) == ""
    (out / "settings.json").write_text(json.dumps(data))
    store.shard_path(out, 1).unlink()


def test_a_capture_made_before_the_fingerprints_resumes_with_a_note(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    out = tmp_path / "old"
    _made_before_the_fingerprints(micro_pair_dir, prompts, out, monkeypatch)
    before = (out / "settings.json").read_text()
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    assert "note: the folder's settings.json records no model fingerprints" in capsys.readouterr().err
    assert (out / "settings.json").read_text() == before  # its hash, which its shards record, unchanged
    assert store.read_capture(out)["root"].unique().to_list() == [0, 1]
    store.CapturedPair(out)


def test_a_capture_made_before_the_settings_hash_is_not_resumed(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    """Its new shards would be stamped, and the readers refuse unstamped shards beside stamped ones."""
    out = tmp_path / "older"
    _made_before_the_fingerprints(micro_pair_dir, prompts, out, monkeypatch)
    for file in out.glob("nodes-r*.parquet"):
        pl.read_parquet(file).write_parquet(file, statistics=False)
    for file in out.glob("logits-r*.npz"):
        with np.load(file) as stored:
            target, draft = stored["target"], stored["draft"]
        np.savez_compressed(file, target=target, draft=draft)
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out, "--full")))
    assert "holds shards made before the settings hash (" in err and "recapture into a new folder" in err
    assert store.completed_roots(out) == [0]
    store.CapturedPair(out)  # still read, as a legacy folder


# -- a damaged root is captured again ---------------------------------------------------------------------------------
def _garbage(file):
    file.write_bytes(b"not a shard")


def _truncated(file):
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _flipped(file):
    """64 bytes flipped a quarter of the way in: the archive's directory and the arrays' headers intact,
    their compressed data damaged (a bad CRC-32, or data zlib cannot inflate)."""
    data = bytearray(file.read_bytes())
    at = len(data) // 4
    data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    file.write_bytes(bytes(data))


def _no_rows(file):
    pl.read_parquet(file).head(0).write_parquet(file, metadata={store.HASH_KEY: pl.read_parquet_metadata(file)[store.HASH_KEY]})


@pytest.mark.parametrize(
    "damage, path, says",
    [
        (_garbage, store.shard_path, "nodes-r000001.parquet' is damaged"),
        (_truncated, store.shard_path, "nodes-r000001.parquet' is damaged"),
        (_no_rows, store.shard_path, "missing columns [] or no rows"),
        (_truncated, store.logits_path, "logits-r000001.npz' is damaged"),
        (_flipped, store.logits_path, "logits-r000001.npz' is damaged"),
        (lambda file: file.unlink(), store.logits_path, "logits-r000001.npz is missing"),
    ],
)
def test_a_damaged_root_is_captured_again(micro_pair_dir, prompts, full, tmp_path, capsys, damage, path, says):
    """Issue 40 item 6: a damaged shard counted as done on resume ("its roots are captured
    already", exit 0), after which every reader refused the folder."""
    out = tmp_path / "damaged"
    shutil.copytree(full, out)
    damage(path(out, 1))
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    err = capsys.readouterr().err
    assert f"root 1 is damaged (" in err and says in err and "capturing it again" in err, err
    assert store.read_capture(out).equals(store.read_capture(full))
    for root in (0, 1):
        np.testing.assert_array_equal(store.read_logits(out, root)[0], store.read_logits(full, root)[0])


def test_the_flipped_archive_passes_a_header_check_and_fails_every_reader(full, tmp_path):
    """The damage ``_flipped`` plants is one a check of the archive's directory and array headers
    alone (``check_root`` before the attack round) passes: the archive opens and its headers read,
    its data does not."""
    import zipfile

    out = tmp_path / "flipped"
    shutil.copytree(full, out)
    _flipped(store.logits_path(out, 1))
    with zipfile.ZipFile(store.logits_path(out, 1)) as archive, archive.open("target.npy") as member:
        np.lib.format.read_magic(member)
        assert len(np.lib.format.read_array_header_1_0(member)[0]) == 2
    with pytest.raises(ValueError, match=r"^capture: '.*logits-r000001.npz' is damaged \((BadZipFile|error): "):
        store.read_logits(out, 1)
    assert "logits-r000001.npz' is damaged (" in store.check_root(out, 1, store.load_settings(out), store.folder_hash(out))


def test_a_root_stored_under_another_roots_name_is_captured_again(micro_pair_dir, prompts, full, tmp_path, capsys):
    """Root 0's shard and logits copied over root 1's: on resume root 1 counted as captured, holding
    root 0's data (its rows counted twice by every reader)."""
    out = tmp_path / "renamed"
    shutil.copytree(full, out)
    shutil.copy(store.shard_path(out, 0), store.shard_path(out, 1))
    shutil.copy(store.logits_path(out, 0), store.logits_path(out, 1))
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    err = capsys.readouterr().err
    assert "root 1 is damaged (" in err and "nodes-r000001.parquet' is damaged (it holds root 0, not root 1" in err, err
    assert store.read_capture(out).equals(store.read_capture(full))
    np.testing.assert_array_equal(store.read_logits(out, 1)[1], store.read_logits(full, 1)[1])
    shutil.copy(store.logits_path(out, 0), store.logits_path(out, 1))  # the logits alone, node counts alike or not
    assert "logits-r000001.npz' is damaged (it holds root 0, not root 1" in store.check_root(
        out, 1, store.load_settings(out), store.folder_hash(out)
    )


def test_a_root_drawn_under_other_settings_stops_the_resume(micro_pair_dir, prompts, full, tmp_path, capsys):
    out, other = tmp_path / "mixed", tmp_path / "other"
    shutil.copytree(full, out)
    assert main(flags(micro_pair_dir, prompts, other, "--full", "--seed", "5")) == 0
    shutil.copy(store.shard_path(other, 1), store.shard_path(out, 1))
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out, "--full")))
    assert "nodes-r000001.parquet' was drawn under other settings" in err


# -- every path checked before anything is created ----------------------------------------------------------------------
def test_a_missing_prompt_file_or_model_folder_creates_nothing(micro_pair_dir, prompts, tmp_path, capsys):
    """Issue 40 item 15: ``--prompts missing.txt`` and a missing model folder left an empty folder."""
    out = tmp_path / "o"
    cases = [
        (["--prompts", str(tmp_path / "missing.txt")], "--prompts:"),
        (["--target", str(tmp_path / "none")], "--target: model folder"),
        (["--draft", str(tmp_path)], "--draft:"),
    ]
    for extra, says in cases:
        err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out) + extra))
        assert says in err and not out.exists(), err
