"""Several captures replayed together (``backends.sources.replay.CaptureSource``, ``--capture A B``):
a study compares their settings, so captures drawn from other models (target, draft, dtype) or other
prompts are refused with one line naming what differs and the two captures (issue 40's attack round:
a sweep over captures of two models exited 0, labelled with the first capture's models)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
from conftest import capture_flags, one_error_line, write_prompts

from analyses import sweep
from backends import capture, capture_store as store
from backends.capture import main
from backends.sources.replay import CaptureSource


def flags(pair_dir, prompts, out, *extra):
    return capture_flags(pair_dir, prompts, out, "--depth", "1", "--width", "2", "--roots-per-forward", "1", "--full", *extra)


def retrain(folder) -> None:
    """Change a model folder's weights in place, as retraining into the same path does."""
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def made(micro_pair_dir, tmp_path_factory):
    """Captures of 2 roots: ``base`` (T = 1) and, at T = 0.5, ``copy`` (the same models and prompts
    at other paths: ``pair-copy``), ``draft`` and ``target`` (that model retrained), ``prompts`` (3 prompts)."""
    root = tmp_path_factory.mktemp("together")
    prompts = write_prompts(root, 2)
    (root / "elsewhere").mkdir()
    moved = shutil.copy(prompts, root / "elsewhere" / "prompts.txt")
    more = write_prompts(tmp_path_factory.mktemp("more"), 3)
    pairs = {"copy": None, "draft": "draft", "target": "target"}
    out = {"base": root / "base"}
    assert main(flags(micro_pair_dir, prompts, out["base"])) == 0
    for name, changed in pairs.items():
        pair = root / f"pair-{name}"
        shutil.copytree(micro_pair_dir, pair)
        if changed:
            retrain(pair / changed)
        out[name] = root / name
        assert main(flags(pair, moved, out[name], "--temperature", "0.5")) == 0
    out["pair-copy"] = root / "pair-copy"
    out["prompts"] = root / "prompts"
    assert main(flags(micro_pair_dir, more, out["prompts"], "--temperature", "0.5")) == 0
    return {k: str(v) for k, v in out.items()}


def refusal(folders, grid=False) -> str:
    with pytest.raises(ValueError) as exc:
        CaptureSource(folders, grid=grid)
    assert "\n" not in str(exc.value)
    return str(exc.value)


@pytest.mark.parametrize(
    "other, says",
    [
        ("draft", "was drawn from another draft model than"),
        ("target", "was drawn from another target model than"),
        ("prompts", "was drawn from other prompts than"),
    ],
)
def test_captures_of_other_models_or_prompts_are_refused_naming_which(made, other, says):
    message = refusal([made["base"], made[other]])
    assert message.startswith(f"capture: {made[other]!r} {says} {made['base']!r} ("), message
    if other != "prompts":
        assert f"{other} sha256:" in message and "replay captures of the same target and draft together" in message
    else:
        assert "(digest " in message


def test_the_same_models_and_prompts_at_other_paths_are_replayed_together(made):
    """Compared by fingerprint and by the prompts' digest, not by path."""
    source = CaptureSource([made["base"], made["copy"]], grid=False)
    assert [(s.temperature, source.count(s)) for s in source.fixed_settings()] == [(1.0, 2), (0.5, 2)]


def test_the_old_rule_that_compared_settings_only_is_caught(made, monkeypatch):
    """The planted fault (no comparison of the models: the old rule) accepts a capture of a retrained
    draft beside the base one, so the test above it fails on it."""
    monkeypatch.setattr(store, "model_difference", lambda a, b: None)
    source = CaptureSource([made["base"], made["draft"]], grid=False)
    assert source.describe() == CaptureSource([made["base"]], grid=False).describe()  # labelled with the first's models


def test_a_sweep_over_captures_of_two_models_exits_2_with_one_line(made, tmp_path, capsys):
    config = tmp_path / "engines.json"
    config.write_text(json.dumps([{"engine": "vllm", "num_speculative_tokens": 1}]))
    out = tmp_path / "o"
    argv = [
        "--capture",
        made["base"],
        made["draft"],
        "--config",
        str(config),
        "--draft-law",
        "setting",
        "--latency",
        "sequoia-demo",
    ]
    with pytest.raises(SystemExit) as exc:
        sweep.main([*argv, "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and "another draft model" in err, err
    assert not out.exists()


def test_captures_without_fingerprints_are_compared_by_model_path(micro_pair_dir, made, tmp_path, monkeypatch):
    """Captures made before the fingerprints record the model paths only: other paths are other models
    (the same files copied elsewhere cannot be told from a retrained copy); the same paths pass."""
    monkeypatch.setattr(capture, "model_fingerprints", lambda settings: {})
    prompts = write_prompts(tmp_path, 2)
    same, moved = tmp_path / "same", tmp_path / "moved"
    assert main(flags(micro_pair_dir, prompts, same)) == 0
    assert main(flags(micro_pair_dir, prompts, tmp_path / "half", "--temperature", "0.5")) == 0
    assert main(flags(made["pair-copy"], prompts, moved, "--temperature", "0.5")) == 0
    assert json.loads((same / "settings.json").read_text())["draft_fingerprint"] == ""
    CaptureSource([str(same), str(tmp_path / "half")], grid=False)
    message = refusal([str(same), str(moved)])
    assert "was drawn from another target and draft model than" in message
    assert f"draft {str(micro_pair_dir / 'draft')!r}, not" not in message  # the moved capture's values come first
    assert f"not {str(micro_pair_dir / 'draft')!r})" in message, message
    CaptureSource([made["base"], str(tmp_path / "half")], grid=False)  # one without fingerprints: by path, the same


def test_model_difference_names_which_model_differs():
    base = store.CaptureSettings(
        "t", "d", "p.txt", target_fingerprint="sha256:" + "a" * 64, draft_fingerprint="sha256:" + "b" * 64
    )
    assert store.model_difference(base, replace(base, target="elsewhere", draft="there")) is None  # same files
    assert store.model_difference(base, replace(base, draft_fingerprint="hub:" + "c" * 40)) == (
        "draft",
        f"draft sha256:{'b' * 12}, not hub:{'c' * 12} (fingerprints of different kinds, a hub commit and a folder digest: "
        "the lab cannot tell them equal)",
    )
    assert store.model_difference(base, replace(base, dtype="bfloat16")) == ("dtype", "dtype float32, not bfloat16")
    pair = store.CaptureSettings("", "early-exit:2", "p.txt", pair="smollm2", target_fingerprint=base.target_fingerprint)
    pair = replace(pair, draft_fingerprint=store.FROM_TARGET)
    assert store.model_difference(pair, replace(pair, draft="quant:4:64")) == ("draft", "draft 'early-exit:2', not 'quant:4:64'")
    assert store.model_difference(pair, replace(pair, draft_fingerprint="")) is None  # one unknown: by name
    assert store.model_difference(replace(pair, target_fingerprint=""), replace(base, target_fingerprint="")) == (
        "target and draft",
        f"target 'pair smollm2', not 't'; draft {store.FROM_TARGET}, not sha256:{'b' * 12}",
    )


def test_prompts_difference_compares_digests_else_paths():
    base = store.CaptureSettings("t", "d", "a.txt", prompts_sha256="e" * 64)
    assert store.prompts_difference(base, replace(base, prompts="b.txt")) is None
    assert "(digest ffffffffffff)" in store.prompts_difference(base, replace(base, prompts_sha256="f" * 64))
    assert store.prompts_difference(replace(base, prompts_sha256=""), base) is None
    assert store.prompts_difference(replace(base, prompts_sha256=""), replace(base, prompts="b.txt")) == (
        "prompts 'a.txt', not 'b.txt'"
    )


def test_every_pair_of_captures_is_compared_and_roots_placed_alike(monkeypatch):
    """Each capture was compared with the first only: a capture without fingerprints listed first
    (compared by name) let two fingerprinted captures of other models through; captures whose roots
    sit elsewhere (other roots per prompt or spacing) were replayed together."""
    from backends.sources import replay

    fingerprinted = store.CaptureSettings(
        "t", "d", "p.txt", target_fingerprint="sha256:" + "a" * 64, draft_fingerprint="sha256:" + "b" * 64
    )
    legacy = replace(fingerprinted, target_fingerprint="", draft_fingerprint="")
    other = replace(fingerprinted, draft_fingerprint="sha256:" + "c" * 64)
    source = replay.CaptureSource.__new__(replay.CaptureSource)
    source.captures = {"L": ("L", legacy), "A": ("A", fingerprinted)}
    with pytest.raises(ValueError, match="another draft model than 'A'"):
        source._check_comparable("B", other)
    source.captures = {"A": ("A", fingerprinted)}
    with pytest.raises(ValueError, match=r"places its roots otherwise than 'A' \(spacing 16, not 8\)"):
        source._check_comparable("S", replace(fingerprinted, spacing=16))
    source._check_comparable("T", replace(fingerprinted, temperature=0.5))  # another setting: the point of several
