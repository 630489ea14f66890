"""P(all k children lie in H) for every prefix H of an ordered vocabulary, drafting without replacement.

The dual of the OT problem (``simlab.otlp``) needs the containment functional
F(H) = Q(all k drafted children lie in H) on the n + 1 prefixes H_0 = {}, H_1, ..., H_n of the
tokens with q > 0 in p/q ascending order.  With i.i.d. children F(H) = q(H)^k.  Without
replacement (X_i ~ q^(i-1), the drafted token removed and q renormalised) F has no product
form; three methods compute it (``prefix_containment(..., method=)``):

* ``"enumerate"`` - every ordered tuple of k distinct tokens with its probability
  (``simlab.drafting.child_tuples``: the remaining mass summed over the undrawn tokens, never
  1 - drawn mass), each tuple counted in every prefix that holds its last-ranked token.  Exact
  to the rounding of its sums (2e-13 at 250,000 tuples); n! / (n - k)! tuples, limited to
  ``simlab.drafting.MAX_ENUMERATED_TUPLES``.
* ``"clocks"`` - exponential clocks (the lab's derivation): F(H) as an integral over the first ring of the
  complement's clocks, a trapezoid rule in log t on a grid shared by all prefixes, O(n k G) for G
  grid points; within 2e-14 of ``"enumerate"`` in the tests, a tiny F keeps its relative accuracy.
  Derivation, error bounds, accuracy and cost: ``docs/derivations/containment.md``.

* ``"pairs"`` - k <= 2 only, in closed form from cumulative sums, O(n); absolute (not relative)
  accuracy, every mass a normal float after rescaling (formula: ``docs/derivations/containment.md``).

alpha* needs F only beside 1 (absolute accuracy) and only the least p(H_j) + 1 - F(H_j): the clocks
with ``absolute=True`` start their grid at ``absolute_left(k)`` (where the integrand's remaining mass
is below ``TAIL``: 92 grid points instead of 254 at k = 4), and ``prefix_minimum`` finishes only the
blocks of tokens that can hold that minimum (21 of 359 on benchmarks/test_alpha_star.py's pair at
n = 128,000, k = 4).

Sources: Hu et al. 2025 (ICLR, arXiv 2502.18779): the subset form of alpha* and the statement
that it is computed efficiently for both drafting laws (no official code; the clock integral
is the lab's route).  Without replacement the minimising subset being a p/q prefix is checked
against all 2^V subsets in the tests.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammainccinv, logsumexp

from simlab.checks import check_bool, check_in_range, check_real_array
from simlab.drafting import Drafting, check_k, child_tuples

METHODS = ("clocks", "enumerate", "pairs")
STEP = 0.125
"""Trapezoid step in log t of the ``"clocks"`` method up to k = 32 (``default_step`` above)."""
LEFT_T = 1e-12
"""Left end of the t grid: below it P(N_H(t) >= k) <= (q t)^k / k!, taken as 0."""
TAIL = 1e-18
"""Mass allowed beyond the right end of the t grid (and, with ``absolute=True``, before its left end)."""
ABSOLUTE_LEFT_CAP = 0.05
"""Largest left end of the grid with ``absolute=True`` (``absolute_left``; reached from k = 9 on)."""
STEP_RANGE = (1e-3, 0.5)
"""Accepted trapezoid steps (0.5 is already off by 5e-7; 1e-3 costs 125x the default)."""
MAX_STATE_VALUES = 200_000_000
"""Most float64 tails the clocks will hold (1.6 GB): 2 k sqrt(n) G values for G grid points (k = 4,
n = 128,000: 0.3 M at the default grid, 34 M at float64's extremes)."""
MAX_GRID = 200_000
"""Most grid points the clocks will use (the default step needs 200-600; at most about 12,000 at
float64's extremes)."""


def default_step(k: int) -> float:
    """The ``"clocks"`` trapezoid step for k >= 1 children, a float in units of natural log time:
    ``STEP`` up to k = 32, ``STEP`` sqrt(32 / k) above (the integrand's strip narrows like
    1 / sqrt(k); derived and measured here, module docstring).  k is not checked (callers have)."""
    return STEP * min(1.0, math.sqrt(32.0 / k))


def prefix_containment(
    q_ordered, k: int, method: str = "clocks", step: float | None = None, absolute: bool = False
) -> np.ndarray:
    """F(H_j) = P(all k children, drafted from q without replacement, lie in the first j tokens).

    Args:
        q_ordered: float64 (n,), the draft masses of the tokens with q > 0 in the order whose
            prefixes are wanted (p/q ascending for alpha*); q need not be normalised (drafting
            renormalises), every entry must be finite and > 0.
        k: number of children, 1 <= k <= n.
        method: ``"clocks"`` (default; any n), ``"enumerate"`` (n! / (n - k)! tuples, at most
            ``simlab.drafting.MAX_ENUMERATED_TUPLES``) or ``"pairs"`` (k <= 2, closed form, O(n);
            absolute accuracy only).  See the module docstring.
        step: the ``"clocks"`` trapezoid step in log t (in ``STEP_RANGE``); None (default) for
            ``default_step(k)``.
        absolute: ``"clocks"`` only: True starts the grid at ``absolute_left(k)`` instead of
            ``LEFT_T`` (F within ``TAIL`` in absolute terms more, a tiny F no longer to relative
            accuracy; 2.4-4.3x fewer grid points at k = 3-8), for callers that need F only
            beside 1, as alpha* does.  False (default) keeps the module docstring's accuracy.

    Returns:
        float64 (n + 1,): F(H_0), ..., F(H_n); exactly 0 for j < k and exactly 1 at j = n.

    Raises:
        ValueError: ``q_ordered`` not a 1-D numeric array of finite positive values (or, for the
            enumeration, masses no float64 scale holds together), ``k`` outside 1..n, an
            unknown ``method``, a ``step`` outside ``STEP_RANGE`` (or one so small that the grid
            would exceed ``MAX_GRID`` points), a clock grid whose tails would exceed
            ``MAX_STATE_VALUES`` (named ``k``), too many tuples to enumerate, or ``"pairs"``
            with k > 2 (named ``k``) or with a mass below 2^-1022 of the largest.
    """
    q = check_real_array(q_ordered, "q_ordered")
    if q.ndim != 1 or q.size == 0 or not np.all(np.isfinite(q)) or np.any(q <= 0):
        raise ValueError("q_ordered: need a non-empty 1-D real array of finite masses > 0 (the tokens with q > 0)")
    k = check_k(k)
    n = q.size
    if k > n:
        raise ValueError(f"k: drafting {k} children without replacement needs at least {k} tokens with q > 0, got {n}")
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    step = default_step(k) if step is None else check_in_range(step, "step", *STEP_RANGE)
    absolute = check_bool(absolute, "absolute")
    if method == "pairs" and k > 2:
        raise ValueError(f"k: method='pairs' is the closed form for k <= 2 children, got k = {k}; use the clocks")
    out = np.zeros(n + 1)
    out[n] = 1.0
    if k == n:
        return out
    exponent = int(np.frexp(q.max())[1])  # drafting renormalises: a power of two rescales exactly
    scaled = np.ldexp(q, -exponent)  # the largest mass in [0.5, 1)
    if method == "enumerate":
        with np.errstate(over="ignore"):
            finite = np.isfinite(q.sum())
        if not finite:
            if np.any(scaled == 0.0):
                raise ValueError("q_ordered: the masses span more than float64's range (no scale holds them all); use the clocks")
            q = scaled
        tuples, probs = child_tuples(q, k, Drafting.WITHOUT_REPLACEMENT)
        last = tuples.max(axis=1)  # the tuple lies in H_j iff its last-ranked token is below j
        out[1:] = np.cumsum(np.bincount(last, weights=probs, minlength=n))
        out[n] = 1.0
        out[:k] = 0.0
        return out
    if method == "pairs" and k == 2:
        if scaled.min() < np.finfo(np.float64).tiny:
            raise ValueError(
                "q_ordered: method='pairs' needs every mass within 2^-1022 of the largest (normal floats); use the clocks"
            )
        return pairs_containment(scaled)
    if k == 1:  # one child: F(H) = q(H) / q(V), no integral needed
        mass = np.cumsum(scaled)
        out[1:n] = mass[:-1] / mass[-1]  # each a ratio of sums to the whole: never above 1
        return out
    left = math.log(absolute_left(k) if absolute else LEFT_T)
    out[k:n] = _contained(_log_masses(q, scaled, exponent), k, step, left)[k:n]
    out[:k] = 0.0
    return out


def prefix_minimum(p_ordered, q_ordered, k: int, absolute: bool = False) -> float:
    """min over j = 0..n of P_j + 1 - F(H_j), P_j the sum of the first j entries of ``p_ordered``
    and F ``prefix_containment(q_ordered, k, absolute=absolute)``: alpha* without replacement
    before its clip to [0, 1] when the order is p/q ascending (``simlab.otlp.optimal_acceptance``).

    The clocks' final pass (module docstring) runs only over the blocks of about sqrt(n) tokens
    that can hold the minimum: F at every block's start comes from the tails before the block, and
    within a block, P rises and F rises, so P_j + 1 - F(H_j) >= P(first of the block) + 1 -
    F(start of the next block); a block whose bound lies above the least value at the blocks'
    starts (by more than 1e-13, F's rounding) is skipped.  The value agrees with the minimum over
    ``prefix_containment``'s F to 1e-14 in the tests (the same arithmetic on the prefixes it
    finishes; F at the blocks' starts from the tails before them).  k = 1, k >= n and fewer than
    three blocks take ``prefix_containment`` whole.

    Args:
        p_ordered: float64 (n,), finite masses >= 0 (the target's, in the same order).
        q_ordered, k, absolute: as in ``prefix_containment`` (the clocks, default step).

    Returns:
        float: the minimum (1 at H_0 = {} included).

    Raises:
        ValueError: ``p_ordered`` not a 1-D array of n finite values >= 0; the errors of
            ``prefix_containment`` for ``q_ordered``, ``k`` and ``absolute``.
    """
    q = check_real_array(q_ordered, "q_ordered")
    if q.ndim != 1 or q.size == 0 or not np.all(np.isfinite(q)) or np.any(q <= 0):
        raise ValueError("q_ordered: need a non-empty 1-D real array of finite masses > 0 (the tokens with q > 0)")
    p = check_real_array(p_ordered, "p_ordered")
    if p.shape != q.shape or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"p_ordered: need {q.size} finite masses >= 0 (one per entry of q_ordered), got shape {p.shape}")
    p_prefix = np.concatenate(([0.0], np.cumsum(p)))
    k = check_k(k)
    absolute = check_bool(absolute, "absolute")
    n = q.size
    block = max(1, int(math.isqrt(n)))
    if k == 1 or k >= n or -(-n // block) < 3:  # k > n: prefix_containment's error
        return float(np.min(p_prefix + 1.0 - prefix_containment(q, k, absolute=absolute)))
    exponent = int(np.frexp(q.max())[1])
    log_q = _log_masses(q, np.ldexp(q, -exponent), exponent)
    left = math.log(absolute_left(k) if absolute else LEFT_T)
    contained = _contained(log_q, k, default_step(k), left, p_prefix=p_prefix)
    contained[:k] = 0.0
    contained[n] = 1.0
    return float(np.nanmin(p_prefix + 1.0 - contained))


def _blocks_to_finish(p_prefix: np.ndarray, first: np.ndarray, at_start: np.ndarray) -> np.ndarray:
    """The blocks that can hold the least P_j + 1 - F(H_j) (``prefix_minimum``), int64: block m
    (prefixes first[m] + 1 .. first[m + 1]) is bounded below by P(first[m] + 1) + 1 - F at the next
    block's start (1 after the last), and kept where that is within 1e-13 of the least value at
    the blocks' starts, H_0 = {} (1) and H_n (P_n)."""
    at_end = np.append(at_start[1:], 1.0)
    best = min(1.0, float(np.min(p_prefix[first] + 1.0 - at_start)), float(p_prefix[-1]))
    bound = p_prefix[first + 1] + 1.0 - at_end
    return np.flatnonzero(bound <= best + 1e-13)


def _log_masses(q: np.ndarray, scaled: np.ndarray, exponent: int) -> np.ndarray:
    """The normalised log masses of q (``scaled`` = q 2^-exponent, its largest in [0.5, 1))."""
    # log masses, so no mass underflows whatever its scale (the rescaled mass where it is still a
    # normal float: the logs of masses near 1 round least; a subnormal one would have lost bits)
    exact = scaled >= np.finfo(np.float64).tiny
    log_q = np.where(exact, np.log(np.where(exact, scaled, 1.0)), np.log(q) - exponent * math.log(2.0))
    log_q -= logsumexp(log_q)
    return log_q


def pairs_containment(q_ordered: np.ndarray) -> np.ndarray:
    """F(H_j), j = 0..n, for k = 2 children in closed form (module docstring, ``"pairs"``):
    ``prefix_containment(q_ordered, 2, method="pairs")`` without its checks, for a caller whose
    masses are validated already.

    Args:
        q_ordered: float64 (n,), n >= 3, in prefix order: masses that are normal floats (>= 2^-1022)
            with a finite sum (a ratio q_i / (1 - q_i) must not overflow).

    Returns:
        float64 (n + 1,), exactly 0 for j < 2 and 1 at j = n.  Nothing is checked (no errors raised).
    """
    n = q_ordered.size
    before = np.empty(n + 1)  # before[j]: the mass of the first j tokens
    before[0] = 0.0
    np.cumsum(q_ordered, out=before[1:])
    after = np.empty(n + 1)  # after[n - j]: the mass of the last j tokens (the mass from n - j on)
    after[0] = 0.0
    np.cumsum(q_ordered[::-1], out=after[1:])
    after = after[::-1]
    others = np.add(before[:n], after[1:])  # 1 - q_i, as the sum of the other masses (> 0: n >= 2 normal masses)
    odds = np.divide(q_ordered, others, out=others)  # at most 2^1022: no overflow
    np.cumsum(odds, out=odds)
    out = np.empty(n + 1)
    body = out[2:n]
    np.multiply(after[2:n], odds[1 : n - 1], out=body)  # lam sum_(i < j) q_i / (1 - q_i)
    np.subtract(before[2:n], body, out=body)
    body *= 1.0 / before[n]
    np.maximum(body, 0.0, out=body)
    np.minimum(body, 1.0, out=body)
    out[:2] = 0.0
    out[n] = 1.0
    return out


def absolute_left(k: int) -> float:
    """The left end t0 of the clocks' grid with ``absolute=True``, for k >= 2 children (a float, in
    units of time at total rate 1): the largest t0 <= ``ABSOLUTE_LEFT_CAP`` with
    t0^(k + 1) / (k + 1)! <= ``TAIL``.  Below t0 the integrand adds at most that: P(N_H(t) >= k) is
    at most the sum over k-sets of H of the product of their ring probabilities 1 - e^(-q_i t)
    <= q_i t, which is at most (sum_i q_i t)^k / k! <= t^k / k! (Maclaurin), and the density
    lam e^(-lam t) <= 1; the integral of t^k / k! from 0 to t0 is t0^(k + 1) / (k + 1)!.  t0 = 7.0e-5
    at k = 3, 6.6e-4 at k = 4, 0.041 at k = 8 (against ``LEFT_T`` = 1e-12)."""
    return min(ABSOLUTE_LEFT_CAP, math.exp((math.log(TAIL) + math.lgamma(k + 2)) / (k + 1)))


def _left_lattice(log_u0: np.ndarray, step: float, series: bool) -> np.ndarray:
    """step sum_(i >= 1) u_i e^(-u_i), u_i = u0 e^(-i step): the density's lattice sum left of the
    grid, float64 like ``log_u0``.  ``series`` False: u e^(-u) taken as u (a geometric series; u0 <=
    1e-12 at ``LEFT_T``, 1e-12 relative); True: the series sum_r (-1)^r / r! u0^(r + 1) /
    (e^((r + 1) step) - 1), 13 terms, for u0 <= ``ABSOLUTE_LEFT_CAP`` (the last term below 1e-20)."""
    with np.errstate(under="ignore"):
        u0 = np.exp(log_u0)
    if not series:
        return step * u0 / math.expm1(step)
    total = np.zeros_like(u0)
    power = u0.copy()
    for r in range(13):
        total += ((-1) ** r / math.factorial(r) / math.expm1((r + 1) * step)) * power
        power *= u0
    return step * total


def _grid(log_q: np.ndarray, k: int, step: float, left: float) -> np.ndarray:
    """The shared grid in s = log t (spaced by ``step``) from ``left`` (log ``LEFT_T``, or log
    ``absolute_left(k)``) to the tail bound
    (module docstring); float64 (G,).  Kept in logs: the k-th ring may lie beyond float64 times.

    Raises:
        ValueError: ``step: ...`` when the grid would need more than ``MAX_GRID`` points (a
            small step with masses outside the k - 1 largest far below the rest).
    """
    smallest = np.sort(log_q)[: log_q.size - k + 1]  # outside the k - 1 largest: every ring up to the k-th runs at rate >= rest
    log_rest = float(logsumexp(smallest))
    x = 1.01 * float(gammainccinv(k, TAIL))  # P(Gamma(k, 1) > x) = TAIL, with 1% to spare
    count = (math.log(x) - log_rest - left) / step
    if count > MAX_GRID:
        raise ValueError(
            f"step: the masses outside the {k - 1} largest sum to e^{log_rest:.4g} of the total: the clocks' grid "
            f"would need {count:.3g} points at step {step}; use a larger step or method='enumerate'"
        )
    return left + step * np.arange(int(math.ceil(count)) + 1)


def _times_rates(log_rates: np.ndarray, s: np.ndarray) -> np.ndarray:
    """rate x t for every rate (rows) and grid point (columns), float64 (len(rates), G): formed
    from logs, so neither factor needs to be a float64 (a zero rate gives 0).  Capped at e^700:
    beyond it e^(-u) and u e^(-u) are 0 in float64 as they are for the true u."""
    u = np.add.outer(log_rates, s)
    np.minimum(u, 700.0, out=u)
    return np.exp(u, out=u)


def _contained(log_q: np.ndarray, k: int, step: float, left: float, p_prefix: np.ndarray | None = None) -> np.ndarray:
    """F(H_j) for j = 0..n by the clock integral (module docstring), from the normalised log
    masses; float64 (n + 1,) (entries j < k are not meaningful: the caller sets them to 0).
    With ``p_prefix`` (float64 (n + 1,), P_j) only the blocks that can hold the least
    P_j + 1 - F(H_j) are finished (``prefix_minimum``); the other entries are NaN.

    The states are the tails D_m(t) = P(N_H(t) > m), m = 0..k-1, which only grow as tokens join
    H: a token ringing by t with probability r moves D_m by r (D_(m-1) - D_m) (D_(-1) = 1), so a
    small tail accumulates small terms (no 1 - tiny rounding), and F is summed directly,
    F(H) = int lam e^(-lam t) D_(k-1)(t) dt, never as 1 - (1 - F)."""
    n = log_q.size
    s = _grid(log_q, k, step, left)
    series = left != math.log(LEFT_T)
    # log of the mass outside H_j, summed over it from the end: log-sum-exp kept exact at any scale
    log_lam = np.concatenate((np.logaddexp.accumulate(log_q[::-1])[::-1], [-np.inf]))
    block = max(1, int(math.isqrt(n)))
    blocks = -(-n // block)
    if 2 * k * blocks * s.size > MAX_STATE_VALUES:
        raise ValueError(
            f"k: the clocks for {k} children on this grid ({s.size} points) would hold {2 * k * blocks * s.size:.3g} "
            f"float64 tails, above {MAX_STATE_VALUES:.3g}; use a larger step, fewer children or method='enumerate'"
        )
    padded = np.full(blocks * block, -np.inf)  # a zero mass never rings: the padding leaves the tails unchanged
    padded[:n] = log_q
    padded = padded.reshape(blocks, block)
    work = np.empty((blocks, s.size))

    def ring(tails: np.ndarray, log_masses: np.ndarray, work: np.ndarray = work) -> None:
        # tails (k, blocks, G): P(N > m); one more token rings by t with probability 1 - e^(-q t)
        rung = _times_rates(log_masses, s)
        np.negative(rung, out=rung)
        np.expm1(rung, out=rung)
        np.negative(rung, out=rung)
        for m in range(k - 1, 0, -1):
            np.subtract(tails[m - 1], tails[m], out=work)
            np.multiply(work, rung, out=work)
            tails[m] += work
        np.subtract(1.0, tails[0], out=work)
        np.multiply(work, rung, out=work)
        tails[0] += work

    products = np.zeros((k, blocks, s.size))  # each block's own tails
    for b in range(block):
        ring(products, padded[:, b])
    starts = np.zeros((k, blocks, s.size))  # the tails of the tokens before each block
    for j in range(1, blocks):  # P(N + N_b > m) = P(N_b > m) + sum_a P(N_b = a) P(N > m - a)
        prev, prod = starts[:, j - 1], products[:, j - 1]
        mass = np.empty((k, s.size))  # P(N_b = a), a = 0..k-1: differences of the block's tails
        np.subtract(1.0, prod[0], out=mass[0])
        np.subtract(prod[:-1], prod[1:], out=mass[1:])
        for m in range(k):
            starts[m, j] = prod[m] + np.einsum("ig,ig->g", mass[: m + 1], prev[m::-1])
    contained = np.empty(n + 1)
    contained[0] = 0.0
    # The lattice sum of the density past the grid's end: point by point where u >= 1 at the end
    # (the sum is then small; at most log(745) / step more points, u e^(-u) is 0 beyond u = 745),
    # else as 1 minus the lattice sum left of the grid (``_left_lattice``) minus the grid's own sum.
    extra = s[-1] + step * np.arange(1, int(math.ceil(math.log(745.0) / step)) + 1)

    with np.errstate(under="ignore"):  # the density's lattice sum left of the grid, for every prefix
        left_sums = _left_lattice(log_lam + s[0], step, series)

    def value(log_rate: np.ndarray, last: np.ndarray, left_sum: np.ndarray) -> np.ndarray:
        # F of the prefixes whose outside mass is e^log_rate, from their tails P(N_H > k - 1) (rows)
        # lam e^(-lam t) dt = u e^(-u) ds with u = lam t: the density in s, times the step
        u = _times_rates(log_rate, s)
        density = np.exp(-u) * u
        density *= step
        # the lattice sum of the density past the grid's end (the comment above)
        past = np.empty(log_rate.size)
        far = log_rate + s[-1] > 0.0
        if far.any():
            v = _times_rates(log_rate[far], extra)
            past[far] = step * (np.exp(-v) * v).sum(axis=1)
        near = ~far  # the lattice sum of u e^(-u) over all s is 1 (Poisson summation: error ~e^(-pi^2 / step))
        past[near] = (1.0 - left_sum[near]) - density[near].sum(axis=1)
        # weighted by P(N_H >= k) at the grid's end (it only grows past it): a lower bound, off by
        # at most TAIL, that keeps a tiny F tiny when H's own k-th ring comes later still
        return np.einsum("bg,bg->b", density, last) + past * last[:, -1]

    chosen = np.arange(blocks)
    if p_prefix is not None:  # F at each block's start, then only the blocks whose bound can win
        first = chosen * block  # block m holds the prefixes first[m] + 1 .. first[m] + block
        at_start = value(log_lam[first], starts[k - 1], left_sums[first])
        at_start[first < k] = 0.0
        chosen = _blocks_to_finish(p_prefix, first, at_start)
        contained[1:] = np.nan
        contained[first] = at_start
        contained[n] = 1.0
        starts = np.ascontiguousarray(starts[:, chosen])
        padded = padded[chosen]
        work = np.empty((chosen.size, s.size))
    tails = starts
    for b in range(block):
        ring(tails, padded[:, b], work)
        index = chosen * block + b + 1  # prefix H_index ends with this token
        valid = index <= n
        at = np.minimum(index, n)
        contained[index[valid]] = value(log_lam[at], tails[k - 1], left_sums[at])[valid]
    return contained
