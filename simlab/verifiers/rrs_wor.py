"""Recursive rejection sampling *without* replacement (RSD, Jeon et al. 2024; EAGLE-1; Sequoia).

Children are drafted without replacement: X_i ~ q^(i-1), where q^(0) = q and q^(i) is
q^(i-1) with X_i removed and renormalised.  Test them in drafted order: accept X_i with
probability min(1, p_{i-1}(X_i) / q^(i-1)(X_i)); on rejection p_i = norm((p_{i-1} - q^(i-1))_+)
(the draft law *before* removing X_i).  If all are rejected, output Y ~ p_k.  Lossless because
X_i ~ q^(i-1) given the history.  alpha has no closed form; ``acceptance_rate`` enumerates
the ordered child tuples (limit ``simlab.drafting.MAX_ENUMERATED_TUPLES``).
Source: Jeon et al. 2024 (arXiv 2402.14160); Infini-AI-Lab/Sequoia@0ff3ff7 ``Tree/SpecTree.py::accept_step``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import residual, sample_categorical
from simlab.drafting import Drafting
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw


class _RRSWithoutReplacementPlan(NodePlan):
    def _trials(self, children):
        """Yield (x, p_{i-1}, q^(i-1)) for i = 1..k, then (None, p_k, None)."""
        p_cur, q_cur = self.p, self.q
        for i, x in enumerate(children):
            yield x, p_cur, q_cur
            p_cur = residual(p_cur, q_cur)
            if i + 1 < self.k:
                q_cur = q_cur.copy()
                q_cur[x] = 0.0
                q_cur /= q_cur.sum()
        yield None, p_cur, None

    def _law(self, children):
        out = np.zeros_like(self.p)
        reach = 1.0
        for x, p_cur, q_cur in self._trials(children):
            if x is None:
                out += reach * p_cur
                break
            if q_cur[x] == 0:
                raise ValueError(f"children: token {x} has q = 0 where it is tested; RRS's test p / q is undefined there")
            a = min(1.0, p_cur[x] / q_cur[x])
            out[x] += reach * a
            reach *= 1.0 - a
        return out

    def _draw(self, children, rng):
        for x, p_cur, q_cur in self._trials(children):
            if x is None:
                return sample_categorical(p_cur, rng)
            if accept_draw(rng, p_cur[x], q_cur[x]):
                return int(x)
        return None  # not reached: _trials always ends with the final residual


@dataclass(frozen=True)
class RRSWithoutReplacement(NodeVerifier):
    """Recursive rejection sampling for children drafted without replacement."""

    name = "rrs_wor"
    label = "RRS-WOR"
    drafting = Drafting.WITHOUT_REPLACEMENT
    speculative_at_one = True
    lossless_for = frozenset({Drafting.WITHOUT_REPLACEMENT})

    def _plan(self, p, q, k):
        if k > int(np.count_nonzero(q)):
            raise ValueError(f"k: {k} children drafted without replacement need at least {k} tokens with q > 0")
        return _RRSWithoutReplacementPlan(self, p, q, k)
