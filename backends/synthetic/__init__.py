"""Synthetic target/draft worlds: model pairs that are deterministic from a seed.

* ``DepthProfileWorld`` (``"depth_profile"``): a context-dependent random target and a draft
  whose total-variation distance from it at draft-tree depth d follows a profile the user gives;
* ``DistilledWorld`` (``"distilled"``): a draft estimated from a finite sample of target text
  (smoothed n-gram counts), so divergence emerges from rare contexts;
* ``RepetitiveWorld`` (``"repetitive"``): a target that copies from its own context and a draft
  that does not (a context n-gram drafter is strong exactly where the draft is weak: TreeGraft);
  ``DiverseRepetitiveWorld`` (``"repetitive_diverse"``) copies less from flatter rows, so long
  contexts hold many distinct continuations of a token (TreeGraft's ablations on long contexts);
* ``ParallelWorld`` (``"parallel"``): ``depth_profile``'s target with a parallel draft whose q at
  a node of depth d is a function of the root and d only (``backends.parallel_draft``).

``make_world(name, ...)`` builds one by name (the studies' ``--world`` flag); ``WORLDS`` is the
registry.  To add a world: write one module with a class decorated ``@register_world("name")``
(constructor ``(vocab, seed, settings, eos_id, **options)``, plus ``with_settings``) and import
it below; every study picks it up.
"""

from backends.synthetic.base import WORLDS, make_world, register_world
from backends.synthetic.depth_profile import DepthProfileWorld, LinearProfile
from backends.synthetic.distilled import DistilledWorld
from backends.synthetic.repetitive import DiverseRepetitiveWorld, RepetitiveWorld
from backends.synthetic.parallel import ParallelWorld

__all__ = [
    "DepthProfileWorld",
    "DistilledWorld",
    "DiverseRepetitiveWorld",
    "LinearProfile",
    "ParallelWorld",
    "RepetitiveWorld",
    "WORLDS",
    "make_world",
    "register_world",
]
