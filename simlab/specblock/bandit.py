"""The cost-aware serving-time bandit SpecBlock describes (its code does not ship one): the lab's own.

While serving a stream of prompts, after each prompt the server may **skip**, update the drafter's
output **heads** (LM head and rank head), or update it in **full**, on that prompt's verified
tokens.  Each arm a has a measured cost c_a (seconds of the update) and an EWMA estimate of the
throughput gain it brings (g_a: tokens/s after the update minus before, over the next prompt).
``CostAwareBandit.choose`` takes, with probability 1 - ``explore``, the arm with the largest
net value g_a - c_a tau / S (tau: the current throughput; S: the serving seconds one prompt
takes; the tokens the update costs, spread over the prompt it serves), each untried arm once
first, otherwise an arm drawn uniformly (``numpy.random.Generator``: deterministic under a seed).
``Rollback`` keeps per-prompt acceptance in windows of ``window`` prompts and asks for the
weights of three windows back when the last window's mean acceptance fell below the one before
by more than ``drop`` (relative) -- the paper's three-window rollback.
``signal`` is the free learning signal of one verification: s = sum over the rejected draft
positions k of (1 - r_k), r_k the target's probability of the drafted token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simlab.checks import check_generator, check_in_range, check_int

ARMS = ("skip", "heads", "full")


def signal(target_probabilities, accepted: int) -> float:
    """s = sum_{k >= accepted} (1 - r_k) over the drafted positions past the accepted prefix
    (``target_probabilities``: r_k = p(x_k) of each drafted token along the verified path)."""
    r = np.asarray(target_probabilities, dtype=np.float64)
    return float(np.sum(1.0 - r[check_int(accepted, "accepted", 0) :]))


@dataclass
class CostAwareBandit:
    """Skip / heads / full from EWMA gains net of measured costs (module docstring).

    Args:
        rng: the generator of the exploration draws.
        ewma: weight of the newest gain in the running estimate, in (0, 1].
        explore: probability of a uniformly drawn arm, in [0, 1].
    """

    rng: np.random.Generator
    ewma: float = 0.3
    explore: float = 0.1
    gains: dict = field(default_factory=dict)
    costs: dict = field(default_factory=lambda: {"skip": 0.0})
    history: list = field(default_factory=list)

    def __post_init__(self):
        check_generator(self.rng)
        check_in_range(self.ewma, "ewma", low_open=True)
        check_in_range(self.explore, "explore")

    def value(self, arm: str, throughput: float, seconds: float) -> float:
        """Net value of ``arm`` (tokens/s): its estimated gain minus its cost (s) spread over ``seconds``
        of serving at ``throughput`` tokens/s.

        Raises:
            ValueError: ``seconds: ...`` unless > 0.
        """
        if not seconds > 0:
            raise ValueError(f"seconds: the serving time an update is spread over must be > 0, got {seconds!r}")
        return self.gains.get(arm, 0.0) - self.costs.get(arm, 0.0) * throughput / seconds

    def choose(self, throughput: float, seconds: float) -> str:
        """The arm for the next update (untried arms first; then epsilon-greedy on the net value)."""
        untried = [a for a in ARMS if a not in self.gains]
        if untried:
            arm = untried[0]
        elif self.rng.random() < self.explore:
            arm = ARMS[int(self.rng.integers(len(ARMS)))]
        else:
            arm = max(ARMS, key=lambda a: (self.value(a, throughput, seconds), -ARMS.index(a)))
        self.history.append(arm)
        return arm

    def observe(self, arm: str, gain: float, cost: float) -> None:
        """Fold the gain an update of ``arm`` brought (tokens/s) and its measured cost (s) into the estimates."""
        if arm not in ARMS:
            raise ValueError(f"arm: must be one of {', '.join(ARMS)}, got {arm!r}")
        self.gains[arm] = gain if arm not in self.gains else (1 - self.ewma) * self.gains[arm] + self.ewma * gain
        self.costs[arm] = cost if arm not in self.costs else (1 - self.ewma) * self.costs[arm] + self.ewma * cost


@dataclass
class Rollback:
    """The three-window rollback (module docstring): ``record`` per prompt returns True when the
    weights should go back to those kept three windows earlier."""

    window: int = 3
    drop: float = 0.05
    acceptance: list = field(default_factory=list)

    def __post_init__(self):
        self.window = check_int(self.window, "window", 1)
        check_in_range(self.drop, "drop", high_open=True)

    def record(self, acceptance: float) -> bool:
        self.acceptance.append(float(acceptance))
        n = len(self.acceptance)
        if n < 2 * self.window or n % self.window:
            return False
        last = np.mean(self.acceptance[-self.window :])
        before = np.mean(self.acceptance[-2 * self.window : -self.window])
        return bool(last < (1.0 - self.drop) * before)
