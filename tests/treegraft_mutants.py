"""Planted faults in TreeGraft's official rules (test-only); test_treegraft_mutants.py proves the
checks of treegraft_checks.py catch each.

Each of the lab's earlier rules (``simlab.treegraft.rules.DEPARTURES``) is a fault against the
official default, planted by turning that one departure on; two more are hand-planted code faults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simlab.treegraft import DEPARTURES, TreeGraft
from simlab.treegraft.builder import GraftState
from simlab.treegraft.ngram import ScoreCache
from treegraft_checks import factory


class _FallbackToSmallerId(GraftState):
    def _fallback(self):
        """The fallback's ties go to the smaller token id, not the most recent."""
        context = self.root.table.context
        token = min(set(context), key=lambda t: (-context.count(t), t))
        self._child(0, int(token), 0.0, 0, overwrite=False)


@dataclass(frozen=True)
class FallbackToSmallerId(TreeGraft):
    def start(self, root):
        return _FallbackToSmallerId(self, root)


class _ShiftedCache(ScoreCache):
    def score(self, position, token):
        """The row after the matched position (an off-by-one between the cache row and the continuation)."""
        return super().score(position + 1, token)


@dataclass(frozen=True)
class CacheRowShifted(TreeGraft):
    def prepare(self, table):
        root = super().prepare(table)
        cache = root.cache
        return replace(root, cache=_ShiftedCache(cache.last, cache.top, cache.floor))


TREEGRAFT_MUTANTS = {
    **{f"lab rule {name}": factory(rules=name) for name in DEPARTURES},
    "fallback ties to the smaller id": factory(FallbackToSmallerId),
    "cache row shifted by one": factory(CacheRowShifted),
}
"""fault -> builder factory ``make(N=5, **options)`` (``treegraft_checks.factory``)."""
