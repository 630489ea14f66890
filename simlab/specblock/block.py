"""One block of a block drafter's output (``simlab.specblock.builder``'s input, the block
drafters' output): its own module so that drafters (``simlab.specblock.synthetic``,
``backends.block_drafter``) need not import the builder."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Block:
    """One block from a seed: slot log-probabilities float64 (K, V), rank classes int64 (K,), and
    the drafter's states for seeds in this block (one per slot, opaque)."""

    logprobs: np.ndarray
    classes: np.ndarray
    states: tuple
