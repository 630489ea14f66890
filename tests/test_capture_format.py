"""Issue 41 (4): typed errors routed by their argument, the versioned settings.json of a capture
and its one upgrade function, the capture tool's greedy rule (the lab's one definition) and its
studies' flags (``--settings``, ``--roots-per-trajectory``)."""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict

import numpy as np
import polars as pl
import pytest

from backends import capture, capture_format
from backends import capture_store as store
from backends.capture import label_refusal, main, parse_args
from backends.cli import ToolParser, flag_message
from conftest import capture_flags, one_error_line, write_prompts
from simlab import tree_verifiers
from simlab.errors import ArgumentError, CaptureError, argument_of
from simlab.sampling import DDTE_SETTINGS, SamplingSettings


# -- typed errors --------------------------------------------------------------------------------------------------
def test_an_argument_error_is_a_one_line_value_error_carrying_its_argument():
    exc = ArgumentError("top_k", "must be >= 1, got 0")
    assert isinstance(exc, ValueError) and str(exc) == "top_k: must be >= 1, got 0"
    assert (exc.argument, exc.detail) == ("top_k", "must be >= 1, got 0")
    again = pickle.loads(pickle.dumps(CaptureError("'x' is damaged")))
    assert type(again) is CaptureError and again.argument == "capture" and str(again) == "capture: 'x' is damaged"
    assert isinstance(again, ArgumentError) and isinstance(again, ValueError)
    assert exc.renamed("target").argument == "target" and str(exc.renamed("target")) == "target: must be >= 1, got 0"
    with pytest.raises(TypeError):
        ArgumentError("", "x")


def test_argument_of_reads_the_attribute_then_the_convention():
    assert argument_of(ArgumentError("vocab", "must be >= 2\nmore")) == ("vocab", "must be >= 2")
    assert argument_of(ValueError("vocab: must be >= 2")) == ("vocab", "must be >= 2")
    assert argument_of(ValueError("no name here")) == (None, "no name here")
    assert argument_of(ValueError("two words: not a name")) == (None, "two words: not a name")


def test_flag_mapping_reads_the_attribute_not_the_text(monkeypatch):
    parser = ToolParser(prog="t")
    parser.add_argument("--top-k", type=int)
    exc = ArgumentError("top_k", "must be >= 1, got 0")
    assert flag_message(exc, parser) == "--top-k: must be >= 1, got 0"
    assert flag_message(ArgumentError("c", "must be > 0"), None, {"c": "--cost-ratio"}) == "--cost-ratio: must be > 0"
    assert flag_message("top_k: must be >= 1", parser) == "--top-k: must be >= 1"  # a core message as text
    assert flag_message(ValueError("other: x"), parser) == "other: x"  # no such flag: unchanged
    # planted: a message whose text no longer starts with its argument still maps by the attribute
    monkeypatch.setattr(ArgumentError, "__str__", lambda self: f"reworded ({self.detail})")
    assert flag_message(exc, parser) == "--top-k: must be >= 1, got 0"


def test_the_store_routes_capture_errors_by_type(tmp_path):
    """``read_safely`` lets the store's own ``CaptureError`` through and reports any other error,
    even a library's ``ValueError`` whose text starts with "capture:", as a damaged file."""

    def own(_):
        raise CaptureError("'f' holds root 2, not root 1")

    def library(_):
        raise ValueError("capture: a library's words")

    with pytest.raises(CaptureError, match="^capture: 'f' holds root 2, not root 1$"):
        store.read_safely("f", own)
    with pytest.raises(CaptureError, match=r"^capture: 'f' is damaged \(ValueError: capture: a library's words\)$"):
        store.read_safely("f", library)


def test_opening_a_captures_models_routes_by_argument(monkeypatch):
    stored = store.CaptureSettings("/nowhere/target", "/nowhere/draft", "p.txt")

    def refuse(error):
        def open_pair(*args, **kwargs):
            raise error

        monkeypatch.setattr(capture, "open_pair", open_pair)

    refuse(ArgumentError("draft", "not a model folder"))
    with pytest.raises(CaptureError, match="^capture: opening the capture's models: draft: not a model folder$"):
        capture.open_captured_pair(stored, "cpu")
    refuse(ValueError("trim_draft_vocab: nothing to trim"))  # a plain core message: its argument by the convention
    with pytest.raises(CaptureError, match="opening the capture's models: trim_draft_vocab"):
        capture.open_captured_pair(stored, "cpu")
    refuse(ArgumentError("device", "no CUDA here"))
    with pytest.raises(ArgumentError, match="^device: no CUDA here$") as exc:
        capture.open_captured_pair(stored, "cpu")
    assert not isinstance(exc.value, CaptureError)


def test_a_fingerprint_error_names_the_model(micro_pair_dir, monkeypatch):
    def unreadable(folder):
        raise ArgumentError("folder", f"cannot read the model folder {str(folder)!r} (Permission denied)")

    monkeypatch.setattr(capture, "folder_fingerprint", unreadable)
    settings = store.CaptureSettings(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), "p.txt")
    with pytest.raises(ArgumentError, match="^target: cannot read the model folder .*Permission denied") as exc:
        capture.model_fingerprints(settings)
    assert exc.value.argument == "target"


# -- the format of settings.json -----------------------------------------------------------------------------------
ORIGINAL = {
    "target": "/m/target",
    "draft": "/m/draft",
    "prompts": "p.txt",
    "roots_per_prompt": 2,
    "spacing": 4,
    "shape": "grid",
    "width": 2,
    "depth": 2,
    "trunk": 1,
    "temperature": 0.6,
    "top_p": None,
    "top_k": None,
    "dtype": "float32",
    "store_top": 8,
    "full": True,
    "seed": 0,
    "samples": 2,
}


FORMAT_0_LEGACY = {
    "prompts_sha256": "",
    "labels": "",
    "roots_per_forward": 1,
    "evaluation": "forward",
    "labels_engine": "",
    "trim_draft_vocab": False,
    "pair": "",
    "target_fingerprint": "",
    "draft_fingerprint": "",
}
"""What a capture of the first format without each field added since was made with."""


def _write(folder, data) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(json.dumps(data))


def test_the_upgrade_fills_every_newer_field_with_its_legacy_value():
    assert set(ORIGINAL) == set(capture_format.ORIGINAL_FIELDS)
    assert set(capture_format.ORIGINAL_FIELDS) | set(capture_format.ADDED_FIELDS) == set(
        asdict(store.CaptureSettings("", "", ""))
    )
    upgraded = capture_format.upgrade_settings(ORIGINAL)
    assert set(upgraded) == set(asdict(store.CaptureSettings("", "", "")))
    assert {k: upgraded[k] for k in [*ORIGINAL, *FORMAT_0_LEGACY]} == {**ORIGINAL, **FORMAT_0_LEGACY}
    assert upgraded.get("trajectory", "forward") == "forward"  # format 2's field: "forward" before it
    assert capture_format.upgrade_settings({**ORIGINAL, "labels": "specinfer"})["labels_engine"] == "unrecorded"
    assert capture_format.upgrade_settings({**ORIGINAL, "roots_per_forward": 4})["roots_per_forward"] == 4  # kept
    assert "format" not in capture_format.upgrade_settings({**upgraded, "format": capture_format.FORMAT})


def test_a_settings_json_lacking_every_newer_field_loads(tmp_path):
    _write(tmp_path / "old", ORIGINAL)
    held = store.load_settings(tmp_path / "old")
    assert (held.roots_per_forward, held.evaluation, held.labels_engine, held.target_fingerprint) == (1, "forward", "", "")
    assert held == store.CaptureSettings(**capture_format.upgrade_settings(ORIGINAL))


def test_the_format_number_is_written_and_left_out_of_the_hash(tmp_path):
    settings = store.CaptureSettings(**capture_format.upgrade_settings(ORIGINAL))
    (tmp_path / "new").mkdir()
    store.save_settings(tmp_path / "new", settings)
    data = json.loads((tmp_path / "new" / "settings.json").read_text())
    assert data == {"format": capture_format.FORMAT, **asdict(settings)}
    assert store.load_settings(tmp_path / "new") == settings
    _write(tmp_path / "today", asdict(settings))  # today's file, written before the number: every field, no number
    assert store.load_settings(tmp_path / "today") == settings
    assert store.folder_hash(tmp_path / "today") == store.folder_hash(tmp_path / "new") == store.settings_hash(settings)


@pytest.mark.parametrize(
    "data, says",
    [
        (
            {"format": 99},
            f"format: format 99 is newer than the formats this version of the lab reads (up to {capture_format.FORMAT}); "
            "update simlab",
        ),
        ({"format": "1"}, "format: expected a format number >= 1, got '1'"),
        ({"format": True}, "format: expected a format number >= 1, got True"),
        ({"format": 0}, "format: expected a format number >= 1, got 0"),
        ({"format": 1}, "prompts_sha256: missing"),  # format 1 holds every field: one missing is damage
    ],
)
def test_a_settings_json_of_an_unknown_format_is_refused_in_one_line(tmp_path, data, says):
    _write(tmp_path / "c", {**ORIGINAL, **data})
    with pytest.raises(CaptureError) as exc:
        store.load_settings(tmp_path / "c")
    what = "was written by a newer version of the lab" if data["format"] == 99 else "has a damaged settings.json"
    assert str(exc.value) == f"capture: {str(tmp_path / 'c')!r} {what} ({says})"


def test_a_node_shard_from_before_the_category_column_reads_with_a_null_one():
    old = pl.DataFrame({"root": [3, 3], "path": [[], [1]]})
    upgraded = capture_format.upgrade_nodes(old)
    assert upgraded["category"].to_list() == [None, None] and upgraded["category"].dtype == pl.String
    new = old.with_columns(pl.lit("code").alias("category"))
    assert capture_format.upgrade_nodes(new) is new


def test_a_format_0_capture_reads_replays_and_resumes(micro_pair_dir, tmp_path, monkeypatch, capsys):
    """A capture whose settings.json lacks every field added since the first format (and the number),
    its shards stamped with that file's hash, as code of before the fields wrote it: read, replayed
    and resumed by today's code."""
    prompts = write_prompts(tmp_path, 2)
    out = tmp_path / "old"
    legacy = ["--depth", "1", "--width", "2", "--roots-per-forward", "1", "--evaluation", "forward", "--full"]
    legacy += ["--trajectory", "forward"] if "trajectory" in capture_format.ADDED_FIELDS else []
    # no fingerprints, no prompt digest: as code of before those fields (a resume of a capture without
    # the digest is refused by today's code, comparing it with this run's: the resume runs as that code)
    monkeypatch.setattr(capture, "model_fingerprints", lambda settings: {})
    monkeypatch.setattr(capture, "prompts_digest", lambda records: "")
    assert main(capture_flags(micro_pair_dir, prompts, out, *legacy)) == 0
    data = json.loads((out / "settings.json").read_text())
    assert data.pop("format") == capture_format.FORMAT
    for name in capture_format.ADDED_FIELDS:
        assert data.pop(name) == FORMAT_0_LEGACY.get(name, "forward"), name
    assert set(data) == set(capture_format.ORIGINAL_FIELDS)
    (out / "settings.json").write_text(json.dumps(data))
    store.shard_path(out, 1).unlink()
    assert store.read_capture(out)["root"].unique().to_list() == [0]  # the shards' hash is the old file's
    store.CapturedPair(out)
    assert main(capture_flags(micro_pair_dir, prompts, out, *legacy)) == 0  # resumed: its models unchecked, said
    assert "records no model fingerprints" in capsys.readouterr().err
    assert json.loads((out / "settings.json").read_text()) == data  # the old file kept: its shards' hash
    assert store.read_capture(out)["root"].unique().to_list() == [0, 1]


# -- the greedy rule -----------------------------------------------------------------------------------------------
SETTINGS = [
    SamplingSettings(0.0),
    SamplingSettings(0.0, top_k=5),
    SamplingSettings(1.0),
    SamplingSettings(0.6, top_p=0.9),
    SamplingSettings(1.0, top_k=1),
    SamplingSettings(0.7, top_k=1, top_p=0.5),
    SamplingSettings(1e-300),
    *DDTE_SETTINGS,
]


GREEDY_ONLY = [n for n in tree_verifiers.names() if tree_verifiers.get(n).needs_greedy_target]
"""The verifiers lossless only for a greedy target (``greedy``, ``hsd``, ...)."""


@pytest.mark.parametrize("sampling", SETTINGS, ids=lambda s: s.name)
def test_the_capture_refuses_a_greedy_only_verifier_exactly_where_the_lab_says_the_target_is_not_greedy(sampling):
    """The capture's rule is the lab's one definition (``SamplingSettings.greedy``, which
    ``tree_verifiers.lossless_names`` reads too): for each greedy-only verifier the grid can carry
    (lossless for its i.i.d. children at a greedy target), refused exactly where it is not greedy."""
    checked = 0
    for name in GREEDY_ONLY:
        if label_refusal(name, 2, SamplingSettings(0.0)) is not None:
            continue  # refused for its drafting law at any target
        refused = label_refusal(name, 2, sampling)
        assert (refused is not None) == (not sampling.greedy), (name, sampling.name, refused)
        in_lossless_names = name in tree_verifiers.lossless_names(tree_verifiers.get(name).lossless_for, sampling)
        assert in_lossless_names == (refused is None), (name, sampling.name)
        checked += 1
    assert checked >= 1


def test_top_k_1_draws_the_greedy_law_bit_for_bit():
    """The fact behind counting top-k = 1 as greedy (see the report of issue 41): at any T its law
    is one-hot on the argmax, lowest id among ties, as T = 0's."""
    rng = np.random.default_rng(0)
    logits = np.round(rng.normal(size=(64, 50)), 1)  # rounded: ties among the maxima
    logits[:, 7] = logits.max(axis=1)
    for T in (1e-300, 0.3, 1.0, 7.0):
        for top_p in (None, 0.5):
            got = SamplingSettings(T, top_k=1, top_p=top_p).probabilities(logits)
            np.testing.assert_array_equal(got, SamplingSettings(0.0).probabilities(logits))


# -- the studies' flags --------------------------------------------------------------------------------------------
BASE = ["--target", "t", "--draft", "d", "--prompts", "p.txt", "--out", "o"]


def _settings(*extra) -> store.CaptureSettings:
    return parse_args([*BASE, *extra])[0]


def test_settings_and_roots_per_trajectory_as_the_studies_spell_them():
    assert _settings("--settings", "0.6") == _settings("--temperature", "0.6")
    assert _settings("--settings", "1:0.9:40") == _settings("--temperature", "1", "--top-p", "0.9", "--top-k", "40")
    assert _settings("--settings", "1::40").sampling() == SamplingSettings(1.0, top_k=40)
    assert _settings("--settings", "0").sampling().greedy
    assert _settings() == _settings("--settings", "1")
    assert _settings("--roots-per-trajectory", "3") == _settings("--roots-per-prompt", "3")
    assert _settings("--roots-per-trajectory", "3").roots_per_prompt == 3
    assert _settings("--shape", "grid", "--labels", "greedy", "--settings", "0").labels == "greedy"


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--settings", "ddte"], "--settings: a capture folder holds one sampling setting, got 8 (T=0.2, "),
        (["--settings", "0.6,1"], "--settings: a capture folder holds one sampling setting, got 2 (T=0.6, T=1)"),
        (["--settings", "1", "--top-k", "4"], "--settings: gives the whole sampling setting; drop --top-k"),
        (["--settings", "x"], "--settings: 'x' is not T, T:top_p or T:top_p:top_k"),
        (["--settings", "-1"], "--settings: temperature must be a finite number >= 0"),
        (["--temperature", "-1"], "--temperature: must be a finite number >= 0"),
        (["--top-k", "0"], "--top-k: "),
        (["--roots-per-prompt", "0"], "--roots-per-trajectory: "),
        (["--shape", "grid", "--labels", "greedy", "--settings", "1"], "--labels: greedy is lossless only for a greedy target"),
    ],
)
def test_bad_capture_flags_are_one_line(extra, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, *extra])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and f"error: {says}" in err, err


def test_a_capture_before_the_prompt_digest_is_resumed_by_its_prompt_path(tmp_path):
    """A stored empty ``prompts_sha256`` is unknown, not different: the prompt file's path decides."""
    from dataclasses import asdict

    prompts = tmp_path / "p.txt"
    prompts.write_text("a\n")
    mine = asdict(store.CaptureSettings("t", "d", str(prompts), prompts_sha256="f" * 64))
    stored = {**mine, "prompts_sha256": ""}
    assert store.differing_settings(stored, mine) == []
    assert store.differing_settings({**stored, "prompts": str(tmp_path / "other.txt")}, mine) == ["prompts_sha256"]
    assert store.differing_settings({**mine, "prompts_sha256": "0" * 64}, mine) == ["prompts_sha256"]
