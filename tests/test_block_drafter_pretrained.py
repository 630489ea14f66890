"""SpecBlock's block drafter for the named pretrained pair (``python -m backends.block_drafter --pair smollm2``).

On a truncated copy of the real weights (the first 2 of SmolLM2's 30 layers) with a one-step
training of the micro drafter on a few hundred tokens: the tool writes the drafter and its
manifest, the same seed and threads give the same bits, the studies' drafter lookup finds it in
the pair's cache and it drafts lossless greedy trees on the pair; untrained, the lookup names the
command that trains it.  Needs the converted target in the user cache (``conftest.smollm2_folder``).
"""

from __future__ import annotations

import dataclasses
import json
import types

import numpy as np
import pytest
import torch

from backends import pretrained
from backends.block_drafter import pretrained as bd_pretrained
from conftest import one_error_line
from simlab.decoding import greedy_decode, speculative_decode
from simlab.sampling import SamplingSettings

SMALL = [
    "--prompts",
    "2",
    "--reply-tokens",
    "8",
    "--text-tokens",
    "512",
    "--held-out-tokens",
    "96",
    "--row-length",
    "32",
    "--held-out-roots",
    "8",
]
CORPUS = bd_pretrained.Corpus(prompts=2, reply_tokens=8, text_tokens=512, held_out_tokens=96, row_length=32, held_out_roots=8)
TEXT = dataclasses.replace(CORPUS, prompts=0)
QUIET = lambda message: None  # noqa: E731


@pytest.fixture(scope="module")
def pair(smollm2_folder):
    """The pair on the target's first 2 layers (early-exit:1 draft), greedy."""
    return pretrained.named_pair("smollm2", "early-exit:1", layers=2, device="cpu", settings=SamplingSettings(0.0))


def tiny(pair, seed: int):
    """(model, manifest) of a one-step training of a small micro drafter on the pair's target, one thread."""
    from backends.block_drafter.model import DrafterSpec

    spec = DrafterSpec.micro(steps=1, rank_freeze=0, roots_per_step=8, windows=2)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return bd_pretrained.train_on("smollm2", pair.target, pair.target_tokenizer, "full", spec, seed, CORPUS, QUIET)
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def cache(pair, tmp_path_factory):
    """A drafter cache folder holding the tiny drafter, saved as the tool saves it."""
    from backends.block_drafter.drafter import save

    root = tmp_path_factory.mktemp("bd_smollm2")
    model, manifest = tiny(pair, 0)
    save(model, root / "full", manifest)
    return root


@pytest.fixture
def at(cache, monkeypatch):
    """The pair's drafter folder pointed at ``cache``."""
    monkeypatch.setattr(bd_pretrained, "drafter_dir", lambda: cache)
    return cache


def test_feature_rows_agree_with_the_target_run_at_every_step(pair):
    """``FeatureRows`` (features once, p through the head at the drawn positions) against the plain
    ``target_pass`` over the same rows: the same features and the same p."""
    from backends.block_drafter.train import FeatureRows, target_pass

    rows, _, _ = bd_pretrained.training_data(pair.target, pair.target_tokenizer, TEXT, 0)
    rows = rows[:3, :16]
    fast = FeatureRows(pair.target, (1, 1, 2), rows)
    features, p = target_pass(pair.target, rows, (1, 1, 2))
    windows, drawn, law = fast.draw(2, torch.Generator().manual_seed(0))
    picked = [int(torch.nonzero((rows == w).all(1))[0]) for w in windows]
    assert torch.allclose(drawn, features[picked], atol=1e-5, rtol=0)
    b, n = torch.tensor([0, 1, 1]), torch.tensor([[2, 3], [0, 15], [7, 7]])
    tv = 0.5 * (law(b[:, None], n) - p[picked][b[:, None], n]).abs().sum(-1)
    assert float(tv.max()) < 1e-5, tv  # float32 rounding of the same head (the row forward vs the window forward)
    with pytest.raises(ValueError, match=r"^layers: the top feature layer must be the target's last \(2\)"):
        FeatureRows(pair.target, (1, 1, 1), rows)
    with pytest.raises(ValueError, match=r"^rows: "):
        FeatureRows(pair.target, (1, 1, 2), rows[:, :3])


def test_the_drafter_text_leaves_the_source_code_stream_unseen(pair):
    """``plain_text(code=False)`` (the drafter's default) holds none of the study's stream prompts."""
    from backends.draft_corpus import plain_text
    from backends.roots import source_code_prompts

    text = pair.target_tokenizer.decode(plain_text(pair.target_tokenizer, 10**7, 0, code=False))
    assert len(text) > 100_000 and not any(prompt[:120] in text for prompt in source_code_prompts(24))


def test_the_manifest_records_the_training(cache):
    m = json.loads((cache / "full" / "manifest.json").read_text())
    assert m["pair"] == "smollm2" and m["variant"] == "full" and m["seed"] == 0
    assert m["torch"] == torch.__version__ and m["threads"] == 1 and m["torch_threads"] == 1 and m["device"] == "cpu"
    assert m["target_layers"] == 2 and m["feature_layers"] == [1, 1, 2] and m["feature_dim"] == 3 * 576
    assert m["vocab_size"] == 49152 and m["width"] == 576 and m["spec"]["arch"] == "attention" and m["spec"]["steps"] == 1
    data = m["data"]
    assert (data["prompts"], data["reply_tokens"], data["text_tokens"], data["held_out_tokens"]) == (2, 8, 512, 96)
    assert data["code"] is False
    assert 2 * 8 < data["conversation_tokens"] and data["rows"] == (data["conversation_tokens"] + 512 - 96) // 32
    assert len(data["rows_sha256"]) == 64 and data["rows_sha256"] != data["held_out_sha256"]
    held = m["held_out"]
    assert held["roots"] == 8 and len(held["acceptance_by_slot"]) == 4
    assert all(0 <= a <= 1 for a in held["acceptance_by_slot"]) and held["expected_chain_length"] >= 1


def test_the_same_seed_and_threads_give_the_same_bits(pair, cache):
    """Retrained with seed 0 on one thread, the saved drafter comes back bit for bit; seed 1 draws other text."""
    from backends.block_drafter.drafter import load

    saved, manifest = load(cache / "full")
    again, info = tiny(pair, 0)
    a, b = saved.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert info["data"] == manifest["data"] and info["held_out"] == manifest["held_out"]
    other, _, _ = bd_pretrained.training_data(pair.target, pair.target_tokenizer, TEXT, 1)
    assert not torch.equal(other, bd_pretrained.training_data(pair.target, pair.target_tokenizer, TEXT, 0)[0])


@pytest.mark.slow
def test_the_tool_trains_the_named_pair_into_its_cache(smollm2_folder, tmp_path, monkeypatch):
    """``python -m backends.block_drafter --pair smollm2`` (2-layer copy, micro drafter, one step) writes
    ``<drafter_dir>/full`` where the lookup finds it."""
    from analyses._block_drafters import DrafterConfig, drafters_for
    from backends.block_drafter.__main__ import main

    monkeypatch.setattr(bd_pretrained, "drafter_dir", lambda: tmp_path / "block_drafter")
    assert main(["--pair", "smollm2", "--target-layers", "2", "--micro", "--steps", "1", *SMALL, "--quiet"]) == 0
    m = json.loads((tmp_path / "block_drafter" / "full" / "manifest.json").read_text())
    assert m["pair"] == "smollm2" and m["target_layers"] == 2 and m["spec"]["roots_per_step"] == 64 and m["threads"] == 1
    assert "full" in drafters_for(DrafterConfig(backend="hf", pair="smollm2"))[0]


def test_the_studies_find_it_and_it_drafts_lossless_greedy_trees(at, pair):
    from analyses._block_drafters import DrafterConfig, drafters_for
    from simlab.specblock import RankGuided

    drafter_of, missing = drafters_for(DrafterConfig(backend="hf", pair="smollm2"))
    assert set(drafter_of) == {"full"} and {r["builder"] for r in missing} == {"no_shift", "no_valid_prefix", "attention_free"}
    assert all("--pair smollm2 --variant" in r["reason"] and "--out" not in r["reason"] for r in missing)
    drafter = drafter_of["full"](pair)
    prompt = pair.encode("The for statement is used to iterate over the elements of a sequence")
    tokens, _ = speculative_decode(
        pair, prompt, RankGuided(drafter, budget=10, beam_width=3), "greedy", 8, np.random.default_rng(0)
    )
    assert tokens == greedy_decode(pair, prompt, 8)


def test_a_drafter_of_other_target_layers_is_refused(cache):
    from backends.block_drafter.drafter import TorchBlockDrafter, load

    model, manifest = load(cache / "full")
    whole = types.SimpleNamespace(target_features=None, feature_layers=lambda: (1, 15, 30))
    with pytest.raises(ValueError, match=r"^feature_layers: the drafter was trained on the target's layers \(1, 1, 2\)"):
        TorchBlockDrafter(model, whole, feature_layers=manifest["feature_layers"])


def test_untrained_the_lookup_names_the_command(tmp_path, monkeypatch):
    from analyses._block_drafters import DrafterConfig, drafters_for

    monkeypatch.setattr(bd_pretrained, "drafter_dir", lambda: tmp_path / "block_drafter")
    with pytest.raises(ValueError) as info:
        drafters_for(DrafterConfig(backend="hf", pair="smollm2"))
    assert str(info.value) == (
        f"drafters: no drafter at {tmp_path / 'block_drafter' / 'full'}: "
        "python -m backends.block_drafter --pair smollm2 --variant full"
    )
    with pytest.raises(ValueError, match=f"--variant full --out {tmp_path / 'mine' / 'full'}$"):
        drafters_for(DrafterConfig(backend="hf", pair="smollm2", drafters=str(tmp_path / "mine")))


@pytest.mark.slow
def test_the_study_on_the_whole_pair_says_how_to_train_it(smollm2_folder, tmp_path, monkeypatch, capsys):
    """``analyses.specblock --pair smollm2`` with no drafter trained: exit 2, one line naming the command."""
    from analyses import specblock

    monkeypatch.setattr(bd_pretrained, "drafter_dir", lambda: tmp_path / "block_drafter")
    with pytest.raises(SystemExit) as exc:
        specblock.main(
            ["--backend", "hf", "--pair", "smollm2", "--draft", "early-exit:2", "--out", str(tmp_path / "o"), "--quiet"]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    assert "--drafters: no drafter at" in err and "python -m backends.block_drafter --pair smollm2 --variant full" in err, err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--text-tokens", "512"], "--text-tokens: only a named pretrained pair takes it"),
        (["--pair", "smollm2", "--row-length", "2"], "--row-length: "),
        (["--pair", "smollm2", "--text-tokens", "10"], "--text-tokens: 10 tokens make no row of 256"),
        (["--pair", "smollm2", "--target-layers", "0"], "--target-layers: must be >= 1"),
        (
            ["--pair", "smollm2", "--held-out-tokens", "100"],
            "--held-out-tokens: 128 roots of 48-token prefixes need at least 176",
        ),
        (["--pair", "smollm2", "--prompts", "-1"], "--prompts: "),
        (["--pair", "nosuch"], "--pair: 'nosuch' is not a reference pair"),
    ],
)
def test_bad_flags_exit_2_with_one_line(flags, message, tmp_path, capsys):
    from backends.block_drafter.__main__ import main

    reference = tmp_path / "ref"
    (reference / "target").mkdir(parents=True)
    (reference / "manifest.json").write_text("{}")
    argv = flags if "--pair" in flags else ["--pair", str(reference), *flags]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and message in err, err
    assert not (tmp_path / "o").exists()
