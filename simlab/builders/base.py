"""The builder protocol: how a draft tree is built from the draft model at a root.

A **builder** turns a root (a ``simlab.trees.NodeTable``: the pair and the root context) into a
``DraftTree`` that states how each node's children were drawn (``DraftTree.law``) and what
drafting it cost (``DraftTree.cost``, draft forwards for ``simlab.latency``).  Every builder is a
frozen dataclass (its options) with

* ``sample(table, rng=None) -> DraftTree``: one tree (``rng`` is needed only by builders that
  sample; one uniform per sampled token, so a seed fixes the tree);
* ``enumerate(table) -> Iterator[(DraftTree, probability)]``: every tree it can build with its
  probability (one tree for a deterministic builder), up to ``MAX_TREES``;
* ``laws``: the drafting laws its trees' nodes can have; ``deterministic``: True when it never
  samples (exact block efficiency is then one value per root);
* ``budget``: the most draft tokens (distinct non-root nodes) its trees have, or None.

``enumerate_draws`` turns a builder written against a ``draw(distribution)`` callback into its
exact enumeration (depth-first over every sequence of draws, each tree with the product of its
draw probabilities).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

import numpy as np

from simlab.checks import check_generator
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting

MAX_TREES = 200_000
"""Largest number of trees ``enumerate`` will list."""


@runtime_checkable
class Builder(Protocol):
    """What every builder offers (module docstring)."""

    laws: frozenset[Drafting]
    deterministic: bool
    budget: int | None

    def sample(self, table, rng: np.random.Generator | None = None): ...

    def enumerate(self, table) -> Iterator: ...


def too_many(count: int) -> None:
    """Refuse to enumerate more than ``MAX_TREES`` trees."""
    if count > MAX_TREES:
        raise ValueError(f"shape: exact enumeration would list {count} trees, above the limit {MAX_TREES}; use method='mc'")


def sampler(rng: np.random.Generator | None) -> Callable[[np.ndarray], int]:
    """``draw(distribution)`` by inverse CDF with ``rng`` (one uniform per draw).

    Raises:
        ValueError: ``rng: ...`` when a draw is needed and ``rng`` is not a Generator.
    """

    def draw(dist: np.ndarray) -> int:
        return sample_categorical(dist, check_generator(rng))

    return draw


class _Branch(Exception):
    def __init__(self, dist: np.ndarray):
        self.dist = dist


def enumerate_draws(build: Callable[[Callable[[np.ndarray], int]], object]) -> Iterator[tuple[object, float]]:
    """Every result of ``build(draw)`` over all outcomes of its draws, with its probability.

    ``build`` must be deterministic given the outcomes of ``draw`` (it is re-run once per
    outcome sequence, so fetched p and q should be memoised in a ``NodeTable``).

    Raises:
        ValueError: more than ``MAX_TREES`` outcome sequences.
    """
    stack: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    listed = 0
    while stack:
        prefix, prob = stack.pop()
        position = 0

        def draw(dist: np.ndarray) -> int:
            nonlocal position
            if position < len(prefix):
                position += 1
                return prefix[position - 1]
            raise _Branch(dist)

        try:
            result = build(draw)
        except _Branch as branch:
            weights = branch.dist / branch.dist.sum()
            outcomes = np.flatnonzero(weights > 0)
            too_many(listed + len(stack) + outcomes.size)
            stack.extend((prefix + (int(t),), prob * float(weights[t])) for t in outcomes[::-1])
            continue
        listed += 1
        yield result, prob
