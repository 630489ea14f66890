"""``repetitive``: a target that copies from its own context, and a draft that does not know it.

The target has a base Markov row b_a (Zipf, seeded by the last token a) and an induction rule:
if the context's longest suffix of length <= ``copy_order`` that occurred before still has a
continuation there, the token t* that followed its most recent earlier occurrence is repeated
with probability ``copy``:

    p(. | c) = copy * delta_{t*} + (1 - copy) * b_a      (a repetitive context)
    p(. | c) = b_a                                         (no earlier occurrence)

The draft (TreeGraft's mid drafter) knows the base rows but not the copying:
q(. | c) = (1 - noise) b_a + noise r_a, r_a a second seeded row.  So on repetitive contexts the
draft misses the copy mass (TV >= copy (1 - b_a(t*)) roughly) and a context n-gram drafter, which
proposes exactly the continuation of the matched suffix, is strong; elsewhere the draft is close
to the target (TV <= noise) and the n-gram drafter finds nothing (``repetition(context)`` tells
which case a context is).  Target trajectories copy more as they grow, so later roots are more
repetitive.  Deterministic from the seed; the sampling transform applies to both rows.
"""

from __future__ import annotations

import copy

import numpy as np

from backends.synthetic.base import BoundedMemo, check_vocab, memo_rows, random_row, register_world
from simlab.checks import check_in_range, check_int, check_seed
from simlab.pairs import check_contexts, check_eos
from simlab.sampling import SamplingSettings, check_settings, seeded_rng


@register_world("repetitive")
class RepetitiveWorld:
    """A copying target and a draft that only knows the base rows (module docstring).

    Args:
        vocab: V, 2 to 50,000.
        seed: world seed.
        settings: sampling transform applied to p and q.
        copy: probability of repeating the matched continuation, in [0, 1].
        copy_order: longest suffix the induction rule matches, >= 1.
        noise: weight of the draft's own row, in [0, 1].
        concentration: Zipf exponent of the base rows.
        eos_id: an end-of-sequence id, or None.

    Raises:
        ValueError: naming the argument.
    """

    def __init__(
        self,
        vocab: int,
        seed: int = 0,
        settings: SamplingSettings | None = None,
        copy: float = 0.7,
        copy_order: int = 3,
        noise: float = 0.1,
        concentration: float = 1.1,
        eos_id: int | None = None,
    ):
        self.vocab_size, self.seed = check_vocab(vocab), check_seed(seed)
        self.settings = check_settings(settings or SamplingSettings())
        for name, value in (("copy", copy), ("noise", noise)):
            check_in_range(value, name)
        self.copy, self.noise, self.concentration = float(copy), float(noise), float(concentration)
        self.copy_order = check_int(copy_order, "copy_order", 1)
        self.eos_id = check_eos(eos_id, self.vocab_size)
        self._memo = BoundedMemo(memo_rows(self.vocab_size))

    def with_settings(self, settings: SamplingSettings) -> "RepetitiveWorld":
        """The same world under other sampling settings (this one is unchanged)."""
        other = copy.copy(self)
        other.settings = check_settings(settings)
        other._memo = BoundedMemo(self._memo.size)
        return other

    def repetition(self, context) -> int | None:
        """The token the induction rule would repeat after ``context``, or None."""
        context = tuple(context)
        for n in range(min(self.copy_order, len(context) - 1), 0, -1):
            suffix = context[-n:]
            for j in range(len(context) - n - 1, -1, -1):
                if context[j : j + n] == suffix:
                    return context[j + n]
        return None

    def _base(self, last: int, salt: int) -> np.ndarray:
        return random_row(seeded_rng(self.seed, salt, last), self.vocab_size, "zipf", self.concentration)

    def _rows(self, context: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        last = context[-1] if context else -1
        base = self._base(last, 0)
        q = (1.0 - self.noise) * base + self.noise * self._base(last, 1)
        repeated = self.repetition(context)
        p = base
        if repeated is not None and self.copy > 0:
            p = (1.0 - self.copy) * base
            p[repeated] += self.copy
        return self.settings.apply(p / p.sum()), self.settings.apply(q / q.sum())

    def distributions(self, contexts):
        p_rows, q_rows = [], []
        for ctx in check_contexts(contexts, self.vocab_size):
            p, q = self._memo.get(ctx, self._rows)
            p_rows.append(p)
            q_rows.append(q)
        return np.array(p_rows), np.array(q_rows)


@register_world("repetitive_diverse")
class DiverseRepetitiveWorld(RepetitiveWorld):
    """The repetitive world with flatter base rows (Zipf exponent 0.5) and less copying (0.5).

    Over contexts of hundreds of tokens a token's earlier occurrences then have many distinct
    continuations, as common words have in long prompts, so a context n-gram drafter that needs
    ``top_k`` distinct continuations of a node (TreeGraft's coverage rule) finds them, and
    TreeGraft's layer loop runs past its first n-gram layer: the world of the TreeGraft
    ablations on long contexts (``python -m analyses.treegraft --world repetitive_diverse``).
    Arguments as ``RepetitiveWorld``'s, with these two defaults.
    """

    def __init__(
        self,
        vocab: int,
        seed: int = 0,
        settings: SamplingSettings | None = None,
        copy: float = 0.5,
        copy_order: int = 3,
        noise: float = 0.1,
        concentration: float = 0.5,
        eos_id: int | None = None,
    ):
        super().__init__(
            vocab, seed, settings, copy=copy, copy_order=copy_order, noise=noise, concentration=concentration, eos_id=eos_id
        )
