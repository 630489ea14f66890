"""SpecTr's K-SEQ verifier (Sun et al. 2023, arXiv 2310.15141; DDTE Sec. 3, App. C).

With beta(rho) = sum_t min(q(t), p(t) / rho) and p_acc(rho) = 1 - (1 - beta)^k, test the
children in order, accepting X_i with probability b_i = min(1, p(X_i) / (rho q(X_i)))
(independent uniforms); if all are rejected output Y ~ norm(p - c min(q, p / rho)) with
c = p_acc / beta.  The residual is a valid law iff c <= rho; rho* is the smallest such rho in
[1, k], the root of g(rho) = p_acc(rho) - rho beta(rho), found by bisection to 1e-12.  At
rho* the residual vanishes wherever p < rho* q, so a rejected child is never re-emitted.
alpha = p_acc + (1 - p_acc) sum_t res(t) (1 - (1 - r(t))^k), r = (q - p / rho*)_+ / (1 - beta).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import residual, sample_categorical
from simlab.drafting import hit_probability
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw

RHO_TOLERANCE = 1e-12


def _p_acc(beta: float, k: int) -> float:
    return float(-np.expm1(k * np.log1p(-beta))) if beta < 1.0 else 1.0


def optimal_rho(p: np.ndarray, q: np.ndarray, k: int, tol: float = RHO_TOLERANCE) -> float:
    """rho* = the smallest rho in [1, k] with p_acc(rho) <= rho beta(rho), by bisection to ``tol``.

    Returns the upper end of the final bracket, so the residual is always valid.  Each step
    moves the tokens whose ratio p/q leaves the bracket into running sums (for rho in
    [lo, hi], a token with p/q <= lo contributes p/rho to beta and one with p/q >= hi
    contributes q), so the total work is about two passes over the vocabulary.
    """
    def g(rho, low_p, high_q, mp, mq):
        beta = low_p / rho + high_q + np.minimum(mq, mp / rho).sum()
        return _p_acc(beta, k) - rho * beta

    pos = q > 0
    mp, mq = p[pos], q[pos]
    ratio = mp / mq
    lo, hi = 1.0, float(k)
    low, high = ratio <= lo, ratio >= hi
    low_p, high_q = float(mp[low].sum()), float(mq[high].sum())
    keep = ~(low | high)
    mp, mq, ratio = mp[keep], mq[keep], ratio[keep]
    if k == 1 or g(lo, low_p, high_q, mp, mq) <= 0.0:
        return 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if g(mid, low_p, high_q, mp, mq) <= 0.0:
            hi = mid
            leaving = ratio >= hi
            high_q += float(mq[leaving].sum())
        else:
            lo = mid
            leaving = ratio <= lo
            low_p += float(mp[leaving].sum())
        stay = ~leaving
        mp, mq, ratio = mp[stay], mq[stay], ratio[stay]
    return hi


class _SpecTrPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.rho = self._choose_rho()
        self.matched = np.minimum(q, p / self.rho)  # min(q, p / rho)
        self.beta = float(self.matched.sum())
        self.p_acc = _p_acc(self.beta, k)
        c = self.p_acc / self.beta if self.beta > 0 else float(k)
        self.correction = residual(p, c * self.matched)

    def _choose_rho(self) -> float:
        return optimal_rho(self.p, self.q, self.k)

    def _accept_probabilities(self, children):
        return np.minimum(1.0, self.p[children] / (self.rho * self.q[children]))

    def _law(self, children):
        b = self._accept_probabilities(children)
        out = np.zeros_like(self.p)
        reach = 1.0
        for x, b_i in zip(children, b):
            out[x] += reach * b_i
            reach *= 1.0 - b_i
        if reach > 0.0:
            out += reach * self.correction
        return out

    def _draw(self, children, rng):
        for x in children:
            if accept_draw(rng, self.p[x], self.rho * self.q[x]):
                return int(x)
        return sample_categorical(self.correction, rng)

    def acceptance_rate(self) -> float:
        if self.beta >= 1.0:
            return 1.0
        r = (self.q - self.matched) / (1.0 - self.beta)
        return float(self.p_acc + (1.0 - self.p_acc) * np.dot(self.correction, hit_probability(r, self.k)))


@dataclass(frozen=True)
class SpecTr(NodeVerifier):
    """K-SEQ (SpecTr) with rho* from bisection; lossless for i.i.d. children."""

    name = "spectr"

    def _plan(self, p, q, k):
        return _SpecTrPlan(self, p, q, k)
