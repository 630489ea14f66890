"""The OT optimum for i.i.d. children at any vocabulary: a curtain selection that reaches alpha* at every node.

Setting (``simlab.otlp``, ``simlab.verifiers.ot_walk``): k children X ~ i.i.d. q, target p; the best
acceptance is alpha* = min_H [p(H) + 1 - q(H)^k] over the prefixes H of the tokens with q > 0 in
r = p/q ascending order (Hu et al. ICLR 2025, arXiv 2502.18779).  Any selection of one child Z
with law mu, followed by speculative sampling of mu against p (accept Z w.p. min(1, p(Z)/mu(Z)),
else a draw from norm((p - mu)_+)), is lossless and accepts with probability sum min(mu, p)
(Khisti et al. 2025, arXiv 2410.18234, the canonical decomposition).  ``ot_walk`` derives the
optimal selection law mu* = max(p, lam_in q) on H* (the minimising prefix, sum q(H*)^k) and
min(p, lam_out q) outside (sum 1 - q(H*)^k), with sum min(mu*, p) = alpha*, but its coin walk
realises mu* only where no coin clips.  This module realises mu* at every node (derived by the lab;
Thomas and Pal, "Partial Resolution", NeurIPS 2025, and "Global Resolution", ICLR 2026,
arXiv 2511.15898, compute the optimal coupling by other routes; no official code).

Vocabulary: a **score** in [0, Q] per drafted copy, the child of highest score selected; an
**atom**, the tokens of equal rho = mu*/q sharing one score law; the **curtain**, the left-curtain
coupling (Beiglboeck and Juillet 2016) that splits [0, Q] into **pieces** among the atoms.  The
construction, step by step, and why it is lossless whatever the rounding:
``docs/derivations/ot_exact.md``.

Contract: ``OTExact`` is lossless for i.i.d. drafting at every p, q, k and accepts alpha* to
rounding (tests: 1e-9 against the closed form and the LP).  Cost: O(k * pieces) per child tuple,
O(V) for the whole law, after one sort, O(V log V), and the curtain, by one of ``curtain``'s
engines: ``"reference"`` (one atom at a time, Python floats; the plain reference),
``"compiled"`` (the same steps compiled by numba, bit for bit the reference's pieces),
``"vectorised"`` (runs of atoms at once); the default takes the compiled loop where numba
imports, else the vectorised runs.  Timings: benchmarks/test_ot_exact.py and
benchmarks/RESULTS.md.  Drafting without replacement is not covered (why, and what the lab has
instead: the derivations page); ``Optimal`` with ``replacement=False`` is its small-V reference.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_choice
from simlab.distributions import inverse_cdf
from simlab.verifiers.base import NodeVerifier
from simlab.verifiers.ot_walk import CERTIFY_TOL, _level, _power_difference, _prefix_cut, _span_midpoint
from simlab.verifiers.selection import SelectionPlan


def _root(f, slope, lo: float, hi: float, start: float) -> float:
    """The root of the nondecreasing f on [lo, hi], clamped there (f(lo) > 0: lo; f(hi) < 0: hi):
    Newton from ``start`` with the exact ``slope``, kept inside the shrinking bracket (a halving
    where a step leaves it), to 1e-16 of the root."""
    if f(lo) >= 0.0:
        return lo
    if f(hi) <= 0.0:
        return hi
    x = start
    for _ in range(200):
        value = f(x)
        if value == 0.0:
            return x
        if value < 0.0:
            lo = x
        else:
            hi = x
        d = slope(x)
        nxt = x - value / d if d > 0.0 else lo - 1.0
        if not lo < nxt < hi:
            nxt = 0.5 * (lo + hi)
        if abs(nxt - x) <= 1e-16 * max(abs(x), 1e-300) or hi - lo <= 1e-16 * max(abs(hi), abs(lo), 1e-300):
            return nxt
        x = nxt
    return x


def _span_start(k, mass, width, near, cum_l, x_lo, x_hi, upward):
    """Newton's start for ``_Curtain.stretch``: the span of length ``width`` (float64 (n,)) whose
    h-mass a^k - b^k is ``mass``, by ``ot_walk._span_midpoint`` (closed form for k <= 4), moved by
    2^-46 of its scale to the side where Newton converges monotonically (above upward, below
    downward) and clipped to the bracket; the bracket's end on that side for larger k and where
    the closed form is not finite.  Returns x (the top length): the span's top is near + x upward,
    near + cum_l - x downward."""
    fallback = x_hi if upward else x_lo
    mid = _span_midpoint(mass, width, k)
    if mid is None:
        return fallback.copy()
    with np.errstate(invalid="ignore"):
        top = mid + 0.5 * width
        slack = 2.0**-46 * (np.abs(top) + width + abs(near))
        x = (top + slack - near) if upward else (near + cum_l - top - slack)
        return np.where(np.isfinite(x), np.clip(x, x_lo, x_hi), fallback)


class _Curtain:
    """The left curtain's state on [start, end] (docs/derivations/ot_exact.md, step 3), in processing coordinates
    z in [0, span] (z = w - start upward, z = end - w downward): the frontier, the stack of free
    gaps below it (top last) and the pieces so far (atom, z of the lower end, length)."""

    def __init__(self, lengths, targets, start, end, k, upward):
        self.lengths, self.k, self.upward, self.start, self.end = lengths, k, upward, start, end
        self.targets = targets if upward else -targets  # signed: the processing coordinates' h increases
        self.span, self.front, self.stack = end - start, 0.0, []
        self.owner, self.lower, self.size, self.pending = [], [], [], []

    def mass(self, z0, size):
        """Signed h-mass of [z0, z0 + size] (scalars or arrays); ``size`` passed on exactly, so a
        piece far below the rounding of its position keeps its mass."""
        if self.upward:
            return _power_difference(self.start + z0 + size, self.start + z0, self.k, size)
        return -_power_difference(self.end - z0, self.end - z0 - size, self.k, size)

    def _scalar_ends(self, z0: float, size: float) -> tuple[float, float]:
        """(a, b) of the piece [z0, z0 + size) on this side's axis: a^j - b^j is its mass term."""
        if self.upward:
            return self.start + z0 + size, self.start + z0
        return self.end - z0, self.end - z0 - size

    @staticmethod
    def _scalar_sum(a: float, b: float, terms: int) -> float:
        """sum_{i < terms} a^(terms-1-i) b^i by Horner's rule (Python floats)."""
        total, power = 1.0, 1.0
        for _ in range(terms - 1):
            power *= b
            total = total * a + power
        return total

    def scalar_mass(self, z0: float, size: float) -> float:
        """``mass`` for Python floats (the scalar steps: a numpy scalar costs ten times more)."""
        a, b = self._scalar_ends(z0, size)
        total = size * self._scalar_sum(a, b, self.k)
        return total if self.upward else -total

    def scalar_rise(self, z0: float, size: float) -> float:
        """``rise`` for Python floats."""
        a, b = self._scalar_ends(z0, size)
        return self.k * size * self._scalar_sum(a, b, self.k - 1)

    def rise(self, z0, size):
        """density(z0 + size) - density(z0), size >= 0, density = d mass / d z (h(w) upward, -h(w)
        downward: nondecreasing in z either way), as k * (w^(k-1) difference) with ``size`` passed
        on exactly (no cancellation for a piece of 1e-27 at w = 0.2)."""
        if self.upward:
            return self.k * _power_difference(self.start + z0 + size, self.start + z0, self.k - 1, size)
        return self.k * _power_difference(self.end - z0, self.end - z0 - size, self.k - 1, size)

    def put(self, atom, z0, size):
        """Record pieces: arrays (a run) or one piece (Python scalars, gathered until the next run)."""
        if np.ndim(size) == 0:
            self.pending.append((int(atom), float(z0), float(size)))
            return
        self.flush()
        self.owner.append(atom)
        self.lower.append(np.asarray(z0, dtype=np.float64))
        self.size.append(np.asarray(size, dtype=np.float64))

    def flush(self):
        if self.pending:
            owner, lower, size = zip(*self.pending)
            self.owner.append(np.array(owner, dtype=np.int64))
            self.lower.append(np.array(lower))
            self.size.append(np.array(size))
            self.pending = []

    def step(self, atom: int) -> None:
        """One atom's shadow, scalar: above the frontier, or [front, front + t] plus the top of the
        stack down to its mean (gaps popped whole, the last one cut)."""
        m, want, room, front = float(self.lengths[atom]), float(self.targets[atom]), self.span - self.front, self.front
        mass = self.scalar_mass
        if m <= room and mass(front, m) <= want:
            top = self.span - m
            first = _PYTHON["interval_start"](
                m, want, self.start, self.end, self.k, self.upward, front, top, top if self.upward else front
            )
            alpha = _root(lambda z: mass(z, m) - want, lambda z: self.scalar_rise(z, m), front, top, first)
            if alpha > front:
                self.stack.append((front, alpha))
            self.put(atom, alpha, m)
            self.front = alpha + m
            return
        taken, taken_mass = 0.0, 0.0
        while self.stack:
            lo, hi = self.stack[-1]
            top = m - taken - (hi - lo)  # what would be left for [front, front + top]
            if top < 0.0 or (top <= room and mass(front, top) + taken_mass + mass(lo, hi - lo) < want):
                break  # the root lies inside this gap
            self.stack.pop()
            self.put(atom, lo, hi - lo)
            taken, taken_mass = taken + hi - lo, taken_mass + mass(lo, hi - lo)
        rest, s = m - taken, 0.0
        if self.stack:
            lo, hi = self.stack[-1]
            high = min(hi - lo, rest)
            low = min(max(0.0, rest - room), high)  # [front, front + rest - s] must fit below the end
            between = mass(hi, front - hi)
            first = _PYTHON["cut_start"](
                between, rest, taken_mass, want, front, hi, self.start, self.end, self.k, self.upward, low, high, high
            )
            s = _root(
                lambda s: -(mass(front, rest - s) + taken_mass + mass(hi - s, s) - want),
                lambda s: self.scalar_rise(hi - s, (front - hi) + rest),
                low,
                high,
                first,
            )
            if s > 0.0:
                self.put(atom, hi - s, s)
            if hi - s > lo:
                self.stack[-1] = (lo, hi - s)
            else:
                self.stack.pop()
        if rest - s > 0.0:  # (past the end by rounding at most: only the pieces' order and lengths count)
            self.put(atom, front, rest - s)
            self.front = front + rest - s

    def stretch(self, first: int, stop: int) -> int:
        """Atoms first.. while each takes [front, front + t] plus a cut of the top gap (the walk's
        V shape), solved for all at once from the cumulative masses: x_i = the top length after
        atom i, the root of the increasing mass(front, x) + mass(top - y, y) = T_i with y = L_i - x
        (convex upward, concave downward: Newton from the side that converges monotonically), then
        each atom's shape tested exactly at the state the ones before it leave.  Returns how many
        atoms it placed (0: the first one is not of that shape; ``step`` places it)."""
        if not self.stack or stop <= first:
            return 0
        lo, hi = self.stack[-1]
        gap, room, front = hi - lo, self.span - self.front, self.front
        m, want = float(self.lengths[first]), float(self.targets[first])
        if not (m > room or self.scalar_mass(front, m) > want) or (m <= gap and self.scalar_mass(hi - m, m) > want):
            return 0  # the first atom is not of this shape (a cheap test before the vectorised one)
        lengths = self.lengths[first:stop]
        cum_l, cum_t = np.cumsum(lengths), np.cumsum(self.targets[first:stop])
        x_hi, x_lo = np.minimum(cum_l, room), np.maximum(cum_l - gap, 0.0)
        # the two pieces' masses are the h-mass of the span [cut, top] less the filled [hi, front]
        # between them (a scalar): one Horner pass gives the value and the slope (the density
        # rise over the span); each atom's shape is tested with the exact masses below
        width = (front - hi) + cum_l  # from the cut up to the frontier's new top, exactly
        goal = cum_t + self.scalar_mass(hi, front - hi)
        sign = 1.0 if self.upward else -1.0
        near, far = (self.start + front, self.start + hi) if self.upward else (self.end - hi, self.end - front)

        def span(x, cl, d, g):
            y = cl - x
            a, b = (near + x, far - y) if self.upward else (near + y, far - x)
            lower, total, power = 1.0, a + b, b
            for _ in range(self.k - 2):
                power = power * b
                lower = total
                total = total * a + power
            return sign * d * total - g, self.k * d * lower

        ok = (x_lo <= x_hi) & (span(x_hi, cum_l, width, goal)[0] >= 0.0) & (span(x_lo, cum_l, width, goal)[0] <= 0.0)
        bad = np.flatnonzero(~ok)
        count = int(bad[0]) if bad.size else lengths.size
        if count == 0:
            return 0
        cum_l, cum_t, x_lo, x_hi = cum_l[:count], cum_t[:count], x_lo[:count], x_hi[:count]
        width, goal = width[:count], goal[:count]
        # f'' = density'(front + x) - density'(top - y): >= 0 upward (h convex, front + x above the
        # cut), <= 0 downward (mirrored); Newton from the side that converges monotonically
        x = _span_start(self.k, sign * goal, width, near, cum_l, x_lo, x_hi, self.upward)
        idx = None  # None: every atom still moves (slices, no gathers)
        for _ in range(100):
            xi = x if idx is None else x[idx]
            if idx is None:
                value, slope = span(xi, cum_l, width, goal)
            else:
                value, slope = span(xi, cum_l[idx], width[idx], goal[idx])
            step = np.where(slope > 0.0, value / np.where(slope > 0.0, slope, 1.0), 0.0)
            moved = np.clip(xi - step, x_lo if idx is None else x_lo[idx], x_hi if idx is None else x_hi[idx])
            going = (np.abs(step) > 1e-15 * (np.abs(front) + xi + 1e-300)) & ((value > 0.0) if self.upward else (value < 0.0))
            if idx is None:
                x = moved
                idx = np.flatnonzero(going)
                if idx.size == count:
                    idx = None
                    continue
            else:
                x[idx] = moved
                idx = idx[going]
            if idx.size == 0:
                break
        if idx is None:
            idx = np.arange(count)
        if idx.size:  # not converged in 100 steps: place the atoms before the first such one
            count = int(idx[0])
            if count == 0:
                return 0
            cum_l, x = cum_l[:count], x[:count]
        # each atom's own shape, tested exactly at the state the ones before it leave (the
        # cumulative differences cannot tell the shape of an atom far below their rounding):
        # its root lies in [front, front + t] plus a cut of what is left of the gap
        fronts = front + np.concatenate(([0.0], x[:-1]))
        used = np.concatenate(([0.0], cum_l[:-1] - x[:-1]))
        own, want = lengths[:count], self.targets[first : first + count]
        s_lo = np.maximum(own - (room - (fronts - front)), 0.0)
        s_hi = np.minimum(own, gap - used)
        fine = (s_lo <= s_hi) & (self.mass(fronts, own - s_lo) + self.mass(hi - used - s_lo, s_lo) >= want)
        fine &= self.mass(fronts, own - s_hi) + self.mass(hi - used - s_hi, s_hi) <= want
        bad = np.flatnonzero(~fine)
        if bad.size:
            count = int(bad[0])
            if count == 0:
                return 0
            x, cum_l = x[:count], cum_l[:count]
        top = np.diff(np.concatenate(([0.0], x)))
        top = np.clip(top, 0.0, lengths[:count])
        cut = lengths[:count] - top
        atoms = np.arange(first, first + count)
        used = cum_l[:count] - x  # gap length consumed after each atom
        keep = top > 0.0
        self.put(atoms[keep], (front + x - top)[keep], top[keep])
        keep = cut > 0.0
        self.put(atoms[keep], (hi - used)[keep], cut[keep])
        self.front = front + x[-1]
        if hi - used[-1] > lo:
            self.stack[-1] = (lo, hi - used[-1])
        else:
            self.stack.pop()
        return count

    def leap(self, first: int, stop: int) -> int:
        """Atoms first.. while each lies above the frontier (the shadow is an interval [a, a + m]
        above the previous one, a gap pushed below it): the independent roots of mass(a, m) = T,
        solved at once (Newton from the side where the convex or concave mass converges
        monotonically), kept while each is above its predecessor.  Returns how many it placed."""
        m = float(self.lengths[first])
        if m > self.span - self.front or self.scalar_mass(self.front, m) > float(self.targets[first]):
            return 0  # the first atom is not above the frontier (a cheap test before the vectorised one)
        lengths, want = self.lengths[first:stop], self.targets[first:stop]
        a_hi = self.span - lengths
        a = (a_hi if self.upward else np.full(lengths.size, self.front)).copy()
        idx = np.flatnonzero(a_hi >= self.front)
        for _ in range(100):
            if idx.size == 0:
                break
            ai, mi = a[idx], lengths[idx]
            value = self.mass(ai, mi) - want[idx]
            slope = self.rise(ai, mi)
            step = np.where(slope > 0.0, value / np.where(slope > 0.0, slope, 1.0), 0.0)
            a[idx] = np.clip(ai - step, self.front, a_hi[idx])
            idx = idx[(np.abs(step) > 1e-15 * (np.abs(ai) + 1e-300)) & ((value > 0.0) if self.upward else (value < 0.0))]
        below = np.concatenate(([self.front], a[:-1] + lengths[:-1]))  # each one's frontier
        fits = (a >= below) & (a <= a_hi) & (self.mass(below, lengths) <= want) & (self.mass(a_hi, lengths) >= want)
        fits &= np.abs(self.mass(a, lengths) - want) <= 1e-9 * np.abs(want)  # a root, not a stalled step
        fits[idx] = False  # not converged in 100 steps: the scalar step decides
        bad = np.flatnonzero(~fits)
        count = int(bad[0]) if bad.size else lengths.size
        if count == 0:
            return 0
        a, below, lengths = a[:count], below[:count], lengths[:count]
        self.stack.extend((lo, hi) for lo, hi in zip(below[a > below].tolist(), a[a > below].tolist()))
        self.put(np.arange(first, first + count), a, lengths)
        self.front = float(a[-1] + lengths[-1])
        return count

    def finish(self, atom: int) -> None:
        """The last atom takes what is left (its mean is the rest's, by the totals)."""
        placed = False
        for lo, hi in self.stack:
            if hi > lo:
                self.put(atom, lo, hi - lo)
                placed = True
        if self.span > self.front or not placed:  # (its own length past the end if rounding left nothing)
            size = self.span - self.front if self.span > self.front else float(self.lengths[atom])
            self.put(atom, self.front, size)

    def pieces(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(atom, lower end on the score axis, length) of every piece, in score order (ties: placed first, first)."""
        self.flush()
        owner = np.concatenate(self.owner) if self.owner else np.zeros(0, dtype=np.int64)
        z0 = np.concatenate(self.lower) if self.lower else np.zeros(0)
        size = np.concatenate(self.size) if self.size else np.zeros(0)
        lower = self.start + z0 if self.upward else self.end - (z0 + size)
        order = np.argsort(lower, kind="stable")
        return owner[order].astype(np.int64), lower[order], size[order]


def _make_kernels(jit):
    """The curtain one atom at a time (``_Curtain.step`` and ``finish``, the same operations in the
    same order on float64 scalars) as one loop over plain arrays, decorated by ``jit``: numba's
    ``njit`` compiles it (``engine="compiled"``: results bit for bit those of the Python steps,
    as numba contracts no multiply-add without fastmath), the identity leaves it Python (the tests
    run it so on small inputs where numba is absent).  Returns {"loop": loop(lengths, targets,
    start, end, k, upward) -> (owner int64, z0 float64, size float64) in placement order,
    processing coordinates, ``targets`` already signed (negated downward); "interval_start",
    "cut_start": the roots' closed-form starts, which the reference steps take from the
    uncompiled kernels}."""

    @jit
    def midpoint(mass: float, width: float, k: int) -> float:
        """``ot_walk._span_midpoint`` for one span (Python floats, also compiled by numba in the
        loop: the same operations, so the same start): the midpoint of the span of length ``width``
        whose a^k - b^k is ``mass``, closed form for k = 2, 3, 4 (t^2 as (R + sqrt(R^2 + w^3))^(2/3));
        NaN for other k or where it is not defined (width <= 0, mass < 0, a zero denominator)."""
        if not (width > 0.0 and mass >= 0.0) or k < 2 or k > 4:
            return math.nan
        if k == 2:
            return mass / (2.0 * width)
        if k == 3:
            v = mass / width - 0.25 * width * width
            return math.sqrt(v / 3.0) if v > 0.0 else 0.0
        w = width * width / 12.0
        r = mass / (8.0 * width)
        t2 = (r + math.sqrt(r * r + w * w * w)) ** (2.0 / 3.0)
        den = t2 * t2 + t2 * w + w * w
        return 2.0 * r * t2 / den if den > 0.0 and den < math.inf else math.nan

    @jit
    def interval_start(
        m: float, want: float, start: float, end: float, k: int, upward: bool, lo: float, hi: float, default: float
    ) -> float:
        """The step's start for an interval [z, z + m] above the frontier of signed h-mass ``want``:
        the closed-form z (``midpoint``) inside [lo, hi], else ``default``."""
        mid = midpoint(want if upward else -want, m, k)
        z = mid - 0.5 * m - start if upward else end - mid - 0.5 * m
        return min(max(z, lo), hi) if z == z and abs(z) < math.inf else default

    @jit
    def cut_start(
        between: float,
        rest: float,
        taken_mass: float,
        want: float,
        front: float,
        hi: float,
        start: float,
        end: float,
        k: int,
        upward: bool,
        lo: float,
        top: float,
        default: float,
    ) -> float:
        """The step's start for the cut s of the top gap (the span from hi - s up to front + rest - s,
        whose h-mass less ``between``, that of the filled [hi, front], is want - taken_mass): the
        closed-form s inside [lo, top], else ``default``."""
        width = (front - hi) + rest
        if upward:
            mid = midpoint(want - taken_mass + between, width, k)
            s = start + front + rest - mid - 0.5 * width
        else:
            mid = midpoint(-(want - taken_mass + between), width, k)
            s = mid - 0.5 * width - end + front + rest
        return min(max(s, lo), top) if s == s and abs(s) < math.inf else default

    @jit
    def horner(a, b, terms):
        total, power = 1.0, 1.0
        for _ in range(terms - 1):
            power *= b
            total = total * a + power
        return total

    @jit
    def mass(z0, size, start, end, k, upward):
        if upward:
            return size * horner(start + z0 + size, start + z0, k)
        return -(size * horner(end - z0, end - z0 - size, k))

    @jit
    def rise(z0, size, start, end, k, upward):
        if upward:
            return k * size * horner(start + z0 + size, start + z0, k - 1)
        return k * size * horner(end - z0, end - z0 - size, k - 1)

    @jit
    def value(mode, x, m, want, front, rest, taken_mass, hi, start, end, k, upward):
        if mode == 0:  # an interval [x, x + m] above the frontier
            return mass(x, m, start, end, k, upward) - want
        return -(mass(front, rest - x, start, end, k, upward) + taken_mass + mass(hi - x, x, start, end, k, upward) - want)

    @jit
    def slope(mode, x, m, front, rest, hi, start, end, k, upward):
        if mode == 0:
            return rise(x, m, start, end, k, upward)
        return rise(hi - x, (front - hi) + rest, start, end, k, upward)

    @jit
    def root(mode, lo, hi_x, start_x, m, want, front, rest, taken_mass, hi, start, end, k, upward):
        """``_root`` for the step's two equations (``mode`` 0: above the frontier, 1: the cut)."""
        if value(mode, lo, m, want, front, rest, taken_mass, hi, start, end, k, upward) >= 0.0:
            return lo
        if value(mode, hi_x, m, want, front, rest, taken_mass, hi, start, end, k, upward) <= 0.0:
            return hi_x
        x = start_x
        for _ in range(200):
            f = value(mode, x, m, want, front, rest, taken_mass, hi, start, end, k, upward)
            if f == 0.0:
                return x
            if f < 0.0:
                lo = x
            else:
                hi_x = x
            d = slope(mode, x, m, front, rest, hi, start, end, k, upward)
            nxt = x - f / d if d > 0.0 else lo - 1.0
            if not (lo < nxt and nxt < hi_x):
                nxt = 0.5 * (lo + hi_x)
            if abs(nxt - x) <= 1e-16 * max(abs(x), 1e-300) or hi_x - lo <= 1e-16 * max(max(abs(hi_x), abs(lo)), 1e-300):
                return nxt
            x = nxt
        return x

    @jit
    def loop(lengths, targets, start, end, k, upward):
        n = lengths.size
        span, front = end - start, 0.0
        stack_lo, stack_hi = np.empty(n + 1), np.empty(n + 1)
        depth = 0
        cap = 4 * n + 4  # a piece per atom and per gap it pops (each gap pushed once), two more
        owner, z0, size = np.empty(cap, dtype=np.int64), np.empty(cap), np.empty(cap)
        count = 0
        for atom in range(n - 1):
            m, want, room = lengths[atom], targets[atom], span - front
            if m <= room and mass(front, m, start, end, k, upward) <= want:
                top = span - m
                first = interval_start(m, want, start, end, k, upward, front, top, top if upward else front)
                alpha = root(0, front, top, first, m, want, front, 0.0, 0.0, 0.0, start, end, k, upward)
                if alpha > front:
                    stack_lo[depth], stack_hi[depth] = front, alpha
                    depth += 1
                owner[count], z0[count], size[count] = atom, alpha, m
                count += 1
                front = alpha + m
                continue
            taken, taken_mass = 0.0, 0.0
            while depth > 0:
                lo, hi = stack_lo[depth - 1], stack_hi[depth - 1]
                top = m - taken - (hi - lo)
                if top < 0.0 or (
                    top <= room
                    and mass(front, top, start, end, k, upward) + taken_mass + mass(lo, hi - lo, start, end, k, upward) < want
                ):
                    break
                depth -= 1
                owner[count], z0[count], size[count] = atom, lo, hi - lo
                count += 1
                taken, taken_mass = taken + hi - lo, taken_mass + mass(lo, hi - lo, start, end, k, upward)
            rest, s = m - taken, 0.0
            if depth > 0:
                lo, hi = stack_lo[depth - 1], stack_hi[depth - 1]
                high = min(hi - lo, rest)
                low = min(max(0.0, rest - room), high)
                between = mass(hi, front - hi, start, end, k, upward)
                first = cut_start(between, rest, taken_mass, want, front, hi, start, end, k, upward, low, high, high)
                s = root(1, low, high, first, m, want, front, rest, taken_mass, hi, start, end, k, upward)
                if s > 0.0:
                    owner[count], z0[count], size[count] = atom, hi - s, s
                    count += 1
                if hi - s > lo:
                    stack_hi[depth - 1] = hi - s
                else:
                    depth -= 1
            if rest - s > 0.0:
                owner[count], z0[count], size[count] = atom, front, rest - s
                count += 1
                front = front + rest - s
        if n > 0:  # ``finish``: the last atom takes what is left
            placed = False
            for i in range(depth):
                if stack_hi[i] > stack_lo[i]:
                    owner[count], z0[count], size[count] = n - 1, stack_lo[i], stack_hi[i] - stack_lo[i]
                    count += 1
                    placed = True
            if span > front or not placed:
                owner[count], z0[count] = n - 1, front
                size[count] = span - front if span > front else lengths[n - 1]
                count += 1
        return owner[:count], z0[:count], size[:count]

    return {"loop": loop, "interval_start": interval_start, "cut_start": cut_start}


_PYTHON = _make_kernels(lambda f: f)
"""The kernels uncompiled: the reference steps take their starts from here."""
_LOOPS = {}
ENGINES = ("auto", "compiled", "vectorised", "python", "reference")
"""``curtain``'s engines (its docstring)."""


@functools.cache
def _numba_available() -> bool:
    """Whether numba imports (checked once)."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _loop(engine: str):
    """The one-atom-at-a-time loop: ``"compiled"`` by numba (compiled once per process), or ``"python"``."""
    if engine not in _LOOPS:
        if engine == "compiled":
            import numba

            _LOOPS[engine] = _make_kernels(numba.njit(cache=False, nogil=True))["loop"]
        else:
            _LOOPS[engine] = _PYTHON["loop"]
    return _LOOPS[engine]


def curtain(lengths, targets, start: float, end: float, k: int, upward: bool, engine: str = "auto"):
    """The left curtain (docs/derivations/ot_exact.md, step 3) of atoms on the scores [start, end].

    Args:
        lengths: float64 (n,), the atoms' q-masses, in processing order (ascending h-mean when
            ``upward``, descending otherwise); their sum is end - start up to rounding.
        targets: float64 (n,), the atoms' h-masses (q_A times the wanted h-mean, h = k w^(k-1)).
        start: the score interval's lower end.
        end: the score interval's upper end.
        k: the number of children (>= 2).
        upward: True runs from ``start`` up (the left curtain), False from ``end`` down (mirrored).
        engine: ``"reference"``, one atom at a time (``_Curtain.step``, the plain reference);
            ``"compiled"``, the same steps as one loop compiled by numba (bit for bit the
            reference's pieces; numba must be installed); ``"python"``, that loop uncompiled (for
            the tests); ``"vectorised"``, runs of V-shaped atoms and of intervals above the
            frontier placed at once by numpy (``_Curtain.stretch``, ``leap``), scalar steps
            between; ``"auto"`` (default), ``"compiled"`` where numba imports, else
            ``"vectorised"``.

    Returns:
        (atom int64, lower end float64, length float64), one entry per piece in score order: the
        pieces tile [start, end] up to rounding; the last atom takes whatever is left.

    Raises:
        ValueError: an unknown ``engine``.
    """
    check_choice(engine, "engine", ENGINES, "curtain engine")
    if engine == "auto":
        engine = "compiled" if _numba_available() else "vectorised"
    lengths, targets = np.asarray(lengths, dtype=np.float64), np.asarray(targets, dtype=np.float64)
    state = _Curtain(lengths, targets, start, end, k, upward)
    if engine in ("compiled", "python"):
        owner, z0, size = _loop(engine)(state.lengths, state.targets, float(start), float(end), int(k), bool(upward))
        state.owner, state.lower, state.size = [owner], [z0], [size]
        return state.pieces()
    fast = engine == "vectorised"
    n, atom = len(lengths), 0
    chunk, wait, misses = {"stretch": 64, "leap": 64}, {"stretch": 0, "leap": 0}, {"stretch": 0, "leap": 0}
    while atom < n - 1:  # runs where they are long, scalar steps between (backoff doubles on each miss)
        placed = 0
        for kind in ("stretch", "leap") if fast else ():
            if wait[kind] > 0:
                wait[kind] -= 1
                continue
            placed = getattr(state, kind)(atom, min(atom + chunk[kind], n - 1))
            if placed:
                chunk[kind] = 2 * chunk[kind] if placed == chunk[kind] else max(64, 2 * placed)
            misses[kind] = 0 if placed >= 8 else misses[kind] + 1
            if misses[kind]:  # a miss or a short run: scalar steps cost less for a while
                wait[kind] = min(4 << misses[kind], 256)
                chunk[kind] = 64
            if placed:
                break
        if placed:
            atom += placed
        else:
            state.step(atom)
            atom += 1
    if n:
        state.finish(n - 1)
    return state.pieces()


def _atoms(rho: np.ndarray) -> np.ndarray:
    """Atom index of each token of a part, rho nondecreasing: runs of equal rho share one."""
    return np.concatenate(([0], np.cumsum(rho[1:] != rho[:-1]))) if rho.size else np.zeros(0, dtype=np.int64)


class _ExactPlan(SelectionPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        full = bool((q > 0).all())  # no support to gather (the common case)
        support = None if full else np.flatnonzero(q > 0)
        with np.errstate(over="ignore"):  # a subnormal q: an infinite ratio still sorts last
            ratio = p / q if full else p[support] / q[support]
        rank = np.argsort(ratio)  # ties share an atom: their order is immaterial
        order = rank if full else support[rank]
        ps, qs = p[order], q[order]
        P, Q, prefix_q, cut, m = _prefix_cut(ps, qs, k)
        self.alpha_star = float(np.clip(cut[m], 0.0, 1.0))
        split, total = float(prefix_q[m]), float(prefix_q[-1])
        inside, lam_in = _level(ps[:m], qs[:m], split**k, True, sums=(P[: m + 1], Q[: m + 1]))
        outside, lam_out = _level(ps[m:], qs[m:], total**k - split**k, False)
        r = ratio[rank]  # ps / qs
        atom = np.concatenate((_atoms(np.maximum(r[:m], lam_in)), _atoms(np.minimum(r[m:], lam_out))))
        n_in = int(atom[m - 1]) + 1 if m else 0
        if m < order.size:
            atom[m:] += n_in
        n_atoms = int(atom[-1]) + 1 if atom.size else 0
        length = np.bincount(atom, weights=qs, minlength=n_atoms)
        goal = np.bincount(atom, weights=np.concatenate((inside, outside)), minlength=n_atoms)
        if k == 1:  # h = 1: every split has the right means; the atoms in order
            pieces = (np.arange(n_atoms), np.concatenate(([0.0], np.cumsum(length)[:-1])), length)
        else:
            engine = verifier.engine
            inner = curtain(length[:n_in], goal[:n_in], 0.0, split, k, True, engine=engine)
            outer = curtain(length[n_in:][::-1], goal[n_in:][::-1], split, total, k, False, engine=engine)
            pieces = (np.concatenate((inner[0], n_atoms - 1 - outer[0])),) + tuple(
                np.concatenate((i, o)) for i, o in zip(inner[1:], outer[1:])
            )
        self._store(order, qs, atom, length, pieces)

    def _store(self, order, qs, atom, length, pieces):
        """Keep the pieces by atom (their global order, length fractions) and the selection law."""
        owner, _, size = pieces
        n_atoms = length.size
        atom_len = np.bincount(owner, weights=size, minlength=n_atoms)
        frac = size / atom_len[owner]
        delta = length[owner] * frac  # a draw's score mass in each piece, in score order
        before = np.zeros(delta.size)
        np.cumsum(delta[:-1], out=before[1:])
        mu_atom = np.bincount(owner, weights=_power_difference(before + delta, before, self.k, delta), minlength=n_atoms)
        # pieces grouped by atom, in score order within each: a stable sort of the owners (a few
        # monotone runs in score order, so the merge sort is near linear); one more atom for the
        # tokens with q = 0 (children only a deterministic or mixed law can hold: a lossy pairing):
        # one piece below every other, so such a child is selected only when every child is one,
        # uniformly among them (the last entry of each array below)
        n = owner.size
        self.rank = np.full(n + 1, -1, dtype=np.int64)
        self.rank[:n] = np.argsort(owner, kind="stable")
        by_atom = self.rank[:n]
        self.ptr = np.zeros(n_atoms + 2, dtype=np.int64)
        np.cumsum(np.bincount(owner, minlength=n_atoms), out=self.ptr[1:-1])
        self.ptr[-1] = n + 1
        ptr = self.ptr[:-1]
        self.frac = np.ones(n + 1)
        grouped = np.take(frac, by_atom, out=self.frac[:n])
        cum = np.cumsum(grouped)
        self.lead = np.zeros(n + 1)
        np.subtract(cum - grouped, np.repeat(cum[ptr[:-1]] - grouped[ptr[:-1]], np.diff(ptr)), out=self.lead[:n])
        self.atom_of = np.full(self.p.size, n_atoms, dtype=np.int64)
        self.atom_of[order] = atom
        mu = np.zeros(self.p.size)
        mu[order] = qs * (mu_atom / length)[atom]
        self._select_with(mu)

    @property
    def certified(self) -> bool:
        """True when sum min(mu, p) equals alpha* to ``ot_walk.CERTIFY_TOL`` (the walk's flag, for
        callers of either: here always, barring a floating-point failure of the curtain)."""
        return abs(self.value - self.alpha_star) <= CERTIFY_TOL

    @property
    def pieces(self) -> int:
        """How many pieces the scores are split into (at least the number of atoms)."""
        return int(self.ptr[-2])

    def _below(self, atom: int, ranks: np.ndarray) -> np.ndarray:
        """The fraction of ``atom``'s score length in pieces before each of ``ranks``."""
        lo, hi = self.ptr[atom], self.ptr[atom + 1]
        idx = np.searchsorted(self.rank[lo:hi], ranks)
        ends = np.concatenate(([0.0], self.lead[lo:hi] + self.frac[lo:hi]))
        return ends[idx]

    def _selection(self, children: np.ndarray) -> np.ndarray:
        """P(child j is selected), float64 (k,) (docs/derivations/ot_exact.md: per atom, then per copy)."""
        atoms, inverse, counts = np.unique(self.atom_of[children], return_inverse=True, return_counts=True)
        per_atom = np.empty(atoms.size)
        for i, (a, n) in enumerate(zip(atoms, counts)):
            lo, hi = self.ptr[a], self.ptr[a + 1]
            c, d = self.lead[lo:hi], self.frac[lo:hi]
            inner, power = np.zeros_like(c), np.ones_like(c)  # int_0^1 (c + d u)^(n-1) du
            for j in range(n):
                inner = inner * (c + d) + power
                power = power * c
            value = d * inner / n
            for b, nb in zip(atoms, counts):
                if b != a:
                    value = value * self._below(b, self.rank[lo:hi]) ** nb
            per_atom[i] = value.sum()
        return per_atom[inverse]

    def _draw(self, children, rng):
        best, chosen = None, None
        for token in children:
            a = self.atom_of[token]
            lo, hi = self.ptr[a], self.ptr[a + 1]
            piece = lo + inverse_cdf(self.lead[lo:hi] + self.frac[lo:hi], rng)
            key = (self.rank[piece], rng.random())
            if best is None or key > best:
                best, chosen = key, token
        return self._speculative(chosen, rng)

    def acceptance_formula(self) -> float:
        """sum min(mu, p): the plan's exact acceptance (alpha* to rounding: the tests)."""
        return self.value


@dataclass(frozen=True)
class OTExact(NodeVerifier):
    """The OT optimum for i.i.d. children (module docstring): selection of the child of highest
    score, the scores split among the tokens by the left curtain so that the selection law is
    ``ot_walk``'s mu* at every node, then speculative sampling of mu* against p.  Acceptance alpha*
    (the closed form) at every p, q, k; lossless for i.i.d. children.

    Args:
        engine: how the curtain is computed (``curtain``'s engines: ``"auto"``, the default,
            ``"compiled"``, ``"vectorised"``, ``"python"``, ``"reference"``); every engine gives
            the same selection law to rounding (the tests: 1e-12), the loops the reference's
            pieces bit for bit.

    Raises:
        ValueError: an unknown ``engine``; ``"compiled"`` without numba fails at ``prepare``
            (ImportError).
    """

    name = "ot_exact"
    label = "OT optimum (curtain)"
    ot_based = True
    speculative_at_one = True
    engine: str = "auto"

    def __post_init__(self):
        check_choice(self.engine, "engine", ENGINES, "curtain engine")

    def _plan(self, p, q, k):
        return _ExactPlan(self, p, q, k)
