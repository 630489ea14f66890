"""Deprecated alias: the builders' old module name.  Import from ``simlab.builders`` instead.

``Delayed``, ``iid``, ``chain`` and ``named_shape`` live in ``simlab.builders.delayed``; ``Static``
in ``simlab.builders.static``; every builder is reachable by name through ``simlab.builders.get``.
This module only re-exports them (no warning is raised) so that old imports keep working; the
lab's own code imports ``simlab.builders``.
"""

from simlab.builders import MAX_TREES, Delayed, Static, chain, iid, named_shape

__all__ = ["MAX_TREES", "Delayed", "Static", "chain", "iid", "named_shape"]
