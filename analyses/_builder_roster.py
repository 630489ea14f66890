"""The builders the matched-budget comparison runs, fitted on training roots (``analyses.compare_builders``).

Every entry answers ``builder(name, root, setting, budget, verifier)``: the builder to value at
that root under that verifier, or None where it has none.  What is fitted, on the training
trajectories only (the comparison values the held-out ones):

* ``iid`` / ``delayed``: the best **static** action of DDTE's grid (K <= 4, L1, L2 <= 8) within the
  budget (L1 + K L2 draft tokens; ``iid``: L1 = 0, i.i.d. rollouts), per setting and verifier, by
  sum E / sum T-hat over the training roots (``action_grid_block_efficiency``, ``grid_samples``
  trees per L1);
* ``nde``: DDTE's selector from a ``train_selector`` run (its checkpoint per verifier), its
  argmax over the actions within the budget at each root;
* ``sequoia``: Sequoia's DP tree (children without replacement, depth <= 8) for the acceptance
  vector measured on the training roots (per setting; Monte Carlo, 512 draws per root);
* ``eagle2``: EAGLE-2 at its defaults (depth 7, top-k 10); ``greedy_draft``: Hu et al.'s greedy
  draft (its defaults: the same sizes);
* ``treegraft_learned`` / ``treegraft_best``: TreeGraft at its defaults (D = 5, top-k 10, lookback 5, N = 5) with
  its scheduler trained on the training roots' exact margins, or the exact best of the 32
  schedules at each root (an oracle);
* ``specblock``: SpecBlock's rank-guided tree from the trained block drafter (real models) or
  the synthetic stand-in.

Each entry is a registered builder (``KIND``); its drafting laws and its defaults are the ones the
builder declares (``simlab.builders.laws``, ``simlab.builders.get``), never restated here.
Deterministic trees are ranked by the drafters' untempered law (``--draft-law raw``) and valued
on the setting's table (``NodeTable.untempered``, ``DraftTree.on``); sampled children come from
the setting's q.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simlab.trees import drafting_table
from simlab import builders, tree_verifiers

KIND = {
    "iid": "iid",
    "delayed": "delayed",
    "nde": "delayed",
    "sequoia": "sequoia",
    "eagle2": "eagle2",
    "greedy_draft": "greedy_draft",
    "treegraft_learned": "treegraft",
    "treegraft_best": "treegraft",
    "specblock": "specblock",
}
"""The registered builder (``simlab.builders``) behind each entry of the comparison."""
NAMES = tuple(KIND)
LAWS = {name: set(builders.laws(kind)) for name, kind in KIND.items()}
"""The drafting laws of each entry's nodes, as its builder declares them."""


def verifiers_for(name: str, setting, allowed) -> list[str]:
    """Every tree verifier among ``allowed`` lossless for the builder's drafting laws at ``setting``
    (``simlab.tree_verifiers.lossless_names``)."""
    return [v for v in tree_verifiers.lossless_names(LAWS[name], setting) if v in allowed]


@dataclass
class Roster:
    """The fitted builders (module docstring); ``not_run`` lists (builder, reason) for those that cannot run."""

    budgets: tuple[int, ...]
    latency: object
    draft_law: str = "raw"
    static: dict = field(default_factory=dict)
    sequoia: dict = field(default_factory=dict)
    schedulers: dict = field(default_factory=dict)
    selectors: dict = field(default_factory=dict)
    block_drafter: object = None
    treegraft: object = None
    not_run: list = field(default_factory=list)

    def builder(self, name: str, root, setting, budget: int, verifier: str, table=None):
        from simlab.builders import Delayed

        if name in ("iid", "delayed"):
            action = self.static.get((setting.name, verifier, budget, name))
            return None if action is None else Delayed(*action)
        if name == "nde":
            return self.selectors.get(verifier) and self.selectors[verifier](root, setting, budget)
        if name == "sequoia":
            return self.sequoia.get((setting.name, budget))
        if name in ("eagle2", "greedy_draft"):
            return builders.get(name, budget=budget)
        if name == "specblock":
            return (
                None
                if self.block_drafter is None
                else builders.get("specblock", drafter=self.block_drafter(root.pair), budget=budget)
            )
        if name.startswith("treegraft"):
            return None if self.treegraft is None else self.treegraft(name, root, setting, budget, verifier, table)
        raise ValueError(f"builders: unknown builder {name!r}")


def static_statistics(roster: Roster, root, table, verifiers, samples: int, seed: int) -> dict:
    """One root's share of the static fit: {verifier: {(K, L1, L2): (E[tau+1] estimate, T-hat in
    seconds)}} over DDTE's grid (``samples`` trees per L1 from ``seed + root.root``, every verifier's
    grid drawing the same trees on ``table``, the root's ``NodeTable``)."""
    from simlab.grid import action_grid_block_efficiency

    times: dict = {}
    out: dict = {v: {} for v in verifiers}
    for v in verifiers:
        grid = action_grid_block_efficiency(root.pair, root.context, v, samples=samples, seed=seed + root.root, table=table)
        for action, estimate in grid.items():
            if action not in times:
                times[action] = roster.latency.delayed_time(*action, len(root.context))
            out[v][action] = (estimate.mean, times[action])
    return out


def add_statistics(totals: dict, statistics: dict) -> dict:
    """``totals`` plus one root's ``static_statistics`` (sums of E and of T-hat per verifier and
    action), as a new dict: the roots are summed in the order they are added."""
    out = {v: dict(actions) for v, actions in totals.items()}
    for v, actions in statistics.items():
        mine = out.setdefault(v, {})
        for action, (E, T) in actions.items():
            E0, T0 = mine.get(action, (0.0, 0.0))
            mine[action] = (E0 + E, T0 + T)
    return out


def choose_static(roster: Roster, totals: dict, setting) -> None:
    """The best static grid action per (verifier, budget) for ``iid`` and ``delayed`` by sum E / sum
    T-hat over the training roots (``totals``: ``add_statistics`` over them), into ``roster.static``."""
    from simlab.grid import GridAxes

    for v, totals_v in totals.items():
        for budget in roster.budgets:
            for kind in ("iid", "delayed"):
                candidates = [a for a in GridAxes().actions(budget, rollouts=kind == "iid") if a in totals_v]
                if candidates:
                    best = max(candidates, key=lambda a: (totals_v[a][0] / totals_v[a][1], -sum(a)))
                    roster.static[(setting.name, v, budget, kind)] = best


def sequoia_vector(root, seed: int, table=None) -> np.ndarray:
    """One root's acceptance vector for Sequoia's fit (width 8; Monte Carlo, 512 draws from
    ``[seed, root.root]``: the exact vector enumerates V^8 prefixes), float64 (8,); p and q at the
    root from ``table`` when given (its own forward otherwise, ``measure_acceptance``)."""
    from simlab.builders.sequoia import acceptance_vector, measure_acceptance

    rng = np.random.default_rng([seed, root.root])
    if table is None:
        return measure_acceptance(root.pair, [root.context], 8, method="mc", samples=512, rng=rng)
    return acceptance_vector(table.p(()), table.q(()), 8, method="mc", samples=512, rng=rng)


def choose_sequoia(roster: Roster, vectors, setting) -> None:
    """Sequoia's tree per budget (depth <= 8) for the mean of the training roots' ``vectors``, into
    ``roster.sequoia``; a budget it cannot build goes to ``roster.not_run``."""
    vector = np.mean(vectors, axis=0)
    for budget in roster.budgets:
        try:
            roster.sequoia[(setting.name, budget)] = builders.get(
                "sequoia", acceptance=tuple(vector.tolist()), budget=budget, depth=min(budget, 8)
            )
        except ValueError as exc:
            roster.not_run.append({"builder": "sequoia", "setting": setting.name, "budget": budget, "reason": str(exc)})


def fit_sequoia(roster: Roster, roots, setting, seed: int) -> None:
    """Sequoia's tree per budget from the acceptance vector measured on ``roots`` (``sequoia_vector``
    by the roots' own forwards, ``choose_sequoia``)."""
    choose_sequoia(roster, [sequoia_vector(root, seed) for root in roots], setting)


class TreeGraftEntry:
    """TreeGraft's two policies: the exact best schedule per root, and the scheduler trained per
    (setting, budget) on the training roots' margins (``simlab.treegraft.schedules``)."""

    def __init__(self, roster: Roster, epochs: int, seed: int):
        self.roster, self.epochs, self.seed, self.scheduler = roster, epochs, seed, {}
        self.best, self.best_of = {}, None  # the best trees of one root (they hold its table): the last one asked

    @staticmethod
    def prompt(root) -> int:
        """The prompt length g_psi's features take: the root's prompt, else its whole context (tokens)."""
        return root.prompt_length if root.prompt_length is not None else len(root.context)

    def base(self, root, budget: int):
        return builders.get("treegraft", budget=budget, cached=root.prompt_length)

    def values(self, root, budget: int, verifier: str, table):
        from simlab.treegraft.schedules import evaluate_schedules

        return evaluate_schedules(
            self.base(root, budget),
            drafting_table(table, self.roster.draft_law),
            verifier,
            self.roster.latency,
            verify_table=table,
        )

    def examples(self, root, table, budget: int, verifier: str) -> tuple[list, list]:
        """One training root's (features, margins) at every decision (``margins``) at ``budget``."""
        from simlab.treegraft.schedules import margins

        prompt = self.prompt(root)
        values = self.values(root, budget, verifier, table)
        pairs = margins(
            self.base(root, budget), drafting_table(table, self.roster.draft_law), values, self.roster.latency, prompt
        )
        return [z for z, _, _ in pairs], [margin for _, margin, _ in pairs]

    def train(self, setting, budget: int, X, y) -> None:
        """The scheduler of (setting, budget) fitted on the training roots' ``examples``."""
        from simlab.treegraft.schedules import train

        self.scheduler[(setting.name, budget)] = train(np.array(X), np.array(y), epochs=self.epochs, seed=self.seed)[0]

    def __call__(self, name, root, setting, budget, verifier, table):
        from dataclasses import replace

        from simlab.treegraft.schedules import best

        if name == "treegraft_best":  # every lossless verifier values a deterministic tree alike: one search per root
            if self.best_of != (setting.name, root.root):  # a new root: the last one's trees (and table) are let go
                self.best, self.best_of = {}, (setting.name, root.root)
            if budget not in self.best:
                values = self.values(root, budget, verifier, table)
                self.best[budget] = values[best(values)]["tree"]
            return _Fixed(self.best[budget])
        scheduler = self.scheduler[(setting.name, budget)]
        prompt = self.prompt(root)
        base = self.base(root, budget)
        return replace(
            base, schedule=scheduler.schedule(base, drafting_table(table, self.roster.draft_law), self.roster.latency, prompt)
        )


@dataclass(frozen=True)
class _Fixed:
    """A tree already built (the best schedule's), served as a deterministic builder."""

    tree: object
    deterministic = True
    laws = builders.laws("treegraft")

    def sample(self, table, rng=None):
        return self.tree
