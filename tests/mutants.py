"""Planted faults: deliberately broken node verifiers (test-only), one documented bug class each.

test_mutants.py asserts that the correctness checks in checks.py catch every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simlab.distributions import inverse_cdf, sample_categorical
from simlab.verifiers.base import accept_draw, summed_over_copies
from simlab.verifiers.greedy import Greedy, _GreedyPlan
from simlab.verifiers.greedy_draft import GreedyDraft, _GreedyDraftPlan
from simlab.verifiers.khisti import Khisti, _KhistiPlan
from simlab.verifiers.naive import Naive, _NaivePlan
from simlab.verifiers.nss import NSS, _NSSPlan
from simlab.verifiers.onehot import OneHot, _OneHotPlan
from simlab.verifiers.ot_exact import OTExact, _ExactPlan
from simlab.verifiers.ot_walk import OTWalk, _WalkPlan
from simlab.verifiers.ot_wor import OTWithoutReplacement, _OrdersPlan
from simlab.verifiers.specinfer import SpecInfer, _SpecInferPlan
from simlab.verifiers.speculative import SingleDraft
from simlab.verifiers.spectr import SpecTr, _SpecTrPlan


# 1. Correction token from p instead of norm((p - q)_+).
class _ResidualIsP(_NaivePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single.correction = p.copy()


@dataclass(frozen=True)
class ResidualIsP(Naive):
    def _plan(self, p, q, k):
        return _ResidualIsP(self, p, q, k)


# 2. Accept with p/q without the min(1, .).
class _UnclippedDraft(SingleDraft):
    def accept_probability(self, x):
        return self.p[x] / self.r[x]


class _UnclippedRatio(_NaivePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = _UnclippedDraft(p, q)


@dataclass(frozen=True)
class UnclippedRatio(Naive):
    def _plan(self, p, q, k):
        return _UnclippedRatio(self, p, q, k)


# 3. SpecInfer that does not remove a rejected child (every trial picks from all k).
class _NoRemoval(_SpecInferPlan):
    def _law(self, children):
        out = np.zeros_like(self.p)
        reach = 1.0
        for trial in range(self.k):
            accept = np.minimum(1.0, self.target_at(trial, children) / self.q[children])
            for x, a in zip(children, accept):
                out[x] += reach * a / self.k
            reach *= 1.0 - accept.mean()
        return out + reach * self.final

    def _draw(self, children, rng):
        for trial in range(self.k):
            x = children[rng.integers(self.k)]
            if rng.random() * self.q[x] < self.target_at(trial, x):
                return int(x)
        return sample_categorical(self.final, rng)


@dataclass(frozen=True)
class SpecInferNoRemoval(SpecInfer):
    def _plan(self, p, q, k):
        return _NoRemoval(self, p, q, k)


# 4. SpecTr with rho = 1 (the residual is then clipped and invalid for k > 1).
class _RhoOne(_SpecTrPlan):
    def _choose_rho(self, buffer):
        return 1.0


@dataclass(frozen=True)
class SpecTrRhoOne(SpecTr):
    def _plan(self, p, q, k):
        return _RhoOne(self, p, q, k)


# 5. NSS that samples from q instead of p.
class _NSSUsesQ(_NSSPlan):
    def _law(self, children):
        return self.q.copy()

    def _draw(self, children, rng):
        return sample_categorical(self.q, rng)


@dataclass(frozen=True)
class NSSUsesQ(NSS):
    def _plan(self, p, q, k):
        return _NSSUsesQ(self, p, q, k)


# 6. Inclusive test u <= p/q: accepts a child with p(x) = 0 when u = 0.
class _InclusiveDraft(SingleDraft):
    def draw(self, x, rng):
        if rng.random() * self.r[x] <= self.p[x]:
            return int(x)
        return sample_categorical(self.correction, rng)


class _Inclusive(_NaivePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = _InclusiveDraft(p, q)


@dataclass(frozen=True)
class InclusiveAccept(Naive):
    def _plan(self, p, q, k):
        return _Inclusive(self, p, q, k)


# 7. The acceptance uniform reused to sample the correction token (sampler-only fault).
class _ReusedDraft(SingleDraft):
    def draw(self, x, rng):
        u = rng.random()
        if u * self.r[x] < self.p[x]:
            return int(x)
        cdf = np.cumsum(self.correction)
        return int(np.searchsorted(cdf, u * cdf[-1], side="right"))


class _ReusedUniform(_NaivePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = _ReusedDraft(p, q)


@dataclass(frozen=True)
class ReusedUniform(Naive):
    def _plan(self, p, q, k):
        return _ReusedUniform(self, p, q, k)


# 8. SpecInfer whose working target is never updated after a rejection.
class _StaleTarget(_SpecInferPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.final = p

    def target_at(self, trial, tokens):
        return self.p[tokens]


@dataclass(frozen=True)
class SpecInferStaleTarget(SpecInfer):
    def _plan(self, p, q, k):
        return _StaleTarget(self, p, q, k)


# 9. Khisti with p_I approximated by q instead of the exact selection law.
class _ApproximateSelectionLaw(_KhistiPlan):
    def __init__(self, verifier, p, q, k, selection):
        selection.law = q
        super().__init__(verifier, p, q, k, selection)


@dataclass(frozen=True)
class KhistiApproximateLaw(Khisti):
    def _plan(self, p, q, k):
        plan = super()._plan(p, q, k)
        return _ApproximateSelectionLaw(self, p, q, k, plan.selection)


# 10. SpecInfer sampler that draws the final token from p instead of the last residual.
class _FinalFromP(_SpecInferPlan):
    def _draw(self, children, rng):
        out = super()._draw(children, rng)
        if out in children.tolist():
            return out
        return sample_categorical(self.p, rng)


@dataclass(frozen=True)
class SpecInferFinalFromP(SpecInfer):
    def _plan(self, p, q, k):
        return _FinalFromP(self, p, q, k)


# 11. The one-hot rule without renormalising the target after a rejection.
class _OneHotStale(_OneHotPlan):
    def _law(self, children):
        out, reach, target = np.zeros_like(self.p), 1.0, self.p.copy()
        for x in dict.fromkeys(children.tolist()):
            out[x] += reach * self.p[x]  # the bug: p(x), not p'(x) / (mass left)
            reach *= 1.0 - self.p[x]
            target[x] = 0.0
        return out + reach * target / target.sum() if target.sum() > 0 else out

    def _draw(self, children, rng):
        target = self.p.copy()
        for x in dict.fromkeys(children.tolist()):
            if rng.random() < self.p[x]:
                return int(x)
            target[x] = 0.0
        return sample_categorical(target, rng)


@dataclass(frozen=True)
class OneHotStale(OneHot):
    def _plan(self, p, q, k):
        return _OneHotStale(self, p, q, k)


# 12. The greedy-draft verifier testing the tail against q instead of q~ (the tail's real law).
class _TailAgainstQ(_GreedyDraftPlan):
    def _single(self, children):
        return SingleDraft(self.p, self.q)


@dataclass(frozen=True)
class GreedyDraftAgainstQ(GreedyDraft):
    def _plan(self, p, q, k):
        return _TailAgainstQ(self, p, q, k)


# 13. The greedy rule following the draft's argmax instead of the target's.
class _ArgmaxOfQ(_GreedyPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.argmax = int(np.argmax(q))


@dataclass(frozen=True)
class GreedyArgmaxOfQ(Greedy):
    def _plan(self, p, q, k):
        return _ArgmaxOfQ(self, p, q, k)


# 14. NaiveTree's children-only mass without the residual landing on the other children.
class _MassWithoutResidual(_NaivePlan):
    def _children_mass(self, children):
        a = self.single.accept_probability(children[0])
        return a * (children == children[0])


@dataclass(frozen=True)
class NaiveMassWithoutResidual(Naive):
    def _plan(self, p, q, k):
        return _MassWithoutResidual(self, p, q, k)


# 15. SpecInfer's children-only mass giving each copy of a repeated child only its own share.
class _MassPerCopy(_SpecInferPlan):
    def _children_mass(self, children):
        mass, reach = self._trials(children)
        return mass + reach * self.target_at(self.k, children)


@dataclass(frozen=True)
class SpecInferMassPerCopy(SpecInfer):
    def _plan(self, p, q, k):
        return _MassPerCopy(self, p, q, k)


# 16. SpecTr's children-only mass without the correction landing on a rejected child's token
#     (zero at rho*, where the residual vanishes on every rejectable child; not at four_step's rho).
class _MassWithoutCorrection(_SpecTrPlan):
    def _children_mass(self, children):
        mass, _ = self._trials(children)
        return summed_over_copies(children, mass)


@dataclass(frozen=True)
class SpecTrMassWithoutCorrection(SpecTr):
    def _plan(self, p, q, k):
        return _MassWithoutCorrection(self, p, q, k)


# 17. NSS's batched children masses (every child list of a node at once) read from q, not p.
class _BatchedFromQ(_NSSPlan):
    def _children_masses(self, rows):
        return self.q[rows]


@dataclass(frozen=True)
class NSSBatchedFromQ(NSS):
    def _plan(self, p, q, k):
        return _BatchedFromQ(self, p, q, k)


# 18. NaiveTree's batched masses taking the one-child shortcut (mass = a(x)) for every child list.
class _ShortcutEverywhere(SingleDraft):
    def masses_at(self, x, tokens):
        a = np.minimum(1.0, self.p[x] / self.r[x])[:, None]
        return np.broadcast_to(a, tokens.shape) * (tokens == x[:, None])


class _BatchedShortcut(_NaivePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.single = _ShortcutEverywhere(p, q)


@dataclass(frozen=True)
class NaiveBatchedShortcut(Naive):
    def _plan(self, p, q, k):
        return _BatchedShortcut(self, p, q, k)


# 19. SpecTr's batched masses without the correction landing on a rejected child's token.
class _BatchedWithoutCorrection(_SpecTrPlan):
    def _children_masses(self, rows):
        return np.stack([summed_over_copies(x, self._trials(x)[0]) for x in rows])


@dataclass(frozen=True)
class SpecTrBatchedWithoutCorrection(SpecTr):
    def _plan(self, p, q, k):
        return _BatchedWithoutCorrection(self, p, q, k)


# 20. SpecInfer's batched masses giving each copy of a repeated child only its own share.
class _BatchedPerCopy(_SpecInferPlan):
    def _children_masses(self, rows):
        out = []
        for x in rows:
            mass, reach = self._trials(x)
            out.append(mass + reach * self.target_at(self.k, x))
        return np.stack(out)


@dataclass(frozen=True)
class SpecInferBatchedPerCopy(SpecInfer):
    def _plan(self, p, q, k):
        return _BatchedPerCopy(self, p, q, k)


# 21. The one-hot rule without its last accepted child: when the children cover p's support and a
#     rounded residual mass rejects the last of them, it draws from a target without mass (issue 28).
class _OneHotNoLastChild(_OneHotPlan):
    def _draw(self, children, rng):
        target, left = self.p.copy(), 1.0
        for x in dict.fromkeys(children.tolist()):
            if accept_draw(rng, target[x], left):
                return int(x)
            left -= target[x]
            target[x] = 0.0
        return sample_categorical(target, rng)


@dataclass(frozen=True)
class OneHotNoLastChild(OneHot):
    def _plan(self, p, q, k):
        return _OneHotNoLastChild(self, p, q, k)


# 22. The OT walk without its split at H*: rows with a child outside H* also select their inside children.
class _WalkNoSplit(_WalkPlan):
    def _draws(self, children):
        return children[np.argsort(-self.rank[children], kind="stable")]


@dataclass(frozen=True)
class WalkNoSplit(OTWalk):
    def _plan(self, p, q, k):
        return _WalkNoSplit(self, p, q, k)


# 23. The OT walk's correction drawn from p instead of norm((p - mu)_+).
class _WalkCorrectionP(_WalkPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.correction = p.copy()


@dataclass(frozen=True)
class WalkCorrectionP(OTWalk):
    def _plan(self, p, q, k):
        return _WalkCorrectionP(self, p, q, k)


# 24. The OT walk's sampler tests the selected child against q instead of its selection law mu.
class _WalkSamplerAgainstQ(_WalkPlan):
    def _draw(self, children, rng):
        draws = self._draws(children)
        chosen = draws[-1]
        for token in draws[:-1]:
            if accept_draw(rng, self.coin[token], 1.0):
                chosen = token
                break
        if accept_draw(rng, self.p[chosen], self.q[chosen]):
            return int(chosen)
        return sample_categorical(self.correction, rng)


@dataclass(frozen=True)
class WalkSamplerAgainstQ(OTWalk):
    def _plan(self, p, q, k):
        return _WalkSamplerAgainstQ(self, p, q, k)


# 25. The curtain's copies of one atom compared by piece only: two children in one piece never
# outrank each other (the within-piece integral int (c + d u)^(n-1) du replaced by c^(n-1)).
class _ExactPieceOnly(_ExactPlan):
    def _selection(self, children):
        atoms, inverse, counts = np.unique(self.atom_of[children], return_inverse=True, return_counts=True)
        per_atom = np.empty(atoms.size)
        for i, (a, n) in enumerate(zip(atoms, counts)):
            lo, hi = self.ptr[a], self.ptr[a + 1]
            value = self.frac[lo:hi] * self.lead[lo:hi] ** (n - 1)
            for b, nb in zip(atoms, counts):
                if b != a:
                    value = value * self._below(b, self.rank[lo:hi]) ** nb
            per_atom[i] = value.sum()
        return per_atom[inverse]


@dataclass(frozen=True)
class ExactPieceOnly(OTExact):
    def _plan(self, p, q, k):
        return _ExactPieceOnly(self, p, q, k)


# 26. The curtain's correction drawn from p instead of norm((p - mu)_+).
class _ExactCorrectionP(_ExactPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.correction = p.copy()


@dataclass(frozen=True)
class ExactCorrectionP(OTExact):
    def _plan(self, p, q, k):
        return _ExactCorrectionP(self, p, q, k)


# 27. The curtain's sampler breaks ties within a shared piece for the first child (no uniform).
class _ExactSamplerFirstInPiece(_ExactPlan):
    def _draw(self, children, rng):
        best, chosen = None, None
        for token in children:
            a = self.atom_of[token]
            lo, hi = self.ptr[a], self.ptr[a + 1]
            key = self.rank[lo + inverse_cdf(self.lead[lo:hi] + self.frac[lo:hi], rng)]
            if best is None or key > best:
                best, chosen = key, token
        if (self.excess == 0.0 and self.mu[chosen] > 0.0) or accept_draw(rng, self.p[chosen], self.mu[chosen]):
            return int(chosen)
        return sample_categorical(self.correction, rng)


@dataclass(frozen=True)
class ExactSamplerFirstInPiece(OTExact):
    def _plan(self, p, q, k):
        return _ExactSamplerFirstInPiece(self, p, q, k)


# 28. The orders' correction drawn from p instead of norm((p - mu)_+).
class _OrdersCorrectionP(_OrdersPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.correction = p.copy()


@dataclass(frozen=True)
class OrdersCorrectionP(OTWithoutReplacement):
    def _plan(self, p, q, k):
        return _OrdersCorrectionP(self, p, q, k)


# 29. The orders select the drafted child ranked lowest (law and sampler alike), against the
# selection law mu of the highest-ranked one.
class _OrdersLowestRanked(_OrdersPlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.ranks = -self.ranks


@dataclass(frozen=True)
class OrdersLowestRanked(OTWithoutReplacement):
    def _plan(self, p, q, k):
        return _OrdersLowestRanked(self, p, q, k)


# 30. The orders' sampler draws an order uniformly, not by its weight (the law keeps the weights).
class _OrdersUniformOrder(_OrdersPlan):
    def _draw(self, children, rng):
        order = int(rng.integers(self.weights.size))
        chosen = int(children[np.argmax(self.ranks[order, children])])
        if (self.excess == 0.0 and self.mu[chosen] > 0.0) or accept_draw(rng, self.p[chosen], self.mu[chosen]):
            return chosen
        return sample_categorical(self.correction, rng)


@dataclass(frozen=True)
class OrdersUniformOrder(OTWithoutReplacement):
    def _plan(self, p, q, k):
        return _OrdersUniformOrder(self, p, q, k)


# Planted faults of the shared inverse-CDF draw (``simlab.distributions.sample_categorical``):
# name -> a broken draw(probs, rng), each caught by checks.check_draw_helper.
def _unguarded_draw(probs, rng):
    """The draw as it was: U * total rounded up to the total gives index V (out of the vocabulary)."""
    cdf = np.cumsum(probs)
    return int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))


def _last_index_draw(probs, rng):
    """Clamped to the last index, without the positive-mass guard (a zero-mass token at the end)."""
    return min(_unguarded_draw(probs, rng), len(probs) - 1)


DRAW_MUTANTS = {"no guard: index V": _unguarded_draw, "clamped to the last index, mass unchecked": _last_index_draw}


# fault -> (broken verifier, the first check in test_mutants.CHECKS expected to catch it)
MUTANTS = {
    "residual = p": (ResidualIsP(), "lossless k=2"),
    "accept p/q without min": (UnclippedRatio(), "lossless k=2"),
    "specinfer keeps rejected child": (SpecInferNoRemoval(), "lossless k=2"),
    "spectr rho = 1": (SpecTrRhoOne(), "lossless k=2"),
    "nss samples q": (NSSUsesQ(), "lossless k=2"),
    "inclusive u <= p/q": (InclusiveAccept(), "u = 0 boundary"),
    "acceptance uniform reused": (ReusedUniform(), "sampler vs law"),
    "specinfer target not updated": (SpecInferStaleTarget(), "lossless k=2"),
    "khisti p_I = q": (KhistiApproximateLaw(), "lossless k=2"),
    "specinfer final token from p (sampler only)": (SpecInferFinalFromP(), "sampler vs law"),
    "one-hot target not renormalised": (OneHotStale(), "lossless k=3"),  # the top-2 of Q hold a p = 0 token
    "greedy-draft tail tested against q": (GreedyDraftAgainstQ(), "lossless k=2"),
    "greedy follows the draft's argmax": (GreedyArgmaxOfQ(), "lossless k=2"),
    "naive children mass without the residual": (NaiveMassWithoutResidual(), "children mass"),
    "specinfer children mass per copy": (SpecInferMassPerCopy(), "children mass"),
    "spectr children mass without the correction": (SpecTrMassWithoutCorrection(rho="four_step"), "children mass"),
    "nss batched masses from q": (NSSBatchedFromQ(), "children mass"),
    "naive batched one-child shortcut everywhere": (NaiveBatchedShortcut(), "children mass"),
    "spectr batched masses without the correction": (SpecTrBatchedWithoutCorrection(rho="four_step"), "children mass"),
    "ot walk without the split at H*": (WalkNoSplit(), "lossless k=2"),
    "ot walk correction from p": (WalkCorrectionP(), "lossless k=2"),
    "ot walk sampler against q": (WalkSamplerAgainstQ(), "sampler vs law"),
    "ot exact copies in one piece compared by piece only": (ExactPieceOnly(), "lossless k=2"),
    "ot exact correction from p": (ExactCorrectionP(), "lossless k=2"),
    "ot exact sampler ties to the first child in a piece": (ExactSamplerFirstInPiece(), "sampler vs law"),
    "ot wor correction from p": (OrdersCorrectionP(), "lossless k=2"),
    "ot wor selects the lowest-ranked child": (OrdersLowestRanked(), "lossless k=2"),
    "ot wor sampler draws the orders uniformly": (OrdersUniformOrder(), "sampler end to end"),
    "specinfer batched masses per copy": (SpecInferBatchedPerCopy(), "children mass"),
    "one-hot without its last child": (OneHotNoLastChild(), "u boundaries"),
}
