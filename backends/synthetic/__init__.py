"""Synthetic target/draft worlds: model pairs that are deterministic from a seed.

* ``DepthProfileWorld``: a context-dependent random target and a draft whose total-variation
  distance from it at draft-tree depth d follows a profile the user gives;
* ``DistilledWorld``: a draft estimated from a finite sample of target text (smoothed n-gram
  counts), so divergence emerges from rare contexts;
* ``SamplingSettings``: temperature / top-k / top-p, applied identically to p and q.

``make_world(name, ...)`` builds one by name (the studies' ``--world`` flag).
"""

from backends.synthetic.base import SamplingSettings, WORLDS, make_world
from backends.synthetic.depth_profile import DepthProfileWorld, LinearProfile
from backends.synthetic.distilled import DistilledWorld

__all__ = ["DepthProfileWorld", "DistilledWorld", "LinearProfile", "SamplingSettings", "WORLDS", "make_world"]
