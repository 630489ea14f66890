"""Drafting laws for the k children of one draft-tree node.

Four laws appear in the literature; every tree states, node by node, which one drew its
children, and every verifier states for which laws it is lossless:

* ``Drafting.IID`` - the children X_1..X_k are i.i.d. q (K independent rollouts; SpecInfer,
  SpecTr, Khisti, NSS, NaiveTree).  Q(x) = prod_i q(x_i).
* ``Drafting.WITHOUT_REPLACEMENT`` - X_i ~ q^(i-1), where q^(0) = q and q^(i) is q^(i-1) with
  x_i removed and renormalised (RSD, EAGLE-1, Sequoia, Traversal siblings).
  Q(x) = prod_i q(x_i) / (1 - sum_{j<i} q(x_j)).
* ``Drafting.DETERMINISTIC`` - the children are a function of the context, not a sample
  (EAGLE-2/3's confidence-ranked top-k, static top-k trees, TreeGraft, SpecBlock).  At node
  level: the k most probable tokens of q (ties: lowest id), Q = 1.
* ``Drafting.MIXED`` - Hu et al.'s greedy draft: the first k-1 children D are deterministic
  (node level: the k-1 most probable tokens of q) and the last one is drawn from
  q~ = q restricted to V \\ D, renormalised.  Q(x) = q~(x_k).

* ``Drafting.REPEATED`` - one draw x ~ q, listed k times (x, ..., x): what the DDTE authors'
  public tree code gives a trunk node shared by K paths (one edge per path).  An audit
  convention (``Delayed(..., trunk_children="per_path")``): verifiers that treat the copies as k
  i.i.d. draws are lossy there.  Q((x, .., x)) = q(x).

A single child drawn from q (k = 1) is both an i.i.d. and a without-replacement draw
(``sampled_once``).  Children are ordered tuples of token ids; exact enumeration lists every
tuple of positive probability together with Q(x).
"""

from __future__ import annotations

import enum
import itertools

import numpy as np

from simlab.checks import check_int
from simlab.distributions import inverse_cdf, positive_part, sample_categorical, top_ranked

MAX_ENUMERATED_TUPLES = 250_000
"""Largest number of ordered child tuples that exact enumeration will list."""


class Drafting(str, enum.Enum):
    """The joint law of a node's drafted children (see the module docstring)."""

    IID = "iid"
    WITHOUT_REPLACEMENT = "without_replacement"
    DETERMINISTIC = "deterministic"
    MIXED = "mixed"
    REPEATED = "repeated"

    @property
    def description(self) -> str:
        return {
            "iid": "i.i.d. from q",
            "without_replacement": "from q without replacement",
            "deterministic": "deterministically (a function of the context)",
            "mixed": "as a greedy draft (deterministic best children, one tail sampled from q on the rest)",
            "repeated": "as one draw from q repeated k times (the DDTE public code's trunk children)",
        }[self.value]


SAMPLED = frozenset({Drafting.IID, Drafting.WITHOUT_REPLACEMENT})
"""The laws of children sampled from q; with one child (k = 1) they coincide."""

ONE_DRAW = SAMPLED | {Drafting.MIXED}
"""Laws under which a single child drawn from q is a valid draw (a greedy draft without
deterministic children is one draw from q)."""


def sampled_once(law: Drafting, k: int) -> bool:
    """True for a single child drawn from q (i.i.d. and without replacement alike)."""
    return k == 1 and law in SAMPLED


def lossless_pairing(lossless_for: frozenset, law: Drafting, k: int) -> bool:
    """True when a verifier lossless for ``lossless_for`` is lossless at a node of ``law`` with k
    children: ``law`` is one of them, or the node has a single child drawn from q and the
    verifier is lossless for some law under which that is a valid draw."""
    return law in lossless_for or (sampled_once(law, k) and bool(lossless_for & ONE_DRAW))


def check_k(k, name: str = "k") -> int:
    """Validate a number of children (a positive integer); return it as ``int``."""
    return check_int(k, name, 1)


def top_tokens(q: np.ndarray, n: int) -> np.ndarray:
    """The n most probable tokens of q with q > 0, most probable first (ties: lowest id), int64.

    Raises:
        ValueError: ``k: ...`` when q has fewer than n tokens of positive probability.
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > q.size or np.count_nonzero(q) < n:
        raise ValueError(f"k: {n} deterministic children need at least {n} tokens with q > 0, q has {int(np.count_nonzero(q))}")
    return top_ranked(q, n)


def tail_law(q: np.ndarray, deterministic) -> np.ndarray:
    """q~ = q restricted to the tokens outside ``deterministic``, renormalised; float64 (V,).

    Raises:
        ValueError: ``k: ...`` when q has no mass outside them (no tail can be drawn).
    """
    rest = q.copy()
    rest[np.asarray(deterministic, dtype=np.int64)] = 0.0
    mass = rest.sum()
    if not mass > 0.0:
        raise ValueError("k: q has no mass outside the deterministic children, so no tail child can be drawn")
    return rest / mass


def child_tuples(q: np.ndarray, k: int, drafting: Drafting) -> tuple[np.ndarray, np.ndarray]:
    """Enumerate every ordered child tuple of positive probability and its probability Q(x).

    Args:
        q: draft distribution, shape (V,), float64 (validated by the caller).
        k: number of children.
        drafting: the drafting law.

    Returns:
        ``(tuples, probs)``: int64 array (n, k) and float64 array (n,) with sum(probs) = 1.

    Raises:
        ValueError: if more than ``MAX_ENUMERATED_TUPLES`` tuples would be listed, or if the
            law asks for more distinct tokens than q has support.
    """
    k = check_k(k)
    support = np.flatnonzero(q > 0)
    n = support.size
    if drafting is Drafting.DETERMINISTIC:
        return top_tokens(q, k)[None, :], np.ones(1)
    if drafting is Drafting.REPEATED:
        return np.repeat(support[:, None], k, axis=1).astype(np.int64), q[support]
    if drafting is Drafting.MIXED:
        best = top_tokens(q, k - 1)
        tail = tail_law(q, best)
        tails = np.flatnonzero(tail > 0)
        tuples = np.concatenate([np.tile(best, (tails.size, 1)), tails[:, None]], axis=1).astype(np.int64)
        return tuples, tail[tails]
    if drafting is Drafting.IID:
        count = n**k
    else:
        if k > n:
            raise ValueError(f"k: drafting {k} children without replacement needs at least {k} tokens with q > 0, q has {n}")
        count = int(np.prod(np.arange(n - k + 1, n + 1, dtype=np.float64)))
    if count > MAX_ENUMERATED_TUPLES:
        raise ValueError(
            f"k: exact enumeration would list {count} child tuples (V={q.size}, k={k}), above the limit "
            f"{MAX_ENUMERATED_TUPLES}; use a smaller vocabulary or k"
        )
    if drafting is Drafting.IID:
        tuples = np.array(list(itertools.product(support, repeat=k)), dtype=np.int64).reshape(-1, k)
        probs = np.prod(q[tuples], axis=1)
    else:
        tuples = np.array(list(itertools.permutations(support, k)), dtype=np.int64).reshape(-1, k)
        probs = tuple_probability(q, tuples, drafting)
    return tuples, probs


def tuple_probability(q: np.ndarray, tuples: np.ndarray, drafting: Drafting) -> np.ndarray:
    """Q(x) for each row of ``tuples`` (shape (n, k)) under a sampled law (i.i.d. or without
    replacement); float64 (n,)."""
    tuples = np.atleast_2d(np.asarray(tuples, dtype=np.int64))
    if drafting is Drafting.IID:
        return np.prod(q[tuples], axis=1)
    if drafting is not Drafting.WITHOUT_REPLACEMENT:
        raise ValueError(f"drafting: tuple probabilities are defined for sampled laws, got {drafting.value}")
    # Without replacement: the remaining mass is summed directly over the undrawn tokens
    # (not as 1 - drawn mass, which cancels badly when the drawn tokens hold most of q).
    rows = np.arange(tuples.shape[0])
    left = np.broadcast_to(q, (tuples.shape[0], q.size)).copy()
    probs = np.ones(tuples.shape[0])
    for column in tuples.T:
        remaining = left.sum(axis=1)
        drawn = left[rows, column]
        with np.errstate(divide="ignore", invalid="ignore"):
            probs *= np.where(remaining > 0, drawn / remaining, 0.0)
        left[rows, column] = 0.0
    return probs


def draw_children(q: np.ndarray, k: int, drafting: Drafting, rng: np.random.Generator) -> np.ndarray:
    """Draw k ordered children from ``q`` under ``drafting``; int64 array (k,).

    Uses one uniform per sampled child (inverse CDF), so the same generator state gives the
    same children (the deterministic children of ``DETERMINISTIC`` and ``MIXED`` use none).
    """
    k = check_k(k)
    if drafting is Drafting.DETERMINISTIC:
        return top_tokens(q, k)
    if drafting is Drafting.MIXED:
        best = top_tokens(q, k - 1)
        return np.append(best, sample_categorical(tail_law(q, best), rng)).astype(np.int64)
    if drafting is Drafting.REPEATED:
        return np.full(k, sample_categorical(q, rng), dtype=np.int64)
    out = np.empty(k, dtype=np.int64)
    if drafting is Drafting.IID:  # one law for every child: its cdf once (the same draws as sample_categorical)
        cdf = np.cumsum(q)
        for i in range(k):
            out[i] = inverse_cdf(cdf, rng)
        return out
    current = q.copy()
    for i in range(k):
        if drafting is Drafting.WITHOUT_REPLACEMENT and not (current > 0).any():
            raise ValueError(f"k: cannot draft {k} children without replacement from {i} tokens with q > 0")
        out[i] = sample_categorical(current, rng)
        if drafting is Drafting.WITHOUT_REPLACEMENT:
            current[out[i]] = 0.0
    return out


def hit_probability(q: np.ndarray, n: int) -> np.ndarray:
    """P(token t appears among n i.i.d. draws from q) = 1 - (1 - q(t))^n, elementwise, float64 (V,).

    (1 - q)^n by repeated squaring (O(log n) passes over the vocabulary); the absolute error
    is a few ulps per token.  n = 0 gives zeros.
    """
    if n == 0:
        return np.zeros_like(q)
    miss = np.subtract(1.0, q)
    positive_part(miss, out=miss)  # q may exceed 1 by rounding (the array-array loop: same values, faster)
    power = None
    while n:
        if n & 1:
            power = miss.copy() if power is None else np.multiply(power, miss, out=power)
        n >>= 1
        if n:
            np.multiply(miss, miss, out=miss)
    return np.subtract(1.0, power, out=power)


def inclusion_probability(q: np.ndarray, k: int, drafting: Drafting) -> np.ndarray:
    """pi(t) = P(token t is among the k children), children drawn from ``q`` by ``drafting``;
    float64 (V,).  So sum_t p(t) pi(t) is the acceptance of a rule that accepts a draw from p
    iff it is a child (NSS, strict exact-match).

    * i.i.d.: 1 - (1 - q(t))^k (``hit_probability``);
    * deterministic: 1 on the k most probable tokens of q (``top_tokens``), else 0;
    * mixed (greedy draft): 1 on the k - 1 deterministic children, q~(t) elsewhere (``tail_law``);
    * repeated: q(t) (one draw, listed k times);
    * without replacement: no product form; the exact sum over the first k - 1 draws D (each
      with its probability Q(D), ``child_tuples``) of 1_D(t) + 1_{t not in D} q(t) / q(V minus D),
      the remaining mass summed over the undrawn tokens.  V^(k-1) terms at most.

    Raises:
        ValueError: ``k: ...`` as ``child_tuples`` (too few tokens with q > 0, or too many
            prefixes to enumerate).
    """
    k = check_k(k)
    if drafting is Drafting.IID:
        return hit_probability(q, k)
    if drafting is Drafting.REPEATED:
        return q.copy()
    if drafting is Drafting.DETERMINISTIC:
        out = np.zeros_like(q)
        out[top_tokens(q, k)] = 1.0
        return out
    if drafting is Drafting.MIXED:
        best = top_tokens(q, k - 1)
        out = tail_law(q, best)
        out[best] = 1.0
        return out
    if k > np.count_nonzero(q):
        raise ValueError(
            f"k: drafting {k} children without replacement needs at least {k} tokens with q > 0, q has {int(np.count_nonzero(q))}"
        )
    if k == 1:
        return q.copy()
    out = np.zeros_like(q)
    prefixes, probs = child_tuples(q, k - 1, Drafting.WITHOUT_REPLACEMENT)
    for prefix, prob in zip(prefixes, probs):
        rest = q.copy()
        rest[prefix] = 0.0
        out += prob * (rest / rest.sum())
        out[prefix] += prob
    return out
