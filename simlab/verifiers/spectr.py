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

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simlab.distributions import inner, positive_part, sample_categorical, scratch
from simlab.drafting import hit_probability
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw, summed_over_copies

RHO_TOLERANCE = 1e-12


def _p_acc(beta: float, k: int) -> float:
    """1 - (1 - beta)^k for a Python float, accurate for small beta (``math``: no numpy scalar overhead)."""
    return -math.expm1(k * math.log1p(-beta)) if beta < 1.0 else 1.0


def optimal_rho(
    p: np.ndarray, q: np.ndarray, k: int, tol: float = RHO_TOLERANCE, buckets: int = 256, out: np.ndarray | None = None
) -> float:
    """rho* = the smallest rho in [1, k] with p_acc(rho) <= rho beta(rho), by bisection to ``tol``.

    Tokens with p <= q add p / rho to beta(rho) = sum min(q, p / rho) on all of [1, k], tokens
    with p >= k q add q, and only those in between (q < p < k q, usually a minority) depend on
    where rho lies.  Their masses below and above the edges of ``buckets`` equal buckets of
    [1, k] come from two weighted bincounts of their ratios p / q; the two outer classes' sums
    L and H follow from beta(1) = sum min(p, q) and beta(k) = sum min(k q, p) / k, two linear
    equations (no masked sums over V).  The bracket edge found there is refined over the tokens
    of one bucket only, so the vocabulary is scanned a fixed number of times.  Returns the upper
    end of the final bracket, so the residual is always a valid law.

    Conditioning: when the overlap beta(1) or 1 - beta(1) is below about 1e-13 (nearly disjoint or
    nearly equal p and q, including p = q up to the 1e-9 normalisation tolerance), g is flat at
    rounding level over much of [1, k]; rho* is then ill-conditioned, and this bucketed search, a
    plain bisection and the batched engine may return different roots (each a valid law to
    rounding, differing on masses of the overlap's size).  ``out``: a float64 (V,) work vector
    (its contents are overwritten).
    """
    if k == 1:
        return 1.0
    work = np.minimum(p, q, out=out)
    beta_one = float(work.sum())  # beta(1), pairwise as np.sum: p == q gives sum p
    if _p_acc(beta_one, k) - beta_one <= 8 * np.finfo(np.float64).eps:  # g(1) >= 0, = 0 iff beta(1) in {0, 1}: allow
        # rounding; the scalar p_acc, as four_step_rho and the batched engine use
        return 1.0
    np.multiply(q, float(k), out=work)
    above = np.greater(p, q, out=scratch(p.size, np.bool_, 0))  # the masks in reused work vectors: no fresh
    below = np.less(p, work, out=scratch(p.size, np.bool_, 1))  # V-sized temporaries to fault in per call
    between = np.flatnonzero(np.logical_and(above, below, out=above))  # 1 < p / q < k; q = 0 < p is never in
    beta_k = float(np.minimum(work, p, out=work).sum()) / k  # beta(k)
    p, q = p[between], q[between]
    ratio = p / q
    scale = buckets / (k - 1.0)
    position = np.multiply(ratio, scale)
    position -= scale - 1.0  # (ratio - 1) * scale + 1 >= 1: truncation is the floor
    index = np.minimum(position.astype(np.intp), buckets)  # b in 1..buckets: ratio in [e_{b-1}, e_b)
    p_by = np.bincount(index, weights=p, minlength=buckets + 2).astype(np.float64, copy=False)  # int when empty
    q_by = np.bincount(index, weights=q, minlength=buckets + 2).astype(np.float64, copy=False)
    p_mid, q_mid = float(p_by.sum()), float(q_by.sum())
    # beta(1) = L + q_mid + H and beta(k) = (L + p_mid) / k + H, with L = sum_{p <= q} p, H = sum_{p >= k q} q
    low = max((beta_one - beta_k - q_mid + p_mid / k) / (1.0 - 1.0 / k), 0.0)
    p_by[0], q_by[buckets + 1] = low, max(beta_one - low - q_mid, 0.0)  # bucket 0: p <= q; bucket buckets + 1: p >= k q
    edges = 1.0 + np.arange(buckets + 1) * ((k - 1.0) / buckets)  # e_0 = 1 .. e_B = k
    low_p = np.cumsum(p_by)[: buckets + 1]  # ratio < e_b
    high_q = q_by.sum() - np.cumsum(q_by)[: buckets + 1]  # ratio >= e_b
    beta = low_p / edges + high_q
    g = _p_acc_vec(beta, k) - edges * beta
    hits = np.flatnonzero(g[1:] <= 0.0)  # g(e_0) = g(1) > 0 was decided above on beta(1) itself
    b = int(hits[0]) + 1 if hits.size else buckets
    # Inside bucket b, beta(rho) = a / rho + c between consecutive sorted ratios: evaluate g
    # at those breakpoints, then bisect the closed form on the one interval left.
    inside = np.flatnonzero(index == b)
    order = np.argsort(ratio[inside], kind="stable")
    r, mp, mq = ratio[inside][order], p[inside][order], q[inside][order]
    points = np.concatenate(([edges[b - 1]], r, [edges[b]]))
    a_at = low_p[b - 1] + np.concatenate(([0.0], np.cumsum(mp)))  # tokens with ratio < point
    c_at = q_by[b + 1 :].sum() + np.concatenate((np.cumsum(mq[::-1])[::-1], [0.0]))  # ratio >= point
    beta_at = a_at / points[: r.size + 1] + c_at
    g_at = _p_acc_vec(beta_at, k) - points[: r.size + 1] * beta_at
    j = max(int(np.flatnonzero(g_at <= 0.0)[0]) - 1, 0) if np.any(g_at <= 0.0) else r.size
    lo, hi = float(points[j]), float(points[j + 1])  # g(lo) > 0 >= g(hi); a, c fixed on (lo, hi]
    a, c = float(a_at[j]), float(c_at[j])
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        beta_mid = a / mid + c
        if _p_acc(beta_mid, k) - mid * beta_mid <= 0.0:
            hi = mid
        else:
            lo = mid
    return hi


def four_step_rho(p: np.ndarray, q: np.ndarray, k: int, steps: int = 4) -> float:
    """A valid rho by ``steps`` halvings of [1, k] (the audit convention ``rho="four_step"``): the
    upper end of the final bracket of g(rho) = p_acc(rho) - rho beta(rho) <= 0, so the residual
    is a valid law and the scheme lossless, with rho >= rho* (less branch mass).  The lab's
    reading of the 4-step search in the DDTE authors' public code (DDTE audit, issue 17)."""
    if k == 1:
        return 1.0

    def g(rho: float) -> float:
        beta = float(np.minimum(q, p / rho).sum())
        return _p_acc(beta, k) - rho * beta

    if g(1.0) <= 8 * np.finfo(np.float64).eps:
        return 1.0
    lo, hi = 1.0, float(k)
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if g(mid) <= 0.0 else (mid, hi)
    return hi


def _p_acc_vec(beta: np.ndarray, k: int) -> np.ndarray:
    return 1.0 - np.power(np.maximum(1.0 - beta, 0.0), k)


class _SpecTrPlan(NodePlan):
    """rho, beta = sum min(q, p / rho), p_acc, c = p_acc / beta and the correction's mass
    Z = sum (p - c min(q, p / rho))_+; the correction law norm((p - c min(q, p / rho))_+) is built
    only for a full law or a draw (``children_mass`` reads it at the children in closed form).

    Written c min(q, p / rho) = (c / rho) min(rho q, p): at a valid rho, c <= rho, so the
    subtracted mass is at most p in floating point too (a product with a factor <= 1 never rounds
    above its other factor) and the residual needs no clipping pass; the residual, its mass and
    its entries at the children use that one expression, so they agree to the last bit.
    """

    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        buffer = scratch(p.size)
        self.rho = self._choose_rho(buffer)
        buffer = self._matched(out=buffer)
        self.beta = float(buffer.sum()) / self.rho
        self.p_acc = _p_acc(self.beta, k)
        self.c = self.p_acc / self.beta if self.beta > 0 else float(k)
        self.excess = float(self._residual_mass(buffer).sum())  # Z (0: a rejection of every child has probability 0)

    def _choose_rho(self, buffer) -> float:
        if self.verifier.rho == "four_step":
            return four_step_rho(self.p, self.q, self.k)
        return optimal_rho(self.p, self.q, self.k, out=buffer)

    def _matched(self, out: np.ndarray | None = None, tokens=slice(None)) -> np.ndarray:
        """min(rho q, p) = rho min(q, p / rho) at ``tokens`` (default all), float64, into ``out``."""
        scaled = np.multiply(self.q[tokens], self.rho, out=out)
        return np.minimum(scaled, self.p[tokens], out=scaled)

    def _residual_mass(self, matched: np.ndarray, tokens=slice(None)) -> np.ndarray:
        """(p - c min(q, p / rho))_+ at ``tokens`` from ``matched = _matched(tokens=tokens)``, in
        place of ``matched``; clipped only when c > rho (an invalid rho: a planted fault)."""
        matched *= self.c / self.rho
        np.subtract(self.p[tokens], matched, out=matched)
        if self.c > self.rho:
            positive_part(matched, out=matched)
        return matched

    @cached_property
    def correction(self) -> np.ndarray:
        """norm((p - c min(q, p / rho))_+), float64 (V,); p itself when that mass is 0
        (a rejection then has probability 0: ``simlab.distributions.residual``)."""
        if self.excess > 0.0:
            return self._residual_mass(self._matched()) / self.excess
        return self.p / self.p.sum()

    def _correction_at(self, tokens):
        if self.excess > 0.0:
            return self._residual_mass(self._matched(tokens=tokens), tokens) / self.excess
        return self.p[tokens] / self.p.sum()

    def _accept_probabilities(self, children):
        qx = self.q[children]  # > 0 at every child: check_drafted refuses q = 0 (divides_by_q)
        return np.minimum(1.0, self.p[children] / (self.rho * qx))

    def _trials(self, children):
        """(mass, reach): mass[j] = P(child j accepted, the first j rejected), float64 (k,), and
        reach = P(every child rejected)."""
        b = self._accept_probabilities(children)
        mass = np.empty(self.k)
        reach = 1.0
        for j, b_j in enumerate(b):
            mass[j] = reach * b_j
            reach *= 1.0 - b_j
        return mass, reach

    def _children_masses(self, rows):
        """``_children_mass`` of every row of (M, k) children in one pass over the rows' columns."""
        qx = self.q[rows]
        if np.any(qx == 0):
            raise ValueError(f"children: token {rows[qx == 0][0]} has q = 0; SpecTr's test p / (rho q) is undefined there")
        b = np.minimum(1.0, self.p[rows] / (self.rho * qx))
        mass = np.empty(rows.shape)
        reach = np.ones(rows.shape[0])
        for j in range(self.k):
            mass[:, j] = reach * b[:, j]
            reach *= 1.0 - b[:, j]
        out = summed_over_copies(rows, mass)
        rejected = reach > 0.0
        if np.any(rejected):
            out[rejected] += reach[rejected, None] * self._correction_at(rows[rejected])
        return out

    def _law(self, children):
        mass, reach = self._trials(children)
        out = np.zeros_like(self.p)
        np.add.at(out, children, mass)
        if reach > 0.0:
            out += reach * self.correction
        return out

    def _children_mass(self, children):
        mass, reach = self._trials(children)
        out = summed_over_copies(children, mass)
        if reach > 0.0:
            out += reach * self._correction_at(children)
        return out

    def _draw(self, children, rng):
        for x in children:
            if accept_draw(rng, self.p[x], self.rho * self.q[x]):
                return int(x)
        return sample_categorical(self.correction, rng)

    def acceptance_formula(self) -> float:
        if self.beta >= 1.0:
            return 1.0
        r = (self.q - np.minimum(self.q, self.p / self.rho)) / (1.0 - self.beta)
        return float(self.p_acc + (1.0 - self.p_acc) * inner(self.correction, hit_probability(r, self.k)))


@dataclass(frozen=True)
class SpecTr(NodeVerifier):
    """K-SEQ (SpecTr); lossless for i.i.d. children.

    Args:
        rho: ``"optimal"`` (default: rho* by bisection to 1e-12) or ``"four_step"`` (the audit
            convention: four halvings of [1, k], a valid rho >= rho*, ``four_step_rho``).
    """

    name = "spectr"
    label = "SpecTr"
    ot_based = True
    speculative_at_one = True
    divides_by_q = True  # the acceptance test divides by q at every child
    rho: str = "optimal"

    def __post_init__(self):
        if self.rho not in ("optimal", "four_step"):
            raise ValueError(f"rho: must be 'optimal' or 'four_step', got {self.rho!r}")

    def _plan(self, p, q, k):
        return _SpecTrPlan(self, p, q, k)
