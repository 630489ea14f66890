"""What every synthetic world shares: sampling settings, seeded rows, a bounded memo."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from simlab.distributions import sampling_distribution


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling transform applied identically to the target and the draft.

    Args:
        temperature: T >= 0 (0 = greedy, argmax with lowest-index ties).
        top_k: keep the k most probable tokens (None: all).
        top_p: nucleus threshold in (0, 1] (None: 1).

    Raises:
        ValueError: out-of-range values (checked by ``simlab.distributions.sampling_distribution``).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        sampling_distribution([0.0, 0.0], temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def identity(self) -> bool:
        return self.temperature == 1.0 and self.top_k is None and self.top_p in (None, 1.0)

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """The transformed distribution of a base distribution ``probs`` (V,)."""
        if self.identity:
            return probs
        with np.errstate(divide="ignore"):
            logits = np.log(probs)
        return sampling_distribution(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


def seeded_rng(seed: int, *key: int) -> np.random.Generator:
    """A Generator determined by (seed, key...) only, via a stable hash (not Python's hash())."""
    data = np.asarray((seed,) + tuple(key), dtype=np.int64).tobytes()
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little"))


def memo_rows(vocab: int, budget_bytes: int = 2**27) -> int:
    """How many (p, q) row pairs fit in ``budget_bytes`` (128 MiB by default), at least 64."""
    return max(64, budget_bytes // (16 * vocab))


class BoundedMemo:
    """A least-recently-used dict with at most ``size`` entries (bounded memory for large V)."""

    def __init__(self, size: int = 1024):
        self.size = size
        self._data: OrderedDict = OrderedDict()

    def get(self, key, make):
        """The value for ``key``, computing it as ``make(key)`` when absent."""
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]
        value = make(key)
        self._data[key] = value
        if len(self._data) > self.size:
            self._data.popitem(last=False)
        return value


def random_row(rng: np.random.Generator, vocab: int, family: str, concentration: float) -> np.ndarray:
    """One random next-token distribution: ``"dirichlet"`` (symmetric, ``concentration``) or
    ``"zipf"`` (p(rank r) proportional to r^-concentration over a random permutation of ids)."""
    if family == "dirichlet":
        row = rng.dirichlet(np.full(vocab, concentration))
    elif family == "zipf":
        weights = np.arange(1, vocab + 1, dtype=np.float64) ** -concentration
        row = np.empty(vocab)
        row[rng.permutation(vocab)] = weights / weights.sum()
    else:
        raise ValueError(f"family: must be 'dirichlet' or 'zipf', got {family!r}")
    return row


WORLDS = ("depth_profile", "distilled")


def make_world(name: str, *, vocab: int, seed: int = 0, settings: SamplingSettings | None = None, **options):
    """Build a synthetic world by name (``"depth_profile"`` or ``"distilled"``).

    Raises:
        ValueError: unknown name or invalid options.
    """
    from backends.synthetic.depth_profile import DepthProfileWorld
    from backends.synthetic.distilled import DistilledWorld

    settings = settings or SamplingSettings()
    if name == "depth_profile":
        return DepthProfileWorld(vocab=vocab, seed=seed, settings=settings, **options)
    if name == "distilled":
        return DistilledWorld(vocab=vocab, seed=seed, settings=settings, **options)
    raise ValueError(f"world: unknown world {name!r}; choose one of {', '.join(WORLDS)}")
