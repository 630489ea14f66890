"""Probability vectors over a vocabulary: validation, residuals, divergences.

Everything here works in float64 on 1-D arrays of length V (the vocabulary size).  The
logits-to-p transform (temperature, top-k, top-p) lives in ``simlab.sampling``.
Nothing is renormalised silently: a vector that is not a probability distribution
raises ``ValueError`` naming the argument and the problem.

Conventions (shared with the rest of the lab):

* target distribution ``p``, draft distribution ``q``;
* divergences in nats; ``TV(p, q) = sum (p - q)_+ = 1 - sum min(p, q)``;
* a categorical draw consumes exactly one uniform from the ``numpy.random.Generator``.
"""

from __future__ import annotations

import functools
import math
import threading

import numpy as np

from simlab.checks import check_generator, check_real_array

_INF = float("inf")  # a module constant: the draw's total test without an attribute lookup

SUM_TOLERANCE = 1e-9
"""Largest accepted |sum(x) - 1| for a float64 probability vector (``sum_tolerance``)."""


def sum_tolerance(dtype, size: int) -> float:
    """The largest accepted |sum(x) - 1| of a probability vector of ``size`` entries held in ``dtype``
    (the input's own dtype, before the float64 cast).

    float32: ``FLOAT32_SPREAD * sqrt(size) * eps32``, eps32 = 2^-23 ~ 1.19e-7 (8.5e-5 at V = 32,000,
    1.7e-4 at V = 128,000, 1.9e-4 at V = 151,936).  Rounding errors of a float32 softmax add up like a
    random walk, about sqrt(V) eps32 (Higham, *Accuracy and Stability of Numerical Algorithms*,
    2002, section 4.2, the probabilistic bound); measured on torch 2.13's float32 ``softmax``,
    ``exp(log_softmax)`` and a hand-written exp / sum (V = 8 to 262,144; logits N(0, s^2) for s up
    to 10, uniform, constant, ramps) the largest deviation was 0.52 sqrt(V) eps32, at V = 8; at V >=
    1,000 at most 0.37 sqrt(V) eps32.  The worst-case bound V u (u = eps32 / 2) is not used: at
    V = 128,000 it is 0.008, wide enough to pass a vector that sums to 0.99.  Every other case keeps
    ``SUM_TOLERANCE`` (1e-9): float64, whose rounding is far below it, and float16, whose rounding
    (2^-10) would pass garbage at any real vocabulary.
    """
    if np.dtype(dtype) == np.float32:
        return max(SUM_TOLERANCE, FLOAT32_SPREAD * math.sqrt(size) * float(np.finfo(np.float32).eps))
    return SUM_TOLERANCE


FLOAT32_SPREAD = 4.0
"""``sum_tolerance``'s factor on sqrt(V) eps32: about 8x the largest deviation measured (0.52)."""


def check_distribution(x, name: str, *, size: int | None = None) -> np.ndarray:
    """Validate a probability vector and return it as a float64 array.

    A vector whose float64 sum is within 1e-9 of 1 is returned with the same values.  A float32
    vector (a torch model's probabilities, for example) may sum to 1 only within its own rounding,
    ``sum_tolerance(float32, V) = 4 sqrt(V) 2^-23``: one off by more than 1e-9 is returned
    divided by its float64 sum (renormalised in float64, so it sums to 1 within float64 rounding).
    Every other dtype must sum to 1 within 1e-9.  Logits are not probabilities:
    ``simlab.sampling.sampling_distribution`` turns them into p.

    Args:
        x: array-like of shape (V,).
        name: the argument's name, used in error messages (for example ``"p"``).
        size: if given, the required length V (the length of the other argument).

    Returns:
        ndarray (V,), float64: the same values (a float32 input off 1 by more than 1e-9: renormalised).

    Raises:
        ValueError: if ``x`` is complex, strings, ``None`` or not numeric, a masked array with
            masked entries (``simlab.checks.check_real_array``), not 1-D, is empty, has the wrong
            length, contains NaN or infinite or negative entries, or sums to 1 only to worse than
            ``sum_tolerance`` of its dtype (the message names ``sampling_distribution`` for logits).
    """
    arr = check_real_array(x, name)
    if arr.ndim != 1:
        raise ValueError(f"{name}: must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name}: is empty")
    if size is not None and arr.size != size:
        raise ValueError(f"{name}: has length {arr.size}, expected {size} (the length of the other distribution)")
    smallest, total = float(arr.min()), float(arr.sum())  # two passes: the fast path at V ~ 1e5
    if not (np.isfinite(smallest) and np.isfinite(total)):
        raise ValueError(f"{name}: contains NaN or infinite entries")
    if smallest < 0:
        raise ValueError(f"{name}: contains negative entries (min {smallest:.3g})")
    if abs(total - 1.0) > SUM_TOLERANCE:  # the float64 bound; a narrower input's own bound is looked up only here
        dtype = np.asarray(x).dtype
        tolerance = sum_tolerance(dtype, arr.size)
        if abs(total - 1.0) > tolerance:
            held = "" if tolerance == SUM_TOLERANCE else f" ({dtype} rounding at V = {arr.size})"
            widened = ""
            if tolerance == SUM_TOLERANCE and 2.0**-24 < abs(total - 1.0) <= sum_tolerance(np.float32, arr.size):
                widened = " (a float32 law cast to float64 or a list keeps float32's rounding: pass it as float32)"
            raise ValueError(
                f"{name}: sums to {total!r}, not 1 within {tolerance:g}{held}{widened}; "
                "for logits use simlab.sampling.sampling_distribution"
            )
        arr = arr / total  # a float32 law within its rounding: renormalised in float64
    return arr


def check_pair(p, q) -> tuple[np.ndarray, np.ndarray]:
    """Validate target ``p`` and draft ``q`` of the same length V; return both as float64."""
    p = check_distribution(p, "p")
    q = check_distribution(q, "q", size=p.size)
    return p, q


def sample_categorical(probs, rng: np.random.Generator) -> int:
    """Draw one index from ``probs`` (shape (V,), non-negative, positive finite sum) by inverse CDF:
    the first index whose cumulative mass exceeds ``U * total``, U = ``rng.random()`` in [0, 1).

    The one categorical draw of the lab: every sampler (node verifiers, tree verifiers, builders,
    drafting laws, the synthetic worlds through ``inverse_cdf``) draws through it.  Consumes
    exactly one ``rng.random()``; returns an index of positive mass for every U in [0, 1): when
    ``U * total`` rounds up to the total (U just below 1 with a subnormal total), the last index
    of positive mass, the one U -> 1 reaches.  ``probs`` need not be normalised exactly (its own
    total is used).  The law is checked here, at the cost of one pass over it besides the cumulative
    sum (its minimum: about 4 % of the draw at V = 128,000, 0.5 us at V = 10); ``inverse_cdf``, for a
    caller that keeps a cdf and draws from it many times, checks only what costs O(1).

    Args:
        probs: array-like (V,) of real numbers: a float64 ndarray as it is, anything else through
            ``simlab.checks.check_real_array`` (float64: a float32 or float16 cumulative sum drifts,
            and stalls at 0.5 for 4,096 float16 masses of 1/4,096).
        rng: a ``numpy.random.Generator``.

    Raises:
        ValueError: ``probs: ...`` when it is not numeric (``check_real_array``), not 1-D, empty,
            has NaN or negative entries, or a total mass that is infinite or not positive (no
            index can be drawn; a caller with a zero residual decides what its rule emits, never
            this draw); ``rng: ...`` when it is not a Generator (``simlab.checks.check_generator``).
    """
    if type(probs) is not np.ndarray or probs.dtype != np.float64:  # float32/16: their cumsum drifts or stalls
        probs = check_real_array(probs, "probs")
    if probs.ndim != 1 or probs.size == 0:
        raise ValueError(f"probs: must be a non-empty 1-D array, got shape {probs.shape}")
    # NaN if there is one; argmin is one C call (the cheaper below 8,192 entries), min the faster per entry
    smallest = probs.min() if probs.size > 8192 else probs[probs.argmin()]
    if not smallest >= 0.0:
        problem = "NaN" if np.isnan(smallest) else f"negative entries (min {smallest:.3g})"
        raise ValueError(f"probs: contains {problem}")
    return inverse_cdf(probs.cumsum(), rng)


def inverse_cdf(cdf: np.ndarray, rng: np.random.Generator) -> int:
    """``sample_categorical`` given the cumulative sums ``cdf = np.cumsum(probs)`` (float64 (V,)),
    for a caller that draws many times from one law and keeps its cdf: the same index, the same
    uniform, the same guard.  Checks what costs O(1) only (the caller checked the law once, where
    it made the cdf): a cdf that is not non-decreasing is drawn from as it is.

    Raises:
        ValueError: ``probs: ...`` when the cdf is empty or its total mass ``cdf[-1]`` is
            infinite, NaN or not positive; ``rng: ...`` when it is not a Generator.
    """
    try:
        total = cdf[-1]
    except IndexError:
        raise ValueError("probs: is empty; nothing to draw") from None
    if not 0.0 < total < _INF:
        what = "is not finite" if total == _INF or total != total else "is not positive"
        raise ValueError(f"probs: total mass {float(total)!r} {what}; nothing to draw")
    if type(rng) is not np.random.Generator:  # None, a seed, a RandomState, the random module: named
        check_generator(rng)
    u = rng.random()
    index = int(cdf.searchsorted(u * total, side="right"))
    if index == cdf.size:  # U * total rounded up to the total: the last index of positive mass
        index = int(cdf.searchsorted(total, side="left"))
    return index


@functools.lru_cache(maxsize=4)
def _zeros(size: int) -> np.ndarray:
    zeros = np.zeros(size)
    zeros.flags.writeable = False  # shared: nobody writes it
    return zeros


_SCRATCH = threading.local()


def scratch(size: int, dtype=np.float64, slot: int = 0) -> np.ndarray:
    """A work vector (size,) of ``dtype`` (default float64) of this thread, reused from call to call
    (contents undefined); ``slot`` tells apart several vectors of one size and dtype held at once.

    For reductions over V that need one temporary and return scalars (a plan's residual masses,
    SpecTr's ratios and its between-set masks): a fresh V-sized array is a new mapping whose pages
    fault in on first touch (at V = 128,000 that cost more than the arithmetic:
    benchmarks/RESULTS.md).  The caller must not keep it past its own computation, nor call another
    user of the same (size, dtype, slot) while it holds it; per thread, so threads never share one.
    """
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    key = (size, np.dtype(dtype), slot)
    if key not in buffers:
        if len(buffers) >= 8:
            buffers.clear()
        buffers[key] = np.empty(size, dtype=dtype)
    return buffers[key]


def positive_part(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """max(x, 0) elementwise for a float64 array (into ``out`` when given; ``out`` may be ``x``).

    The same values as ``np.maximum(x, 0.0)``, through numpy's array-array loop against a shared
    read-only zero vector: against the scalar 0 numpy 2.4 takes a loop about four times slower
    (55 us against 15 us at V = 128,000 on these machines: benchmarks/RESULTS.md), and every
    residual of every verifier goes through this.
    """
    x = np.asarray(x)
    if x.ndim != 1 or x.dtype != np.float64:
        return np.maximum(x, 0.0, out=out)
    return np.maximum(x, _zeros(x.shape[0]), out=out)


def residual(p: np.ndarray, subtract: np.ndarray) -> np.ndarray:
    """The correction (residual) law ``norm((p - subtract)_+)``, shape (V,), float64.

    ``subtract`` is the mass already emitted by accepted drafts: q for speculative sampling,
    c * min(q, p / rho) for SpecTr.  If ``(p - subtract)_+`` has zero mass, a rejection has
    probability zero in exact arithmetic (for speculative sampling p <= q elementwise means
    p = q up to the 1e-9 validation tolerance), so any law is correct for the correction
    token and ``p`` itself is returned; never a constant floor.
    Source: Leviathan et al. 2023, Alg. 1.
    """
    diff = positive_part(p - subtract)
    mass = diff.sum()
    if mass > 0.0:
        return diff / mass
    return p / p.sum()


def inner(a: np.ndarray, b: np.ndarray) -> float:
    """sum_t a(t) b(t) for float64 (V,) arrays, by numpy's own loop (``einsum``), never threaded BLAS
    (``np.dot`` over V hands the sum to BLAS threads, which stall on a shared machine)."""
    return float(np.einsum("i,i->", a, b))


def top_ranked(x: np.ndarray, n: int) -> np.ndarray:
    """The first n entries of ``np.argsort(-x, kind="stable")`` (largest first, ties: lowest id),
    int64 (min(n, V),), for a 1-D float array without NaN.

    A fast path for n much smaller than V: a partition finds the n-th largest value, and only the
    tokens at or above it (every token tied with the n-th included, so ties still go to the lowest
    id) are sorted; the full stable sort is the reference (tests/test_distributions.py checks
    that they agree, ties and zeros included).
    """
    x = np.asarray(x)
    n = min(int(n), x.size)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    if n < x.size // 8:
        cutoff = -np.partition(-x, n - 1)[n - 1]  # the n-th largest value
        candidates = np.flatnonzero(x >= cutoff)
        return candidates[np.argsort(-x[candidates], kind="stable")][:n].astype(np.int64)
    return np.argsort(-x, kind="stable")[:n].astype(np.int64)


def top_positive(x: np.ndarray, n: int, *, block: int = 2048) -> np.ndarray:
    """The n largest positive entries of a 1-D float array without NaN, largest first (ties: lowest
    id), fewer when x has fewer positive entries: the first min(n, count(x > 0)) entries of
    ``np.argsort(-x, kind="stable")``, int64.

    No partition of the whole row: the n-th largest of the first ``block`` entries is a lower bound
    t of the row's n-th largest (a subset's n-th largest never exceeds the set's), so every entry of
    the answer, ties at the n-th included, is among the entries >= t, found by one sequential
    comparison over x (one read of the row) and ranked alone (by ``top_ranked`` when there are
    many).  Which subset gives t changes only how many candidates there are, never the answer.
    When the block has fewer than n positive entries every positive entry is a candidate.
    ``top_ranked`` on the positive entries is the reference (tests).
    """
    x = np.asarray(x)
    n = int(n)
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    head = x[: max(block, n)]
    t = np.partition(head, head.size - n)[head.size - n] if head.size >= n else 0.0  # the block's n-th largest
    candidates = np.flatnonzero(x >= t) if t > 0.0 else np.flatnonzero(x > 0.0)
    if candidates.size > 64 * n:
        order = top_ranked(x[candidates], n)
    else:
        order = np.argsort(-x[candidates], kind="stable")[:n]
    return candidates[order].astype(np.int64, copy=False)


def total_variation(p, q) -> float:
    """TV(p, q) = sum (p - q)_+ = 1 - sum min(p, q), in [0, 1]."""
    p, q = check_pair(p, q)
    return float(positive_part(p - q).sum())


def l1_distance(p, q, *, checked: bool = False) -> float:
    """||p - q||_1 = 2 TV(p, q), in [0, 2] (``checked=True``: p and q are validated float64 arrays)."""
    if not checked:
        p, q = check_pair(p, q)
    return float(np.abs(p - q).sum())


def kl_divergence(p, q, *, checked: bool = False) -> float:
    """KL(p || q) = sum_t p(t) log(p(t) / q(t)) in nats; ``inf`` if some q(t) = 0 < p(t).

    For the reverse direction KL(q || p) call ``kl_divergence(q, p)``.  ``checked=True``: p and q
    are validated float64 arrays already (``check_pair``), so they are not validated again.
    """
    if not checked:
        p, q = check_pair(p, q)
    support = p > 0
    if np.any(q[support] == 0):
        return float("inf")
    ps, qs = p[support], q[support]
    return float(max(np.sum(ps * (np.log(ps) - np.log(qs))), 0.0))


def entropy(p, *, checked: bool = False) -> float:
    """Shannon entropy H(p) = -sum p log p in nats (0 log 0 = 0) (``checked=True``: p is validated)."""
    if not checked:
        p = check_distribution(p, "p")
    ps = p[p > 0]
    return float(-np.sum(ps * np.log(ps)))
