"""The optimal-transport LP of multi-draft verification and its closed-form optimum.

With k drafted children X ~ Q (i.i.d. q, or q without replacement) and target p, a verifier
is a coupling pi(x, y) of Q and p; it emits y given x with probability pi(x, y) / Q(x).  The
best acceptance is the OT problem with membership cost 1[y not in x]:

    alpha* = max_pi sum_{x, y in set(x)} pi(x, y)   s.t.  sum_y pi(x, y) = Q(x),  sum_x pi(x, y) = p(y).

``solve_ot_lp`` solves it with cvxpy (HiGHS) over the ordered child tuples of positive
probability; ``optimal_acceptance`` evaluates the dual (min-cut) closed form

    alpha* = min over token subsets H of [ p(H) + 1 - Q(all k drafts lie in H) ],

minimised over the prefixes of the tokens with q > 0 sorted by p/q ascending.
Sources: Sun et al. 2023 (SpecTr, the OT framing); Hu et al. 2025 (arXiv 2502.18779, the
subset form; no official code).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from simlab.checks import check_bool
from simlab.containment import pairs_containment, prefix_containment, prefix_minimum
from simlab.distributions import check_pair
from simlab.drafting import Drafting, check_k, child_tuples

MAX_LP_VARIABLES = 60_000
"""Largest coupling (number of child tuples x V) that ``solve_ot_lp`` will set up."""


@dataclass(frozen=True)
class OTSolution:
    """A solved OT LP.

    Attributes:
        value: the LP optimum, max P(Y in X), as the solver reports it (float; it can exceed the
            true optimum, even 1, by the solver's tolerance: 8e-8 seen on V = 4, k = 3;
            ``acceptance`` is the repaired coupling's own value).
        tuples: int64 (n, k), every ordered child tuple with Q(x) > 0.
        tuple_probs: float64 (n,), Q(x).
        coupling: float64 (n, V), pi(x, y) with exact marginals (rows sum to Q(x), columns
            to p(y), to rounding): the LP's solution after repair (see ``solve_ot_lp``).
    """

    value: float
    tuples: np.ndarray
    tuple_probs: np.ndarray
    coupling: np.ndarray

    @property
    def acceptance(self) -> float:
        """P(Y in X) under the repaired coupling (equal to ``value`` up to the LP tolerance)."""
        return float(np.sum(self.coupling * _membership(self.tuples, self.coupling.shape[1])))


def _membership(tuples: np.ndarray, vocab: int) -> np.ndarray:
    """Boolean (n, V): y in set(x)."""
    member = np.zeros((tuples.shape[0], vocab), dtype=bool)
    np.put_along_axis(member, tuples, True, axis=1)
    return member


def solve_ot_lp(p, q, k: int, replacement: bool = True) -> OTSolution:
    """Solve the OT LP that maximises P(Y in X) over couplings of the children's law and p.

    Args:
        p: target distribution, array-like (V,).
        q: draft distribution, array-like (V,).
        k: number of children (>= 1).
        replacement: True for i.i.d. children, False for drafting without replacement.

    Returns:
        ``OTSolution``.  The solver's coupling is repaired so that its marginals are exact:
        the accepted entries are clipped at 0 and scaled down where a row or column exceeds
        its marginal, and the remaining row and column mass is coupled independently.  The
        repair never lowers P(Y in X) by more than the solver tolerance, and makes the
        verifier built on it lossless to rounding.

    Raises:
        ValueError: invalid p, q or k; ``replacement`` not a bool; the coupling would exceed
            ``MAX_LP_VARIABLES``; the solver fails.
    """
    import cvxpy as cp  # imported on first use: it is slow to import

    p, q = check_pair(p, q)
    k = check_k(k)
    replacement = check_bool(replacement, "replacement")
    drafting = Drafting.IID if replacement else Drafting.WITHOUT_REPLACEMENT
    tuples, probs = child_tuples(q, k, drafting)
    n, vocab = tuples.shape[0], p.size
    if n * vocab > MAX_LP_VARIABLES:
        raise ValueError(
            f"k: the OT LP would have {n} x {vocab} = {n * vocab} variables, above the limit {MAX_LP_VARIABLES}; "
            "use optimal_acceptance for the value"
        )
    # The reduced (max-flow) form: only the accepted cells y in set(x) are variables, with
    # row sums <= Q(x) and column sums <= p(y); unmatched mass can always be coupled freely.
    rows = np.repeat(np.arange(n), k)
    cols = tuples.reshape(-1)
    flow = cp.Variable(rows.size, nonneg=True)
    row_sum = sp.csr_matrix((np.ones(rows.size), (rows, np.arange(rows.size))), shape=(n, rows.size))
    col_sum = sp.csr_matrix((np.ones(rows.size), (cols, np.arange(rows.size))), shape=(vocab, rows.size))
    problem = cp.Problem(cp.Maximize(cp.sum(flow)), [row_sum @ flow <= probs, col_sum @ flow <= p])
    problem.solve(solver=cp.SCIPY, scipy_options={"method": "highs"})  # HiGHS simplex: a vertex solution
    if problem.status != cp.OPTIMAL or flow.value is None:
        raise ValueError(f"p, q: the OT LP solver ended with status {problem.status!r}")
    matched = np.zeros((n, vocab))
    np.add.at(matched, (rows, cols), flow.value)
    coupling = _repair(matched, probs, p)
    return OTSolution(float(problem.value), tuples, probs, coupling)


def _repair(matched: np.ndarray, row_marginal: np.ndarray, col_marginal: np.ndarray) -> np.ndarray:
    """Turn an approximate accepted part into a coupling with exact marginals (see solve_ot_lp)."""
    matched = np.maximum(matched, 0.0)
    rows = matched.sum(axis=1)
    over = rows > row_marginal
    matched[over] *= (row_marginal[over] / rows[over])[:, None]
    cols = matched.sum(axis=0)
    over = cols > col_marginal
    matched[:, over] *= col_marginal[over] / cols[over]
    row_left = np.maximum(row_marginal - matched.sum(axis=1), 0.0)
    col_left = np.maximum(col_marginal - matched.sum(axis=0), 0.0)
    if row_left.sum() > 0.0:
        # Columns (the target law) come out exact; a row can differ from Q(x) only by the
        # rounding of sum(Q) - sum(p).
        matched += np.outer(row_left / row_left.sum(), col_left)
    return matched


_TINY = float(np.finfo(np.float64).tiny)
METHODS = ("fast", "reference")
"""``optimal_acceptance``'s methods with i.i.d. children (``"fast"`` is the default)."""


def optimal_acceptance(p, q, k: int, replacement: bool = True, method: str | None = None) -> float:
    """The optimal acceptance alpha* = min_H [p(H) + 1 - Q(all k drafts in H)] in closed form.

    The minimum is taken over H = the prefixes of the tokens with q > 0 sorted by p/q
    ascending (H = {} gives 1).  With i.i.d. children Q(all in H) = q(H)^k and the whole
    computation is one sort, O(V log V).  Without replacement Q(all k distinct draws in H) has
    no product form; ``simlab.containment.prefix_containment`` gives it on every prefix: in
    closed form from cumulative sums for k = 2 (``"pairs"``, O(V), within 1e-15 absolute), by
    exponential clocks for any k (``"clocks"``: about 0.17 s at V = 32,000 and 0.8 s at 128,000
    for k = 4, within 1e-14 of the exact sum) or by listing the n! / (n - k)! ordered tuples
    (``"enumerate"``, small supports only).  That the minimising subset
    is a p/q prefix without replacement too is Hu et al.'s statement, checked against all 2^V
    subsets in the tests (the lab has no proof; a non-prefix minimiser would make the value an
    upper bound on alpha*).  At k = 1 both laws give sum min(p, q).

    Why prefixes, and why the order of tied ratios does not matter (i.i.d. children).  Relax H
    to x in [0, 1]^V: f(x) = p.x + 1 - (q.x)^k.  For a fixed s = q.x the least p.x is the
    fractional knapsack, G(s): fill by p/q ascending, so G is piecewise linear and convex in s,
    with one linear piece per block of equal ratio r (slope r).  On each piece G(s) + 1 - s^k
    is concave in s (linear minus convex), so its minimum over the piece is at one of its two
    ends, the prefixes that hold none or all of the block; hence min over [0, 1]^V = min over
    the prefixes at block ends <= min over subsets <= min over any p/q-ascending order's
    prefixes (each a subset) <= min over the block-end prefixes (every such order reaches them).
    All are equal, whatever order a block of tied ratios takes inside the sort.  A token with
    q = 0 would only add p >= 0; it is left out.

    Methods with i.i.d. children (the two agree to 1e-12 in the tests, on random, tied, one-hot,
    disjoint, q = 0 < p, p = q and tiny-mass inputs):

    * ``"fast"`` (default, or None): one sort of int64 keys, each the bit pattern of the ratio
      p/q (non-negative floats order as their bit patterns) with its low b bits replaced by the
      token's index, b = bits of V - 1 (18 at V = 151,936); the sorted keys' low bits are the
      order.  Keys that share their high bits hold ratios equal to 1 in 2^(52 - b), and come out
      by index: the gathered ratios are checked to be non-decreasing (one pass), and where they
      are not (a near tie across an index inversion) a stable argsort of the nearly sorted
      gathered ratios (timsort: runs) repairs the order.  Then the cumulative sums of p and q in
      that order, q(H)^k by repeated squaring (within k ulps of ``**``), and the minimum; where
      q > 0 everywhere the support is not gathered.  1.5-1.9x the thread time of one default
      ``np.sort`` of the V ratios at V = 32,000-151,936, k = 2-8, against 3.2-4.1x for
      ``"reference"`` (benchmarks/test_alpha_star.py, 2026-12-06, one thread).
    * ``"reference"``: the plain path: the tokens with q > 0, a stable argsort of p/q, cumulative
      sums, ``q(H) ** k``.

    Without replacement the order of tied ratios is not shown not to matter, so both paths keep
    the stable argsort's order (ties by index; the key sort reproduces it exactly): the default
    (None) takes the key sort's order and ``"pairs"`` for k = 2 (where every mass is a normal
    float64), otherwise the clocks through ``simlab.containment.prefix_minimum`` with
    ``absolute=True`` (alpha* needs F only beside 1: the grid starts where the integrand's
    remaining mass is below 1e-18; the final pass only over the blocks that can hold the minimum:
    1.5-2.5x one sort at k = 2 and 22-44x at k = 4, 8 where the clocks take 120-225x, V = 32,000-
    151,936, benchmarks/test_alpha_star.py);
    ``method="clocks"`` or ``"enumerate"`` takes the stable argsort and that method (the plain
    path; the default agrees with it to 1e-12 in the tests).

    Args:
        p, q: target and draft distributions, array-like (V,).
        k: number of children (>= 1).
        replacement: True for i.i.d. children, False for drafting without replacement.
        method: with i.i.d. children ``"fast"`` (default; None means it) or ``"reference"``;
            without replacement None (default: the key sort, ``"pairs"`` for k = 2 and
            ``"clocks"`` otherwise), ``"clocks"``, ``"enumerate"`` or ``"pairs"`` (k <= 2).

    Returns:
        alpha* in [0, 1] (float).

    Raises:
        ValueError: invalid input (``replacement`` not a bool included); ``method`` unknown for
            the drafting law; without replacement, k above the support of q,
            (``"enumerate"``) too many tuples, or (``"pairs"``) k > 2 or a mass of q below
            2^-1022 of its largest.

    Sources: Hu et al. 2025 (ICLR, arXiv 2502.18779), the subset form; the relaxation argument is
    the lab's (``simlab.batched.optimal_acceptance`` uses the same tie argument).
    """
    p, q = check_pair(p, q)
    k = check_k(k)
    replacement = check_bool(replacement, "replacement")
    if not replacement:
        if method is None:  # the key sort's order (the stable one), and the closed form where k <= 2
            p_sorted, q_sorted = _ratio_order(*_support(p, q))
            if k == 2 and q_sorted.size > 2 and q_sorted.min() >= _TINY:  # validated masses: no further checks
                all_in = pairs_containment(q_sorted)
            else:  # k = 1, two tokens, subnormal masses (the closed form needs normal floats) or k > 2
                return float(np.clip(prefix_minimum(p_sorted, q_sorted, k, absolute=True), 0.0, 1.0))
        else:
            support = np.flatnonzero(q > 0)
            with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio still sorts last
                order = support[np.argsort(p[support] / q[support], kind="stable")]
            p_sorted = p[order]
            all_in = prefix_containment(q[order], k, method=method)
        p_prefix = np.concatenate(([0.0], np.cumsum(p_sorted)))
        return float(np.clip(np.min(p_prefix + 1.0 - all_in), 0.0, 1.0))
    if method is None or (isinstance(method, str) and method == "fast"):
        return _iid_fast(p, q, k)
    if isinstance(method, str) and method == "reference":
        return _iid_reference(p, q, k)
    raise ValueError(f"method: i.i.d. children take one of {', '.join(METHODS)} (or None), got {method!r}")


def _iid_reference(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """alpha* with i.i.d. children, the plain path (``optimal_acceptance(method="reference")``)."""
    support = np.flatnonzero(q > 0)
    with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio still sorts last
        order = support[np.argsort(p[support] / q[support], kind="stable")]
    p_prefix = np.concatenate(([0.0], np.cumsum(p[order])))
    q_prefix = np.minimum(np.concatenate(([0.0], np.cumsum(q[order]))), 1.0)
    return float(np.clip(np.min(p_prefix + 1.0 - q_prefix**k), 0.0, 1.0))


def _ratio_order(p: np.ndarray, q: np.ndarray, bits: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """p and q gathered in p/q-ascending order, float64 (n,) each, for q > 0 everywhere
    (``optimal_acceptance``'s ``"fast"`` method: one sort of int64 keys, docstring there).

    The order is exactly the stable argsort's (equal ratios by index).  ``bits``: the low bits given to the index, at least the bits of n - 1 (None: exactly
    those; more only in the tests, to make near ties common and exercise the repair)."""
    n = p.size
    bits = max(1, (n - 1).bit_length()) if bits is None else bits
    with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio (bit pattern 0x7ff0...) still sorts last
        key = np.divide(p, q).view(np.int64)
    # the ratio's high bits without the sign (p = -0.0 gives -0.0, whose sign bit would sort it first) ...
    np.bitwise_and(key, np.int64((1 << 63) - (1 << bits)), out=key)
    np.bitwise_or(key, np.arange(n, dtype=np.int64), out=key)  # ... and the token's index below them
    key.sort()
    np.bitwise_and(key, np.int64((1 << bits) - 1), out=key)
    p_sorted, q_sorted = np.take(p, key), np.take(q, key)
    with np.errstate(over="ignore"):
        ratio = np.divide(p_sorted, q_sorted)
    if not np.all(ratio[1:] >= ratio[:-1]):  # a near tie (equal high bits) met an index inversion
        repair = np.argsort(ratio, kind="stable")
        p_sorted, q_sorted = p_sorted[repair], q_sorted[repair]
    return p_sorted, q_sorted


def _support(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p and q on the tokens with q > 0 (the arrays themselves where q > 0 everywhere)."""
    if q.min() > 0.0:
        return p, q
    support = q > 0
    return p[support], q[support]


def _iid_fast(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """alpha* with i.i.d. children, one int64 key sort (``optimal_acceptance(method="fast")``)."""
    p_prefix, q_prefix = _ratio_order(*_support(p, q))
    np.cumsum(p_prefix, out=p_prefix)
    np.cumsum(q_prefix, out=q_prefix)
    np.minimum(q_prefix, 1.0, out=q_prefix)
    all_in = _power(q_prefix, k)
    np.subtract(p_prefix, all_in, out=p_prefix)
    return float(np.clip(min(0.0, float(p_prefix.min())) + 1.0, 0.0, 1.0))


def _power(x: np.ndarray, k: int) -> np.ndarray:
    """x^k for an integer k >= 1 by repeated squaring, within about k ulps of ``x ** k`` (x is
    overwritten; the result may be x itself)."""
    result = None
    while k > 1:
        if k & 1:
            result = x.copy() if result is None else np.multiply(result, x, out=result)
        np.multiply(x, x, out=x)
        k >>= 1
    return x if result is None else np.multiply(result, x, out=result)
