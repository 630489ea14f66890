"""The trained adapter draft of the pretrained pair (``backends.drafts.adapter``, ``backends.train_draft``).

Runs on a truncated copy of the real weights (the first 3 of 30 layers) with a short-trained
recipe (a few steps on a few hundred tokens): the draft's forward is its written-out definition,
shares the target's modules, runs as an ordinary pair member (tree attention probe), and the
training is bit-identical under one seed and thread count.  The fixture ``folder`` fetches the
real file once (see tests/test_pretrained.py; ``SIMLAB_OFFLINE=1`` skips offline).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from backends import pretrained, train_draft
from backends.drafts import adapter
from backends.draft_corpus import plain_text, training_prompts
from backends.hf import HFPair
from backends.prompt_sets import prompt_set
from pair_checks import check_pair_member

TINY = train_draft.DraftRecipe(
    layers=1,
    prompts=4,
    reply_tokens=10,
    text_tokens=400,
    length=32,
    steps=5,
    batch=2,
    positions=16,
    generate_batch=2,
    paths=2,
    depth=3,
)
EVAL = ["What is 2 plus 3?", "Name a colour."]


@pytest.fixture(scope="module")
def folder(smollm2_folder):
    """The converted float32 folder (``conftest.smollm2_folder``)."""
    return smollm2_folder


@pytest.fixture(scope="module")
def target(folder):
    import torch

    torch.set_num_threads(1)
    return pretrained.load_target(folder, layers=3)


@pytest.fixture(scope="module")
def trained(target):
    model, tokenizer = target
    return train_draft.build_draft(model, tokenizer, TINY, eval_prompts=EVAL)


def test_training_is_bit_identical_under_one_seed_and_thread_count(target, trained):
    import torch

    model, tokenizer = target
    again = train_draft.build_draft(model, tokenizer, TINY, eval_prompts=EVAL)
    for a, b in zip([*trained[0].parameters(), *trained[1].parameters()], [*again[0].parameters(), *again[1].parameters()]):
        assert torch.equal(a, b)
    assert trained[2]["acceptance_by_depth"] == again[2]["acceptance_by_depth"]
    assert trained[2]["data"]["rows_sha256"] == again[2]["data"]["rows_sha256"]
    other = train_draft.build_draft(model, tokenizer, replace(TINY, seed=1), eval_prompts=EVAL)
    assert not torch.equal(next(trained[0].parameters()), next(other[0].parameters()))


def test_the_manifest_records_what_the_weights_depend_on(trained):
    manifest = trained[2]
    assert manifest["recipe"]["seed"] == 0 and manifest["threads"] == 1 and manifest["device"] == "cpu"
    assert pretrained.SHA256 in train_draft.TARGET_NAME and manifest["target"] == train_draft.TARGET_NAME
    assert (
        manifest["torch"]
        and manifest["transformers"]
        and manifest["target_layers"] == 3
        and len(manifest["data"]["rows_sha256"]) == 64
    )
    for sampler in ("target", "draft"):
        by_depth = manifest["acceptance_by_depth"][sampler]
        assert len(by_depth) == TINY.depth and all(0 <= a <= 1 for a in by_depth)
    assert [point["step"] for point in manifest["learning_curve"]] == [0, TINY.steps - 1]
    assert 0 <= manifest["held_out_text_acceptance"] <= 1


def test_the_draft_is_its_definition_and_shares_the_targets_modules(target, trained):
    import torch

    model, tokenizer = target
    stack, norm, _ = trained
    draft = adapter.build(model, 1, stack, norm)
    assert draft.model.layers[0] is model.model.layers[0] and draft.model.layers[1] is stack[0]
    assert draft.lm_head is model.lm_head and draft.model.embed_tokens is model.model.embed_tokens
    assert draft.model.norm is norm and norm is not model.model.norm
    ids = torch.tensor([tokenizer("def f(x):\n    return x + 1\n")["input_ids"]])
    with torch.no_grad():
        h1 = model(ids, output_hidden_states=True).hidden_states[1]  # the target's stream after its first layer
        written_out = model.lm_head(
            adapter.adapter_forward(stack, norm, model.model.rotary_emb, h1, torch.arange(ids.shape[1])[None])
        )
        np.testing.assert_allclose(draft(ids).logits.numpy(), written_out.numpy(), atol=2e-5, rtol=0)


def test_the_draft_is_an_ordinary_pair_member_and_round_trips_through_its_folder(target, trained, tmp_path):
    import torch

    model, tokenizer = target
    stack, norm, manifest = trained
    adapter.save(tmp_path / "adapter-1-tiny", stack, norm, manifest)
    loaded, again = adapter.load(model, "adapter:1:tiny", tmp_path)
    assert again == manifest and not any(p.requires_grad for p in loaded.parameters())
    pair = check_pair_member(model, tokenizer, loaded, "adapter:1:tiny")
    root = pair.encode("Here is a list:")
    ids = torch.tensor([list(root)])
    with torch.no_grad():
        built = adapter.build(model, 1, stack, norm)
        assert torch.equal(loaded(ids).logits, built(ids).logits)


def test_a_draft_not_trained_says_which_command_trains_it(target, tmp_path):
    model, _ = target
    with pytest.raises(ValueError, match=r"^draft: adapter:2 is not trained yet .*python -m backends.train_draft --layers 2"):
        adapter.load(model, "adapter:2", tmp_path)
    (tmp_path / "adapter-1").mkdir()
    (tmp_path / "adapter-1" / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"^draft: cannot load adapter:1 .*train it again"):
        adapter.load(model, "adapter:1", tmp_path)
    for bad in ("adapter", "adapter:0", "adapter:x", "adapter:2:a b", "adapter:\u00b2", "adapter:2:\u00e9"):
        with pytest.raises(ValueError, match=r"^draft: "):
            pretrained.parse_draft(bad)
    assert pretrained.parse_draft("adapter:14") == "adapter:14" and pretrained.parse_draft(None) == pretrained.DEFAULT_DRAFT


def test_batched_left_padded_sampling_equals_one_prompt_at_a_time(target, monkeypatch):
    model, tokenizer = target
    monkeypatch.setattr(train_draft, "_sample", lambda logits, generator: logits.argmax(-1, keepdim=True))
    prompts = ["Hi", "Tell me about the sea and the mountains in a long answer"]
    together = train_draft.sample_replies(model, tokenizer, prompts, 6, 2, None, stop=False)
    alone = [train_draft.sample_replies(model, tokenizer, [p], 6, 1, None, stop=False)[0] for p in prompts]
    assert together == alone and all(len(s) - len(a) == 0 for s, a in zip(together, alone))


def test_recipe_and_flags_are_checked_before_any_work(capsys):
    with pytest.raises(ValueError, match=r"^steps: must be an integer >= 1"):
        train_draft.DraftRecipe(layers=3, steps=0)
    with pytest.raises(ValueError, match=r"^positions: at most batch x length"):
        train_draft.DraftRecipe(layers=3, batch=1, length=8, positions=9)
    for argv, message in [
        (["--layers", "3", "--steps", "10"], "--variant: a recipe other than the default needs a --variant name"),
        (["--layers", "3", "--steps", "0", "--variant", "x"], "--steps: must be an integer >= 1"),
        (["--layers", "3", "--variant", "a b"], "--variant: letters, digits and '-' only"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            train_draft.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_the_training_material_is_seeded_and_leaves_the_shipped_prompts_out(target):
    _, tokenizer = target
    assert training_prompts(30, 0) == training_prompts(30, 0) != training_prompts(30, 1)
    shipped = {p.text for p in prompt_set("workloads")}
    assert not shipped & set(training_prompts(300, 0))
    long_texts = [p.text for p in prompt_set("long-context")]
    for prompt in training_prompts(300, 0):
        body = prompt.split(": ", 1)[-1].split("\nQuestion")[0].replace("Passage: ", "")
        assert not any(body[:120] in " ".join(t.split()) for t in long_texts if len(body) > 150)
    ids = plain_text(tokenizer, 300, 0)
    assert len(ids) == 300 and ids == plain_text(tokenizer, 300, 0)
    with pytest.raises(ValueError, match=r"^n: must be an integer >= 1"):
        training_prompts(0)


def test_load_refuses_a_draft_of_another_exit_layer_target_or_recipe(tmp_path, monkeypatch):
    """No model needed: the manifest is checked before any module is built."""
    import json
    from dataclasses import asdict
    from types import SimpleNamespace

    import torch
    from safetensors.torch import save_file

    target = SimpleNamespace(config=SimpleNamespace(num_hidden_layers=30))
    default = asdict(train_draft.DraftRecipe(layers=2))

    def write(name, recipe, target_layers=30):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({"target_layers": target_layers, "recipe": recipe}))
        save_file({"norm.weight": torch.zeros(1)}, str(folder / "adapter.safetensors"))

    write("adapter-2", {**default, "steps": 10})
    with pytest.raises(ValueError, match=r"^draft: adapter:2 .*another recipe than today's default \(differs in steps\)"):
        adapter.load(target, "adapter:2", tmp_path)
    write("adapter-3", default)
    with pytest.raises(ValueError, match=r"^draft: adapter:3 .*was trained as adapter:2"):
        adapter.load(target, "adapter:3", tmp_path)
    write("adapter-2-v", {**default, "steps": 10}, target_layers=3)
    with pytest.raises(ValueError, match=r"^draft: adapter:2:v .*trained on a target of 3 layers"):
        adapter.load(target, "adapter:2:v", tmp_path)
    write("adapter-2-w", {**default, "steps": 10})  # a variant may have any recipe
    write("adapter-4", asdict(train_draft.DraftRecipe(layers=4)))  # today's default recipe

    class Reached(Exception):
        pass

    def reached(*args):
        raise Reached

    monkeypatch.setattr(adapter, "adapter_modules", reached)
    for spec in ("adapter:2:w", "adapter:4"):
        with pytest.raises(Reached):
            adapter.load(target, spec, tmp_path)


def test_acceptance_by_depth_and_the_cli_refuse_bad_input_before_any_work(tmp_path, capsys):
    for kwargs, message in (
        ({"sampler": "Target"}, r"^sampler: must be 'target' or 'draft'"),
        ({"depth": 0}, r"^depth: must be an integer >= 1"),
        ({"paths": 0}, r"^paths: must be an integer >= 1"),
    ):
        args = {"paths": 1, "depth": 3, "sampler": "target", **kwargs}
        with pytest.raises(ValueError, match=message):
            train_draft.acceptance_by_depth(None, None, None, ["x"], generator=None, **args)
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exit_info:
        train_draft.main(["--layers", "3", "--out", str(tmp_path / "file"), "--quiet"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--out: cannot create" in err


def test_the_weight_ratio_from_the_config_is_the_models_own(target, trained):
    model, _ = target
    stack, norm, _ = trained
    config = model.config.to_dict()
    for spec, draft in (
        ("adapter:1", adapter.build(model, 1, stack, norm)),
        ("early-exit:2", pretrained.early_exit(model, 2)),
        ("early-exit:3", pretrained.early_exit(model, 3)),
    ):
        expected = pretrained.linear_weights(draft) / pretrained.linear_weights(model)
        assert pretrained.weight_ratio(spec, config) == pytest.approx(expected, rel=1e-12)
    assert pretrained.weight_ratio("early-exit:3", config) == 1.0


def test_temperature_zero_speculative_decoding_with_the_adapter_draft_is_the_greedy_sequence(target, trained):
    from simlab.builders import iid
    from simlab.decoding import greedy_decode, speculative_decode
    from simlab.sampling import SamplingSettings

    model, tokenizer = target
    draft = adapter.build(model, 1, trained[0], trained[1])
    pair = HFPair("smollm2", "adapter:1", device="cpu", models=((model, tokenizer), (draft, tokenizer)))
    pair = pair.with_settings(SamplingSettings(temperature=0.0))
    prompt = pair.encode("The for statement is used to iterate over")
    expected = greedy_decode(pair, prompt, 16)
    for verifier in ("specinfer", "traversal"):
        tokens, _ = speculative_decode(pair, prompt, iid(2, 2), verifier, 16, np.random.default_rng(2))
        assert tokens == expected


@pytest.mark.parametrize("layers", [6, 14])
def test_the_shipped_drafts_are_the_default_recipe_with_their_record(layers):
    """The drafts in backends/drafts/smollm2 (the results' drafts): default recipe, a full target,
    the measures the README quotes, and adapter weights of one decoder layer of the target's shape."""
    import json

    from safetensors import safe_open

    folder = adapter.folder_of(pretrained.SHIPPED_DRAFTS, layers)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["recipe"] == {**train_draft.asdict(train_draft.DraftRecipe(layers=layers))}
    assert manifest["target_layers"] == 30 and manifest["threads"] == 1 and manifest["target"] == train_draft.TARGET_NAME
    assert len(manifest["acceptance_by_depth"]["target"]) == 9 and manifest["variant"] == ""
    with safe_open(str(folder / "adapter.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["stack.0.mlp.gate_proj.weight"] == (1536, 576) and shapes["norm.weight"] == (576,)
    assert shapes["stack.0.self_attn.k_proj.weight"] == (192, 576) and len(shapes) == 10


@pytest.mark.slow
def test_the_shipped_adapter_draft_runs_on_the_whole_pair(smollm2_folder):
    pair = pretrained.named_pair("smollm2", "adapter:14", device="cpu")
    assert (
        pair.tree_attention and len(pair.draft.model.layers) == 15 and pair.draft.model.layers[13] is pair.target.model.layers[13]
    )
