"""TreeGraft in the lab: a context n-gram drafter and a mid drafter grafting onto one tree.

* ``ngram``: the training-free small drafter (prompt lookup, the official code's scores);
* ``builder``: the TreeGraft builder (``TreeGraft``, the layer state ``GraftState``);
* ``schedules``: the exact best schedule per root, the scheduler's 17 features, margins and MLP.

The drafter set is the pair (target p, mid drafter q as the ``"draft"``) plus the n-gram drafter
(``"small"``), each timed by its own table in ``simlab.latency.LatencyModel``.
"""

from simlab.treegraft.builder import GraftState, TreeGraft, check_schedule
from simlab.treegraft.ngram import NGramDrafter, NGramIndex, ScoreCache, prompt_cache

__all__ = ["GraftState", "NGramDrafter", "NGramIndex", "ScoreCache", "TreeGraft", "check_schedule", "prompt_cache"]
