"""Planted faults in the engine rules (test-only): strict exact-match's per-law acceptance, SGLang's
threshold rule and Medusa's typical acceptance (``tests/test_lossy_rules.py`` shows each is caught), and
Fast-HSD's lenience, CoS, SpecCascade and eta acceptance (``FAST_HSD_MUTANTS``, caught in
``tests/test_lossy_rules_2026.py``).

Each broken class subclasses the correct one and changes one thing, a bug class an implementer
could make when transcribing the official code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import inner, residual, sample_categorical
from simlab.drafting import hit_probability
from simlab.tree_verifiers.typical import TypicalAcceptance
from simlab.verifiers.cos import CoS, _CoSPlan
from simlab.verifiers.eagle_eta import EagleEta
from simlab.verifiers.eagle_lenience import EagleLenience, SequentialPlan
from simlab.verifiers.eagle_min_p import EagleMinP
from simlab.verifiers.eta_acceptance import EtaAcceptance
from simlab.verifiers.exact_match import ExactMatch
from simlab.verifiers.lenience import Lenience, _LeniencePlan
from simlab.verifiers.nss import _NSSPlan
from simlab.verifiers.sglang_threshold import SGLangThreshold, _ThresholdPlan
from simlab.verifiers.speccascade import MembershipPlan, SpecCascade
from simlab.verifiers.speculative import SingleDraft


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


# -- Fast-HSD's rules ----------------------------------------------------------------------------
class _ResidualOfScaledQ(_LeniencePlan):
    @property
    def correction(self):  # norm((p - l q)_+): the residual of the scaled q the ratio uses
        return residual(self.p, self.scaled)


@dataclass(frozen=True)
class LenienceResidualOfScaledQ(Lenience):
    """The correction drawn from norm((p - l q)_+) where Fast-HSD subtracts the unscaled q (law and sampler)."""

    def _plan(self, p, q, k):
        return _ResidualOfScaledQ(self, p, q, k)


class _LenienceOnP(_LeniencePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.scaled = q / verifier.lenience  # min(1, l p / q): the factor on the wrong side


@dataclass(frozen=True)
class LenienceOnP(Lenience):
    """The lenience factor multiplying p instead of dividing it (law and sampler)."""

    def _plan(self, p, q, k):
        return _LenienceOnP(self, p, q, k)


class _WeightsAsDescribed(_CoSPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        weight = verifier.cos_lambda
        self.single = SingleDraft(weight * p + (1.0 - weight) * q, q)  # configs/methods/cos.json's words, not the code


@dataclass(frozen=True)
class CoSWeightsAsDescribed(CoS):
    """r = lambda p + (1 - lambda) q, as Fast-HSD's config describes CoS, where its code weighs q by lambda."""

    def _plan(self, p, q, k):
        return _WeightsAsDescribed(self, p, q, k)


class _ResidualCorrection(MembershipPlan):
    def _law(self, children):
        x = int(children[0])
        if self.allowed[x]:
            return super()._law(children)
        return residual(self.p, self.q)  # the p_prime the official code computes, then overrides

    def _draw(self, children, rng):
        x = int(children[0])
        return x if self.allowed[x] else sample_categorical(residual(self.p, self.q), rng)


@dataclass(frozen=True)
class SpecCascadeResidualCorrection(SpecCascade):
    """The correction drawn from norm((p - q)_+) where Fast-HSD draws it from p (law and sampler)."""

    def _plan(self, p, q, k):
        return _ResidualCorrection(self, p, q, k)


@dataclass(frozen=True)
class SpecCascadeStrict(SpecCascade):
    """The allowed set tested strictly, p(x) > c max p (law and sampler)."""

    def allowed(self, p):
        return p > self.min_p_spd * p.max()


@dataclass(frozen=True)
class EtaWithoutSqrt(EtaAcceptance):
    """tau = min(eta, exp(-H(p))): the paper's Eq. 4 with delta = 1 (Fast-HSD's ``fast_hsd/core``), not the
    official ``sqrt(eta)`` factor (law and sampler)."""

    def allowed(self, p):
        positive = p[p > 0]
        return p >= min(self.eta_spd, float(np.exp(np.sum(positive * np.log(positive)))))


class _ThresholdOfP(SequentialPlan):
    def acceptance(self, residual, x):  # tau(p) once, not tau(p') after each rejection
        tau = self.verifier.threshold(self.p)
        return min(float(residual[x]) / tau, 1.0) if tau > 1e-9 else 1.0


@dataclass(frozen=True)
class EagleEtaThresholdOfP(EagleEta):
    """tau computed once from p, not from the renormalised residual after each rejection (law and sampler)."""

    def _plan(self, p, q, k):
        return _ThresholdOfP(self, p, q, k)


class _NoRenormalisation(SequentialPlan):
    def _law(self, children):  # p(x) / l on the raw p with the rejected children removed, never renormalised
        out, residual, reach = np.zeros_like(self.p), self.p.copy(), 1.0
        for x in dict.fromkeys(children.tolist()):
            a = self.acceptance(residual, x)
            out[x] += reach * a
            reach *= 1.0 - a
            residual[x] = 0.0
        return out + reach * residual / residual.sum() if reach > 0.0 else out


@dataclass(frozen=True)
class EagleLenienceNoRenormalisation(EagleLenience):
    """The residual not renormalised after a rejection (the law only)."""

    def _plan(self, p, q, k):
        return _NoRenormalisation(self, p, q, k)


class _CorrectionFromTarget(SequentialPlan):
    def _law(self, children):  # every child rejected: a draw from p, the rejected children kept
        out, residual, reach = np.zeros_like(self.p), self.p.copy(), 1.0
        for x in dict.fromkeys(children.tolist()):
            a = self.acceptance(residual, x)
            out[x] += reach * a
            reach *= 1.0 - a
            residual[x] = 0.0
            residual /= residual.sum()
        return out + reach * self.p


@dataclass(frozen=True)
class EagleMinPCorrectionFromP(EagleMinP):
    """The correction drawn from p, not from the residual without the rejected children (the law only)."""

    def _plan(self, p, q, k):
        return _CorrectionFromTarget(self, p, q, k)


FAST_HSD_MUTANTS = {
    "lenience: residual of l q": LenienceResidualOfScaledQ(lenience=0.5),
    "lenience: factor on p": LenienceOnP(lenience=0.5),
    "cos: weights as the config describes them": CoSWeightsAsDescribed(cos_lambda=0.3),
    "speccascade: correction from the residual": SpecCascadeResidualCorrection(min_p_spd=0.5),
    "speccascade: strict allowed set": SpecCascadeStrict(min_p_spd=0.5),
    "eta acceptance: no sqrt(eta) factor": EtaWithoutSqrt(eta_spd=0.2),
    "eagle eta: threshold of p, not of the residual": EagleEtaThresholdOfP(eta=0.2),
    "eagle lenience: residual not renormalised": EagleLenienceNoRenormalisation(lenience=0.5),
    "eagle min-p: correction from p": EagleMinPCorrectionFromP(min_p=0.5),
}
