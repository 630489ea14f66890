"""The context n-gram drafter (training-free prompt lookup), as TreeGraft's official code uses it.

For a node whose text is ``context + path``, the drafter looks for the longest suffix of that text
(n = N down to 1) among the n-grams of the **context** (``NGramIndex``); every occurrence of the
suffix that has a continuation in the context proposes the next ``chain`` tokens after it, which
are attached below the node as a chain (trie-style: a token that is already a child is reused).
Occurrences are taken most recent first, longer suffixes before shorter ones, until ``k``
distinct first tokens exist.

Scores (log space, added to the parent's cumulative score) of a chain's **first** token, by
default as the code does (``ScoreCache``): the target's log-probability at the matched context
position from a cache of the target's top-10 at the prompt's positions (outside the top-10: the
10th value minus 5); a match whose position lies beyond the cached prompt scores 0.0
(probability 1), which outranks every prompt match; the code's quirk is kept on purpose.
``scoring="clean"`` scores by the target's true probability at the node instead.  Deeper chain
tokens score -inf until they become direct children of a frontier node.
Source: TreeGraft (arXiv 2608.26112); fjm9933/TreeGraft@f53e3a8 ``graft/ngram_tree/generator.py``: N = 5 in the main evaluation (``--max-matching-ngram-size``), top-10 cache,
``update_prefill_with_accepted=False``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_int, check_token_ids

CACHE_TOP = 10
OUTSIDE_TOP_PENALTY = 5.0


class NGramIndex:
    """Start positions of every n-gram (n = 1..``max_n``) of a token sequence, with a continuation.

    Args:
        tokens: the context (token ids).
        max_n: the longest n-gram indexed (>= 1).
    """

    def __init__(self, tokens: Sequence[int], max_n: int):
        self.tokens = tuple(int(t) for t in tokens)
        self.max_n = check_int(max_n, "max_n", 1)
        self.positions: dict[tuple[int, ...], list[int]] = {}
        for n in range(1, self.max_n + 1):
            for j in range(len(self.tokens) - n):  # a continuation token must follow the n-gram
                self.positions.setdefault(self.tokens[j:j + n], []).append(j)

    def matches(self, suffix: tuple[int, ...]) -> list[int]:
        """Positions i of the continuation token after each occurrence of ``suffix``, most recent first."""
        return [j + len(suffix) for j in reversed(self.positions.get(tuple(suffix), []))]


@dataclass(frozen=True)
class ScoreCache:
    """The target's top-10 log-probabilities at the cached prompt positions.

    ``top[i]`` maps token -> log p(token | context[:i]) for the 10 most probable tokens at
    position i (1 <= i < ``length``); ``floor[i]`` is the 10th value minus 5.
    """

    length: int
    top: dict
    floor: dict

    @classmethod
    def of(cls, p_rows: np.ndarray, length: int) -> "ScoreCache":
        """From the target's rows at positions 1..length-1 (``p_rows[i - 1]`` = p(. | context[:i]))."""
        top, floor = {}, {}
        for i in range(1, length):
            row = p_rows[i - 1]
            order = np.argsort(-row, kind="stable")[:CACHE_TOP]
            with np.errstate(divide="ignore"):
                logs = np.log(row[order])
            top[i] = {int(t): float(v) for t, v in zip(order, logs)}
            floor[i] = float(logs[-1]) - OUTSIDE_TOP_PENALTY
        return cls(length, top, floor)

    def score(self, position: int, token: int) -> float:
        """The cached log-probability of ``token`` at ``position``; 0.0 beyond the cache (the code's quirk)."""
        if position >= self.length or position < 1:
            return 0.0
        return self.top[position].get(token, self.floor[position])


def prompt_cache(pair, context: Sequence[int], length: int | None = None) -> ScoreCache:
    """The score cache of the first ``length`` positions of ``context`` (default: all of it: the
    root context counts as the prefilled prompt)."""
    context = tuple(context)
    length = len(context) if length is None else check_int(length, "length", 0)
    if length > len(context):
        raise ValueError(f"length: the cache covers at most the {len(context)} context positions, got {length}")
    if length < 2:
        return ScoreCache(length, {}, {})
    p_rows, _ = pair.distributions([context[:i] for i in range(1, length)])
    return ScoreCache.of(p_rows, length)


@dataclass(frozen=True)
class NGramDrafter:
    """TreeGraft's small drafter (module docstring).

    Args:
        max_n: N, the longest suffix matched (>= 1; TreeGraft's main evaluation: 5).
        scoring: ``"code"`` (the official code's cached scores) or ``"clean"`` (true target probabilities).

    Raises:
        ValueError: ``max_n: ...`` or ``scoring: ...``.
    """

    max_n: int = 5
    scoring: str = "code"

    def __post_init__(self):
        object.__setattr__(self, "max_n", check_int(self.max_n, "max_n", 1))
        if self.scoring not in ("code", "clean"):
            raise ValueError(f"scoring: must be 'code' or 'clean', got {self.scoring!r}")

    def chain_length(self, layer: int) -> int:
        """Tokens attached per occurrence at layer l (1-based): max(1, N - (l - 1))."""
        return max(1, self.max_n - (check_int(layer, "layer", 1) - 1))

    def proposals(self, index: NGramIndex, text: Sequence[int], k: int, layer: int):
        """Chains for a node whose text is ``text``: a list of (suffix length n, continuation
        position i, chain tokens), in the order they attach, until ``k`` distinct first tokens."""
        check_token_ids(text, 2**63, "text")
        text = tuple(text)
        chain = self.chain_length(layer)
        out, firsts = [], set()
        for n in range(min(self.max_n, len(text)), 0, -1):
            for i in index.matches(text[-n:]):
                out.append((n, i, index.tokens[i:i + chain]))
                firsts.add(index.tokens[i])
                if len(firsts) >= k:
                    return out
        return out
