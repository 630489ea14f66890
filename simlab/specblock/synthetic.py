"""A block drafter made from a model pair: the synthetic stand-in for SpecBlock's trained drafter.

Slot k of a block from seed u has the pair's own draft law along the block's greedy path:
q(. | u + g_0..g_{k-1}), with g_j the greedy token of slot j, so the slots are as dependent as
the draft model is (an upper bound for a drafter that predicts K positions in one forward).  Its
rank head is an oracle (``noise=0``: the class of the true rank of the target's greedy token
among the slot's draft probabilities) or a noisy one (with probability ``noise`` the class is
replaced by a uniformly drawn other class, from a generator seeded by the path: deterministic).
It needs no training, so the study's training-time ablations (no shift, no valid prefix) do
not apply to it.  State: the slot's path (a later block from a seed starts at its path).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_in_range, check_int
from simlab.specblock.block import Block
from simlab.specblock.rank import bucket, rank_of


@dataclass(frozen=True)
class PairBlockDrafter:
    """Blocks of K slots from a pair's q (module docstring).

    Args:
        vocab_size: V of the pair.
        K: slots per block, >= 1.
        noise: probability that the rank head reports a wrong class, in [0, 1].
        seed: seed of that noise.
    """

    vocab_size: int
    K: int = 4
    noise: float = 0.0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "K", check_int(self.K, "K", 1))
        object.__setattr__(self, "vocab_size", check_int(self.vocab_size, "vocab_size", 2))
        check_in_range(self.noise, "noise")

    def _block(self, table, seed: tuple[int, ...]) -> Block:
        if table.vocab_size != self.vocab_size:
            raise ValueError(f"vocab_size: the drafter has {self.vocab_size} tokens, the pair {table.vocab_size}")
        logprobs, classes, states, path = [], [], [], seed
        for _ in range(self.K):
            table.fetch([path])
            q, p = table.q(path), table.p(path)
            with np.errstate(divide="ignore"):
                logprobs.append(np.log(q))
            cls = int(bucket(rank_of(int(np.argmax(p)), q)))
            if self.noise:
                key = np.asarray((self.seed,) + table.context + path, dtype=np.int64).tobytes()
                rng = np.random.default_rng(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))
                if rng.random() < self.noise:
                    cls = int(rng.choice([c for c in range(4) if c != cls]))
            classes.append(cls)
            states.append(path)
            path = path + (int(np.argmax(q)),)
        return Block(np.array(logprobs), np.array(classes, dtype=np.int64), tuple(states))

    def first_block(self, table) -> Block:
        return self._block(table, ())

    def next_blocks(self, table, seeds) -> list[Block]:
        return [self._block(table, path) for path, _ in seeds]
