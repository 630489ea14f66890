"""Model pairs: where the target p and the draft q come from.

A model pair answers one question: for a batch of token-id contexts, what are the target and
draft next-token distributions?  Synthetic worlds (``backends.synthetic``) and real models
(``backends.hf``) implement the same protocol; trees and studies only ever call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

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
        """
        ...


def check_context(context, vocab_size: int, name: str = "context") -> tuple[int, ...]:
    """Validate a token-id sequence (integer ids in [0, V)); return it as a tuple of ints.

    Raises:
        ValueError: not a sequence, a string, a non-integer id (floats are not truncated),
            or an id outside [0, V).
    """
    if isinstance(context, (str, bytes)) or not hasattr(context, "__iter__"):
        raise ValueError(f"{name}: must be a sequence of integer token ids, got {context!r}")
    ids = []
    for t in context:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise ValueError(f"{name}: token ids must be integers, got {t!r}")
        if not 0 <= int(t) < vocab_size:
            raise ValueError(f"{name}: token id {int(t)} is outside [0, {vocab_size})")
        ids.append(int(t))
    return tuple(ids)


def target_trajectory(pair: ModelPair, length: int, rng: np.random.Generator, prefix=()) -> tuple[int, ...]:
    """Sample ``length`` tokens from the target after ``prefix`` (one uniform per token).

    Returns the prefix followed by the sampled tokens (token ids).
    """
    tokens = list(check_context(prefix, pair.vocab_size, "prefix"))
    for _ in range(length):
        p, _ = pair.distributions([tuple(tokens)])
        tokens.append(sample_categorical(p[0], rng))
    return tuple(tokens)


def rooted(pair: ModelPair, root_length: int) -> ModelPair:
    """The pair as seen from a root of ``root_length`` tokens: pairs whose draft depends on the
    depth below the root (``rooted`` method) are re-rooted, all others returned as they are."""
    return pair.rooted(root_length) if hasattr(pair, "rooted") else pair


class ContextFreePair:
    """The same p and q at every context (the single-node world of the node-level analysis).

    Args:
        p, q: distributions of shape (V,).
    """

    def __init__(self, p, q):
        self.p = check_distribution(p, "p")
        self.q = check_distribution(q, "q", size=self.p.size)
        self.vocab_size = self.p.size

    def distributions(self, contexts):
        n = len(contexts)
        return np.tile(self.p, (n, 1)), np.tile(self.q, (n, 1))


class MarkovPair:
    """An order-1 Markov pair: p and q depend on the last token of the context only.

    Args:
        target: (V, V) row-stochastic matrix, row a = p(. | last token a).
        draft: (V, V) row-stochastic matrix, row a = q(. | last token a).
        target_start, draft_start: (V,) laws for the empty context (default: row 0).
    """

    def __init__(self, target, draft, target_start=None, draft_start=None):
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
        self.target_start = check_distribution(target[0] if target_start is None else target_start, "target_start", size=self.vocab_size)
        self.draft_start = check_distribution(draft[0] if draft_start is None else draft_start, "draft_start", size=self.vocab_size)

    @classmethod
    def random(cls, vocab_size: int, rng: np.random.Generator, concentration: float = 1.0, closeness: float = 0.5):
        """A random pair: Dirichlet target rows, draft rows = mix of the target row and an independent Dirichlet row.

        ``closeness`` in [0, 1] is the weight of the target row in the draft (1 gives q = p).

        Raises:
            ValueError: vocab_size not an integer >= 2, rng not a numpy Generator, or
                concentration / closeness out of range.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
            raise ValueError(f"vocab_size: must be an integer >= 2, got {vocab_size!r}")
        if not isinstance(rng, np.random.Generator):
            raise ValueError(f"rng: must be a numpy.random.Generator, got {type(rng).__name__}")
        if not concentration > 0 or not 0 <= closeness <= 1:
            raise ValueError(f"concentration, closeness: need concentration > 0 and closeness in [0, 1], got {concentration}, {closeness}")
        alpha = np.full(vocab_size, concentration)
        target = rng.dirichlet(alpha, size=vocab_size)
        noise = rng.dirichlet(alpha, size=vocab_size)
        draft = closeness * target + (1 - closeness) * noise
        draft /= draft.sum(axis=1, keepdims=True)
        return cls(target, draft)

    def distributions(self, contexts):
        last = np.array([c[-1] if len(c) else -1 for c in contexts], dtype=np.int64)
        p = np.where(last[:, None] >= 0, self.target[np.maximum(last, 0)], self.target_start)
        q = np.where(last[:, None] >= 0, self.draft[np.maximum(last, 0)], self.draft_start)
        return p, q
