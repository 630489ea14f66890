"""The real-model backend on a micro pair trained offline in seconds (no network, ever)."""

from __future__ import annotations

import numpy as np
import pytest

from backends.hf import HFPair, check_tokenizers
from backends.synthetic import SamplingSettings
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
