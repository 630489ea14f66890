"""Speculative decoding loops over any model pair: draft a tree, verify it, emit, repeat.

Each step emits the accepted path and the correction or bonus token, so it emits between 1 and
depth + 1 tokens.  ``greedy_decode`` is the plain target argmax baseline (lowest-index ties)
that temperature-0 speculative decoding must reproduce token for token.  When the pair names an
end-of-sequence id (``simlab.pairs.EndOfSequence``), both loops stop after emitting it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simlab import tree_verifiers
from simlab.checks import check_generator, check_int
from simlab.pairs import ModelPair, check_context, eos_of
from simlab.trees import NodeTable


def _check_pair(pair) -> None:
    if not isinstance(pair, ModelPair):
        raise ValueError(f"pair: must implement the ModelPair protocol (vocab_size, distributions), got {type(pair).__name__}")


def speculative_decode(
    pair: ModelPair, prompt: Sequence[int], shape, verifier, new_tokens: int, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """Generate ``new_tokens`` tokens after ``prompt`` by speculative decoding.

    Args:
        pair: the model pair (drafts come from its q, verification uses its p).
        prompt: token ids in [0, V) (non-empty for real models).
        shape: a tree builder (``simlab.builders``).
        verifier: a tree-verifier name or object.
        new_tokens: how many tokens to return (>= 0; the last step's surplus is cut).
        rng: all randomness (drafting and verification), a ``numpy.random.Generator``.

    Returns:
        (tokens, steps): the generated ids (fewer than ``new_tokens`` if an EOS was emitted:
        the EOS is the last one), and the tokens emitted at each step (tau + 1).

    Raises:
        ValueError: naming the argument: a pair that is not a ``ModelPair``, a prompt with an
            id outside [0, V), a shape that cannot sample, an unknown verifier, new_tokens < 0,
            or rng not a Generator.
    """
    _check_pair(pair)
    context = check_context(prompt, pair.vocab_size, "prompt")
    if not hasattr(shape, "sample"):
        raise ValueError(f"shape: must be a tree shape (simlab.Delayed, iid, chain, Static), got {shape!r}")
    verifier = tree_verifiers.as_verifier(verifier)
    new_tokens = check_int(new_tokens, "new_tokens", 0)
    check_generator(rng)
    eos = eos_of(pair)
    out: list[int] = []
    steps: list[int] = []
    while len(out) < new_tokens:
        tree = shape.sample(NodeTable(pair, context), rng)
        path, token = verifier.verify(tree, rng)
        emitted = list(path) + [int(token)]
        if eos is not None and eos in emitted:
            emitted = emitted[: emitted.index(eos) + 1]
        steps.append(len(emitted))
        out.extend(emitted)
        context += tuple(emitted)
        if eos is not None and emitted[-1] == eos:
            break
    return out[:new_tokens], steps


def greedy_decode(pair: ModelPair, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The target's argmax continuation (ties to the lowest id), one token at a time; stops after an EOS.

    Raises:
        ValueError: a pair that is not a ``ModelPair``, a bad prompt, or new_tokens < 0.
    """
    _check_pair(pair)
    context = check_context(prompt, pair.vocab_size, "prompt")
    new_tokens = check_int(new_tokens, "new_tokens", 0)
    eos = eos_of(pair)
    out = []
    for _ in range(new_tokens):
        p, _ = pair.distributions([context])
        token = int(np.argmax(p[0]))
        out.append(token)
        context += (token,)
        if token == eos:
            break
    return out
