"""DIVERSE's static ensemble verification (issue 42, item 2): the lab's rule and transformers' function.

Exact evidence: the lab's law (``simlab.verifiers.diverse``) against a written-out reference, by
enumeration; its output law is the ensemble v = w p + (1 - w) q and its bias (1 - w) TV(p, q),
declared lossy and confirmed lossy by ``simlab.conformance`` (exact at w = 1).  Real code:
transformers' ``_speculative_sampling`` behind a few-line adapter (``backends.engine_samplers``; its code is not copied), its
exact law read through torch's two random primitives (the acceptance ratio handed to
``torch.rand_like``, the residual handed to ``torch.multinomial``) and compared with the lab's,
and designed G-tests (false alarm 1e-6, power 0.99 at TV 0.02) of its emitted token, standard mode
against p and ensemble mode against the lab's exact law; its edge cases (p and q equal to
rounding, q = 0 at a drafted token, one-hot targets).  Planted faults: ``MUTANTS``, each caught.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch
from transformers.generation import utils as _utils

from backends.engine_samplers import transformers_inputs, transformers_law, transformers_sampler
from simlab import conformance, tree_verifiers, verifiers
from simlab.builders import chain, iid
from simlab.drafting import Drafting
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import MarkovPair
from simlab.verifiers.diverse import Diverse, _DiversePlan, ensemble_law
from simlab.verifiers.naive import Naive
from stats import TV_SAMPLING_LOOP, assert_sampler_matches

EXACT = 1e-12
WEIGHTS = (0.1, 0.5, 0.9, 1.0)
PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)
INSTANCES = list(conformance.CASES)


def diverse_reference(p, q, x, w):
    """DIVERSE at one child x, written out: accept w.p. min(1, 1 - w + w p(x) / q(x)) (1 if q(x) = 0
    < p(x), 0 if both are 0), else a draw from norm((p - q)_+), or from p where that is zero."""
    if q[x] > 0:
        a = min(1.0, 1.0 - w + w * p[x] / q[x])
    else:
        a = 1.0 if p[x] > 0 else 0.0
    residual = np.maximum(p - q, 0.0)
    correction = residual / residual.sum() if residual.sum() > 0 else p
    out = (1.0 - a) * correction
    out[x] += a
    return out


def _children(p, q):
    drafted = np.flatnonzero(q > 0)
    first = int(drafted[0])
    return [[first], [first, int(drafted[-1])], [int(drafted[-1]), first, first]]


# -- the lab's rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("w", WEIGHTS)
@pytest.mark.parametrize("case", INSTANCES)
def test_law_equals_the_written_out_rule(case, w):
    p, q = conformance.CASES[case]
    p, q = np.array(p), np.array(q)
    v = Diverse(weight=w)
    for children in _children(p, q) + [[int(np.argmin(q))]]:  # the last: possibly q = 0 (deterministic children)
        law = v.prepare(p, q, len(children), Drafting.DETERMINISTIC).output_distribution(children)
        assert np.abs(law - diverse_reference(p, q, children[0], w)).max() <= EXACT, children


@pytest.mark.parametrize("w", WEIGHTS)
def test_output_law_is_the_ensemble_and_the_bias_is_one_minus_w_times_tv(w):
    """By enumeration at k = 1, 2, 3 i.i.d. children, every instance: the output law is v and its
    bias (1 - w) TV(p, q); lossy as declared below w = 1, lossless (confirmed) at w = 1."""
    report = conformance.check_verifier(Diverse(weight=w), laws=[Drafting.IID])
    for case in report.cases:
        tv = 0.5 * np.abs(case.p - case.q).sum()
        assert np.abs(case.output_law - ensemble_law(case.p, case.q, w)).max() <= EXACT, case.describe()
        assert abs(case.bias - (1.0 - w) * tv) <= EXACT, case.describe()
    assert report.lossless == (w == 1.0) and abs(report.bias - (1.0 - w)) <= EXACT  # disjoint supports: TV = 1
    assert Diverse(weight=w).lossless_for == frozenset()


def test_at_w_one_the_law_is_speculative_sampling():
    for p, q in conformance.CASES.values():
        p, q = np.array(p), np.array(q)
        for children in _children(p, q):
            assert (
                np.abs(
                    Diverse(weight=1.0).output_distribution(p, q, children) - Naive().output_distribution(p, q, children)
                ).max()
                <= EXACT
            )


def test_acceptance_is_one_minus_w_tv_for_one_child():
    for p, q in conformance.CASES.values():
        p, q = np.array(p), np.array(q)
        for w in WEIGHTS:
            alpha = Diverse(weight=w).acceptance_rate(p, q, 1)
            assert abs(alpha - (1.0 - w * 0.5 * np.abs(p - q).sum())) <= EXACT


@pytest.mark.parametrize("shape", [chain(2), iid(2, 2)])
def test_declared_lossy_refused_and_its_tree_bias(shape):
    with pytest.raises(ValueError, match="^verifier: diverse is not lossless .* declared lossy"):
        expected_block_efficiency(PAIR, (1,), shape, "diverse")
    lossy = tree_verifiers.get("diverse", allow_lossy=True, weight=0.5)
    assert not expected_block_efficiency(PAIR, (1,), shape, lossy, allow_lossy=True).lossless
    assert pairing_bias(PAIR, (1,), shape, lossy, n=2) > 1e-2
    assert pairing_bias(PAIR, (1,), shape, tree_verifiers.get("diverse", allow_lossy=True, weight=1.0), n=2) <= EXACT
    assert "diverse" not in tree_verifiers.lossless_names({Drafting.IID}, tree_verifiers_settings())


def tree_verifiers_settings():
    from variants import SAMPLED_T

    return SAMPLED_T


def test_sampler_matches_its_law():
    p, q = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25]), np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
    plan = Diverse(weight=0.4).prepare(p, q, 2)
    assert_sampler_matches(lambda rng: plan.sample([0, 4], rng), plan.output_distribution([0, 4]), seed=41)


def test_bad_weights():
    for bad in (0, 0.0, -0.1, 1.5, math.nan, math.inf, True, "0.5", None):
        with pytest.raises(ValueError, match="^weight: must be a number in"):
            Diverse(weight=bad)
    with pytest.raises(ValueError, match="^weight: "):
        verifiers.get("diverse", weight=2.0)


# -- planted faults ------------------------------------------------------------------------------------
class _SwappedPlan(_DiversePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.v = (1.0 - verifier.weight) * p + verifier.weight * q  # w and 1 - w swapped


class _NoFloorPlan(_DiversePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        self.v = verifier.weight * p  # the 1 - w term dropped: ratio w p / q


class _CorrectionFromPPlan(_DiversePlan):
    def _law(self, children):
        x = int(children[0])
        a = min(1.0, self.v[x] / self.q[x])
        out = (1.0 - a) * self.p
        out[x] += a
        return out


def _mutant(plan_class):
    @dataclass(frozen=True)
    class Mutant(Diverse):
        def _plan(self, p, q, k):
            return plan_class(self, p, q, k)

    return Mutant(weight=0.3)


MUTANTS = {
    "weights swapped": _mutant(_SwappedPlan),
    "1 - w dropped from the ratio": _mutant(_NoFloorPlan),
    "correction from p": _mutant(_CorrectionFromPPlan),
}


def _checks(v):
    for p, q in list(conformance.CASES.values())[:8]:
        p, q = np.array(p), np.array(q)
        for children in _children(p, q):
            law = v.output_distribution(p, q, children)
            assert np.abs(law - diverse_reference(p, q, children[0], v.weight)).max() <= EXACT, "law"


def test_the_correct_rule_passes_the_mutants_checks():
    _checks(Diverse(weight=0.5))


@pytest.mark.parametrize("fault", list(MUTANTS))
def test_planted_fault_is_caught(fault):
    with pytest.raises(AssertionError):
        _checks(MUTANTS[fault])


# -- transformers' function ----------------------------------------------------------------------------
ENSEMBLE = "assistant_ensemble_weight" in inspect.signature(_utils._speculative_sampling).parameters
needs_ensemble = pytest.mark.skipif(not ENSEMBLE, reason="this transformers has no assistant_ensemble_weight (before DIVERSE)")


@needs_ensemble
@pytest.mark.parametrize("weight", [None, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("case", INSTANCES)
def test_transformers_exact_law_is_the_labs(case, weight):
    """Every drafted child (q > 0) of every instance: transformers' law equals the lab's speculative
    sampling (standard mode) or DIVERSE (ensemble mode) to float32 rounding (2e-6)."""
    p, q = (np.array(v) for v in conformance.CASES[case])
    lab = Naive() if weight is None else Diverse(weight=weight)
    for x in np.flatnonzero(q > 0):
        if q[x] < 1e-30 or 0 < p[x] < 1e-30:
            continue  # below float32's range: the function sees a different p, q
        law = transformers_law(*transformers_inputs(p, q, x), weight)
        assert np.abs(law - lab.output_distribution(p, q, [x])).max() <= 2e-6, (x, law)


P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])


def test_transformers_standard_mode_passes_the_g_test():
    """The function's exact law is the lab's (the test above, through torch's primitives); this checks
    its sampling path end to end, at the sampling-loop alternative (``stats.TV_SAMPLING_LOOP``: power
    0.99 at TV 0.05; the results section runs TV 0.02)."""
    conformance.assert_sampler_lossless(transformers_sampler(None), P, Q, seed=51, tv=TV_SAMPLING_LOOP)


@needs_ensemble
def test_transformers_ensemble_mode_against_the_labs_law_and_against_p():
    """w = 0.5: bias (1 - w) TV(p, q) = 0.225 > 0.05, so the G-test against p rejects with power >= 0.99;
    against the lab's exact law (the ensemble v) it passes (the stated alternative as above)."""
    v = ensemble_law(P, Q, 0.5)
    assert 0.5 * np.abs(v - P).sum() == pytest.approx(0.5 * 0.5 * np.abs(P - Q).sum())
    assert conformance.check_sampler(transformers_sampler(0.5), P, Q, reference=v, seed=52, tv=TV_SAMPLING_LOOP).passed
    assert not conformance.check_sampler(transformers_sampler(0.5), P, Q, seed=53, tv=TV_SAMPLING_LOOP).passed


ROUNDING = [-0.49839067459106445, -4.568305492401123, 1.1450517177581787, -3.0828258991241455]
"""Draft logits whose target logits, shifted by -5.630527496337891, give p = q to rounding in float32
with p(0) < q(0) and no token where p > q: the residual (p - q)_+ is exactly 0."""


@needs_ensemble
def test_p_equal_to_q_to_rounding():
    """Standard mode divides the zero residual by its zero sum: NaN, and ``torch.multinomial`` raises
    when the draft is rejected (probability 1 - p(0)/q(0), about 6e-8); ensemble mode falls back to p."""
    draft = torch.tensor(ROUNDING, dtype=torch.float32)[None, None, :]
    target = (draft + torch.tensor(-5.630527496337891, dtype=torch.float32)).repeat(1, 2, 1)
    p, q = target[0, 0].softmax(-1), draft[0, 0].softmax(-1)
    assert p[0] < q[0] and torch.clamp(p - q, min=0).sum() == 0
    ids = torch.tensor([[0]])
    with mock.patch.object(torch, "rand_like", lambda t: torch.full_like(t, 1.0 - 2.0**-24)):
        with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
            _utils._speculative_sampling(ids, draft, 1, target)
        tokens, n = _utils._speculative_sampling(ids, draft, 1, target, 0.5)
    assert int(n) == 0 and tokens.shape == (1, 1)
    law = transformers_law(ids, draft, target, 0.5)
    rejected = (1.0 - law[0]) / (1.0 - float(p[0]))  # law = (1 - e) delta_0 + e p: the rejected mass e goes to p
    expected = rejected * p.double().numpy()
    expected[0] += 1.0 - rejected
    assert 0.0 < rejected < 1e-6 and np.abs(law - expected).max() <= 1e-12


@needs_ensemble
def test_q_zero_at_the_drafted_token():
    """q(x) = 0 < p(x): the ratio is inf and x is accepted (both modes), as the lab's convention; q(x) =
    p(x) = 0: 0/0 is NaN, the strict test rejects, as the lab's."""
    p, q = np.array([0.3, 0.3, 0.4, 0.0]), np.array([0.0, 0.5, 0.5, 0.0])
    for weight in (None, 0.5):
        lab = Naive() if weight is None else Diverse(weight=weight)
        for x in (0, 3):
            law = transformers_law(*transformers_inputs(p, q, x), weight)
            expected = lab.prepare(p, q, 1, Drafting.DETERMINISTIC).output_distribution([x])
            assert np.abs(law - expected).max() <= 1e-6, (weight, x, law)
            assert (law[x] == 1.0) == (p[x] > 0)


@needs_ensemble
def test_one_hot_target():
    """A one-hot target (T = 0): standard mode emits the argmax always (lossless); ensemble mode emits
    v = w e + (1 - w) q, exactly as the lab's rule."""
    p, q = np.eye(4)[1], np.array([0.4, 0.3, 0.2, 0.1])
    for weight in (None, 0.5):
        marginal = sum(q[x] * transformers_law(*transformers_inputs(p, q, x), weight) for x in range(4))
        expected = p if weight is None else ensemble_law(p, q, weight)
        assert np.abs(marginal - expected).max() <= 2e-7


def test_lossy_at_a_greedy_target_as_declared():
    """A one-hot target: a child the target never emits is accepted w.p. 1 - w, so the output law is
    v = w e + (1 - w) q, at TV (1 - w)(1 - q(argmax p)) from p (``exact_at_greedy_target`` False)."""
    p, q = np.eye(4)[1], np.array([0.4, 0.3, 0.2, 0.1])
    case = conformance.exact_case(Diverse(weight=0.25), p, q, 1)
    assert abs(case.bias - 0.75 * 0.7) <= EXACT and not Diverse.exact_at_greedy_target
