"""``depth_profile``: a random order-n Markov target and a draft whose divergence follows a depth profile.

At a context whose last ``order`` tokens are a, the target is a random row p_a (Dirichlet or
Zipf, seeded by (seed, a)).  The draft at draft-tree depth d is q = (1 - lam) p_a + lam r_a,
with r_a a second seeded row (a random partner; the anti-aligned rearrangement of p_a if the
partner is too close) and lam = profile(d) / TV(p_a, r_a), so TV(p, q) = profile(d) exactly
(before the sampling transform).  Depth d is the number of tokens after the root: a world is
"rooted" at a context length with ``rooted(root_length)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from backends.synthetic.base import BoundedMemo, check_vocab, memo_rows, random_row, register_world
from simlab.checks import check_int, check_seed
from simlab.pairs import check_contexts, check_eos
from simlab.sampling import SamplingSettings, check_settings, seeded_rng


@dataclass(frozen=True)
class LinearProfile:
    """TV(p, q) at depth d: ``start`` at d = 0 rising linearly to ``end`` at d = ``depth``, flat after.

    Raises:
        ValueError: values outside [0, 1] or depth < 1.
    """

    start: float = 0.1
    end: float = 0.5
    depth: int = 8

    def __post_init__(self):
        for name in ("start", "end"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"profile: {name} must lie in [0, 1], got {getattr(self, name)!r}")
        if self.depth < 1:
            raise ValueError(f"profile: depth must be >= 1, got {self.depth!r}")

    def __call__(self, d: int) -> float:
        return self.start + (self.end - self.start) * min(d, self.depth) / self.depth


@dataclass(frozen=True)
class _Spec:
    vocab: int
    seed: int
    settings: SamplingSettings
    profile: LinearProfile
    order: int
    family: str
    concentration: float
    root_length: int
    eos_id: int | None


@register_world("depth_profile")
class DepthProfileWorld:
    """A model pair (``simlab.pairs.ModelPair``) with a draft divergence set by depth.

    Args:
        vocab: V, 2 to 50,000.
        seed: world seed (same seed, same world).
        settings: sampling transform applied to p and q.
        profile: TV target by depth (default ``LinearProfile(0.1, 0.5, 8)``).
        order: Markov order of the target (the number of context tokens it depends on).
        family: ``"zipf"`` or ``"dirichlet"`` rows.
        concentration: Zipf exponent or Dirichlet concentration.
        root_length: context length of the root (depth 0).
        eos_id: an end-of-sequence id, or None (the default: no EOS).

    Raises:
        ValueError: naming the argument (``vocab``, ``seed``, ``order``, ``family``,
            ``root_length``, ``eos_id``).
    """

    def __init__(
        self,
        vocab: int,
        seed: int = 0,
        settings: SamplingSettings | None = None,
        profile: LinearProfile | None = None,
        order: int = 1,
        family: str = "zipf",
        concentration: float = 1.0,
        root_length: int = 0,
        eos_id: int | None = None,
    ):
        vocab = check_vocab(vocab)
        order = check_int(order, "order", 1)
        random_row(np.random.default_rng(0), 2, family, concentration)  # validates family
        self.spec = _Spec(
            vocab,
            check_seed(seed),
            check_settings(settings or SamplingSettings()),
            profile or LinearProfile(),
            order,
            family,
            float(concentration),
            check_int(root_length, "root_length", 0),
            check_eos(eos_id, vocab),
        )
        self.vocab_size = vocab
        self._memo = BoundedMemo(memo_rows(vocab))

    @classmethod
    def _from_spec(cls, s: _Spec) -> "DepthProfileWorld":
        return cls(s.vocab, s.seed, s.settings, s.profile, s.order, s.family, s.concentration, s.root_length, s.eos_id)

    @property
    def settings(self) -> SamplingSettings:
        return self.spec.settings

    @property
    def eos_id(self) -> int | None:
        return self.spec.eos_id

    def rooted(self, root_length: int) -> "DepthProfileWorld":
        """The same world with depth measured from a root context of ``root_length`` tokens."""
        return self._from_spec(replace(self.spec, root_length=root_length))

    def with_settings(self, settings: SamplingSettings) -> "DepthProfileWorld":
        """The same world under other sampling settings (this one is unchanged)."""
        return self._from_spec(replace(self.spec, settings=settings))

    def _rows(self, key: tuple[int, ...], depth: int) -> tuple[np.ndarray, np.ndarray]:
        s = self.spec
        p = random_row(seeded_rng(s.seed, 0, *key), s.vocab, s.family, s.concentration)
        partner = random_row(seeded_rng(s.seed, 1, *key), s.vocab, s.family, s.concentration)
        target_tv = s.profile(depth)
        if np.maximum(p - partner, 0.0).sum() < target_tv:  # anti-aligned: p's values in reverse rank order
            partner = np.empty_like(p)
            order = np.argsort(-p, kind="stable")
            partner[order] = p[order][::-1]
        gap = float(np.maximum(p - partner, 0.0).sum())
        lam = min(1.0, target_tv / gap) if gap > 0 else 0.0
        q = (1.0 - lam) * p + lam * partner
        return s.settings.apply(p), s.settings.apply(q / q.sum())

    def distributions(self, contexts):
        s = self.spec
        p_rows, q_rows = [], []
        for ctx in check_contexts(contexts, s.vocab):
            key = tuple([-1] * max(s.order - len(ctx), 0)) + ctx[-s.order :] if ctx else tuple([-1] * s.order)
            depth = max(len(ctx) - s.root_length, 0)
            p, q = self._memo.get((key, depth), lambda kd: self._rows(*kd))
            p_rows.append(p)
            q_rows.append(q)
        return np.array(p_rows), np.array(q_rows)
