"""EAGLE-2's dynamic draft tree (Li et al. 2024), as its official code builds it.

At the root the draft's ``top_k`` most probable tokens are scored by log q; then ``depth``
rounds: the frontier (the ``top_k`` best candidates of the last round) goes through one draft
forward, each frontier node proposes its own ``top_k`` tokens scored by cumulative log q, and
every one of the top_k^2 candidates is kept; finally the tree keeps the ``budget`` best of all
k + depth k^2 candidates (``simlab.builders.dynamic.grow``).  Only tokens with q > 0 are
proposed.  The children are deterministic given the context (``Drafting.DETERMINISTIC``), so
the lossless verifiers are the one-hot rule (EAGLE's T > 0 verification) and the greedy rule
at T = 0; the i.i.d. verifiers are refused.

Conventions (Li et al. 2024, EAGLE-2; SafeAILab/EAGLE@cb7e084
``eagle/model/cnets.py::topK_genrate``): EAGLE's ``total_token`` counts the root, so
``budget = total_token - 1`` draft tokens; ``depth`` counts expansion rounds, so a tree has up to
``depth + 1`` levels (EAGLE issue #118); the defaults of ``EaModel.from_pretrained`` are
total_token 60, depth 7, top_k 10 (``budget=59``).  Ties: lowest token id within a node's
top-k, creation order between candidates (EAGLE leaves both to ``torch.topk``; this choice keeps
every tree ancestor-closed).  EAGLE ranks by the draft's untempered log-softmax: build from a
pair at temperature 1 to reproduce that; the lab ranks by the q of the table it is given.
Cost: one draft forward of 1 token (the root), then one of at most top_k tokens per round.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.builders.dynamic import grow
from simlab.checks import check_int
from simlab.distributions import top_positive
from simlab.drafting import Drafting
from simlab.trees import DraftTree, NodeTable


@dataclass(frozen=True)
class EAGLE2:
    """EAGLE-2's dynamic tree (module docstring).

    Args:
        budget: draft tokens kept (EAGLE's total_token - 1), >= 1.
        depth: expansion rounds after the root's, >= 0 (up to depth + 1 levels).
        top_k: proposals per node and frontier size, >= 1.

    Raises:
        ValueError: ``budget: ...``, ``depth: ...`` or ``top_k: ...`` out of range.
    """

    budget: int = 59
    depth: int = 7
    top_k: int = 10

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "EAGLE2":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(budget=3, depth=1, top_k=2)

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 0, 64))
        object.__setattr__(self, "top_k", check_int(self.top_k, "top_k", 1))

    def _propose(self, q: np.ndarray):
        """The top_k most probable tokens with q > 0 (fewer when q has fewer), ties to the lowest id,
        scored by log q: one comparison over V and a sort of the candidates above a subsample's
        top_k-th (``simlab.distributions.top_positive``), no count of the zeros of q."""
        top = top_positive(q, self.top_k)
        return list(zip(top.tolist(), np.log(q[top]).tolist(), [False] * top.size))

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used)."""
        return grow(table, depth=self.depth, top_k=self.top_k, budget=self.budget, propose=self._propose)

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield self.sample(table), 1.0
