"""TreeGraft in the lab: a context n-gram drafter and a mid drafter grafting onto one tree.

* ``ngram``: the training-free small drafter (prompt lookup, the official code's scores);
* ``builder``: the TreeGraft builder (``TreeGraft``, the layer state ``GraftState``);
* ``rules``: the official code's rules (default) and the lab's earlier departures (``Rules``);
* ``schedules``: the exact best schedule per root, the scheduler's 17 features, margins and MLP.

The drafter set is the pair (target p, mid drafter q as the ``"draft"``) plus the n-gram drafter
(``"small"``), each timed by its own table in ``simlab.latency.LatencyModel``.
"""

from simlab.treegraft.builder import GraftState, TreeGraft, check_schedule
from simlab.treegraft.ngram import NGramDrafter, NGramIndex, ScoreCache, prompt_cache
from simlab.treegraft.rules import DEPARTURES, Rules

__all__ = [
    "DEPARTURES",
    "GraftState",
    "NGramDrafter",
    "NGramIndex",
    "Rules",
    "ScoreCache",
    "TreeGraft",
    "check_schedule",
    "prompt_cache",
]
