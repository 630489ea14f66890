"""The optimal verifier: the coupling that solves the optimal-transport LP.

Given children x, output y with probability pi*(x, y) / Q(x), where pi* solves
``simlab.otlp.solve_ot_lp`` (max P(Y in X) over couplings of Q and p).  Its acceptance is
the optimum alpha*, which every other verifier is bounded by.  Small vocabularies only: the
LP has (number of child tuples) x V variables, at most ``simlab.otlp.MAX_LP_VARIABLES``.
Sources: Sun et al. 2023 (SpecTr, Sec. 3); Hu et al. 2025 (arXiv 2502.18779).
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.checks import check_bool
from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.otlp import solve_ot_lp
from simlab.verifiers.base import NodePlan, NodeVerifier


class _OptimalPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.solution = solve_ot_lp(p, q, k, replacement=verifier.replacement)
        self.rows = {tuple(x): i for i, x in enumerate(self.solution.tuples.tolist())}

    def _row(self, children):
        return self.rows[tuple(children.tolist())]

    def _law(self, children):
        row = self.solution.coupling[self._row(children)]
        mass = row.sum()  # = Q(x) up to rounding; exact normalisation keeps B(x, .) a law
        if mass == 0.0:
            # Q(x) underflowed to 0 in float64: the coupling does not constrain Y given a
            # probability-zero x, and p keeps its column marginal exact.
            return self.p.copy()
        return row / mass

    def _draw(self, children, rng):
        return sample_categorical(self._law(children), rng)

    def acceptance_formula(self) -> float:
        return self.solution.acceptance


@dataclass(frozen=True)
class Optimal(NodeVerifier):
    """The OT-optimal verifier.

    Args:
        replacement: True (default) for i.i.d. children, False for children drafted
            without replacement.

    Raises:
        ValueError: ``replacement`` is not a bool (``0`` or ``"no"`` would read as a setting).
    """

    name = "optimal"
    label = "OT optimum (LP)"
    replacement: bool = True

    def __post_init__(self):
        check_bool(self.replacement, "replacement")

    @property
    def drafting(self) -> Drafting:  # type: ignore[override]
        return Drafting.IID if self.replacement else Drafting.WITHOUT_REPLACEMENT

    @property
    def lossless_for(self) -> frozenset[Drafting]:  # type: ignore[override]
        return frozenset({self.drafting})

    def _plan(self, p, q, k):
        return _OptimalPlan(self, p, q, k)
