"""P(all k children lie in H) for every prefix H of an ordered vocabulary, drafting without replacement.

The dual of the OT problem (``simlab.otlp``) needs the containment functional
F(H) = Q(all k drafted children lie in H) on the n + 1 prefixes H_0 = {}, H_1, ..., H_n of the
tokens with q > 0 in p/q ascending order.  With i.i.d. children F(H) = q(H)^k.  Without
replacement (X_i ~ q^(i-1), the drafted token removed and q renormalised) F has no product
form; two methods compute it (``prefix_containment(..., method=)``):

* ``"enumerate"`` - every ordered tuple of k distinct tokens with its probability
  (``simlab.drafting.child_tuples``: the remaining mass summed over the undrawn tokens, never
  1 - drawn mass), each tuple counted in every prefix that holds its last-ranked token.  Exact
  to the rounding of its sums (2e-13 at 250,000 tuples); n! / (n - k)! tuples, limited to
  ``simlab.drafting.MAX_ENUMERATED_TUPLES``.
* ``"clocks"`` - exponential clocks (derived here).  Give token i an independent clock
  E_i ~ Exp(q_i); the order in which the clocks ring is a draw without replacement from q (the
  race of exponentials: the next token to ring is i with probability q_i / (mass still
  silent), and memorylessness restarts the race).  The first k rings all lie in H iff at least
  k clocks of H ring before the first clock of the complement, which rings at T ~ Exp(lam),
  lam = q(V minus H), independent of H's clocks.  So

      F(H) = int_0^inf lam e^(-lam t) P(N_H(t) >= k) dt,

  N_H(t) the number of H's clocks rung by t: a Poisson-binomial count with success
  probabilities 1 - e^(-q_i t).  F is summed directly, never as 1 - (1 - F) (that form
  drifted by 1.6e-12 at n = 128,000 with many tiny masses, F below 0).  The integral is a
  trapezoid rule in s = log t on a grid shared by all prefixes, from ``LEFT_T`` (below it
  P(N_H(t) >= k) <= (q t)^k: nothing to add) to t_hi, the time by which the k-th ring overall
  has passed with probability 1 - ``TAIL`` (it is stochastically below a Gamma(k, r) time, r the
  mass outside the k - 1 largest q).  Past t_hi the rule adds the lattice sum of the density times
  P(N_H(t_hi) >= k) (it only grows past t_hi, to at most 1: a lower bound, off by at most
  P(T > t_hi, N_H(t_hi) < k) <= P(fewer than k rings by t_hi) <= ``TAIL``), summed point by point
  where the density is small there, else as 1 minus the rest (the density u e^(-u), u = lam t,
  sums to 1 over any lattice in s to within about e^(-pi^2 / step), Poisson summation).  The
  integrand is analytic in a strip around the real s axis and decays at both ends, so the rule
  converges geometrically in 1 / step; the strip narrows like 1 / sqrt(k) (N_H's k-th ring is
  sharp in log t), so the default step is ``STEP`` up to k = 32 and ``STEP`` sqrt(32 / k) above
  (``default_step``: the error stays below 1e-15 in the tests; ``STEP`` itself errs 2e-13 at
  k = 48, 4e-9 at k = 100).  q is normalised first (drafting renormalises; the time scale
  assumes a total of 1), in logs: every rate x time product is formed from log q and log t, so a
  tail of 5e-324 masses (low-temperature sampling) keeps its relative weights and a k-th ring
  beyond float64 times (t_hi up to e^1460) is still integrated: the grid then spans up to about
  12,000 points instead of 200-600, and a call costs 11-24 s at n = 32,000 and 45-112 s at
  n = 128,000 (k = 4) instead of 0.2 s and 0.8 s; the tails' memory (2 k sqrt(n) G values) is
  capped at ``MAX_STATE_VALUES``.  P(N_H(t) >= k) for every prefix and grid point comes from a
  recursion over the ordered tokens on the tails D_m = P(N > m), m < k (each token moves D_m
  toward D_(m-1) by its ring probability: tails only grow, small ones from small terms), run in
  blocks of about sqrt(n) tokens: each block's own tails, then the tails before each block
  (truncated convolutions), then each block again from its start.  O(n k G) arithmetic for G grid
  points (about 200-300 at k = 4); 0.17 s at n = 32,000 and 0.8 s at n = 128,000, k = 4, one
  thread (benchmarks/RESULTS.md).

  Accuracy: within 2e-14 of ``"enumerate"`` in the tests; every prefix is computed on its own, so
  F rises along the prefixes only to within an ulp or two.  A tiny F keeps its relative accuracy
  (a prefix of 20,000 masses of 1e-16: 4e-24 to 1e-15; two masses of 1e-20 before 100 of 0.01:
  2e-40 to 1e-13) except where H's own k-th ring lies far past t_hi, where it is a lower bound
  within ``TAIL``.  Masses below about 1e-300 of the largest enter through their logarithms'
  rounding (1e-13 relative), which moves F by up to about 3e-14 where the choice among such
  masses decides it (``k = 1`` is summed without logs).

Sources: Hu et al. 2025 (ICLR, arXiv 2502.18779): the subset form of alpha* and the statement
that it is computed efficiently for both drafting laws (no official code; the clock integral
is the lab's route).  Without replacement the minimising subset being a p/q prefix is checked
against all 2^V subsets in the tests.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammainccinv, logsumexp

from simlab.checks import check_in_range, check_real_array
from simlab.drafting import Drafting, check_k, child_tuples

METHODS = ("clocks", "enumerate")
STEP = 0.125
"""Trapezoid step in log t of the ``"clocks"`` method up to k = 32 (``default_step`` above)."""
LEFT_T = 1e-12
"""Left end of the t grid: below it P(N_H(t) >= k) <= (q t)^k / k!, taken as 0."""
TAIL = 1e-18
"""Mass allowed beyond the right end of the t grid."""
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


def prefix_containment(q_ordered, k: int, method: str = "clocks", step: float | None = None) -> np.ndarray:
    """F(H_j) = P(all k children, drafted from q without replacement, lie in the first j tokens).

    Args:
        q_ordered: float64 (n,), the draft masses of the tokens with q > 0 in the order whose
            prefixes are wanted (p/q ascending for alpha*); q need not be normalised (drafting
            renormalises), every entry must be finite and > 0.
        k: number of children, 1 <= k <= n.
        method: ``"clocks"`` (default; any n) or ``"enumerate"`` (n! / (n - k)! tuples, at most
            ``simlab.drafting.MAX_ENUMERATED_TUPLES``).  See the module docstring.
        step: the ``"clocks"`` trapezoid step in log t (in ``STEP_RANGE``); None (default) for
            ``default_step(k)``.

    Returns:
        float64 (n + 1,): F(H_0), ..., F(H_n); exactly 0 for j < k and exactly 1 at j = n.

    Raises:
        ValueError: ``q_ordered`` not a 1-D numeric array of finite positive values (or, for the
            enumeration, masses no float64 scale holds together), ``k`` outside 1..n, an
            unknown ``method``, a ``step`` outside ``STEP_RANGE`` (or one so small that the grid
            would exceed ``MAX_GRID`` points), a clock grid whose tails would exceed
            ``MAX_STATE_VALUES`` (named ``k``), or too many tuples to enumerate.
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
    if k == 1:  # one child: F(H) = q(H) / q(V), no integral needed
        mass = np.cumsum(scaled)
        out[1:n] = mass[:-1] / mass[-1]  # each a ratio of sums to the whole: never above 1
        return out
    # log masses, so no mass underflows whatever its scale (the rescaled mass where it is still a
    # normal float: the logs of masses near 1 round least; a subnormal one would have lost bits)
    exact = scaled >= np.finfo(np.float64).tiny
    log_q = np.where(exact, np.log(np.where(exact, scaled, 1.0)), np.log(q) - exponent * math.log(2.0))
    log_q -= logsumexp(log_q)
    out[k:n] = _contained(log_q, k, step)[k:n]
    out[:k] = 0.0
    return out


def _grid(log_q: np.ndarray, k: int, step: float) -> np.ndarray:
    """The shared grid in s = log t (spaced by ``step``) from log ``LEFT_T`` to the tail bound
    (module docstring); float64 (G,).  Kept in logs: the k-th ring may lie beyond float64 times.

    Raises:
        ValueError: ``step: ...`` when the grid would need more than ``MAX_GRID`` points (a
            small step with masses outside the k - 1 largest far below the rest).
    """
    smallest = np.sort(log_q)[: log_q.size - k + 1]  # outside the k - 1 largest: every ring up to the k-th runs at rate >= rest
    log_rest = float(logsumexp(smallest))
    x = 1.01 * float(gammainccinv(k, TAIL))  # P(Gamma(k, 1) > x) = TAIL, with 1% to spare
    count = (math.log(x) - log_rest - math.log(LEFT_T)) / step
    if count > MAX_GRID:
        raise ValueError(
            f"step: the masses outside the {k - 1} largest sum to e^{log_rest:.4g} of the total: the clocks' grid "
            f"would need {count:.3g} points at step {step}; use a larger step or method='enumerate'"
        )
    return math.log(LEFT_T) + step * np.arange(int(math.ceil(count)) + 1)


def _times_rates(log_rates: np.ndarray, s: np.ndarray) -> np.ndarray:
    """rate x t for every rate (rows) and grid point (columns), float64 (len(rates), G): formed
    from logs, so neither factor needs to be a float64 (a zero rate gives 0).  Capped at e^700:
    beyond it e^(-u) and u e^(-u) are 0 in float64 as they are for the true u."""
    u = np.add.outer(log_rates, s)
    np.minimum(u, 700.0, out=u)
    return np.exp(u, out=u)


def _contained(log_q: np.ndarray, k: int, step: float) -> np.ndarray:
    """F(H_j) for j = 0..n by the clock integral (module docstring), from the normalised log
    masses; float64 (n + 1,) (entries j < k are not meaningful: the caller sets them to 0).

    The states are the tails D_m(t) = P(N_H(t) > m), m = 0..k-1, which only grow as tokens join
    H: a token ringing by t with probability r moves D_m by r (D_(m-1) - D_m) (D_(-1) = 1), so a
    small tail accumulates small terms (no 1 - tiny rounding), and F is summed directly,
    F(H) = int lam e^(-lam t) D_(k-1)(t) dt, never as 1 - (1 - F)."""
    n = log_q.size
    s = _grid(log_q, k, step)
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

    def ring(tails: np.ndarray, log_masses: np.ndarray) -> None:
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
    # else as 1 minus the lattice sum left of LEFT_T (u < 1e-12 there: u e^(-u) = u to 1e-12
    # relative, a geometric series) minus the grid's own sum.
    extra = s[-1] + step * np.arange(1, int(math.ceil(math.log(745.0) / step)) + 1)
    tails = starts
    for b in range(block):
        ring(tails, padded[:, b])
        index = np.arange(blocks) * block + b + 1  # prefix H_index ends with this token
        valid = index <= n
        log_rate = log_lam[np.minimum(index, n)]
        # lam e^(-lam t) dt = u e^(-u) ds with u = lam t: the density in s, times the step
        u = _times_rates(log_rate, s)
        density = np.exp(-u) * u
        density *= step
        # the lattice sum of the density past the grid's end (the comment above)
        past = np.empty(blocks)
        far = log_rate + s[-1] > 0.0
        if far.any():
            v = _times_rates(log_rate[far], extra)
            past[far] = step * (np.exp(-v) * v).sum(axis=1)
        near = ~far  # the lattice sum of u e^(-u) over all s is 1 (Poisson summation: error ~e^(-pi^2 / step))
        with np.errstate(under="ignore"):
            before = step * np.exp(log_rate[near] + s[0]) / math.expm1(step)
        past[near] = (1.0 - before) - density[near].sum(axis=1)
        # weighted by P(N_H >= k) at the grid's end (it only grows past it): a lower bound, off by
        # at most TAIL, that keeps a tiny F tiny when H's own k-th ring comes later still
        value = np.einsum("bg,bg->b", density, tails[k - 1]) + past * tails[k - 1][:, -1]
        contained[index[valid]] = value[valid]
    return contained
