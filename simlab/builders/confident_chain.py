"""llama.cpp's draft-model chain: the draft's greedy tokens while it is confident, discarded if short.

llama.cpp drafts one chain per step with a draft model (ggml-org/llama.cpp@6c8a045
``common/speculative.cpp::common_speculative_use_draft_model``; the server's per-request rules:
@6c8a045 ``tools/server/server-context.cpp``, @00efb3e ``tools/server/server-task.cpp``):

1. the draft's sampler is ``top_k = 10`` followed by ``dist`` (``common_sampler_init``,
   @00efb3e ``common/sampling.cpp``): ``dist`` softmaxes the 10 kept logits, so the confidence
   of a token is its draft probability renormalised over the draft's 10 most probable tokens,
   ``q(x) / sum of the 10 largest q`` (``q`` itself for a vocabulary of at most 10);
2. at each position the drafted token is the first candidate after sorting by that probability
   (the draft's argmax), and it is **kept**; the chain then stops if it holds ``n_max`` tokens
   or if the token's confidence is below ``p_min`` (``cur_p->data[0].p < params.p_min``: a
   token at exactly ``p_min`` continues the chain);
3. the server verifies the chain only if it holds at least ``n_min`` tokens ("ignoring small
   draft"); a shorter one is dropped and the step is a plain one (its draft forwards were still
   spent).

Verification is ``common_sampler_sample_and_accept_n``: the target samples at each position and
the draft token is accepted while it equals the sample, i.e. exact matching on a deterministic
chain (the lab's ``exact_match``; ``onehot`` and ``nss`` are equivalent on one child).

The chain is deterministic given the context (``Drafting.DETERMINISTIC``).  Ties between tokens
of equal probability go to the lowest id (llama.cpp's sorts leave them unspecified).  The
confidence is computed in float64 from the drafting table's ``q``; llama.cpp compares the float32
softmax of the draft's untempered logits, so build from a pair at temperature 1 (the engine
valuation's drafting table) and expect a confidence within float32 rounding of ``p_min`` to fall
either way.  ``p_min`` is any finite real, as llama.cpp's ``--draft-p-min`` (``std::stof``, no
range check): at or below 0 the chain always runs to ``n_max`` tokens; above 1 it stops after its
first token.  Draft cost: one draft forward of one token per kept token (the last token is not
forwarded; ``common_speculative_use_draft_model`` breaks before decoding it), at contexts
0, 1, ..., m - 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.builders.cost import DraftCost, DraftForward
from simlab.checks import check_int
from simlab.distributions import top_positive
from simlab.drafting import Drafting
from simlab.trees import DraftTree, NodeTable

DRAFT_TOP_K = 10
"""llama.cpp's draft sampler keeps the draft's 10 most probable tokens (``params.top_k = 10`` in
``common_speculative_state_draft``, ggml-org/llama.cpp@6c8a045 ``common/speculative.cpp``)."""


def confidence(q: np.ndarray, top_k: int = DRAFT_TOP_K) -> tuple[int, float]:
    """The draft's argmax token (ties: lowest id) and its probability renormalised over the
    ``top_k`` most probable tokens (module docstring, rule 1).

    Args:
        q: the draft's distribution at a node, float64 of shape (V,), with a positive entry.
        top_k: the renormalisation window, >= 1.

    Raises:
        ValueError: ``q: ...`` for a row without a positive entry.
    """
    top = top_positive(q, top_k)
    if top.size == 0:
        raise ValueError("q: the draft's distribution has no positive entry")
    return int(top[0]), float(q[top[0]] / q[top].sum())


@dataclass(frozen=True)
class ConfidentChain:
    """llama.cpp's draft chain (module docstring).

    Args:
        budget: ``n_max``, the most draft tokens (llama.cpp's ``--draft-max``), >= 1.
        p_min: the confidence below which the chain stops after the token (``--draft-p-min``),
            a finite real.
        n_min: a chain shorter than this is discarded (``--draft-min``), in [0, budget].
        top_k: the draft sampler's window for the confidence (llama.cpp's 10), >= 1.

    Raises:
        ValueError: ``budget: ...``, ``p_min: ...``, ``n_min: ...`` or ``top_k: ...`` out of range.
    """

    budget: int = 16
    p_min: float = 0.75
    n_min: int = 0
    top_k: int = DRAFT_TOP_K

    laws: ClassVar[frozenset[Drafting]] = frozenset({Drafting.DETERMINISTIC})
    default_laws: ClassVar[frozenset[Drafting]] = laws
    deterministic: ClassVar[bool] = True

    @classmethod
    def example(cls, vocab_size: int = 4) -> "ConfidentChain":
        """A tiny instance for the generic builder tests (``simlab.builders.example``)."""
        return cls(budget=3, p_min=0.4, n_min=0)

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "budget", 1))
        p_min = self.p_min
        if isinstance(p_min, (bool, np.bool_)) or not isinstance(p_min, (int, float, np.integer, np.floating)):
            raise ValueError(f"p_min: must be a finite real number, got {p_min!r}")
        if not math.isfinite(float(p_min)):
            raise ValueError(f"p_min: must be a finite real number, got {p_min!r}")
        object.__setattr__(self, "p_min", float(p_min))
        object.__setattr__(self, "n_min", check_int(self.n_min, "n_min", 0, self.budget))
        object.__setattr__(self, "top_k", check_int(self.top_k, "top_k", 1))

    def chain(self, table: NodeTable) -> tuple[int, ...]:
        """The drafted chain at ``table``'s root before the ``n_min`` rule (rules 1 and 2)."""
        tokens: list[int] = []
        while True:
            path = tuple(tokens)
            table.fetch([path])
            token, conf = confidence(table.q(path), self.top_k)
            tokens.append(token)
            if len(tokens) >= self.budget or conf < self.p_min:
                return tuple(tokens)

    def sample(self, table: NodeTable, rng=None) -> DraftTree:
        """The tree (deterministic: ``rng`` is not used): the chain, or the root alone when the
        chain is shorter than ``n_min`` (its draft forwards kept in the cost)."""
        tokens = self.chain(table)
        forwards = tuple(DraftForward(1, i) for i in range(len(tokens)))
        if len(tokens) < self.n_min:
            return DraftTree(table, {}, Drafting.DETERMINISTIC, {}, DraftCost(forwards, 0)).fill()
        children = {tokens[:i]: (tokens[i],) for i in range(len(tokens))}
        return DraftTree(table, children, Drafting.DETERMINISTIC, {}, DraftCost(forwards, len(tokens))).fill()

    def enumerate(self, table: NodeTable) -> Iterator[tuple[DraftTree, float]]:
        yield self.sample(table), 1.0
