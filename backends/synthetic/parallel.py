"""``parallel``: the ``depth_profile`` world with a parallel draft (``backends.parallel_draft``).

The target is ``DepthProfileWorld``'s (same seed, same p); the draft is its root-conditioned
stand-in: at every node of depth d below a root r, q = the depth-profile draft at r followed by
that draft's greedy chain of d tokens (TV from the target there = profile(d)), whatever tokens
the tree holds above the node.  So the parallel and the autoregressive drafter of one world
can be compared at matched budgets (``analyses.parallel_drafters``).
"""

from __future__ import annotations

from backends.parallel_draft import RootConditioned
from backends.synthetic.base import register_world
from backends.synthetic.depth_profile import DepthProfileWorld


@register_world("parallel")
class ParallelWorld(RootConditioned):
    """``RootConditioned(DepthProfileWorld(vocab, seed, settings, eos_id=eos_id, **options))``.

    Raises:
        ValueError: as ``DepthProfileWorld`` (naming the argument).
    """

    def __init__(self, vocab: int, seed: int = 0, settings=None, eos_id: int | None = None, root_length: int = 0, **options):
        super().__init__(DepthProfileWorld(vocab, seed, settings, eos_id=eos_id, **options), root_length)
