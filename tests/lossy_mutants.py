"""Planted faults in the engine rules (test-only): strict exact-match's per-law acceptance, SGLang's
threshold rule and Medusa's typical acceptance; ``tests/test_lossy_rules.py`` shows each is caught.

Each broken class subclasses the correct one and changes one thing, a bug class an implementer
could make when transcribing the official code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import inner, sample_categorical
from simlab.drafting import hit_probability
from simlab.tree_verifiers.typical import TypicalAcceptance
from simlab.verifiers.exact_match import ExactMatch
from simlab.verifiers.nss import _NSSPlan
from simlab.verifiers.sglang_threshold import SGLangThreshold, _ThresholdPlan


class _IIDFormulaEverywhere(_NSSPlan):
    def acceptance_formula(self):
        return inner(self.p, hit_probability(self.q, self.k))  # the collision probability whatever the law


@dataclass(frozen=True)
class ExactMatchIIDFormula(ExactMatch):
    """The i.i.d. collision probability used as the acceptance of every drafting law."""

    def _plan(self, p, q, k):
        return _IIDFormulaEverywhere(self, p, q, k)


class _NotCumulated(_ThresholdPlan):
    def _law(self, children):  # each sibling tested against its own p(x) / acc, as if prob_acc were reset
        out, reached = np.zeros_like(self.p), 0.0
        for x in children.tolist():
            if self.p[x] >= self.single:
                out[x] += 1.0 - reached
                return out
            accept = (1.0 - reached) * min(1.0, self.p[x] / self.acc)
            out[x] += accept
            reached += accept
        rest = self._rest(children)
        if reached < 1.0 and rest.any():
            out += (1.0 - reached) * rest / rest.sum()
        return out


@dataclass(frozen=True)
class ThresholdNotCumulated(SGLangThreshold):
    """prob_acc reset at every sibling (the law only)."""

    def _plan(self, p, q, k):
        return _NotCumulated(self, p, q, k)


class _CorrectionFromP(_ThresholdPlan):
    def _draw(self, children, rng):  # the correction drawn from p, the rejected children kept (the sampler only)
        u = rng.random()
        cumulative = 0.0
        for x in children.tolist():
            cumulative += self.p[x]
            if u * self.acc < cumulative or self.p[x] >= self.single:
                return int(x)
        return sample_categorical(self.p, rng)


@dataclass(frozen=True)
class ThresholdCorrectionFromP(SGLangThreshold):
    """The correction token drawn from p instead of p without the rejected children."""

    def _plan(self, p, q, k):
        return _CorrectionFromP(self, p, q, k)


class _SingleStrict(_ThresholdPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = np.nextafter(self.single, 2.0)  # p(x) > threshold_single instead of >=


@dataclass(frozen=True)
class ThresholdSingleStrict(SGLangThreshold):
    """The single threshold tested strictly (p(x) > threshold_single), law and sampler alike."""

    def _plan(self, p, q, k):
        return _SingleStrict(self, p, q, k)


@dataclass(frozen=True)
class TypicalFirstLongest(TypicalAcceptance):
    """The first longest accepted path, the likelihood tie-break dropped."""

    def _accepted_path(self, tree):
        best, stack = (), [()]
        while stack:
            path = stack.pop()
            best = path if len(path) > len(best) else best
            p, tau = tree.table.p(path), self.threshold(tree.table.p(path))
            stack.extend(path + (t,) for t in reversed(list(dict.fromkeys(tree.child_list(path)))) if p[t] > tau)
        return best


@dataclass(frozen=True)
class TypicalTiesToLowestCandidate(TypicalAcceptance):
    """A likelihood tie to the lowest (length, ranks) candidate: Medusa's choices in sorted order,
    not the reversed order ``retrieve_indices`` lists them in."""

    first_candidate = min


@dataclass(frozen=True)
class TypicalExactEntropy(TypicalAcceptance):
    """The threshold from the exact entropy, without the official 1e-5 offset."""

    def threshold(self, p):
        positive = p[p > 0]
        return min(self.posterior_threshold, self.posterior_alpha * float(np.exp(np.sum(positive * np.log(positive)))))


@dataclass(frozen=True)
class TypicalNextFromP(TypicalAcceptance):
    """The next token drawn from p where Medusa takes the argmax (law and sampler alike)."""

    def _next_law(self, p):
        return p.copy()

    def _verify(self, tree, rng):
        path = self._accepted_path(tree)
        return path, sample_categorical(tree.table.p(path), rng)


NODE_MUTANTS = {
    "exact-match acceptance: the i.i.d. formula for every law": ExactMatchIIDFormula(),
    "sglang: prob_acc reset per sibling": ThresholdNotCumulated(threshold_single=0.3, threshold_acc=0.5),
    "sglang: correction from p (sampler only)": ThresholdCorrectionFromP(threshold_single=0.3, threshold_acc=0.5),
    "sglang: single threshold strict": ThresholdSingleStrict(threshold_single=0.3, threshold_acc=0.5),
}
TREE_MUTANTS = {
    "typical: likelihood tie-break dropped": TypicalFirstLongest(posterior_threshold=0.05, posterior_alpha=0.2, allow_lossy=True),
    "typical: ties to the lowest candidate": TypicalTiesToLowestCandidate(
        posterior_threshold=0.3, posterior_alpha=1.0, allow_lossy=True
    ),
    "typical: entropy without the 1e-5 offset": TypicalExactEntropy(
        posterior_threshold=1.0, posterior_alpha=0.99999, allow_lossy=True
    ),
    "typical: next token from p": TypicalNextFromP(allow_lossy=True),
}
