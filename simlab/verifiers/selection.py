"""Select one child, then speculative sampling of the selection law: the plans that share this step.

Khisti et al. 2025 (arXiv 2410.18234, the canonical decomposition): a rule that selects one child
Z with law mu (over the drafted children and the drafting) and then accepts Z with probability
min(1, p(Z) / mu(Z)), else emits a draw from norm((p - mu)_+), is lossless and accepts with
probability sum min(mu, p) at least.  ``SelectionPlan`` holds that second step for a plan that
knows mu (float64 (V,), the exact marginal law of its selection) and P(child j is selected | x):
``ot_exact`` (the curtain's scores) and ``ot_wor`` (a mixture of priority orders).
"""

from __future__ import annotations

import abc
from functools import cached_property

import numpy as np

from simlab.distributions import positive_part, residual, sample_categorical
from simlab.verifiers.base import NodePlan, accept_draw, summed_over_copies


class SelectionPlan(NodePlan):
    """A ``NodePlan`` whose rule selects one child and tests it against its selection law.

    A subclass calls ``_select_with(mu)`` once mu is known and implements ``_selection(children)``
    (float64 (k,), P(child j is selected), per copy) and ``_draw`` (ending in ``_speculative``).
    """

    def _select_with(self, mu: np.ndarray) -> None:
        """Keep mu, its value sum min(mu, p), the acceptance test min(1, p / mu) per token (1 where
        mu underflowed to 0 < p) and the excess mass sum (p - mu)_+."""
        self.mu = mu
        self.value = float(np.minimum(mu, self.p).sum())
        self.accept = (self.p > 0).astype(np.float64)
        with np.errstate(over="ignore"):  # a subnormal mu: p / mu = inf, then 1
            np.divide(self.p, mu, out=self.accept, where=mu > 0)
        np.minimum(self.accept, 1.0, out=self.accept)
        self.excess = float(positive_part(self.p - mu).sum())
        if self.excess == 0.0:  # mu = p: a selected child is always accepted
            self.accept[mu > 0] = 1.0

    @cached_property
    def correction(self) -> np.ndarray:
        """R = norm((p - mu)_+), float64 (V,); p itself when that mass is 0 (``residual``)."""
        return residual(self.p, self.mu)

    @abc.abstractmethod
    def _selection(self, children: np.ndarray) -> np.ndarray:
        """P(child j is selected | children), float64 (k,), per copy."""

    def _accepted(self, children):
        acc = self._selection(children) * self.accept[children]
        return acc, max(0.0, 1.0 - float(acc.sum()))

    def _children_mass(self, children):
        acc, reject = self._accepted(children)
        mass = summed_over_copies(children, acc)
        return mass + reject * self.correction[children] if reject > 0.0 else mass

    def _law(self, children):
        acc, reject = self._accepted(children)
        law = reject * self.correction if reject > 0.0 else np.zeros_like(self.p)
        np.add.at(law, children, acc)
        return law

    def _speculative(self, chosen: int, rng: np.random.Generator) -> int:
        """The test of the selected child ``chosen`` (one uniform unless mu = p), else the correction."""
        if (self.excess == 0.0 and self.mu[chosen] > 0.0) or accept_draw(rng, self.p[chosen], self.mu[chosen]):
            return int(chosen)
        return sample_categorical(self.correction, rng)
