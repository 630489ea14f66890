"""Single-draft speculative sampling, the primitive inside NaiveTree and Khisti.

Given one drafted token x ~ r (the *proposal* law; q for NaiveTree, Khisti's p_I), accept x
with probability a(x) = min(1, p(x) / r(x)); otherwise output the correction token
Y ~ norm((p - r)_+).  Output law: B(x, .) = a(x) delta_x + (1 - a(x)) norm((p - r)_+), and
sum_x r(x) B(x, .) = p.  Source: Leviathan et al. 2023, Alg. 1; Chen et al. 2023.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from simlab.distributions import positive_part, residual, sample_categorical, scratch
from simlab.verifiers.base import accept_draw

_BLOCK = 2048
"""Tokens compared per step when deciding whether p > r somewhere (``SingleDraft.has_excess``)."""


def accept_probabilities(p_values, r_values) -> np.ndarray:
    """min(1, p / r) elementwise.  Where r = 0 (a proposal mass that underflowed) the limit is
    used: 1 if p > 0, and 0 if p = 0, so a token the target never emits is never accepted."""
    p_values, r_values = np.asarray(p_values, dtype=np.float64), np.asarray(r_values, dtype=np.float64)
    safe = np.where(r_values > 0, r_values, 1.0)
    with np.errstate(over="ignore"):  # p / r above the float range for a subnormal r: min(1, inf) = 1
        ratio = np.minimum(1.0, p_values / safe)
    return np.where(r_values > 0, ratio, (p_values > 0).astype(np.float64))


class SingleDraft:
    """Speculative sampling of target ``p`` against proposal ``r`` (both float64 (V,)).

    Nothing over V is computed at construction: the correction law ``correction`` =
    norm((p - r)_+) is built on first use (``simlab.distributions.residual``), and ``mass_at``
    reads B(x, .) at a few tokens from the residual mass ``excess`` alone (one reduction), so a
    caller pays for the full law or the children's entries, not both.
    """

    def __init__(self, p: np.ndarray, r: np.ndarray):
        self.p = p
        self.r = r

    @cached_property
    def excess(self) -> float:
        """Z = sum (p - r)_+, the residual mass; 0 when p <= r everywhere (the correction is then p)."""
        buffer = np.subtract(self.p, self.r, out=scratch(self.p.size))
        positive_part(buffer, out=buffer)
        return float(buffer.sum())

    @cached_property
    def correction(self) -> np.ndarray:
        """norm((p - r)_+), float64 (V,) (p itself when Z = 0, as ``residual``)."""
        return residual(self.p, self.r)

    def correction_at(self, tokens: np.ndarray) -> np.ndarray:
        """correction[tokens] without building the correction law; float64 (len(tokens),)."""
        if self.excess > 0.0:
            return np.maximum(self.p[tokens] - self.r[tokens], 0.0) / self.excess
        return self.p[tokens] / self.p.sum()

    def accept_probability(self, x: int) -> float:
        """a(x) = min(1, p(x) / r(x)); see ``accept_probabilities``."""
        return float(accept_probabilities(self.p[x], self.r[x]))

    def law(self, x: int) -> np.ndarray:
        """B(x, .), float64 (V,)."""
        a = self.accept_probability(x)
        out = (1.0 - a) * self.correction
        out[x] += a
        return out

    def mass_at(self, x: int, tokens: np.ndarray) -> np.ndarray:
        """B(x, tokens) = law(x)[tokens] in O(len(tokens)); float64 (len(tokens),)."""
        a = self.accept_probability(x)
        return (1.0 - a) * self.correction_at(tokens) + a * (tokens == x)

    @cached_property
    def has_excess(self) -> bool:
        """Z > 0, i.e. p > r at some token (in floating point p - r > 0 iff p > r, and a sum of
        nonnegative terms is positive iff one term is), decided block by block: for any p != r the
        first block usually settles it, so the rows are rarely read whole."""
        if "excess" in self.__dict__:
            return self.excess > 0.0
        for start in range(0, self.p.size, _BLOCK):
            if np.any(self.p[start : start + _BLOCK] > self.r[start : start + _BLOCK]):
                return True
        return False

    def masses_at(self, x: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``mass_at(x[i], tokens[i])`` for every row i at once: int (M,) drafts and int (M, n)
        tokens -> float64 (M, n), equal to the row-by-row values bit for bit (the same elementwise
        operations).

        One child (n = 1, tokens = x): the mass is a(x) itself whenever Z > 0, with no pass over V
        for Z.  Bit for bit: (1 - a) * correction(x) + a, where a < 1 means p(x) / r(x) < 1, so
        p(x) < r(x) and correction(x) = (p(x) - r(x))_+ / Z = 0, and a = 1 makes (1 - a) zero;
        only Z = 0 (p <= r everywhere) takes the general formula (correction = p)."""
        a = accept_probabilities(self.p[x], self.r[x])[:, None]
        if tokens.shape[1] == 1 and np.array_equal(tokens[:, 0], x) and self.has_excess:
            return a
        return (1.0 - a) * self.correction_at(tokens) + a * (tokens == x[:, None])

    def draw(self, x: int, rng: np.random.Generator) -> int:
        """One run: accept x, or draw the correction token."""
        if accept_draw(rng, self.p[x], self.r[x]):
            return int(x)
        return sample_categorical(self.correction, rng)
