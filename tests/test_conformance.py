"""The public losslessness check (issue 42, item 1): ``simlab.conformance``.

Exact path: a planted verifier that declares itself lossless and is not is caught with its exact
bias and worst case (a written-out reference: it always accepts its first child, so its output
law is q and its bias TV(p, q)); the lab's declared-lossless verifiers pass through the public
path.  The gate: such a class, registered as a user would, is refused by every study with its
exact bias, and a gate-less mutant (the declarations trusted, the behaviour before the gate) is
shown to let it through.  Statistical path: a planted biased black-box sampler is rejected at the
stated power and the lab's speculative sampling behind the same interface passes (false alarm
1e-6, power 0.99 at TV 0.02: ``simlab.conformance.sample_size``).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

import variants
from simlab import conformance, tree_verifiers, verifiers
from simlab.builders import iid
from simlab.drafting import SAMPLED, Drafting
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import MarkovPair
from simlab.tree_verifiers import topdown
from simlab.verifiers.base import NodePlan, NodeVerifier
from simlab.verifiers.naive import Naive
from variants import SAMPLED_T

PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)


# -- planted verifiers (a user's classes) ------------------------------------------------------------
class _AcceptFirstPlan(NodePlan):
    def _law(self, children):
        out = np.zeros_like(self.p)
        out[children[0]] = 1.0
        return out

    def _draw(self, children, rng):
        return int(children[0])


@dataclass(frozen=True)
class AcceptFirst(NodeVerifier):
    """Accepts its first child always, and declares itself lossless for i.i.d. drafts: its output
    law is q, its bias TV(p, q)."""

    name = "accept_first"

    def _plan(self, p, q, k):
        return _AcceptFirstPlan(self, p, q, k)


@dataclass(frozen=True)
class NaiveClaimsEveryLaw(Naive):
    """Speculative sampling on the first child, declared lossless for every law: true for the laws
    under which the first child is a draw from q, false for deterministic and mixed children."""

    name = "naive_every_law"
    lossless_for = frozenset(Drafting)


@dataclass(frozen=True)
class RenamedNaive(Naive):
    """A user's lossless class (speculative sampling under another name)."""

    name = "renamed_naive"


@pytest.fixture
def registered():
    """The three user classes, registered for one test and removed afterwards."""
    for cls in (AcceptFirst, NaiveClaimsEveryLaw, RenamedNaive):
        verifiers.register(cls)
    try:
        yield
    finally:
        for cls in (AcceptFirst, NaiveClaimsEveryLaw, RenamedNaive):
            verifiers.unregister(cls.name)


# -- exact path --------------------------------------------------------------------------------------
def test_the_planted_lossy_class_is_caught_with_its_exact_bias_and_worst_case():
    report = conformance.check_verifier(AcceptFirst)
    assert not report.lossless and report.laws == (Drafting.IID,) and report.declared == frozenset({Drafting.IID})
    for case in report.cases:  # the written-out reference: the output law is q, the bias TV(p, q)
        assert np.abs(case.output_law - case.q).max() <= 1e-15
        assert abs(case.bias - 0.5 * np.abs(case.p - case.q).sum()) <= 1e-15
    assert report.bias == 1.0 and report.worst.name == "disjoint supports"
    assert np.array_equal(report.output_law, conformance.edge_case("disjoint supports")[1])
    assert report.lossless_laws() == frozenset() and report.refuted_laws() == frozenset({Drafting.IID})
    with pytest.raises(AssertionError, match=r"accept_first: exact bias 1 \(TV from p\) at case 'disjoint supports'"):
        conformance.assert_lossless(AcceptFirst)


def test_a_class_lossless_for_some_declared_laws_only():
    """Speculative sampling on the first child declared lossless for every law: the i.i.d.,
    without-replacement and repeated laws confirmed, the deterministic and mixed ones refuted."""
    report = conformance.check_verifier(NaiveClaimsEveryLaw())
    assert report.lossless_laws() == SAMPLED | {Drafting.REPEATED}
    assert report.refuted_laws() == {Drafting.DETERMINISTIC, Drafting.MIXED} and report.bias > 0.1
    assert conformance.check_verifier(NaiveClaimsEveryLaw(), laws=SAMPLED).lossless


@pytest.mark.parametrize("name", [n for n in verifiers.names() if verifiers.REGISTRY[n].lossless_for or n == "optimal"])
def test_the_labs_lossless_verifiers_pass_the_public_path(name):
    report = conformance.assert_lossless(verifiers.get(name))
    assert report.bias <= conformance.TOLERANCE and len(report.cases) >= 40, report.summary()


def test_declared_lossy_rules_are_valued_not_asserted():
    """A declared-lossy class: ``assert_lossless`` refuses it; ``check_verifier`` values it on its own
    drafting law (SGLang's defaults are exact on distinct children, DIVERSE at w = 0.5 is not)."""
    with pytest.raises(AssertionError, match="declares no lossless drafting law"):
        conformance.assert_lossless(verifiers.get("sglang_threshold"))
    assert conformance.check_verifier(verifiers.get("sglang_threshold")).lossless
    assert not conformance.check_verifier(verifiers.get("diverse")).lossless


def test_bad_input():
    with pytest.raises(TypeError, match="^verifier: "):
        conformance.check_verifier(object())
    with pytest.raises(ValueError, match="^laws: "):
        conformance.check_verifier(verifiers.get("spectr"), laws=["iid"])
    with pytest.raises(ValueError, match="^ks: "):
        conformance.check_verifier(RenamedNaive, ks=(0,))


def test_the_edge_cases_and_the_designed_test_live_in_simlab():
    import stats

    assert variants.EDGE_CASES is conformance.EDGE_CASES and variants.edge_case is conformance.edge_case
    assert stats.sample_size is conformance.sample_size and stats.FALSE_ALARM == 1e-6 and stats.POWER == 0.99
    out = subprocess.run(
        [sys.executable, "-c", "from simlab.conformance import assert_lossless, check_sampler, check_verifier; print('ok')"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "ok"


# -- the gate ----------------------------------------------------------------------------------------
def _gate_refuses(name: str) -> bool:
    """True when every study path refuses the registered class ``name`` on i.i.d. trees, naming its
    exact bias; False when one of them takes it as lossless."""
    if name in tree_verifiers.lossless_names({Drafting.IID}, SAMPLED_T):
        return False
    if tree_verifiers.get(name).lossless_on(next(iter(iid(2, 2).enumerate(_table())))[0]):
        return False
    try:
        expected_block_efficiency(PAIR, (1,), iid(2, 2), name)
    except ValueError as exc:
        assert "refuted by simlab.conformance" in str(exc) and "exact bias" in str(exc), exc
        return True
    return False


def _table():
    from simlab.trees import NodeTable

    return NodeTable(PAIR, (1,))


def test_studies_refuse_a_user_class_that_declares_itself_lossless_and_is_not(registered):
    assert _gate_refuses("accept_first")
    with pytest.raises(ValueError, match=r"^verifier: accept_first is not lossless .* exact bias 1 \(TV from p\)"):
        expected_block_efficiency(PAIR, (1,), iid(2, 2), "accept_first")
    biased = expected_block_efficiency(PAIR, (1,), iid(2, 2), "accept_first", allow_lossy=True)
    assert not biased.lossless and pairing_bias(PAIR, (1,), iid(2, 2), "accept_first", n=2) > 0.05
    assert "accept_first" not in tree_verifiers.lossless_names({Drafting.IID}, SAMPLED_T)


def test_the_gate_keeps_what_the_check_confirms(registered):
    """A partly-wrong class keeps its confirmed laws; a lossless user class and the lab's own stay."""
    iid_names = tree_verifiers.lossless_names({Drafting.IID}, SAMPLED_T)
    assert {"renamed_naive", "naive_every_law", "naive", "specinfer"} <= set(iid_names)
    deterministic = tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, SAMPLED_T)
    assert "naive_every_law" not in deterministic and "nss" in deterministic
    assert tree_verifiers.get("naive_every_law").lossless_for == SAMPLED | {Drafting.REPEATED}
    assert conformance.refutation(verifiers.get("renamed_naive")) is None
    assert conformance.refutation(verifiers.get("naive")) is None  # the lab's own: not re-checked


def test_the_check_is_cached_per_instance(registered, monkeypatch):
    calls = []
    original = conformance.check_verifier
    monkeypatch.setattr(conformance, "check_verifier", lambda v, *a, **k: calls.append(v) or original(v, *a, **k))
    conformance._CERTIFICATES.clear()
    for _ in range(3):
        tree_verifiers.lossless_names({Drafting.IID}, SAMPLED_T)
    assert sorted(type(v).__name__ for v in calls) == ["AcceptFirst", "NaiveClaimsEveryLaw", "RenamedNaive"]


def test_a_gateless_mutant_lets_the_planted_class_through(registered, monkeypatch):
    """The planted fault: the declarations trusted (the behaviour before the gate); the gate's test
    above then fails."""
    monkeypatch.setattr(topdown, "certified_lossless_for", lambda v: frozenset(v.lossless_for))
    monkeypatch.setattr(topdown, "certified_lossless", lambda v, law, k: v.is_lossless(law, k))
    assert not _gate_refuses("accept_first")


# -- statistical path --------------------------------------------------------------------------------
P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])


def lab_speculative(p, q, drafts, generator):
    """The lab's speculative sampling behind the black-box interface."""
    return Naive().sample(p, q, drafts, generator)


def correction_from_p(p, q, drafts, generator):
    """A planted engine bug: the correction drawn from p, not norm((p - q)_+)."""
    x = int(drafts[0])
    if generator.random() * q[x] < p[x]:
        return [x, 0]  # an emitted sequence: the first entry is read
    return [int(generator.choice(p.size, p=p))]


def test_a_planted_biased_sampler_is_rejected_at_the_stated_power():
    """Its exact law, min(p, q) + TV(p, q) p, is at TV 0.1525 from p (> 0.02: power >= 0.99)."""
    exact = np.minimum(P, Q) + 0.5 * np.abs(P - Q).sum() * P
    assert 0.5 * np.abs(exact - P).sum() > conformance.TV_ALTERNATIVE
    for seed in range(3):
        report = conformance.check_sampler(correction_from_p, P, Q, seed=seed)
        assert not report.passed and report.pvalue < conformance.FALSE_ALARM, report.summary()
        assert report.n == conformance.sample_size(5) and report.tv == 0.02
    with pytest.raises(AssertionError, match="G-test rejects"):
        conformance.assert_sampler_lossless(correction_from_p, P, Q)
    assert conformance.check_sampler(correction_from_p, P, Q, reference=exact, seed=4).passed


@pytest.mark.parametrize("k, law", [(1, Drafting.IID), (3, Drafting.IID), (2, Drafting.WITHOUT_REPLACEMENT)])
def test_a_lossless_sampler_passes(k, law):
    report = conformance.assert_sampler_lossless(lab_speculative, P, Q, k, law=law, seed=11)
    assert report.pvalue > 1e-6 and report.tv_estimate < 0.02


def test_the_design():
    """N grows as the alternative shrinks; the stated power is reached at N (non-central chi-square)."""
    from scipy import stats as st

    n = conformance.sample_size(5)
    critical = st.chi2.isf(1e-6, 4)
    assert st.ncx2.sf(critical, 4, 4 * n * 0.02**2) >= 0.99 > st.ncx2.sf(critical, 4, 4 * (n - 1000) * 0.02**2)
    assert conformance.sample_size(5, 0.01) > n > conformance.sample_size(5, 0.05)
    assert conformance.sample_size(5, false_alarm=1e-3) < n


def test_sampler_bad_input():
    with pytest.raises(TypeError, match="^sampler: "):
        conformance.check_sampler("not callable", P, Q)
    with pytest.raises(ValueError, match="^sampler: returned token 9"):
        conformance.check_sampler(lambda p, q, d, g: 9, P, Q)
    with pytest.raises(ValueError, match="^sampler: must return integer"):
        conformance.check_sampler(lambda p, q, d, g: [0.5], P, Q)
    with pytest.raises(ValueError, match="^law: "):
        conformance.check_sampler(lab_speculative, P, Q, law="iid")
    with pytest.raises(ValueError, match="^k: "):
        conformance.check_sampler(lab_speculative, P, Q, 7, law=Drafting.WITHOUT_REPLACEMENT)
    with pytest.raises(ValueError, match="^tv: "):
        conformance.sample_size(3, 0.0)


# -- the attack round's cases: state, inputs, errors, capabilities -------------------------------------
class _MixPlan(NodePlan):
    """Speculative sampling on the first child, then a share ``eps`` of the law moved onto that child."""

    def _law(self, children):
        law = Naive().prepare(self.p, self.q, self.k).output_distribution(children)
        return (1.0 - self.verifier.eps) * law + self.verifier.eps * np.eye(self.p.size)[children[0]]

    def _draw(self, children, rng):
        return int(rng.choice(self.p.size, p=self._law(children)))


@dataclass(eq=True)
class MutableMix(NodeVerifier):
    """A plain (mutable, unhashable) dataclass: lossless at eps = 0 only."""

    eps: float = 0.0
    name = "mutable_mix"

    def _plan(self, p, q, k):
        return _MixPlan(self, p, q, k)


def test_an_option_changed_after_the_check_is_checked_anew():
    """The certificate followed the object (or, unhashable, its class): eps changed from 0 to 0.8
    after the check kept 'lossless'; the key now digests the state."""
    conformance._CERTIFICATES.clear()
    v = MutableMix(0.0)
    assert conformance.certified_lossless_for(v) == frozenset({Drafting.IID})
    v.eps = 0.8
    assert conformance.certified_lossless_for(v) == frozenset()
    assert conformance.certified_lossless_for(MutableMix(0.5)) == frozenset()
    assert conformance.certified_lossless_for(MutableMix(0.0)) == frozenset({Drafting.IID})


class _TruncatingPlan(NodePlan):
    """Zeroes p below half its maximum in place, then speculative sampling against the edited p."""

    def __init__(self, verifier, p, q, k):
        p[p < 0.5 * p.max()] = 0.0
        p /= p.sum()
        super().__init__(verifier, p, q, k)
        self.inner = Naive().prepare(p, q, k)

    def _law(self, children):
        return self.inner.output_distribution(children)

    def _draw(self, children, rng):
        return int(rng.choice(self.p.size, p=self._law(children)))


@dataclass(frozen=True)
class EditsItsInputs(NodeVerifier):
    name = "edits_its_inputs"

    def _plan(self, p, q, k):
        return _TruncatingPlan(self, p, q, k)


@dataclass(frozen=True)
class Raises(NodeVerifier):
    name = "raises"

    def _plan(self, p, q, k):
        raise KeyError("a user's bug")


def test_a_verifier_that_edits_its_inputs_or_raises_is_refuted_not_certified():
    """The check compared with the p the plan had edited in place (certified, true TV 0.2 at
    p = (.5, .3, .2), q = (.2, .3, .5)); a KeyError escaped the gate.  Both are refutations now."""
    report = conformance.check_verifier(EditsItsInputs())
    assert not report.lossless and report.bias > 0.1
    report = conformance.check_verifier(Raises())
    assert not report.lossless and "KeyError" in report.worst.problem
    assert conformance.certified_lossless_for(Raises()) == frozenset()


@dataclass(frozen=True)
class NSSUnderNaive(Naive):
    """A user's class inheriting Naive's capabilities (``speculative_at_one``, the name ``naive``)
    while running NSS's rule: the fast paths must not trust what it inherits."""

    name = "nss_under_naive"
    lossless_for = frozenset(Drafting)

    def _plan(self, p, q, k):
        return verifiers.get("nss").prepare(p, q, k)


def test_inherited_capabilities_are_not_trusted_for_a_users_class():
    from simlab import batched
    from simlab.trees import SPECULATIVE, planning_verifier

    user = NSSUnderNaive()
    assert planning_verifier(user, 1) is user and planning_verifier(Naive(), 1) is SPECULATIVE
    assert not batched.supports(user) and batched.supports(Naive())
    from simlab.builders import chain

    ours = expected_block_efficiency(PAIR, (0,), chain(1), tree_verifiers.get("nss")).mean
    theirs = expected_block_efficiency(PAIR, (0,), chain(1), topdown.TopDown(user)).mean
    assert theirs == pytest.approx(ours, abs=1e-12)  # NSS's value, not speculative sampling's


def test_the_exact_check_refuses_vacuous_or_malformed_requests():
    for kwargs, name in (({"ks": ()}, "ks"), ({"cases": {}}, "cases"), ({"laws": [None]}, "laws"), ({"laws": []}, "laws")):
        with pytest.raises(ValueError, match=f"^{name}: "):
            conformance.check_verifier(Naive(), **kwargs)


def test_the_g_test_keeps_its_power_on_merged_cells():
    """Cells expected below 5 are merged: N grows until the merged tail cannot hide an alternative
    at the stated TV (a Zipf law over 150,000 tokens: 9.8 million draws, not sample_size's 2.45)."""
    zipf = 1.0 / np.arange(1, 150_001)
    zipf /= zipf.sum()
    plain = conformance.sample_size(150_000)
    n = conformance.designed_draws(zipf)
    tail = zipf[zipf * n < 5].sum()
    assert (
        n > plain
        and tail < conformance.TV_ALTERNATIVE
        and n >= conformance.sample_size(150_000, conformance.TV_ALTERNATIVE - tail)
    )
    assert conformance.designed_draws(np.full(5, 0.2)) == conformance.sample_size(5)
    with pytest.raises(ValueError, match="^sampler: must return integer token ids"):
        conformance.check_sampler(lambda p, q, drafts, rng: True, [0.5, 0.5], [0.5, 0.5])


@dataclass(frozen=True)
class HoldsALambda(Naive):
    """A user's lossless class whose state cannot be pickled (an option holding a function)."""

    name = "holds_a_lambda"
    hook: object = lambda x: x  # noqa: E731


def test_an_unpicklable_verifier_is_checked_once_not_at_every_node(monkeypatch):
    """Its certificate was never cached: the exact check ran at every node (189 times, 8.9 s for one
    valuation of a 3-token chain); it is cached by the object's identity now."""
    from simlab.builders import chain

    calls = []
    original = conformance.check_verifier
    monkeypatch.setattr(conformance, "check_verifier", lambda v, *a, **k: calls.append(v) or original(v, *a, **k))
    conformance._CERTIFICATES.clear()
    verifier = topdown.TopDown(HoldsALambda())
    expected_block_efficiency(PAIR, (0,), chain(3), verifier)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "name, options", [("lenience", {"lenience": 0.5}), ("diverse", {"weight": 0.5}), ("cos", {"cos_lambda": 0.5})]
)
def test_the_ratio_rules_raise_no_overflow_warning_on_a_subnormal_q(name, options):
    import warnings

    p, q = np.array([0.3, 0.3, 0.4]), np.array([1e-320, 3e-315, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        law = verifiers.get(name, **options).output_distribution(p, q / q.sum(), [0])
    assert law.tolist() == [1.0, 0.0, 0.0]
