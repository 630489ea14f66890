"""What every synthetic world shares: the world registry, seeded rows, a bounded memo.

A world is a ``simlab.pairs.ModelPair`` built from ``(vocab, seed, settings, eos_id, **options)``
and deterministic from them; it also offers ``with_settings`` (``simlab.pairs.WithSettings``) and
names its ``eos_id`` (``simlab.pairs.EndOfSequence``, None by default).  A new world is one
module with a class decorated ``@register_world("name")`` and one import line in
``backends/synthetic/__init__.py``; every study's ``--world`` then accepts it.
"""

from __future__ import annotations

from collections import OrderedDict
import numpy as np

from simlab.checks import check_int
from simlab.sampling import SamplingSettings


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


WORLDS: dict[str, type] = {}
"""Registered worlds by name (``register_world``), in registration order."""


def register_world(name: str):
    """Class decorator: register a world under ``name`` (the studies' ``--world``)."""

    def register(cls):
        if name in WORLDS:
            raise ValueError(f"world: {name!r} is registered twice")
        WORLDS[name] = cls
        return cls

    return register


def check_vocab(vocab) -> int:
    """A synthetic vocabulary size: an integer in [2, 50000]."""
    return check_int(vocab, "vocab", 2, 50_000)


def make_world(
    name: str, *, vocab: int, seed: int = 0, settings: SamplingSettings | None = None, eos_id: int | None = None, **options
):
    """Build the synthetic world registered as ``name``.

    Raises:
        ValueError: ``world: ...`` for an unknown name; the world's own ``ValueError`` (naming
            the argument: ``vocab: ...``, ``seed: ...``) for invalid options.
    """
    if name not in WORLDS:
        raise ValueError(f"world: unknown world {name!r}; choose one of {', '.join(WORLDS)}")
    return WORLDS[name](vocab=vocab, seed=seed, settings=settings, eos_id=eos_id, **options)
