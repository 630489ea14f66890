"""Toward the OT optimum for children drafted without replacement: a mixture of priority orders.

Setting: k children drafted from q without replacement (S the drafted set of k distinct tokens),
target p.  Any rule that selects one child Z with law mu and then runs speculative sampling of
mu against p (accept Z w.p. min(1, p(Z) / mu(Z)), else a draw from norm((p - mu)_+)) is
lossless and accepts with probability sum min(mu, p) (Khisti et al. 2025, arXiv 2410.18234,
the canonical decomposition).  Derived here; no paper gives a rule for this drafting law at real
vocabularies (UniVer, arXiv 2605.04543, works on such trees; its definition was not reachable).

1. Priority orders.  For a total order pi of the tokens with q > 0, "select the drafted child
   that pi ranks highest" has the selection law mu_pi(t) = F(A_t) - F(A_t minus t), where A_t
   is the set of tokens ranked at most as high as t and F(A) = P(S lies in A) (the child ranked
   highest is t iff S lies in A_t but not in A_t minus t).  F along the order's prefixes is
   ``simlab.containment.prefix_containment``.  F is the containment functional of a random set,
   hence supermodular; the selection laws of all rules are its core {mu >= 0: mu(A) >= F(A) for
   every A, mu(V) = 1}, whose vertices are the mu_pi (Shapley 1971, "Cores of convex games";
   Edmonds' greedy algorithm).  A mixture with weights w (draw an order, then select by it) has
   the law sum_i w_i mu_pi_i.
2. The best mixture: the weights come by column generation over restricted LPs (up to ``LP_BELOW``
   tokens with q > 0; HiGHS) or by Frank-Wolfe (above), and stop at alpha* within ``tol``, when a
   step gains nothing, or after ``rounds`` orders.  Any weights give a lossless rule; the choice only
   decides how close to alpha* it gets (``gap``, ``certified``).  Derivation, measured gaps and the
   variants tried and not adopted: ``docs/derivations/ot_wor.md``.
3. Per drafted tuple x: P(Z = t | x) = sum of w_i over the orders whose highest-ranked child of x
   is t (O(k * orders)); B(x, .) adds the speculative step.  Tokens with q = 0 (children only a
   lossy pairing with another law can hold) rank below every other in every order.

Cost: each order is one ``prefix_containment`` plus O(V) passes and, on small supports, one small
LP (``lp="highs"``, the default, through ``highspy``; ``lp="linprog"`` the reference path).
Break-down and timings: ``docs/derivations/ot_wor.md``.

Plans are kept by value (``PLAN_CACHE``): a node law met again, in another table or another tree
(a Markov world repeats its laws at every node with the same last token and depth), reuses the
plan already computed instead of solving its LPs again.  The key is the content of p and q (their
bytes), k, the verifier's options and the module's settings, so a hit is the plan that would be
computed, bit for bit; the cache is bounded in bytes (least recently used entries go first).
"""

from __future__ import annotations

import copy
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from simlab.checks import check_choice, check_in_range, check_int
from simlab.containment import prefix_containment
from simlab.distributions import inverse_cdf
from simlab.drafting import Drafting
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.ot_walk import CERTIFY_TOL
from simlab.verifiers.selection import SelectionPlan

ENUMERATE_BELOW = 20_000
"""Ordered tuples up to which an order's containments are enumerated exactly (above: clocks)."""
TOLERANCES = {"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10}
"""HiGHS's feasibility tolerances for the restricted LP (its defaults, 1e-7, left gaps of 1e-8)."""
LINPROG_OPTIONS = {"presolve": "on", "simplex_strategy": 1, "highs_debug_level": 0, "output_flag": False, "log_to_console": False}
"""The other HiGHS options ``scipy.optimize.linprog(method="highs")`` sets (scipy 1.17.1,
``scipy/optimize/_linprog_highs.py``: presolve on, the dual simplex, no debugging, no output);
``lp="highs"`` sets them with ``TOLERANCES`` on its own HiGHS instance, so both paths solve the
same model under the same options."""
LP_BELOW = 2_000
"""Tokens with q > 0 up to which the orders are chosen by column generation (above: Frank-Wolfe)."""
PLAN_CACHE_BYTES = 256 * 2**20
"""The most bytes ``PLAN_CACHE`` holds (its keys' p and q and its plans' arrays)."""


def _line_search(mu: np.ndarray, law: np.ndarray, p: np.ndarray) -> float:
    """argmax over s in [0, 1] of sum min(mu + s (law - mu), p): concave and piecewise linear, so
    its slope only falls, by |d_t| where token t crosses p; the maximum is the first breakpoint
    where the slope reaches 0 (0 when it starts there, 1 when it never does)."""
    d = law - mu
    below = (mu < p) | ((mu == p) & (d < 0.0))
    slope = float(d[below].sum())
    if slope <= 0.0:
        return 0.0
    crossing = ((mu < p) & (d > 0.0)) | ((mu > p) & (d < 0.0))
    at = (p[crossing] - mu[crossing]) / d[crossing]
    order = np.argsort(at)
    falls = np.cumsum(np.abs(d[crossing])[order])
    stop = np.flatnonzero(falls >= slope)
    return float(min(at[order][stop[0]], 1.0)) if stop.size else 1.0


def _containment_method(q_support: np.ndarray, k: int, containment: str) -> tuple[str, bool]:
    """(method, absolute) of ``prefix_containment`` for the orders of one plan: the enumeration up
    to ``ENUMERATE_BELOW`` ordered tuples; above it ``containment="reference"`` takes the clocks
    with F to relative accuracy, ``"fast"`` (the default) the closed form ``"pairs"`` at k = 2
    (O(V); every mass a normal float after the rescaling by the largest, else the clocks) and the
    clocks with ``absolute=True`` at k >= 3 (the grid started where the integrand's mass left of
    it is below ``simlab.containment.TAIL`` = 1e-18: F, hence each order's mu_pi(t) = F(A_t) -
    F(A_t minus t), to 1e-18 in absolute terms, about 1e-13 in all over V = 128,000 tokens; the
    relative accuracy of a tiny F is what it gives up, which a selection law's sum does not need)."""
    n = q_support.size
    if math.perm(n, k) <= ENUMERATE_BELOW:
        return "enumerate", False
    if containment == "reference" or k == 1:
        return "clocks", False
    if k == 2:
        scale = np.ldexp(1.0, -int(np.frexp(q_support.max())[1]))
        if q_support.min() * scale >= np.finfo(np.float64).tiny:
            return "pairs", False
        return "clocks", True
    return "clocks", True


def _linprog_restricted(cost: np.ndarray, mu: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w (m,), the rows' duals (c,)) of min cost @ (w, a) subject to a_j - sum_i w_i mu[i, j] <= 0,
    sum_i w_i = 1, w >= 0, 0 <= a <= cap, through ``scipy.optimize.linprog(method="highs")`` (the
    reference path, ``lp="linprog"``).  ``mu``: (m, c) float64, the orders' laws on the contested
    tokens.  Raises ValueError (naming p, q) unless HiGHS reports an optimum."""
    m, c = mu.shape
    rows = sp.hstack((sp.csr_matrix(-mu.T), sp.identity(c, format="csr")), format="csr")
    equal = np.concatenate((np.ones(m), np.zeros(c)))[None, :]
    bounds = [(0.0, None)] * m + [(0.0, float(v)) for v in cap]
    result = linprog(cost, A_ub=rows, b_ub=np.zeros(c), A_eq=equal, b_eq=[1.0], bounds=bounds, method="highs", options=TOLERANCES)
    if result.status != 0:
        raise ValueError(f"p, q: the restricted LP of ot_wor failed ({result.message})")
    return result.x[:m], result.ineqlin.marginals


_SOLVERS = threading.local()


def _highs_instance() -> highspy._Highs:
    """This thread's HiGHS instance (``highspy._Highs``, the plain binding: no callbacks, no banner)
    with ``LINPROG_OPTIONS`` and ``TOLERANCES`` set (again whenever either has changed since);
    each solve passes a whole new model."""
    options = {**LINPROG_OPTIONS, **TOLERANCES}
    solver = getattr(_SOLVERS, "highs", None)
    if solver is None:
        solver = _SOLVERS.highs = highspy._Highs()
        _SOLVERS.options = None
    if _SOLVERS.options != options:
        for name, value in options.items():
            if solver.setOptionValue(name, value) != highspy.HighsStatus.kOk:
                raise RuntimeError(f"highspy refused the HiGHS option {name} = {value!r}")
        _SOLVERS.options = options
    return solver


def _highs_restricted(cost: np.ndarray, mu: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``_linprog_restricted`` with HiGHS called directly: the model linprog passes (columns w_1..w_m,
    a_1..a_c; rows a_j - sum_i w_i mu[i, j] <= 0, then sum_i w_i = 1; column-wise, zeros dropped,
    row indices ascending), under the same options, so the same solution.  Raises ValueError
    (naming p, q) unless HiGHS reports an optimum."""
    m, c = mu.shape
    n = m + c
    columns = np.zeros((n, c + 1))  # the constraint matrix, one column of it per row here
    np.negative(mu, out=columns[:m, :c])
    columns[:m, c] = 1.0
    columns[np.arange(m, n), np.arange(c)] = 1.0
    column, row = np.nonzero(columns)  # by column, rows ascending within each
    start = np.zeros(n, dtype=np.int32)
    np.cumsum(np.bincount(column, minlength=n)[:-1], out=start[1:])
    upper = np.concatenate((np.full(m, np.inf), cap))
    row_lower = np.full(c + 1, -np.inf)
    row_upper = np.zeros(c + 1)
    row_lower[c] = row_upper[c] = 1.0
    solver = _highs_instance()
    status = solver.passModel(
        n, c + 1, column.size, 1, 1, 0.0, cost, np.zeros(n), upper, row_lower, row_upper,
        start, row.astype(np.int32), columns[column, row], np.zeros(n, dtype=np.int32),
    )  # fmt: skip
    if status == highspy.HighsStatus.kError or solver.run() == highspy.HighsStatus.kError:
        raise ValueError("p, q: the restricted LP of ot_wor failed (HiGHS reported an error)")
    model = solver.getModelStatus()
    if model != highspy.HighsModelStatus.kOptimal:
        raise ValueError(f"p, q: the restricted LP of ot_wor failed ({solver.modelStatusToString(model)})")
    solution = solver.getSolution()
    return np.array(solution.col_value[:m]), np.array(solution.row_dual[:c])


class _OrdersPlan(SelectionPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        support = np.flatnonzero(q > 0)
        n = support.size
        self.containment_method, self.containment_absolute = _containment_method(self.q[support], k, verifier.containment)
        ratio_rank = np.empty(n, dtype=np.int64)
        with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio still sorts last
            ratio_rank[np.argsort(p[support] / q[support], kind="stable")] = np.arange(n)
        *first, containment = self._vertex(support, ratio_rank)
        ascending = support[np.argsort(ratio_rank)]
        cut = np.concatenate(([0.0], np.cumsum(p[ascending]))) + 1.0 - containment
        self.alpha_star = float(np.clip(cut.min(), 0.0, 1.0))
        if support.size <= LP_BELOW:
            laws, ranks, weights = self._column_generation(first, support, ratio_rank)
        else:
            laws, ranks, weights = self._conditional_gradient(first, support, ratio_rank)
        keep = weights > 0.0
        self.weights = weights[keep] / weights[keep].sum()
        self.ranks = np.array(ranks)[keep]
        self._select_with(self.weights @ laws[keep])  # the law the sampler realises, exactly

    def _column_generation(self, first, support, ratio_rank):
        """(laws (m, V), ranks (m, V), weights (m,)) by the restricted LP and its prices."""
        laws, ranks = [first[0]], [first[1]]
        weights = np.ones(1)
        for _ in range(self.verifier.rounds - 1):
            value, weights, prices = self._restricted(np.array(laws), support)
            if self.alpha_star - value <= self.verifier.tol:
                break
            law, rank, _ = self._vertex(support, ratio_rank, prices)
            laws.append(law)
            ranks.append(rank)
        else:
            if len(laws) > 1:
                weights = self._restricted(np.array(laws), support)[1]
        return np.array(laws), np.array(ranks), weights

    def _conditional_gradient(self, first, support, ratio_rank):
        """(laws (m, V), ranks (m, V), weights (m,)) by Frank-Wolfe steps with exact line search."""
        p = self.p
        mu, laws, ranks, weights = first[0], [first[0]], [first[1]], [1.0]
        for _ in range(self.verifier.rounds - 1):
            if self.alpha_star - np.minimum(mu, p).sum() <= self.verifier.tol:
                break
            law, rank, _ = self._vertex(support, ratio_rank, (mu < p).astype(np.float64))
            s = _line_search(mu, law, p)
            if s <= 0.0:
                break  # no order ranking the under-served tokens first improves the mixture
            mu = (1.0 - s) * mu + s * law
            weights = [w * (1.0 - s) for w in weights] + [s]
            laws.append(law)
            ranks.append(rank)
        return np.array(laws), np.array(ranks), np.array(weights)

    def _restricted(self, laws, support):
        """(value, weights, prices (V,)) of max sum_t min(sum_i w_i law_i(t), p_t) over w on the
        simplex (module docstring, step 2).  A token below p under every order so far adds its mu
        (price 1), one above p under all adds p (price 0); only the others get a variable a_t <= p_t
        and a row a_t <= mu(t), whose HiGHS dual is its price.  One order (m = 1): no token is
        contested (its law is both the largest and the smallest), the simplex is the point w = 1,
        and ``lp="highs"`` returns it without a solve (HiGHS's w_1 / w_1 is that 1.0 too)."""
        m, p = laws.shape[0], self.p[support]
        on = laws[:, support]
        below, above = on.max(axis=0) <= p, on.min(axis=0) >= p
        contested = np.flatnonzero(~below & ~above)
        cost = np.concatenate((-on[:, below].sum(axis=1), -np.ones(contested.size)))
        if self.verifier.lp == "linprog":
            weights, duals = _linprog_restricted(cost, on[:, contested], p[contested])
        elif m == 1:
            weights, duals = np.ones(1), np.zeros(0)
        else:
            weights, duals = _highs_restricted(cost, on[:, contested], p[contested])
        weights = np.clip(weights, 0.0, None)
        weights /= weights.sum()
        prices = np.zeros(self.p.size)
        prices[support[below]] = 1.0
        prices[support[contested]] = -duals
        return float(np.minimum(weights @ laws, self.p).sum()), weights, prices

    def _vertex(self, support, ratio_rank, prices=None):
        """(mu_pi float64 (V,), rank int64 (V,): the position in pi, -1 off the support, F on pi's
        n + 1 prefixes) for pi = ascending (prices, then p/q rank): the last token is ranked highest."""
        ascending = np.empty_like(support)
        ascending[ratio_rank] = support  # the p/q order: ratio_rank is a permutation (no sort)
        if prices is None:
            order = ascending
        else:
            price = prices[ascending]
            low = price == 0.0
            if (low | (price == 1.0)).all():  # Frank-Wolfe's 0/1 prices: a stable partition
                order = np.concatenate((ascending[low], ascending[~low]))
            else:
                order = support[np.lexsort((ratio_rank, prices[support]))]
        containment = prefix_containment(
            self.q[order], self.k, method=self.containment_method, absolute=self.containment_absolute
        )
        law = np.zeros(self.p.size)
        law[order] = np.diff(containment)
        rank = np.full(self.p.size, -1, dtype=np.int64)
        rank[order] = np.arange(order.size)
        return law, rank, containment

    @property
    def gap(self) -> float:
        """alpha* - ``value`` >= 0 (to rounding): a bound on how far the acceptance is from alpha*.
        ``value`` = sum min(mu, p) is the probability that the selected child is accepted; the
        acceptance also counts a correction token that is a child too, so it lies in [value,
        alpha*] (exact by ``acceptance_rate("enumerate")`` on small supports)."""
        return self.alpha_star - self.value

    @property
    def certified(self) -> bool:
        """True when ``value``, hence the acceptance, reaches alpha* to ``ot_walk.CERTIFY_TOL``."""
        return abs(self.gap) <= CERTIFY_TOL

    @property
    def orders(self) -> int:
        """How many priority orders the mixture draws from."""
        return int(self.weights.size)

    def _selection(self, children: np.ndarray) -> np.ndarray:
        """P(child j is selected), float64 (k,): the weight of the orders ranking it highest (a
        repeated token: its first copy)."""
        top = np.argmax(self.ranks[:, children], axis=1)
        return np.bincount(top, weights=self.weights, minlength=children.size)

    def _draw(self, children, rng):
        order = inverse_cdf(np.cumsum(self.weights), rng)
        return self._speculative(int(children[np.argmax(self.ranks[order, children])]), rng)


class PlanCache:
    """``_OrdersPlan`` by value, least recently used first out, at most ``PLAN_CACHE_BYTES`` bytes.

    Keyed by (verifier, k, ``LP_BELOW``, ``ENUMERATE_BELOW``, ``TOLERANCES``, ``LINPROG_OPTIONS``, the
    bytes of p and of q): equal keys give the plan computed from equal inputs, so a hit is bit for
    bit the plan a miss would compute (HiGHS and the containments are deterministic).  The kept plan's arrays are
    read-only and its p and q are views of the key's own bytes (no caller's array is kept); each
    caller gets a shallow copy with its own p and q (``NodeVerifier.prepare`` sets ``law`` on it).
    ``clear()`` empties it (timings of the plan itself call it first).  Thread-safe.
    """

    def __init__(self):
        self._plans: OrderedDict[tuple, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        """Drop every plan and reset the counters."""
        with self._lock:
            self._plans.clear()
            self.bytes = self.hits = self.misses = 0

    def plan(self, verifier: "OTWithoutReplacement", p: np.ndarray, q: np.ndarray, k: int) -> "_OrdersPlan":
        """The plan of (p, q, k) under ``verifier``: kept, or computed and kept (errors propagate, nothing kept)."""
        p_bytes, q_bytes = p.tobytes(), q.tobytes()
        options = (LP_BELOW, ENUMERATE_BELOW, tuple(sorted(TOLERANCES.items())), tuple(sorted(LINPROG_OPTIONS.items())))
        key = (verifier, k, options, p.dtype.str, q.dtype.str, p_bytes, q_bytes)
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                self.hits += 1
        if found is None:
            kept = _OrdersPlan(verifier, p, q, k)
            kept.p = np.frombuffer(p_bytes, dtype=p.dtype)
            kept.q = np.frombuffer(q_bytes, dtype=q.dtype)
            size = len(p_bytes) + len(q_bytes)
            for name in ("mu", "accept", "ranks", "weights"):
                array = getattr(kept, name)
                array.flags.writeable = False
                size += array.nbytes
            with self._lock:
                self.misses += 1
                if size <= PLAN_CACHE_BYTES and key not in self._plans:
                    self._plans[key] = (kept, size)
                    self.bytes += size
                    while self.bytes > PLAN_CACHE_BYTES:
                        self.bytes -= self._plans.popitem(last=False)[1][1]
        else:
            kept = found[0]
        plan = copy.copy(kept)
        plan.p, plan.q = p, q
        return plan


PLAN_CACHE = PlanCache()
"""The process's ``ot_wor`` plans by value (``PlanCache``)."""


@dataclass(frozen=True)
class OTWithoutReplacement(NodeVerifier):
    """A mixture of priority orders for children drafted without replacement (module docstring):
    draw an order, select the drafted child it ranks highest, then speculative sampling of the
    mixture's selection law against p.  Lossless for drafting without replacement; acceptance
    between alpha* - ``plan.gap`` and alpha* (no closed form: enumeration, or sampled children).

    Args:
        rounds: at most this many orders (>= 1; default 16).
        tol: stop adding orders once the gap to alpha* is at most this (in [0, 1]; default 1e-12).
        containment: ``"fast"`` (default) or ``"reference"``: how each order's containments are
            computed above the enumeration (``_containment_method``: the closed form at k = 2 and
            the clocks to absolute accuracy at k >= 3, or the clocks to relative accuracy).
        lp: ``"highs"`` (default) or ``"linprog"``: how the column generation's restricted LPs
            reach HiGHS: directly through ``highspy`` (``_highs_restricted``) or through
            ``scipy.optimize.linprog`` (``_linprog_restricted``, the reference); the same model and
            options, the same plans (bit for bit where measured; tested to 1e-12 on random
            instances).

    Raises:
        ValueError: ``rounds``, ``tol``, ``containment`` or ``lp`` out of range, named; ``p, q``
            when a restricted LP has no optimum in HiGHS's report.
    """

    name = "ot_wor"
    label = "OT optimum (w/o repl., orders)"
    drafting = Drafting.WITHOUT_REPLACEMENT
    lossless_for = frozenset({Drafting.WITHOUT_REPLACEMENT})
    rounds: int = 16
    tol: float = 1e-12
    containment: str = "fast"
    lp: str = "highs"

    def __post_init__(self):
        object.__setattr__(self, "rounds", check_int(self.rounds, "rounds", 1, 10_000))
        object.__setattr__(self, "tol", check_in_range(self.tol, "tol", 0.0, 1.0))
        check_choice(self.containment, "containment", ("fast", "reference"), "containment method")
        check_choice(self.lp, "lp", ("highs", "linprog"), "LP path")

    def _plan(self, p, q, k):
        if k > int(np.count_nonzero(q)):
            raise ValueError(f"k: {k} children drafted without replacement need at least {k} tokens with q > 0")
        return PLAN_CACHE.plan(self, p, q, k)
