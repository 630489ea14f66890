"""SpecBlock in the lab: rank classes, the rank-guided block tree, a pair-made block drafter, the bandit.

* ``rank``: the rank head's classes and its 15 input statistics;
* ``builder``: the ``BlockDrafter`` protocol and the rank-guided builder (``RankGuided``);
* ``synthetic``: ``PairBlockDrafter``, a block drafter made from a model pair (the stand-in);
* ``bandit``: the cost-aware serving-time bandit (the lab's own: the paper describes it, its
  code does not ship it).

The trained drafter (torch) is ``backends.block_drafter``.
"""

from simlab.specblock.builder import CLASS_DEFAULT, SLIM_R2, Block, BlockDrafter, RankGuided
from simlab.specblock.synthetic import PairBlockDrafter

__all__ = ["CLASS_DEFAULT", "SLIM_R2", "Block", "BlockDrafter", "PairBlockDrafter", "RankGuided"]
