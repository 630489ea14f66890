"""Tree shapes: the sampled and static builders under their historical module name.

``Delayed``, ``iid``, ``chain`` and ``named_shape`` live in ``simlab.builders.delayed``;
``Static`` in ``simlab.builders.static``; every builder (EAGLE-2, Sequoia, greedy draft too)
is reachable by name through ``simlab.builders.get``.
"""

from simlab.builders.base import MAX_TREES
from simlab.builders.delayed import Delayed, chain, iid, named_shape
from simlab.builders.static import Static

__all__ = ["MAX_TREES", "Delayed", "Static", "chain", "iid", "named_shape"]
