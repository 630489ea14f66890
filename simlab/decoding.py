"""Speculative decoding loops over any model pair: draft a tree, verify it, emit, repeat.

Each step emits the accepted path and the correction or bonus token, so it emits between 1 and
depth + 1 tokens.  ``greedy_decode`` is the plain target argmax baseline (lowest-index ties)
that temperature-0 speculative decoding must reproduce token for token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simlab import tree_verifiers
from simlab.pairs import ModelPair
from simlab.trees import NodeTable


def speculative_decode(pair: ModelPair, prompt: Sequence[int], shape, verifier, new_tokens: int,
                       rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Generate ``new_tokens`` tokens after ``prompt`` by speculative decoding.

    Args:
        pair: the model pair (drafts come from its q, verification uses its p).
        prompt: token ids (non-empty for real models).
        shape: a tree shape (``simlab.shapes``).
        verifier: a tree-verifier name or object.
        new_tokens: how many tokens to return (the last step's surplus is cut).
        rng: all randomness (drafting and verification).

    Returns:
        (tokens, steps): the generated ids, and the tokens emitted at each step (tau + 1).
    """
    verifier = tree_verifiers.get(verifier) if isinstance(verifier, str) else verifier
    context = tuple(int(t) for t in prompt)
    out: list[int] = []
    steps: list[int] = []
    while len(out) < new_tokens:
        tree = shape.sample(NodeTable(pair, context), rng)
        path, token = verifier.verify(tree, rng)
        emitted = list(path) + [int(token)]
        steps.append(len(emitted))
        out.extend(emitted)
        context += tuple(emitted)
    return out[:new_tokens], steps


def greedy_decode(pair: ModelPair, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The target's argmax continuation (ties to the lowest id), one token at a time."""
    context = tuple(int(t) for t in prompt)
    out = []
    for _ in range(new_tokens):
        p, _ = pair.distributions([context])
        token = int(np.argmax(p[0]))
        out.append(token)
        context += (token,)
    return out
