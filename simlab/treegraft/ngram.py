"""The context n-gram drafter (training-free prompt lookup), as TreeGraft's official code uses it.

For a node whose text is ``context + path``, the drafter looks for the suffixes of that text
(n = N down to 1) among the n-grams of the **context** (``NGramIndex``).  Every occurrence of a
suffix proposes the next ``chain`` tokens after it (``chain_length``: max(1, N - (l - 1)) at layer
l), to be attached below the node as a chain (trie-style).  The official rules (``collect``):

* occurrences of one n are taken oldest first; an occurrence whose whole chain does not fit
  before the end of the context is **skipped**;
* each distinct chain is kept once, at its first occurrence (longest n, then oldest); the chains
  attach sorted by (match length desc, position desc, tokens);
* **coverage** = the node's existing children plus every first token a valid occurrence
  proposes; it is tested after each whole n level: with >= ``k`` tokens collection stops, and a
  node that ends with fewer is **terminated** (its chains still attach);
* the match length of a first token is the longest n that proposed it in this collection.

Scores (log space, added to the parent's cumulative score) of a chain's **first** token, by
default as the code does (``ScoreCache``): the target's log-probability at the matched context
position from a cache of the target's top-10 at the prompt's positions (outside the top-10: the
10th value minus 5); the cache holds every prompt row, p(. | whole prompt) included, and a match
whose position lies beyond the prompt scores 0.0 (probability 1), which outranks every prompt
match; the code's quirk is kept on purpose.  ``scoring="clean"`` scores by the target's true
probability at the node instead.  Deeper chain tokens score -inf until they become direct
children of a frontier node.  The lab's earlier rules (``simlab.treegraft.rules``:
``truncated_chains``, ``coverage_by_proposals``, ``recent_occurrences_first``,
``cache_without_last_row``) are options.
Source: TreeGraft (arXiv 2608.26112); fjm9933/TreeGraft@f53e3a8 ``graft/ngram_tree/generator.py`` (``NgramDraftGenerator._collect_parent_suffixes``,
``_estimate_token_logprob_from_cache``): N = 5 in the main evaluation (``--max-matching-ngram-size``),
top-10 cache, ``update_prefill_with_accepted=False``, ``stop_on_relax_zero=True``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_int, check_token_ids
from simlab.distributions import top_ranked
from simlab.pairs import PrefixRows
from simlab.treegraft.rules import Rules

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
                self.positions.setdefault(self.tokens[j : j + n], []).append(j)

    def matches(self, suffix: tuple[int, ...]) -> list[int]:
        """Positions i of the continuation token after each occurrence of ``suffix``, oldest first."""
        return [j + len(suffix) for j in self.positions.get(tuple(suffix), [])]


@dataclass(frozen=True)
class ScoreCache:
    """The target's top-10 log-probabilities at the cached prompt positions.

    ``top[i]`` maps token -> log p(token | context[:i]) for the 10 most probable tokens at
    position i (1 <= i <= ``last``); ``floor[i]`` is the 10th value minus 5.
    """

    last: int
    top: dict
    floor: dict

    @classmethod
    def of(cls, p_rows: np.ndarray, last: int) -> "ScoreCache":
        """From the target's rows at positions 1..last (``p_rows[i - 1]`` = p(. | context[:i]))."""
        top, floor = {}, {}
        for i in range(1, last + 1):
            row = p_rows[i - 1]
            order = top_ranked(row, CACHE_TOP)  # np.argsort(-row, kind="stable")[:CACHE_TOP], without the full sort
            with np.errstate(divide="ignore"):
                logs = np.log(row[order])
            top[i] = {int(t): float(v) for t, v in zip(order, logs)}
            floor[i] = float(logs[-1]) - OUTSIDE_TOP_PENALTY
        return cls(last, top, floor)

    def score(self, position: int, token: int) -> float:
        """The cached log-probability of ``token`` at ``position``; 0.0 beyond the cache (the code's quirk)."""
        if position > self.last or position < 1:
            return 0.0
        return self.top[position].get(token, self.floor[position])


def prompt_cache(pair, context: Sequence[int], length: int | None = None, last_row: bool = True) -> ScoreCache:
    """The score cache of a prompt of ``length`` tokens of ``context`` (default: all of it: the root
    context counts as the prefilled prompt): rows p(. | context[:i]) for i = 1..length, the last
    one p(. | whole prompt) (``last_row=False``: i = 1..length - 1, the lab's
    ``cache_without_last_row``), from ``pair.prefix_distributions`` when the pair offers it
    (``simlab.pairs.PrefixRows``), else one ``distributions`` row per prefix."""
    context = tuple(context)
    length = len(context) if length is None else check_int(length, "length", 0)
    if length > len(context):
        raise ValueError(f"length: the cache covers at most the {len(context)} context positions, got {length}")
    last = length if last_row else length - 1
    if last < 1:
        return ScoreCache(0, {}, {})
    if isinstance(pair, PrefixRows):  # e.g. a causal model: every prefix's row from one forward
        return ScoreCache.of(pair.prefix_distributions(context, last), last)
    p_rows, _ = pair.distributions([context[:i] for i in range(1, last + 1)])
    return ScoreCache.of(p_rows, last)


@dataclass(frozen=True)
class Chain:
    """One proposed chain: suffix length ``n`` matched, continuation ``position`` in the context, ``tokens``."""

    n: int
    position: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Collection:
    """What a node's matches propose: the distinct ``chains`` in the order they attach, the longest
    ``match`` length per first token, and whether the node is ``covered`` (else terminated)."""

    chains: tuple[Chain, ...]
    match: dict
    covered: bool


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

    def collect(
        self, index: NGramIndex, text: Sequence[int], k: int, layer: int, existing=(), rules: Rules = Rules()
    ) -> Collection:
        """The chains for a node whose text is ``text`` and whose children are ``existing`` (tokens),
        under the official rules (module docstring) or the departures in ``rules``."""
        check_token_ids(text, 2**63, "text")
        text, length = tuple(text), self.chain_length(layer)
        by_proposals = "coverage_by_proposals" in rules
        coverage = set() if by_proposals else {int(t) for t in existing}
        chains: dict[tuple[int, ...], Chain] = {}
        match: dict[int, int] = {}
        for n in range(min(self.max_n, len(text)), 0, -1):
            positions = index.matches(text[-n:])
            for i in reversed(positions) if "recent_occurrences_first" in rules else positions:
                chain = index.tokens[i : i + length]
                if len(chain) < length and "truncated_chains" not in rules:
                    continue  # the official code skips an occurrence whose chain does not fit
                match.setdefault(chain[0], n)
                coverage.add(chain[0])
                chains.setdefault(chain, Chain(n, i, chain))
                if by_proposals and len(coverage) >= k:
                    return Collection(tuple(chains.values()), match, True)
            if len(coverage) >= k:
                break
        ordered = list(chains.values())
        if "recent_occurrences_first" not in rules:
            ordered.sort(key=lambda c: (-c.n, -c.position, c.tokens))
        return Collection(tuple(ordered), match, len(coverage) >= k)
