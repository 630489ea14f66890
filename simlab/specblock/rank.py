"""SpecBlock's rank classes and the 15 statistics its rank head reads (arXiv 2605.07243; official code).

The rank head predicts where the target's token sits in the draft's ranking of a slot, in four
**classes** (``bucket``): 0 = rank 1, 1 = ranks 2-4, 2 = ranks 5-10, 3 = beyond 10 ("give up").
Its inputs are the slot's detached hidden state and 15 statistics of the slot's logits
(``statistics``): the top-10 log-probabilities normalised by the log-sum-exp of the top 20 (10),
the logit gaps between ranks 1-2, 1-3 and 1-5 (3), the top-1 probability of the top 20
renormalised (1: the official ``cumprob_top1``; ``top1="vocabulary"``, a departure in
``docs/departures.md``, takes it over the whole vocabulary) and the entropy of the top-20 renormalised (1).
Source: SpecBlock (arXiv 2605.07243); shiweijiezero/SpecBlock@b7938c5 ``specforge/core/specblock.py``,
``specforge/modeling/draft/llama3_specblock.py`` (``forward_parallel``'s rank features).
"""

from __future__ import annotations

import numpy as np

from simlab.checks import check_choice

CLASSES = 4
STATISTICS = 15
EDGES = (1, 4, 10)
"""Upper rank of classes 0, 1, 2 (rank 1; 2-4; 5-10); class 3 is every rank beyond 10."""


def bucket(rank) -> np.ndarray:
    """The rank class of a 1-based rank (or an array of them): 0, 1, 2 or 3 (int64)."""
    rank = np.asarray(rank)
    if np.any(rank < 1):
        raise ValueError(f"rank: ranks are 1-based, got {rank.min()}")
    return np.searchsorted(np.array(EDGES), rank, side="left").astype(np.int64)


def rank_of(token: int, scores: np.ndarray) -> int:
    """The 1-based rank of ``token`` in ``scores`` (descending; ties: lower ids rank first)."""
    scores = np.asarray(scores)
    s = scores[token]
    return int(np.count_nonzero(scores > s) + np.count_nonzero(scores[:token] == s) + 1)


TOP1 = ("top20", "vocabulary")
"""Where the top-1 statistic is normalised: the top 20 (official) or the whole vocabulary (a departure)."""


def statistics(logits: np.ndarray, top1: str = "top20") -> np.ndarray:
    """The 15 statistics of one slot's logits (V,) or a batch (..., V); float64 (..., 15).

    Args:
        logits: float (..., V), V >= 20.
        top1: ``"top20"`` (official) or ``"vocabulary"`` (module docstring).

    Raises:
        ValueError: ``logits: ...`` for a vocabulary below 20 tokens (the statistics need a top 20);
            ``top1: ...``.
    """
    check_choice(top1, "top1", TOP1, "top-1 normalisation")
    z = np.asarray(logits, dtype=np.float64)
    if z.shape[-1] < 20:
        raise ValueError(f"logits: the rank statistics need V >= 20, got {z.shape[-1]}")
    top = -np.sort(-z, axis=-1)[..., :20]
    lse = np.log(np.exp(top - top[..., :1]).sum(-1, keepdims=True)) + top[..., :1]
    logp10 = top[..., :10] - lse
    gaps = np.stack([top[..., 0] - top[..., 1], top[..., 0] - top[..., 2], top[..., 0] - top[..., 4]], axis=-1)
    if top1 == "top20":
        norm = lse[..., 0]
    else:
        norm = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    first = np.exp(top[..., 0] - norm)[..., None]
    p20 = np.exp(top - lse)
    entropy = -(p20 * np.log(np.maximum(p20, 1e-300))).sum(-1, keepdims=True)
    return np.concatenate([logp10, gaps, first, entropy], axis=-1)
