"""The OT walk: a closed-form coupling for i.i.d. children that reaches alpha* where it is certified.

Setting (``simlab.otlp``): k children X ~ i.i.d. q, target p; a verifier is a coupling of Q and p,
and the best acceptance is the min-cut value alpha* = min_H [p(H) + 1 - q(H)^k] over the prefixes
H of the tokens with q > 0 sorted by r = p/q ascending (Hu et al. ICLR 2025, arXiv 2502.18779,
the subset dual).  The LP (``Optimal``) stops near V = 100; this rule is evaluated per child tuple
in O(k log k) (children only) or O(V) (the whole law) after an O(V log V) preparation.

Construction (derived by the lab; the reduction to max-flow and polymatroids is Thomas and Pal,
"Partial Resolution", NeurIPS 2025 and "Global Resolution", ICLR 2026, arXiv 2511.15898, whose
i.i.d. algorithms compute the optimal coupling by a different route; no official code).

Vocabulary: a **selection** picks one child Z with law mu, then speculative sampling of mu against
p; **H*** is the minimising prefix; a **game** is the rows inside H* or the rows with a child
outside it; the **walk** takes a game's children from the highest r down (or up), a child of token
t with a **coin** e(t); a plan is **certified** when no coin needed clipping.  The construction
(steps 1-4: selection, which mu, the walk, the certificate): ``docs/derivations/ot_walk.md``.

Contract: lossless for i.i.d. drafting at every p, q, k (the clipped coins' own selection law is
used); a certified plan accepts alpha* (checked against ``optimal_acceptance`` and the LP in the
tests), an uncertified one gives its exact law and ``acceptance_formula`` refuses.
``simlab.verifiers.ot_exact`` reaches alpha* at every node.

Drafting without replacement is not covered (its F(A) is not a function of q(A); ``Optimal`` with
``replacement=False`` is the small-V reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simlab.distributions import positive_part, residual, sample_categorical
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw

CERTIFY_TOL = 1e-10
"""``certified`` when |sum min(mu, p) - alpha*| is at most this (the rounding of sums over V = 128,000)."""


def _power_difference(a: np.ndarray, b: np.ndarray, k: int, diff: np.ndarray | None = None) -> np.ndarray:
    """a^k - b^k as diff * sum_i a^(k-1-i) b^i with diff = a - b (given exactly by the caller when it
    knows it: no cancellation when a - b is tiny against a)."""
    if k <= 1:
        return (a - b if diff is None else diff) * np.ones_like(a)
    total, power = a + b, b  # Horner's first round, without the arrays of ones
    for _ in range(k - 2):
        power = power * b
        total = total * a + power
    return (a - b if diff is None else diff) * total


def _newton(x: np.ndarray, residual, scale: np.ndarray, lo, hi, side: float) -> np.ndarray:
    """Vectorised Newton on the entries still moving: ``residual(x, idx)`` returns (value, slope) at
    x[idx], the value monotone with the iterates coming from ``side`` (+1: from above, a convex
    increasing value; -1: from below, a concave one), so they approach the root without crossing it
    in exact arithmetic; steps are clipped to [lo, hi] (arrays or scalars, full length) and an entry
    stops once its step is below 1e-14 of its ``scale``, once its value has crossed to the other
    side (the root, to the rounding of the value), once a round leaves it where it was (clipped at a
    bound: every later round would too), or after 60 rounds."""
    idx = np.arange(x.size)
    lo, hi = np.broadcast_to(lo, x.shape), np.broadcast_to(hi, x.shape)
    for _ in range(60):
        if idx.size == 0:
            break
        old = x[idx]
        value, slope = residual(old, idx)
        moving = slope > 0
        step = np.where(moving, value / np.where(moving, slope, 1.0), 0.0)
        new = np.clip(old - step, lo[idx], hi[idx])
        x[idx] = new
        # an entry held where it was (at a bound, the step pointing out) would repeat the same
        # round forever: it stops, as one whose step is below the tolerance
        idx = idx[moving & (np.abs(step) > 1e-14 * scale[idx]) & (new != old) & (side * value > 0.0)]
    return x


def _span_midpoint(mass: np.ndarray, width: np.ndarray, k: int) -> np.ndarray | None:
    """The midpoint c of the span [c - width / 2, c + width / 2] whose a^k - b^k is ``mass``
    (float64 arrays; the root for c >= 0), in closed form for k <= 4 (None above): a^k - b^k is
    2 c d, d (3 c^2 + d^2 / 4) and 4 d c^3 + d^3 c for k = 2, 3, 4 (d = width); k = 4 by
    Cardano's formula in the form without cancellation, c = 2 R t^2 / (t^4 + t^2 w + w^2) with
    w = d^2 / 12, R = mass / (8 d), t^3 = R + sqrt(R^2 + w^3).  Entries where it is not finite
    (d = 0, overflow) are NaN: the callers keep their own start there."""
    if k > 4 or k < 2:
        return None
    with np.errstate(all="ignore"):
        if k == 2:
            mid = mass / (2.0 * width)
        elif k == 3:
            mid = np.sqrt(np.maximum(mass / width - 0.25 * width * width, 0.0) / 3.0)
        else:
            w = width * width / 12.0
            r = mass / (8.0 * width)
            t2 = np.cbrt(r + np.sqrt(r * r + w * w * w)) ** 2
            mid = 2.0 * r * t2 / (t2 * t2 + t2 * w + w * w)
    return np.where(np.isfinite(mid), mid, np.nan)


def _passed_mass(prefix: np.ndarray, mass: np.ndarray, base: float, k: int) -> np.ndarray:
    """u in [0, top_n - top] with (u + top)^k - (u + base)^k = prefix, elementwise: Newton from
    above (the left side is convex and increasing in u; u = 0 where top = base or k = 1).  The
    passed mass is at most the q-mass walked before the token (top_n - top, top_n = base + the
    game's mass): the bound keeps the start finite where the slope at 0 is tiny (a token of
    q ~ 1e-50 with k = 8 would otherwise start Newton near 1e40 and overflow the powers); a target
    outside the walk's reach clips there (the coin is then clipped and the plan uncertified)."""
    if k == 1:
        return np.zeros_like(mass)
    top = base + mass
    slope0 = k * _power_difference(top, np.full_like(top, base), k - 1, mass)
    start = np.maximum(prefix - _power_difference(top, np.full_like(top, base), k, mass), 0.0)
    u = np.divide(start, slope0, out=np.zeros_like(top), where=slope0 > 0)
    mid = _span_midpoint(prefix, mass, k)
    if mid is not None:  # the closed form, moved up by 2^-46 of its scale: still above the root
        with np.errstate(invalid="ignore"):
            closed = mid - base - 0.5 * mass + 2.0**-46 * (np.abs(mid) + mass + base)
            u = np.where(closed < u, np.maximum(closed, 0.0), u)  # (NaN: the tangent's start)
    walked = np.maximum(top[-1] - top, 0.0) if top.size else top
    np.minimum(u, walked, out=u)

    def residual(x, idx):
        hi, lo, gap = x + top[idx], x + base, mass[idx]
        return _power_difference(hi, lo, k, gap) - prefix[idx], k * _power_difference(hi, lo, k - 1, gap)

    return _newton(u, residual, top, 0.0, walked, 1.0)


def _taken_mass(qs: np.ndarray, target: np.ndarray, u: np.ndarray, top: np.ndarray, base: float, k: int) -> np.ndarray:
    """delta = e q in [0, q] with PD(a, a - delta) + PD(c + q - delta, c) = target, a = u + top,
    c = u + base (the walk's law at one token given its passed mass u; PD(x, y) = x^k - y^k).

    Where q is not tiny against u + top, delta = q - (u_{j-1} - u_j) (the passed mass grows by what
    is not taken); elsewhere that difference cancels, and delta is the root found by Newton from
    delta = 0 (the left side is concave and increasing in delta, so Newton climbs to the root)."""
    if k == 1:
        return qs.copy()
    delta = np.empty_like(qs)
    delta[1:] = qs[1:] - (u[:-1] - u[1:])
    delta[0] = qs[0]
    tiny = np.flatnonzero(qs < 1e-6 * (u + top))
    if tiny.size:
        a, c, qt, want = u[tiny] + top[tiny], u[tiny] + base, qs[tiny], target[tiny]

        def residual(d, idx):
            ai, ci, qi = a[idx], c[idx], qt[idx]
            value = _power_difference(ai, ai - d, k, d) + _power_difference(ci + qi - d, ci, k, qi - d) - want[idx]
            return value, k * _power_difference(ai - d, ci + qi - d, k - 1, ai - ci - qi)

        delta[tiny] = _newton(np.zeros_like(qt), residual, qt, 0.0, qt, -1.0)
    return delta


def _prefix_cut(ps: np.ndarray, qs: np.ndarray, k: int):
    """The closed form's prefixes for p and q in p/q ascending order (``ps``, ``qs``: float64 (n,)):
    (P, Q, min(Q, 1), cut, m) with P[j], Q[j] the masses of the first j tokens ((n + 1,), P[0] =
    Q[0] = 0), cut[j] = P[j] + 1 - min(Q[j], 1)^k and m its first argmin: alpha* = cut[m], H* the
    first m tokens (``simlab.otlp.optimal_acceptance``; Hu et al. ICLR 2025).  The power by
    repeated products, as ``ot_walk`` and ``ot_exact`` both read it."""
    P, Q = np.zeros(ps.size + 1), np.zeros(qs.size + 1)
    np.cumsum(ps, out=P[1:])
    np.cumsum(qs, out=Q[1:])
    prefix_q = np.minimum(Q, 1.0)
    power = prefix_q
    for _ in range(k - 1):
        power = power * prefix_q
    cut = P + 1.0 - power
    return P, Q, prefix_q, cut, int(np.argmin(cut))


def _level(ps: np.ndarray, qs: np.ndarray, total: float, raise_low: bool, sums=None) -> tuple[np.ndarray, float]:
    """(max(p, lam q), lam) (raise_low) or (min(p, lam q), lam) with the level lam chosen so the sum
    is ``total``; ps, qs in r = p/q ascending order, float64 (n,).  lam is 0 (raise_low) or inf
    when p itself is returned (nothing raised or lowered).  ``sums``: (P, Q), the prefix sums of ps
    and qs from 0 (float64 (n + 1,)) where the caller has them (the same values)."""
    n = ps.size
    if n == 0:
        return ps.copy(), (0.0 if raise_low else np.inf)
    if sums is None:
        P = np.concatenate(([0.0], np.cumsum(ps)))
        Q = np.concatenate(([0.0], np.cumsum(qs)))
    else:
        P, Q = sums
    with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio, above every level
        r = ps / qs
    if raise_low:  # sum = lam Q_l + (P_n - P_l) for lam in [r_l, r_{l+1}] (l tokens raised)
        if total <= P[n]:
            return ps.copy(), 0.0
        with np.errstate(over="ignore"):  # a subnormal Q_l: an infinite level (the limit), as the ratios
            lam = (total - (P[n] - P[1:])) / Q[1:]
        l = int(np.argmax(lam <= np.concatenate((r[1:], [np.inf]))))  # the first level inside its bracket
        return np.maximum(ps, lam[l] * qs), float(lam[l])
    if total >= P[n]:  # sum = P_l + lam (Q_n - Q_l) for lam in [r_l, r_{l+1}] (l tokens kept whole)
        return ps.copy(), np.inf
    rest = np.maximum(Q[n] - Q[:n], np.finfo(float).tiny)
    lam = (total - P[:n]) / rest  # lam > r_l for every l below the answer, lam <= r_l at it
    fits = lam <= r
    l = int(np.argmax(fits)) if fits.any() else n - 1  # none: total = P_n up to rounding
    level = float(np.clip(lam[l], r[l - 1] if l else 0.0, r[l]))
    return np.minimum(ps, level * qs), level


def _walk(qs: np.ndarray, target: np.ndarray, base: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(coins, law) of the walk from the end of the arrays (walk order = reversed array order) in one
    game: the coins that select ``target``, clipped to [0, 1] (the first entry, reached last, takes
    what reaches it: coin 1), and the exact selection law of those coins."""
    mass = np.cumsum(qs)
    top = base + mass
    u = _passed_mass(np.cumsum(target), mass, base, k)
    u[-1] = 0.0
    e = np.clip(_taken_mass(qs, target, u, top, base, k) / qs, 0.0, 1.0)
    e[0] = 1.0
    taken = e * qs
    passed = qs - taken
    u = np.concatenate((np.cumsum(passed[::-1])[::-1][1:], [0.0]))  # u_j = sum over tokens walked before j
    return e, _power_difference(u + top, u + top - taken, k, taken) + _power_difference(u + passed + base, u + base, k, passed)


DIRECTIONS = (("down", "up"), ("down", "down"), ("up", "up"), ("up", "down"))
"""Walk directions (inside H*, outside H*) tried in this order until one is certified: "down" walks
from the highest p/q, "up" from the lowest (the best value is kept when none is)."""


class _WalkPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        full = bool((q > 0).all())  # no support to gather (the common case)
        support = None if full else np.flatnonzero(q > 0)
        with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio still sorts last
            # tied ratios in whatever order the (unstable) sort leaves them: the coins are solved
            # for the order walked and the law recomputed from them, so the rule is lossless in
            # any order, and alpha* (the cut below) does not depend on it
            order = np.argsort(p / q) if full else support[np.argsort(p[support] / q[support])]
        ps, qs = p[order], q[order]
        P, Q, prefix_q, cut, m = _prefix_cut(ps, qs, k)
        inside_mass = prefix_q[m] ** k
        outside_mass = prefix_q[-1] ** k - inside_mass  # rows with a child outside H* (1 - F(H*) up to sum(q) rounding)
        inside = _level(ps[:m], qs[:m], inside_mass, True, sums=(P[: m + 1], Q[: m + 1]))[0]
        target = np.concatenate((inside, _level(ps[m:], qs[m:], outside_mass, False)[0]))
        self.alpha_star = float(np.clip(cut[m], 0.0, 1.0))
        self.order, self.split = order, m
        self.rank = np.full(p.size, -1, dtype=np.int64)
        self.rank[order] = np.arange(order.size)
        best, walked = None, {}  # each part's walk in each direction computed once
        for directions in DIRECTIONS:
            coins, mu = np.ones(order.size), np.zeros(order.size)
            for part, base, way in ((slice(0, m), 0.0, directions[0]), (slice(m, order.size), float(prefix_q[m]), directions[1])):
                if part.stop > part.start:
                    if (part.start, way) not in walked:
                        flip = slice(None, None, -1) if way == "up" else slice(None)
                        e, law = _walk(qs[part][flip], target[part][flip], base, k)
                        walked[part.start, way] = e[flip], law[flip]
                    coins[part], mu[part] = walked[part.start, way]
            value = float(np.minimum(mu, ps).sum())
            if best is None or value > best[0]:
                best = (value, directions, coins, mu)
            if abs(value - self.alpha_star) <= CERTIFY_TOL:
                break
        self.value, self.directions, coins, mu = best
        self.coin = np.zeros(p.size)
        self.coin[order] = coins
        self.mu = np.zeros(p.size)
        self.mu[order] = mu
        self.accept = (p > 0).astype(np.float64)  # min(1, p / mu): 1 where mu underflowed to 0 < p
        with np.errstate(over="ignore"):  # a subnormal mu: p / mu = inf, then 1
            np.divide(p, self.mu, out=self.accept, where=self.mu > 0)
        np.minimum(self.accept, 1.0, out=self.accept)
        self.excess = float(positive_part(p - self.mu).sum())
        if self.excess == 0.0:  # mu = p: a selected child is always accepted
            self.accept[self.mu > 0] = 1.0

    @property
    def certified(self) -> bool:
        """True when the walk's acceptance equals alpha* (no coin was clipped): the plan is an
        optimal coupling; False: lossless but below the optimum by ``alpha_star - value``."""
        return abs(self.value - self.alpha_star) <= CERTIFY_TOL

    @cached_property
    def correction(self) -> np.ndarray:
        """R = norm((p - mu)_+), float64 (V,); p itself when that mass is 0 (``residual``'s
        convention: a rejection then has probability 0 in exact arithmetic, and a row that reaches
        it in floating point, a selected token whose mu underflowed to 0 = p, still gets a law)."""
        return residual(self.p, self.mu)

    def _draws(self, children: np.ndarray) -> np.ndarray:
        """The game's children in walk order."""
        outside = self.rank[children] >= self.split
        draws = children[outside] if outside.any() else children
        sign = -1 if self.directions[1 if outside.any() else 0] == "down" else 1
        return draws[np.argsort(sign * self.rank[draws], kind="stable")]

    def _selection(self, children: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens, P(selected)) over the game's children in walk order (copies kept)."""
        draws = self._draws(children)
        take = self.coin[draws].copy()
        take[-1] = 1.0
        reach = np.concatenate(([1.0], np.cumprod(1.0 - take[:-1])))
        return draws, reach * take

    def _accepted(self, children: np.ndarray) -> tuple[np.ndarray, float]:
        """P(output = x_j and accepted) per child (summed over copies), and P(rejection)."""
        draws, sel = self._selection(children)
        acc = sel * self.accept[draws]
        per_child = ((children[:, None] == draws[None, :]) * acc[None, :]).sum(axis=1)
        return per_child, max(0.0, 1.0 - float(acc.sum()))

    def _children_mass(self, children):
        per_child, reject = self._accepted(children)
        return per_child + reject * self.correction[children] if reject > 0.0 else per_child

    def _law(self, children):
        draws, sel = self._selection(children)
        acc = sel * self.accept[draws]
        reject = max(0.0, 1.0 - float(acc.sum()))
        law = reject * self.correction if reject > 0.0 else np.zeros_like(self.p)
        np.add.at(law, draws, acc)
        return law

    def _draw(self, children, rng):
        draws = self._draws(children)
        chosen = draws[-1]
        for token in draws[:-1]:
            if accept_draw(rng, self.coin[token], 1.0):
                chosen = token
                break
        if (self.excess == 0.0 and self.mu[chosen] > 0.0) or accept_draw(rng, self.p[chosen], self.mu[chosen]):
            return int(chosen)
        return sample_categorical(self.correction, rng)

    def acceptance_formula(self) -> float:
        if not self.certified:
            raise ValueError(
                f"method: the walk is not certified optimal here (sum min(mu, p) = {self.value!r} < alpha* = "
                f"{self.alpha_star!r}); its acceptance needs 'enumerate'"
            )
        return self.value


@dataclass(frozen=True)
class OTWalk(NodeVerifier):
    """The OT walk (module docstring): selection by a coin walk down the p/q order, then
    speculative sampling of the selection law against p; lossless for i.i.d. children, optimal
    (acceptance alpha*) wherever its plan is ``certified``.  O(V log V) per node, O(k log k) per
    child tuple for ``children_mass``, O(V) for the whole law."""

    name = "ot_walk"
    label = "OT walk"
    ot_based = True
    speculative_at_one = True

    def _plan(self, p, q, k):
        return _WalkPlan(self, p, q, k)
