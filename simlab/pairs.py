"""Model pairs: where the target p and the draft q come from, and what a pair may offer beyond that.

A model pair answers one question: for a batch of token-id contexts, what are the target and
draft next-token distributions?  Synthetic worlds (``backends.synthetic``), real models
(``backends.hf.HFPair``) and capture replays (``backends.capture_store.CapturedPair``)
implement the same protocol; trees and studies only ever call it.

The protocol and its optional capabilities (``typing.Protocol``, checked with ``isinstance``;
this is the one place they are documented):

=====================  ==========================================  ==========================
protocol               members                                     used by
=====================  ==========================================  ==========================
``ModelPair``          ``vocab_size``, ``distributions(contexts)``  everything (required)
``NodeBatch``          ``node_distributions(root, paths)``          ``NodeTable.fetch``: every
                                                                   node of a tree in one batch
``Rooted``             ``rooted(root_length)``                      pairs whose draft depends
                                                                   on the depth below a root
``HiddenStates``       ``hidden_states(context)``                   the selector's features
``NodeLogits``         ``node_logits(root, paths)``, ``settings``   the capture tool (stores
                                                                   logits, replays p and q)
``WithSettings``       ``settings``, ``with_settings(settings)``    sources iterating over
                                                                   sampling settings
``EndOfSequence``      ``eos_id`` (an int, or None)                 block efficiency and decoding
                                                                   stop at EOS
``ParallelDraft``      ``position_distributions(root, depth)``      the parallel builders
                                                                   (``medusa``, ``ddtree``)
``PrefixRows``         ``prefix_distributions(context, last)``      TreeGraft's prompt score
                                                                   cache (a causal model's
                                                                   one forward)
=====================  ==========================================  ==========================

What a ``ParallelDraft`` pair's q is at a node: ``docs/derivations/pairs.md``.

Nothing mutates a pair: ``with_settings`` and ``rooted`` return new pairs.  Every pair
validates its contexts (``ValueError`` naming ``context`` for an id outside [0, V), ``-1``
included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from simlab.checks import check_generator, check_int, check_token_ids
from simlab.distributions import check_distribution, sample_categorical


@runtime_checkable
class ModelPair(Protocol):
    """The protocol every source of p and q implements.

    Attributes:
        vocab_size: V, the number of token ids (ids are 0..V-1).
    """

    vocab_size: int

    def distributions(self, contexts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Target and draft next-token distributions for each context.

        Args:
            contexts: n token-id sequences (the root context plus any drafted tokens).

        Returns:
            ``(P, Q)``: float64 arrays of shape (n, V); row i is p(. | contexts[i]) and
            q(. | contexts[i]).

        Raises:
            ValueError: a context that is not a sequence of ids in [0, V).
        """
        ...


@runtime_checkable
class NodeBatch(Protocol):
    """Optional: p and q for many nodes below one root in one batch (one tree forward per model)."""

    def node_distributions(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """float64 (n, V) p and q at ``root + path`` for each of the n paths."""
        ...


@runtime_checkable
class PrefixRows(Protocol):
    """Optional: the target's p at every prefix of one context at once (one causal forward)."""

    def prefix_distributions(self, context: Sequence[int], last: int) -> np.ndarray:
        """float64 (last, V): row i - 1 is p(. | context[:i]) for i = 1..last, what
        ``distributions([context[:i] for i in 1..last])[0]`` gives (to the model's float rounding)."""
        ...


@runtime_checkable
class Rooted(Protocol):
    """Optional: the pair as seen from a root of a given context length (the draft may depend on
    the depth below the root, as in ``backends.synthetic.DepthProfileWorld``)."""

    def rooted(self, root_length: int) -> ModelPair:
        """A new pair whose depth 0 is a context of ``root_length`` tokens."""
        ...


@runtime_checkable
class HiddenStates(Protocol):
    """Optional: the embeddings the delayed-expansion selector reads at a root (DDTE Sec. 6)."""

    def hidden_states(self, context: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float32 (target at the previous token, draft at the previous token, draft at the root)."""
        ...


@runtime_checkable
class NodeLogits(Protocol):
    """Optional: the raw logits behind p and q (captures store them; ``settings.probabilities``
    turns them into p and q)."""

    settings: object

    def node_logits(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """float32 (n, V) target and draft logits at ``root + path`` for each path (host arrays, or
        torch tensors on the device that made them: ``NodeTable`` keeps those there)."""
        ...


@runtime_checkable
class WithSettings(Protocol):
    """Optional: a pair built with ``simlab.sampling.SamplingSettings`` that can give the same
    models under other settings."""

    settings: object

    def with_settings(self, settings) -> ModelPair:
        """A new pair with ``settings``; this pair is unchanged."""
        ...


@runtime_checkable
class ParallelDraft(Protocol):
    """Optional: the draft is a parallel drafter (module docstring): per-position distributions
    that do not depend on the drafted prefix."""

    def position_distributions(self, root: Sequence[int], depth: int) -> np.ndarray:
        """float64 (depth, V): row d is the draft's q at every node of depth d below ``root``
        (d = 0: the root's children), the row ``node_distributions`` gives there."""
        ...


@runtime_checkable
class EndOfSequence(Protocol):
    """Optional: the pair names an end-of-sequence id (None: no EOS).  Block efficiency then
    counts no token after an accepted or emitted EOS, and the decoding loops stop at it."""

    eos_id: int | None


def rooted(pair: ModelPair, root_length: int) -> ModelPair:
    """The pair as seen from a root of ``root_length`` tokens: ``Rooted`` pairs are re-rooted,
    all others returned as they are."""
    return pair.rooted(root_length) if isinstance(pair, Rooted) else pair


def eos_of(pair) -> int | None:
    """The pair's EOS id, or None when it names none.

    ``getattr`` with a default: what ``isinstance(pair, EndOfSequence)`` checks for this one-attribute
    protocol (``hasattr``), without the runtime-protocol machinery (it runs once per ``NodeTable``)."""
    return getattr(pair, "eos_id", None)


def check_context(context, vocab_size: int, name: str = "context") -> tuple[int, ...]:
    """Validate a token-id sequence (integer ids in [0, V)); return it as a tuple of ints.

    Raises:
        ValueError: not a sequence, a string, a non-integer id (floats are not truncated),
            or an id outside [0, V).
    """
    return check_token_ids(context, vocab_size, name)


def check_contexts(contexts, vocab_size: int) -> list[tuple[int, ...]]:
    """Validate a batch of contexts (see ``check_context``)."""
    if isinstance(contexts, (str, bytes)) or not hasattr(contexts, "__iter__"):
        raise ValueError(f"contexts: must be a sequence of token-id sequences, got {contexts!r}")
    return [check_token_ids(c, vocab_size, "context") for c in contexts]


def check_eos(eos_id, vocab_size: int) -> int | None:
    """An EOS id in [0, V), or None."""
    return None if eos_id is None else check_int(eos_id, "eos_id", 0, vocab_size - 1)


TRAJECTORY_METHODS = ("forward", "cached")
"""How ``target_trajectory`` evaluates the target: ``forward``, ``pair.distributions`` on the whole
context at every step (any pair; q is computed and unused); ``cached``, the pair's
``TargetSteps.target_steps`` (one step's p from the model's KV cache: a real model's cost per token
falls from a forward over the whole context to one over one token)."""


@runtime_checkable
class TargetSteps(Protocol):
    """Optional: the target's p along a growing context, one token at a time, from a KV cache."""

    def target_steps(self, prefix: Sequence[int]):
        """A generator: it yields float64 (V,) p(. | prefix), then, after each ``send(token)``,
        p(. | the context so far + token); equal to ``distributions([context])[0][0]`` to the
        model's float rounding (cached attention sums in another order)."""
        ...


def target_trajectory(
    pair: ModelPair, length: int, rng: np.random.Generator, prefix=(), method: str = "forward"
) -> tuple[int, ...]:
    """Sample ``length`` tokens from the target after ``prefix`` (one uniform of ``rng`` per token,
    ``simlab.distributions.sample_categorical``).

    ``method`` (``TRAJECTORY_METHODS``): ``forward`` evaluates p with ``pair.distributions`` (the
    reference, any pair); ``cached`` with ``pair.target_steps`` (``TargetSteps``), the same law and
    the same uniforms, its p equal to the reference's to the model's float rounding, so a token
    can differ only where a uniform falls within that rounding of a boundary of the cumulative p.

    Returns the prefix followed by the sampled tokens (token ids).

    Raises:
        ValueError: a bad prefix, length < 0, rng not a numpy Generator, an unknown ``method``, or
            ``method="cached"`` for a pair without ``target_steps``.
    """
    tokens = list(check_context(prefix, pair.vocab_size, "prefix"))
    check_int(length, "length", 0)
    check_generator(rng)
    if method not in TRAJECTORY_METHODS:
        raise ValueError(f"method: one of {', '.join(TRAJECTORY_METHODS)}, got {method!r}")
    if method == "cached" and not isinstance(pair, TargetSteps):
        raise ValueError(f"method: 'cached' needs a pair with target_steps; {type(pair).__name__} has none")
    if method == "forward" or length == 0:
        for _ in range(length):
            p, _ = pair.distributions([tuple(tokens)])
            tokens.append(sample_categorical(p[0], rng))
        return tuple(tokens)
    steps = pair.target_steps(tuple(tokens))
    p = next(steps)
    for i in range(length):
        tokens.append(sample_categorical(p, rng))
        if i + 1 < length:
            p = steps.send(tokens[-1])
    steps.close()
    return tuple(tokens)


class ContextFreePair:
    """The same p and q at every context (the single-node world of the node-level analysis).

    Args:
        p: the target distribution, float64 of shape (V,).
        q: the draft distribution, float64 of shape (V,) (the same V).
        eos_id: an end-of-sequence id, or None.
    """

    def __init__(self, p, q, eos_id: int | None = None):
        self.p = check_distribution(p, "p")
        self.q = check_distribution(q, "q", size=self.p.size)
        self.vocab_size = self.p.size
        self.eos_id = check_eos(eos_id, self.vocab_size)

    def distributions(self, contexts):
        n = len(check_contexts(contexts, self.vocab_size))
        return np.tile(self.p, (n, 1)), np.tile(self.q, (n, 1))


class MarkovPair:
    """An order-1 Markov pair: p and q depend on the last token of the context only.

    Args:
        target: (V, V) row-stochastic matrix, row a = p(. | last token a).
        draft: (V, V) row-stochastic matrix, row a = q(. | last token a).
        target_start: (V,) target law for the empty context (default: row 0 of ``target``).
        draft_start: (V,) draft law for the empty context (default: row 0 of ``draft``).
        eos_id: an end-of-sequence id, or None.
    """

    def __init__(self, target, draft, target_start=None, draft_start=None, eos_id: int | None = None):
        target = np.asarray(target, dtype=np.float64)
        draft = np.asarray(draft, dtype=np.float64)
        if target.ndim != 2 or target.shape[0] != target.shape[1]:
            raise ValueError(f"target: must be a square (V, V) matrix, got shape {target.shape}")
        if draft.shape != target.shape:
            raise ValueError(f"draft: must have the target's shape {target.shape}, got {draft.shape}")
        self.vocab_size = target.shape[0]
        for a in range(self.vocab_size):
            check_distribution(target[a], f"target[{a}]")
            check_distribution(draft[a], f"draft[{a}]")
        self.target, self.draft = target, draft
        self.target_start = check_distribution(
            target[0] if target_start is None else target_start, "target_start", size=self.vocab_size
        )
        self.draft_start = check_distribution(
            draft[0] if draft_start is None else draft_start, "draft_start", size=self.vocab_size
        )
        self.eos_id = check_eos(eos_id, self.vocab_size)

    @classmethod
    def random(
        cls,
        vocab_size: int,
        rng: np.random.Generator,
        concentration: float = 1.0,
        closeness: float = 0.5,
        eos_id: int | None = None,
    ):
        """A random pair: Dirichlet target rows, draft rows = mix of the target row and an independent Dirichlet row.

        ``closeness`` in [0, 1] is the weight of the target row in the draft (1 gives q = p).

        Raises:
            ValueError: vocab_size not an integer >= 2, rng not a numpy Generator, or
                concentration / closeness out of range.
        """
        vocab_size = check_int(vocab_size, "vocab_size", 2)
        check_generator(rng)
        if not concentration > 0 or not 0 <= closeness <= 1:
            raise ValueError(
                f"concentration, closeness: need concentration > 0 and closeness in [0, 1], got {concentration}, {closeness}"
            )
        alpha = np.full(vocab_size, concentration)
        target = rng.dirichlet(alpha, size=vocab_size)
        noise = rng.dirichlet(alpha, size=vocab_size)
        draft = closeness * target + (1 - closeness) * noise
        draft /= draft.sum(axis=1, keepdims=True)
        return cls(target, draft, eos_id=eos_id)

    def distributions(self, contexts):
        contexts = check_contexts(contexts, self.vocab_size)
        last = np.array([c[-1] if len(c) else -1 for c in contexts], dtype=np.int64)
        p = np.where(last[:, None] >= 0, self.target[np.maximum(last, 0)], self.target_start)
        q = np.where(last[:, None] >= 0, self.draft[np.maximum(last, 0)], self.draft_start)
        return p, q
