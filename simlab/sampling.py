"""Sampling settings and the one logits-to-p transform of the lab.

Every source of p and q (synthetic worlds, ``backends.hf.HFPair``, the capture replay) turns
next-token logits into the distribution actually sampled from with ``sampling_distribution``,
applied identically to the target and the draft, in the Hugging Face order:

1. **temperature** T: ``softmax((z - max z) / T)``; the maximum is subtracted *before* the
   division, so a tiny T (1e-310) gives a finite law (one-hot on the maximum, split evenly
   between tied maxima) instead of ``inf - inf = NaN``.  **T = 0 is greedy**, defined
   explicitly, not as a limit: one-hot on the argmax, ties to the lowest token id (the
   convention of ``simlab.decoding.greedy_decode`` and the ``greedy`` verifier);
2. **top-k**: keep the k most probable tokens (ties: lowest id first), renormalise;
3. **top-p** (nucleus): keep the smallest set of most probable tokens whose mass reaches
   top_p (the token that crosses the threshold is kept), renormalise.

A result that is not a finite probability vector raises ``ValueError``; nothing is patched.
``DDTE_SETTINGS`` are the eight settings of DDTE's Tables 2-7.

Seeded randomness: ``seeded_rng(seed, stream, *key)`` is the one way a study or source derives
a generator from its ``--seed``; ``Stream`` names the streams, one per kind of draw, so that no two
kinds ever share a generator.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from simlab.errors import argument_of
from simlab.checks import check_in_range, check_int, check_seed


class Stream(IntEnum):
    """The named streams of ``seeded_rng(seed, stream, *key)`` (the values are what the lab has
    always used, so seeded outputs are unchanged)."""

    PROMPT = 0
    """A real prompt's continuation by the target (``backends.roots.prompt_roots``; key: trajectory)."""
    TREE = 1
    """A root's tree draws (``backends.capture``, ``analyses.divergence_by_depth``; key: root id)."""
    WALK = 2
    """A synthetic trajectory: its start token, then the walk (``backends.sources.synthetic``; key: trajectory)."""
    LABELS = 3
    """A root's fresh grid drafts for labels (``analyses._labels.root_drafts``; key: verifier key, trajectory, root)."""


def seeded_rng(seed: int, *key: int) -> np.random.Generator:
    """A Generator determined by (seed, key...) only, via a stable hash (not Python's hash()); a
    study's first key is its ``Stream``, a world's its own salt.

    Raises:
        ValueError: ``seed: ...`` outside [0, 2**63 - 1].
    """
    data = np.asarray((check_seed(seed),) + tuple(key), dtype=np.int64).tobytes()
    return np.random.default_rng(int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little"))


def _check_options(temperature, top_k, top_p) -> tuple[float, int | None, float | None]:
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, (int, float, np.integer, np.floating)):
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature!r}")
    if top_k is not None:
        top_k = check_int(top_k, "top_k", 1)
    if top_p is not None:
        top_p = check_in_range(top_p, "top_p", low_open=True)
    return float(temperature), top_k, top_p


def sampling_distribution(
    logits, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """The distribution sampled from, for one row (V,) or a batch (n, V) of logits.

    Args:
        logits: array-like (V,) or (n, V), any float dtype (float32 model logits are converted
            to float64 first); finite or ``-inf`` (masked) entries, at least one finite per row.
        temperature: T >= 0 (0 = greedy, see the module docstring).
        top_k: keep the k most probable tokens; None = all.
        top_p: nucleus threshold in (0, 1]; None = 1.

    Returns:
        float64 array of the same shape, each row summing to 1.

    Raises:
        ValueError: ``logits: ...`` (not numeric, not 1-D or 2-D, empty, NaN or +inf, a row
            of -inf only), ``temperature: ...``, ``top_k: ...``, ``top_p: ...``, or a result
            that is not finite.
    """
    temperature, top_k, top_p = _check_options(temperature, top_k, top_p)
    try:
        z = np.array(logits, dtype=np.float64)  # a copy: the caller's logits are never touched
    except (TypeError, ValueError) as exc:
        raise ValueError(f"logits: not a numeric array ({exc})") from None
    if z.ndim not in (1, 2) or z.shape[-1] == 0 or z.size == 0:
        raise ValueError(f"logits: must be a non-empty (V,) or (n, V) array, got shape {z.shape}")
    if np.isnan(z).any() or (z == np.inf).any():
        raise ValueError("logits: contains NaN or +inf entries")
    top = z.max(axis=-1, keepdims=True)
    if not np.isfinite(top).all():
        raise ValueError("logits: a row has every entry -inf")
    if temperature == 0.0:
        probs = np.zeros_like(z)
        np.put_along_axis(probs, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
        return probs
    with np.errstate(over="ignore", under="ignore"):  # overflow to -inf is the exact limit: weight 0
        z -= top
        if temperature != 1.0:
            z /= temperature
        np.exp(z, out=z)
    z /= z.sum(axis=-1, keepdims=True)
    vocab = z.shape[-1]
    if top_k is not None and top_k < vocab:
        order = np.argsort(-z, axis=-1, kind="stable")
        z = _keep(z, order, np.full(z.shape[:-1], top_k))
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-z, axis=-1, kind="stable")
        cumulative = np.cumsum(np.take_along_axis(z, order, axis=-1), axis=-1)
        n_keep = (cumulative < top_p * cumulative[..., -1:]).sum(axis=-1) + 1
        z = _keep(z, order, np.minimum(n_keep, vocab))
    if not np.isfinite(z).all():
        raise ValueError(f"temperature: {temperature!r} gives a law that is not finite")
    return z


def _keep(probs: np.ndarray, order: np.ndarray, n_keep: np.ndarray) -> np.ndarray:
    """Zero every token ranked at or below ``n_keep`` (per row) in ``order``; renormalise."""
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(order.shape[-1]), axis=-1)
    out = np.where(ranks < n_keep[..., None], probs, 0.0)
    return out / out.sum(axis=-1, keepdims=True)


@dataclass(frozen=True)
class SamplingSettings:
    """Temperature, top-k and top-p, applied identically to the target and the draft.

    Args:
        temperature: T >= 0 (0 = greedy: argmax, lowest-id ties).
        top_k: keep the k most probable tokens (None: all).
        top_p: nucleus threshold in (0, 1] (None: 1).

    Raises:
        ValueError: ``temperature: ...``, ``top_k: ...`` or ``top_p: ...`` for values out of
            range or of the wrong type.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self):
        temperature, top_k, top_p = _check_options(self.temperature, self.top_k, self.top_p)
        object.__setattr__(self, "temperature", temperature)
        object.__setattr__(self, "top_k", top_k)
        object.__setattr__(self, "top_p", top_p)

    @property
    def identity(self) -> bool:
        """True when the transform leaves a distribution unchanged (T = 1, no truncation)."""
        return self.temperature == 1.0 and self.top_k is None and self.top_p in (None, 1.0)

    @property
    def greedy(self) -> bool:
        """True where p is one-hot: temperature 0 (on the logits' argmax, the lowest id of exact ties),
        or top-k = 1 at any temperature (on the most probable token after the temperature, the
        lowest id of exact ties: the same token unless the temperature rounds distinct logits to
        one probability)."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def name(self) -> str:
        """``"T=0.6"``, ``"T=1,p=0.9"``, ``"T=1,k=40"``: the settings' name in every table."""
        name = f"T={self.temperature:g}"
        if self.top_p not in (None, 1.0):
            name += f",p={self.top_p:g}"
        if self.top_k is not None:
            name += f",k={self.top_k}"
        return name

    def probabilities(self, logits) -> np.ndarray:
        """``sampling_distribution(logits)`` under these settings: float64, shape of ``logits``."""
        return sampling_distribution(logits, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """The transformed law of a base distribution (V,) or batch (n, V): its log-probabilities
        are the logits (log 0 = -inf).  The identity returns ``probs`` itself, unchanged."""
        if self.identity:
            return probs
        with np.errstate(divide="ignore"):
            logits = np.log(probs)
        return self.probabilities(logits)


def check_settings(settings, name: str = "settings") -> SamplingSettings:
    """``settings`` itself, if it is a ``SamplingSettings``.

    Raises:
        ValueError: anything else.
    """
    if not isinstance(settings, SamplingSettings):
        raise ValueError(f"{name}: must be a simlab.sampling.SamplingSettings, got {type(settings).__name__}")
    return settings


DDTE_SETTINGS = tuple(SamplingSettings(t) for t in (0.2, 0.4, 0.6, 0.8, 1.0, 1.2)) + (
    SamplingSettings(1.0, top_p=0.9),
    SamplingSettings(1.0, top_p=0.99),
)
"""DDTE's eight sampling settings (Tables 2-7): T in {0.2, ..., 1.2}, and T = 1 with top-p 0.9 and 0.99."""


def parse_settings(text: str) -> tuple[SamplingSettings, ...]:
    """A comma list of ``T``, ``T:top_p`` or ``T:top_p:top_k`` entries, e.g. ``"0.6,1:0.9,1::40"``,
    where the entry ``ddte`` stands for DDTE's eight settings (``"ddte"``, ``"0,ddte"``).

    Raises:
        ValueError: ``settings: ...`` for an entry that is not of that form, values out of
            range (the message of ``SamplingSettings``), a setting named twice, or two greedy
            settings (T = 0 and top-k = 1 give one law).
    """
    out = []
    for entry in (e.strip() for e in str(text).split(",")):
        if entry == "ddte":
            out.extend(DDTE_SETTINGS)
            continue
        parts = entry.split(":")
        if not entry or len(parts) > 3 or not parts[0]:
            raise ValueError(f"settings: {entry!r} is not T, T:top_p or T:top_p:top_k")
        try:
            temperature = float(parts[0])
            top_p = float(parts[1]) if len(parts) > 1 and parts[1] else None
            top_k = int(parts[2]) if len(parts) > 2 and parts[2] else None
        except ValueError:
            raise ValueError(f"settings: {entry!r} is not T, T:top_p or T:top_p:top_k") from None
        try:
            out.append(SamplingSettings(temperature, top_k, top_p))
        except ValueError as exc:
            name, rest = argument_of(exc)
            detail = f"{name.replace('_', '-')} {rest}" if name else rest
            raise ValueError(f"settings: {detail} (entry {entry!r})") from None
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"settings: {text!r} names a setting twice")
    greedy = [s.name for s in out if s.greedy]
    if len(greedy) > 1:
        raise ValueError(f"settings: {', '.join(greedy)} are one law (the target's argmax, greedy); keep one")
    return tuple(out)
