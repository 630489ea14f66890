"""A parallel drafter built from an autoregressive draft: every position conditioned on the root only.

``RootConditioned(pair)`` keeps the pair's target p and replaces its draft by a parallel one
(``simlab.pairs.ParallelDraft``, the drafting model of DFlash, PARD, P-EAGLE and Medusa heads):
below a root r, the draft's q at **every** node of depth d is

    q_{d+1}(r) = q(. | r, g_1, ..., g_d),

the autoregressive draft's distribution after the root and its own greedy chain g_1..g_d
(g_i = argmax q(. | r, g_<i), ties to the lowest id), whatever tokens the tree holds above the
node.  Why this is a valid drafting law: the chain, and so every row, is a function of the root
alone, fixed before any token is drafted; a builder's children at a node are chosen (top-k) or
drawn from that node's row, and the pair gives the verifier that same row at that node
(``node_distributions``), so every pairing lossless for the builder's law stays lossless.  At
depth 0 it equals the autoregressive draft (q_1(r) = q(. | r)); deeper, it is what a parallel
head that guesses the intermediate tokens by the draft's own argmax would give, and it loses the
dependence on the drafted prefix that an autoregressive draft has off the greedy chain.

The stand-in computes the rows with d sequential draft evaluations along the chain (memoised per
root); a real parallel drafter produces them in one forward, which is what the parallel builders
charge (``simlab.builders.medusa``, ``simlab.builders.ddtree``).  It wraps any pair: a synthetic
world (``backends.synthetic.parallel``) or live models (``backends.hf.HFPair``, through
``parallel_roots``).  The argmax is the same under every sampling setting (temperature, top-k and
top-p keep it), so the chain does not depend on the setting; the rows are the setting's q.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from simlab.checks import check_int
from simlab.pairs import NodeBatch, WithSettings, check_context, check_contexts, eos_of, rooted


MEMO_ROOTS = 256
"""Roots whose chain rows a stand-in keeps (then it starts over)."""


class RootConditioned:
    """The parallel stand-in of ``pair`` (module docstring): a ``ModelPair`` that is also
    ``NodeBatch``, ``Rooted``, ``ParallelDraft``, ``WithSettings`` (when ``pair`` is) and names the
    pair's ``eos_id``.

    ``node_distributions(root, paths)`` (what every ``NodeTable`` asks) takes the root it is given;
    ``distributions(contexts)`` measures depth from a root of ``root_length`` tokens (``rooted``).

    Args:
        pair: the autoregressive pair whose target and draft are used.
        root_length: the context length of the root for ``distributions`` (>= 0).

    Raises:
        ValueError: ``pair: ...`` without ``vocab_size`` and ``distributions``; ``root_length: ...``.
    """

    def __init__(self, pair, root_length: int = 0):
        if not hasattr(pair, "vocab_size") or not hasattr(pair, "distributions"):
            raise ValueError(f"pair: must be a simlab.pairs.ModelPair, got {type(pair).__name__}")
        self.pair = pair
        self.vocab_size = int(pair.vocab_size)
        self.root_length = check_int(root_length, "root_length", 0)
        self.eos_id = eos_of(pair)
        self._rows: dict[tuple[int, ...], list[np.ndarray]] = {}  # root -> chain rows q(. | root, g_<d)

    @property
    def settings(self):
        return getattr(self.pair, "settings", None)

    def with_settings(self, settings) -> "RootConditioned":
        """The stand-in of the pair under ``settings``.

        Raises:
            ValueError: ``pair: ...`` when the wrapped pair has no ``with_settings``.
        """
        if not isinstance(self.pair, WithSettings):
            raise ValueError(f"pair: {type(self.pair).__name__} cannot change its sampling settings")
        return RootConditioned(self.pair.with_settings(settings), self.root_length)

    def rooted(self, root_length: int) -> "RootConditioned":
        """The same stand-in with ``distributions`` measuring depth from ``root_length`` tokens."""
        return RootConditioned(self.pair, root_length)

    def _inner(self, root: tuple[int, ...]):
        return rooted(self.pair, len(root))

    def _fetch(self, root: tuple[int, ...], paths: list[tuple[int, ...]]):
        inner = self._inner(root)
        if isinstance(inner, NodeBatch):
            return inner.node_distributions(root, paths)
        return inner.distributions([root + pth for pth in paths])

    def position_distributions(self, root: Sequence[int], depth: int) -> np.ndarray:
        """float64 (depth, V): row d = q(. | root, g_1..g_d) along the draft's greedy chain.

        Raises:
            ValueError: ``context: ...`` for a bad root; ``depth: ...`` below 0.
        """
        root = check_context(root, self.vocab_size)
        depth = check_int(depth, "depth", 0)
        if root not in self._rows and len(self._rows) >= MEMO_ROOTS:
            self._rows.clear()  # bounded memory over a long study; rows are recomputed identically
        rows = self._rows.setdefault(root, [])
        while len(rows) < depth:
            chain = tuple(int(np.argmax(row)) for row in rows)  # np.argmax: the lowest id among ties
            rows.append(np.asarray(self._fetch(root, [chain])[1][0], dtype=np.float64))
        return np.array(rows[:depth]).reshape(depth, self.vocab_size)

    def node_distributions(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]):
        """p at ``root + path`` (the wrapped target's) and q = the position row of ``len(path)``,
        each float64 (n, V)."""
        root = check_context(root, self.vocab_size)
        paths = [check_context(pth, self.vocab_size, "paths") for pth in paths]
        if not paths:
            return np.empty((0, self.vocab_size)), np.empty((0, self.vocab_size))
        p = np.asarray(self._fetch(root, paths)[0], dtype=np.float64)
        rows = self.position_distributions(root, 1 + max(len(pth) for pth in paths))
        return p, rows[[len(pth) for pth in paths]]

    def distributions(self, contexts):
        """p and q for whole contexts, depth measured from the first ``root_length`` tokens (a
        context shorter than that is its own root)."""
        contexts = check_contexts(contexts, self.vocab_size)
        p_rows, q_rows = [], []
        for ctx in contexts:
            cut = min(self.root_length, len(ctx))
            p, q = self.node_distributions(ctx[:cut], [ctx[cut:]])
            p_rows.append(p[0])
            q_rows.append(q[0])
        return np.array(p_rows).reshape(len(contexts), self.vocab_size), np.array(q_rows).reshape(len(contexts), self.vocab_size)


def parallel_roots(roots: Iterator) -> Iterator:
    """The roots of a source (``backends.sources.Root``) with each pair replaced by its parallel
    stand-in (``RootConditioned``) rooted at the root's context: how a study runs the parallel
    drafter of any source (a synthetic world, live models)."""
    import dataclasses

    for root in roots:
        yield dataclasses.replace(root, pair=RootConditioned(root.pair, len(root.context)))
