"""A greedy-draft tree with proxy scores (Hu et al.'s greedy draft, grown as RheoSampling-style trees).

Every expanded node proposes its ``best`` most probable tokens D (deterministic, scored by
log q) and one **tail** token drawn from q~ = q restricted to V \\ D, renormalised (Hu et al.'s
greedy draft with n = best + 1 drafts).  The tree grows by cumulative score like EAGLE-2
(``simlab.builders.dynamic.grow``), but the tail is ranked by a **proxy** that does not depend
on which token was drawn: log min(q(d_best), z), with d_best the least probable of D and
z = q(V \\ D) the mass the tail was drawn from (log z when best = 0).  So whether a tail is kept,
expanded or pruned never depends on its own identity, the tail kept at a node is still a draw
from q~ given everything the verifier conditions on, and the node's children have the law
``Drafting.MIXED``; where the tail was pruned (it ranks below its deterministic siblings, so it
goes first) the children are deterministic (``Drafting.DETERMINISTIC``, one-hot rule).  Verified
losslessly by ``greedy_draft`` (its acceptance at a mixed node is Hu et al.'s optimum
p(D) + sum_{t not in D} min(p, q~)), ``onehot``, ``nss``, or ``greedy`` at T = 0.  Ranking a tail
by its own probability instead would make its survival depend on the token and the pairing
lossy (a planted fault of the tests).

Defaults follow the reference's description of RheoSampling (best 1: one deterministic child
and one tail per node), with EAGLE-2's budget, depth and frontier.  Cost: as EAGLE-2.
Sources: Hu et al. 2025 (arXiv 2502.18779); RheoSampling (arXiv 2609.21827, abstract) and the
proxy rule as ``docs/sources.md`` states it (no official code).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.builders.base import enumerate_draws, sampler
from simlab.builders.dynamic import grow
from simlab.checks import check_int
from simlab.drafting import Drafting, top_tokens
from simlab.trees import DraftTree, NodeTable


@dataclass(frozen=True)
class GreedyDraftTree:
    """Deterministic best children plus one sampled tail per node, ranked by a token-independent proxy.

    Args:
        budget: draft tokens kept, >= 1.
        depth: expansion rounds after the root's, >= 0.
        top_k: frontier size, >= 1.
        best: deterministic children per node (n - 1 of Hu et al.'s greedy draft), >= 0.

    Raises:
        ValueError: naming the argument out of range.
    """

    budget: int = 59
    depth: int = 7
    top_k: int = 10
    best: int = 1

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.MIXED, Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = False

    @classmethod
    def example(cls, vocab_size: int = 4) -> "GreedyDraftTree":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(budget=3, depth=1, top_k=2)

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 0, 64))
        object.__setattr__(self, "top_k", check_int(self.top_k, "top_k", 1))
        object.__setattr__(self, "best", check_int(self.best, "best", 0))

    def proxy(self, q: np.ndarray, best: np.ndarray, rest: float) -> float:
        """The tail's log score: log min(q(least probable of ``best``), mass outside them)."""
        return float(np.log(min(float(q[best[-1]]), rest) if best.size else rest))

    def _proposer(self, draw):
        def propose(q: np.ndarray):
            best = top_tokens(q, min(self.best, int(np.count_nonzero(q))))
            out = [(t, np.log(q[t]), False) for t in best.tolist()]
            tail = q.copy()
            tail[best] = 0.0
            rest = float(tail.sum())
            if rest > 0.0:
                out.append((draw(tail / rest), self.proxy(q, best, rest), True))
            return out

        return propose

    def _grow(self, table: NodeTable, draw) -> DraftTree:
        return grow(table, depth=self.depth, top_k=self.top_k, budget=self.budget, propose=self._proposer(draw))

    def sample(self, table: NodeTable, rng: np.random.Generator | None = None) -> DraftTree:
        """One tree (one uniform of ``rng`` per tail).

        Raises:
            ValueError: ``rng: ...`` when a tail is drawn and ``rng`` is not a Generator.
        """
        return self._grow(table, sampler(rng))

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        """Every tree over all tail draws, with its probability (small vocabularies only)."""
        yield from enumerate_draws(lambda draw: self._grow(table, draw))
