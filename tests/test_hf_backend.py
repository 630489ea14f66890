"""The real-model backend on a micro pair trained offline in seconds (no network, ever)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.hf import HFPair, check_tokenizers
from simlab.sampling import SamplingSettings
from simlab import tree_verifiers
from simlab.decoding import greedy_decode, speculative_decode
from simlab.shapes import Delayed, chain, iid
from simlab.trees import NodeTable
from stats import assert_sampler_matches


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


@pytest.fixture(scope="module")
def prompt(pair):
    return pair.encode("The for statement is used to iterate over")


def test_tree_forward_equals_sequential_forwards(pair, prompt):
    """Every node's p and q from one tree-attention forward equal a plain forward on its path (1e-4)."""
    tree = Delayed(3, 2, 3).sample(NodeTable(pair, prompt), np.random.default_rng(0))
    paths = tree.nodes()
    tree_p, tree_q = pair.node_distributions(prompt, paths)
    for i, path in enumerate(paths):
        p, q = pair.distributions([prompt + path])
        np.testing.assert_allclose(tree_p[i], p[0], atol=1e-4)
        np.testing.assert_allclose(tree_q[i], q[0], atol=1e-4)


def test_siblings_do_not_see_each_other(pair, prompt):
    """A node's distribution does not change when a sibling branch is added to the tree."""
    alone_p, _ = pair.node_distributions(prompt, [(5, 7)])
    crowded_p, _ = pair.node_distributions(prompt, [(5, 7), (9,), (9, 11), (5, 3)])
    np.testing.assert_allclose(alone_p[0], crowded_p[0], atol=1e-5)


def test_width_one_tree_equals_the_chain(pair, prompt):
    chain_tree = chain(3).sample(NodeTable(pair, prompt), np.random.default_rng(1))
    path = chain_tree.first_path()
    a = pair.node_distributions(prompt, [path[:d] for d in range(4)])
    b = pair.distributions([prompt + path[:d] for d in range(4)])
    np.testing.assert_allclose(a[0], b[0], atol=1e-4)


def test_path_batching_fallback_agrees(micro_pair_dir, pair, prompt):
    fallback = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", tree_attention=False)
    paths = [(), (4,), (4, 9)]
    np.testing.assert_allclose(fallback.node_distributions(prompt, paths)[0], pair.node_distributions(prompt, paths)[0], atol=1e-4)


@pytest.mark.parametrize("verifier", tree_verifiers.names())
def test_temperature_zero_equals_greedy_decoding(micro_pair_dir, prompt, verifier):
    greedy = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu",
                    settings=SamplingSettings(temperature=0.0))
    shape = chain(3) if verifier == "rrs_wor" else iid(2, 2)
    if verifier == "greedy_draft":
        from simlab.builders import GreedyDraftTree

        shape = GreedyDraftTree(budget=4, depth=1, top_k=2)
    tokens, _ = speculative_decode(greedy, prompt, shape, verifier, 12, np.random.default_rng(2))
    assert tokens == greedy_decode(greedy, prompt, 12)


@pytest.mark.parametrize("verifier", ["specinfer", "traversal"])
def test_first_token_follows_the_target_at_temperature_one(pair, prompt, verifier):
    """G-test (stats.py design) of the first emitted token, its law binned into the target's 7 most
    probable tokens and 'other' (the false-alarm and power statements apply to the binned law)."""
    p = pair.distributions([prompt])[0][0]
    top = [int(t) for t in np.argsort(-p, kind="stable")[:7]]
    law = np.append(p[top], 1.0 - p[top].sum())
    cell = {t: i for i, t in enumerate(top)}
    table = NodeTable(pair, prompt)  # p, q and plans per node reused across draws
    tree_verifier, shape = tree_verifiers.get(verifier), iid(2, 1)

    def first_token(rng):
        path, token = tree_verifier.verify(shape.sample(table, rng), rng)
        return cell.get((path + (token,))[0], 7)

    assert_sampler_matches(first_token, law, seed=41)


def test_tokenizer_disagreement_is_an_error(pair):
    class Shifted:
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def convert_ids_to_tokens(self, ids):
            tokens = self.inner.convert_ids_to_tokens(ids)
            return tokens[:5] + ["<changed>"] + tokens[6:]

    with pytest.raises(ValueError, match=r"^draft: tokenizer disagrees with the target's at id 5"):
        check_tokenizers(pair.target_tokenizer, Shifted(pair.draft_tokenizer))


def test_missing_model_folder(tmp_path):
    with pytest.raises(ValueError, match=r"^target: model folder .* does not exist"):
        HFPair(str(tmp_path / "nope"), str(tmp_path / "nope"))


def test_context_longer_than_the_model(pair):
    with pytest.raises(ValueError, match=r"^context: .* exceed the model's context"):
        pair.distributions([(1,) * (pair.max_context + 1)])


# -- issue 11: settings without mutation, bad ids, the tree-attention probe, out-of-memory errors ----------
def test_with_settings_shares_the_models_and_leaves_the_pair_alone(pair, prompt):
    from simlab.pairs import HiddenStates, NodeBatch, NodeLogits, WithSettings

    assert all(isinstance(pair, c) for c in (NodeBatch, NodeLogits, HiddenStates, WithSettings))
    greedy = pair.with_settings(SamplingSettings(0.0))
    assert greedy.target is pair.target and pair.settings == SamplingSettings()
    p_greedy = greedy.distributions([prompt])[0][0]
    assert sorted(set(p_greedy.tolist())) == [0.0, 1.0] and pair.distributions([prompt])[0][0].min() > 0


def test_a_tiny_temperature_gives_laws_not_index_errors(pair, prompt):
    p, q = pair.with_settings(SamplingSettings(1e-310)).node_distributions(prompt, [(), (3,)])
    assert np.isfinite(p).all() and np.allclose(p.sum(axis=1), 1.0) and np.allclose(q.sum(axis=1), 1.0)


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_out_of_range_ids_are_value_errors(pair, prompt, bad):
    bad = bad if bad < 0 else pair.vocab_size
    with pytest.raises(ValueError, match="^context: "):
        pair.distributions([prompt + (bad,)])
    with pytest.raises(ValueError, match="^context: "):
        pair.node_distributions(prompt, [(bad,)])


def test_chunked_tree_forwards_equal_one_forward(pair, prompt):
    paths = Delayed(3, 1, 3).sample(NodeTable(pair, prompt), np.random.default_rng(5)).nodes()
    whole = pair.node_logits(prompt, paths)
    for chunk in (1, 3):
        part = pair.node_logits(prompt, paths, max_batch=chunk)
        np.testing.assert_allclose(part[0], whole[0], atol=1e-4)
        np.testing.assert_allclose(part[1], whole[1], atol=1e-4)


def test_out_of_memory_in_a_tree_forward_reaches_the_caller(pair, prompt, monkeypatch):
    import torch

    calls = {"n": 0}
    real = type(pair.target).forward

    def forward(self, *args, **kwargs):
        if kwargs.get("attention_mask") is not None and kwargs["attention_mask"].dim() == 4:
            calls["n"] += 1
            raise torch.cuda.OutOfMemoryError("simulated")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(pair.target), "forward", forward)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        pair.node_logits(prompt, [(1,), (1, 2)])
    assert calls["n"] == 1 and pair.tree_attention  # not switched off for the rest of the run


@pytest.mark.parametrize("failure", ["raises", "ignores"])
def test_models_without_tree_masks_fall_back_once_with_a_warning(micro_pair_dir, prompt, monkeypatch, failure):
    from transformers import GPT2LMHeadModel

    real = GPT2LMHeadModel.forward

    def forward(self, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4:
            if failure == "raises":
                raise RuntimeError("custom 4D attention masks are not supported")
            kwargs["attention_mask"] = None  # silently ignored: siblings see each other
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GPT2LMHeadModel, "forward", forward)
    with pytest.warns(RuntimeWarning, match="tree attention"):
        fallback = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    assert not fallback.tree_attention
    monkeypatch.setattr(GPT2LMHeadModel, "forward", real)
    plain = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    paths = [(), (4,), (4, 9), (5,)]
    np.testing.assert_allclose(fallback.node_distributions(prompt, paths)[0], plain.node_distributions(prompt, paths)[0], atol=1e-4)


def test_the_reference_pair_manifest_records_its_machine(micro_pair_dir):
    import json

    import torch

    manifest = json.loads((micro_pair_dir / "manifest.json").read_text())
    assert manifest["torch"] == torch.__version__ and manifest["threads"] == 1 and manifest["device"] == "cpu"
    assert manifest["cpu"] and manifest["seed"] == 0
