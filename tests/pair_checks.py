"""A check for a draft model of the pretrained pair: it runs as an ordinary pair member."""

from __future__ import annotations

import numpy as np

from backends.hf import HFPair


def check_pair_member(model, tokenizer, draft, name: str) -> HFPair:
    """``draft`` beside the target ``model`` as an ``HFPair`` called ``name``: the tree-attention
    probe passes and tree forwards equal path forwards (p and q, 1e-5) at the root
    ``pair.encode("Here is a list:")``; returns the pair."""
    pair = HFPair("smollm2", name, device="cpu", models=((model, tokenizer), (draft, tokenizer)))
    assert pair.tree_attention  # the probe: tree forwards equal path forwards on this draft
    root = pair.encode("Here is a list:")
    p, q = pair.node_distributions(root, [(), (11,), (11, 12)])
    plain_p, plain_q = pair.distributions([root, root + (11,), root + (11, 12)])
    np.testing.assert_allclose(q, plain_q, atol=1e-5)
    np.testing.assert_allclose(p, plain_p, atol=1e-5)
    return pair
