"""Which of TreeGraft's building rules follow the official code, and which the lab's earlier reading.

By default (``Rules.parse("official")``, no departure) the builder follows TreeGraft@f53e3a8
``graft/combine_tree/generator.py`` (the layer loop) and ``graft/ngram_tree/generator.py`` (the
n-gram drafter, ``direct_match``).  Each of the lab's earlier rules is a **departure** with its own
name (``DEPARTURES``), kept so that earlier results can be reproduced; ``"lab"`` turns them all on
(the builder of issue 13 exactly).  Every one has a row in ``docs/departures.md``.

Raises (``Rules.parse``): ValueError ``rules: ...`` for an unknown name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEPARTURES = {
    "continue_after_empty_frontier": "when every frontier parent is terminated the layer loop goes on (official: it stops); a later call "
    "grafts on the pool around the depths the last skip reached",
    "top_k_fallback": "if layer 1 leaves the root childless, the root takes the top_k most frequent context tokens (ties: smaller id), "
    "scored by their log relative frequency, and the loop goes on (official: one token, ties to the most recent, "
    "score 0.0, and the loop stops)",
    "truncated_chains": "an occurrence whose chain runs past the end of the context attaches the chain truncated (official: skipped)",
    "coverage_by_proposals": "a parent's coverage counts only the first tokens its matches propose in this layer, and collection stops at "
    "the k-th distinct one (official: the parent's existing children count too, tested after each whole n level)",
    "overwrite_scores": "the first chain of a layer that reaches an existing child overwrites its score, also by re-matching an "
    "existing path (official: an existing path attaches nothing; otherwise the score becomes max(old, new))",
    "cache_without_last_row": "the score cache holds no row for p(. | whole prompt): a match continuing at the prompt's end scores 0.0 "
    "(official: that row is cached; only positions beyond the prompt score 0.0)",
    "frontier_attached_only": "the next frontier is the children this layer's matches reached (official: every child of a non-terminated "
    "parent, earlier ones included, unmatched ones with match length 0)",
    "recent_occurrences_first": "occurrences are taken most recent first and attach in that order, a chain scored at its most recent "
    "occurrence (official: a chain is scored at its first occurrence, oldest first, and chains attach sorted by "
    "match length, position (recent first), tokens)",
    "no_node_cap": "no cap on the nodes built before pruning (official: max(B + 1, 1 + k + D k^2) nodes; a chain or graft "
    "stops at the cap, and the layer loop stops once it is reached)",
}
"""The lab's departures from the official code: name -> what the lab does instead (official in brackets)."""


@dataclass(frozen=True)
class Rules:
    """A set of departures (names from ``DEPARTURES``); empty = the official code's rules."""

    departures: frozenset = frozenset()

    @classmethod
    def parse(cls, value) -> "Rules":
        """``"official"``, ``"lab"`` (every departure), a comma-separated string of departure names,
        an iterable of them, or a ``Rules``.

        Raises:
            ValueError: ``rules: ...`` naming an unknown departure.
        """
        if isinstance(value, Rules):
            return value
        if isinstance(value, str):
            if value == "official":
                return cls()
            if value == "lab":
                return cls(frozenset(DEPARTURES))
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, Iterable):
            raise ValueError(f"rules: 'official', 'lab' or departure names, got {value!r}")
        names = frozenset(value)
        unknown = sorted(str(n) for n in names - set(DEPARTURES))
        if unknown:
            raise ValueError(
                f"rules: unknown departure {', '.join(unknown)}; choose 'official', 'lab' or any of {', '.join(DEPARTURES)}"
            )
        return cls(names)

    def __contains__(self, name: str) -> bool:
        if name not in DEPARTURES:
            raise KeyError(name)
        return name in self.departures

    @property
    def name(self) -> str:
        """``official``, ``lab``, or the departures joined by ``+`` (in ``DEPARTURES`` order)."""
        if not self.departures:
            return "official"
        if self.departures == frozenset(DEPARTURES):
            return "lab"
        return "+".join(n for n in DEPARTURES if n in self.departures)
