"""``distilled``: a draft estimated from a finite sample of the target's text.

The target is a random order-n Markov chain whose rows share a global popularity: p(t | a)
is proportional to w(t) exp(spread * g(a, t)), with w a Zipf law over a seeded permutation of
the ids and g(a, .) seeded standard normals, so popular tokens are popular everywhere and
contexts made of rare tokens are rare.  A training text of ``train_tokens`` tokens is sampled
from the target; the draft is the smoothed n-gram estimate
q(t | a) = (c(a, t) + smoothing / V) / (c(a) + smoothing).  Contexts the target visits often
are estimated well; the draft's smoothing leads its own paths into rarer contexts, where it
is close to uniform, so divergence grows with depth as a property of the world, not a
setting.
"""

from __future__ import annotations

import numpy as np

import copy

from backends.synthetic.base import BoundedMemo, check_vocab, memo_rows, random_row, register_world
from simlab.checks import check_int, check_seed
from simlab.distributions import inverse_cdf
from simlab.pairs import check_contexts, check_eos
from simlab.sampling import SamplingSettings, check_settings, seeded_rng


@register_world("distilled")
class DistilledWorld:
    """A model pair whose draft is a smoothed n-gram model distilled from target samples.

    Args:
        vocab: V, 2 to 50,000.
        seed: world seed (target rows and the training text).
        settings: sampling transform applied to p and q.
        order: n-gram order of both models (context tokens used).
        concentration: Zipf exponent of the global popularity w.
        spread: standard deviation of the per-context log-normal perturbation.
        train_tokens: length of the sampled training text.
        smoothing: pseudo-count mass of the uniform back-off (> 0).
        eos_id: an end-of-sequence id, or None (the default: no EOS).

    Raises:
        ValueError: naming the argument (``vocab``, ``seed``, ``order``, ``train_tokens``,
            ``smoothing``, ``eos_id``, ``settings``).
    """

    def __init__(
        self,
        vocab: int,
        seed: int = 0,
        settings: SamplingSettings | None = None,
        order: int = 2,
        concentration: float = 1.3,
        spread: float = 0.7,
        train_tokens: int = 50_000,
        smoothing: float = 8.0,
        eos_id: int | None = None,
    ):
        vocab = check_vocab(vocab)
        order = check_int(order, "order", 1)
        train_tokens = check_int(train_tokens, "train_tokens", order + 1)
        if not smoothing > 0:
            raise ValueError(f"smoothing: must be > 0, got {smoothing!r}")
        self.vocab_size, self.seed, self.order = vocab, check_seed(seed), order
        self.spread, self.smoothing = float(spread), float(smoothing)
        self.settings = check_settings(settings or SamplingSettings())
        self.eos_id = check_eos(eos_id, vocab)
        self.popularity = random_row(seeded_rng(self.seed, 3), self.vocab_size, "zipf", concentration)
        self._memo = BoundedMemo(memo_rows(int(vocab)))
        self._train(train_tokens)

    def _key(self, ctx: tuple[int, ...]) -> tuple[int, ...]:
        pad = max(self.order - len(ctx), 0)
        return tuple([-1] * pad) + (ctx[len(ctx) - (self.order - pad) :] if self.order - pad else ())

    def target_row(self, key: tuple[int, ...]) -> np.ndarray:
        """The target's base row (before the sampling transform) for the last-``order``-tokens key."""
        noise = seeded_rng(self.seed, 0, *key).standard_normal(self.vocab_size)
        row = self.popularity * np.exp(self.spread * noise)
        return row / row.sum()

    def _train(self, n: int) -> None:
        rng = seeded_rng(self.seed, 2)
        text: list[int] = []
        cdfs = BoundedMemo(size=max(16, 2**26 // (8 * self.vocab_size)))  # at most ~64 MB of rows
        for _ in range(n):
            key = self._key(tuple(text[-self.order :]))
            cdf = cdfs.get(key, lambda k: np.cumsum(self.target_row(k)))
            text.append(inverse_cdf(cdf, rng))
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        for i in range(n):
            key = self._key(tuple(text[max(0, i - self.order) : i]))
            bucket = self.counts.setdefault(key, {})
            bucket[text[i]] = bucket.get(text[i], 0) + 1
        self.train_tokens = n

    def draft_row(self, key: tuple[int, ...]) -> np.ndarray:
        """The distilled draft's base row for a key (the smoothed n-gram estimate)."""
        bucket = self.counts.get(key, {})
        row = np.full(self.vocab_size, self.smoothing / self.vocab_size)
        total = self.smoothing
        for t, c in bucket.items():
            row[t] += c
            total += c
        return row / total

    def context_count(self, ctx) -> int:
        """How often the context's key occurred in the training text."""
        return sum(self.counts.get(self._key(tuple(int(t) for t in ctx)), {}).values())

    def with_settings(self, settings: SamplingSettings) -> "DistilledWorld":
        """The same world (same target, same trained draft) under other sampling settings; this
        one is unchanged."""
        other = copy.copy(self)
        other.settings = check_settings(settings)
        other._memo = BoundedMemo(self._memo.size)
        return other

    def distributions(self, contexts):
        p_rows, q_rows = [], []
        for ctx in check_contexts(contexts, self.vocab_size):
            key = self._key(ctx)
            p, q = self._memo.get(
                key, lambda k: (self.settings.apply(self.target_row(k)), self.settings.apply(self.draft_row(k)))
            )
            p_rows.append(p)
            q_rows.append(q)
        return np.array(p_rows), np.array(q_rows)
