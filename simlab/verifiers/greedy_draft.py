"""The verifier of Hu et al.'s greedy draft: deterministic best children plus one sampled tail.

Children (d_1..d_m, s): D = {d_1..d_m} is deterministic (the m most probable tokens of q at node
level) and the tail s was drawn from q~ = q restricted to V \\ D, renormalised
(``Drafting.MIXED``).  Run single-draft speculative sampling of p against the proposal q~ on s:
accept s with probability a(s) = min(1, p(s) / q~(s)), otherwise draw Y ~ norm((p - q~)_+); Y
counts as accepted when it lies in D (q~ = 0 there, so the residual equals p on D up to its
normalisation).  B(s, .) = a(s) delta_s + (1 - a(s)) norm((p - q~)_+) and sum_s q~(s) B(s, .) = p,
so the rule is lossless for any deterministic D with a tail from q~; its acceptance is
alpha = p(D) + sum_{t not in D} min(p(t), q~(t)), Hu et al.'s optimum for this draft.  The same
argument holds given any first children whose last sibling is a draw from q restricted to the
others, so the rule is also lossless for siblings drafted without replacement (there D is random,
but the last draw is from q~ given it; a finding of the lab's exact tests).  At a node without a
tail (every child deterministic, for example after the tail was pruned) it runs the one-hot rule
(``for_law``).
Sources: Hu et al. 2025 (arXiv 2502.18779, the greedy draft; no official code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.drafting import Drafting, tail_law, top_tokens
from simlab.verifiers.base import NodePlan, NodeVerifier
from simlab.verifiers.speculative import SingleDraft


class _GreedyDraftPlan(NodePlan):
    def _single(self, children) -> SingleDraft:
        return SingleDraft(self.p, tail_law(self.q, children[:-1]))

    def _law(self, children):
        return self._single(children).law(int(children[-1]))

    def _draw(self, children, rng):
        return self._single(children).draw(int(children[-1]), rng)

    def acceptance_formula(self) -> float:
        best = top_tokens(self.q, self.k - 1)
        rest = np.ones(self.p.size, dtype=bool)
        rest[best] = False
        return float(self.p[best].sum() + np.minimum(self.p, tail_law(self.q, best))[rest].sum())


@dataclass(frozen=True)
class GreedyDraft(NodeVerifier):
    """Speculative sampling of p against q~ on the tail; the deterministic children are accepted via the residual."""

    name = "greedy_draft"
    drafting = Drafting.MIXED
    lossless_for = frozenset({Drafting.MIXED, Drafting.DETERMINISTIC, Drafting.WITHOUT_REPLACEMENT})

    def for_law(self, law: Drafting) -> NodeVerifier:
        if law is Drafting.DETERMINISTIC:
            from simlab.verifiers.onehot import OneHot

            return OneHot()
        return self

    def _plan(self, p, q, k):
        return _GreedyDraftPlan(self, p, q, k)
