"""Reusable correctness checks for node verifiers: the tests apply them to the real verifiers,
and the planted-fault suite (test_mutants.py) asserts that each broken variant fails one.

Each check raises AssertionError on failure.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from simlab.conformance import exact_case
from simlab.drafting import Drafting, child_tuples, draw_children
from simlab.verifiers.base import NodeVerifier
from stats import assert_sampler_matches

EXACT = 1e-12


@st.composite
def pairs(draw, max_vocab=6):
    """(p, q): two distributions over V in [2, max_vocab], with exact zeros allowed."""
    vocab = draw(st.integers(2, max_vocab))
    weight = st.one_of(st.just(0.0), st.floats(1e-3, 1.0))

    def dist():
        w = np.array(draw(st.lists(weight, min_size=vocab, max_size=vocab)))
        if w.sum() == 0:
            w[draw(st.integers(0, vocab - 1))] = 1.0
        return w / w.sum()

    return dist(), dist()


DISTINCT = (Drafting.WITHOUT_REPLACEMENT, Drafting.DETERMINISTIC, Drafting.MIXED)


def applicable(verifier: NodeVerifier, q: np.ndarray, k: int, p: np.ndarray | None = None) -> bool:
    """False where the verifier's drafting law cannot produce k children from q (its laws of
    distinct children need k tokens with q > 0), or, when ``p`` is given (a check of the target
    law), for a verifier that needs a greedy target where p is not one-hot, and for a declared-lossy
    verifier (``lossless_for`` empty: its law is checked against its own reference instead,
    ``tests/test_lossy_rules.py``)."""
    if verifier.drafting in DISTINCT and k > np.count_nonzero(q):
        return False
    if p is not None and not verifier.lossless_for:
        return False
    return not (p is not None and verifier.needs_greedy_target and np.max(p) < 1.0)


def check_lossless(verifier: NodeVerifier, p, q, k: int) -> None:
    """sum_x Q(x) B(x, .) == p to 1e-12 in TV, every B(x, .) a distribution, for exact enumeration of x
    drawn by the verifier's ``drafting`` law (``simlab.conformance.exact_case``, the public exact path)."""
    case = exact_case(verifier, np.asarray(p, float), np.asarray(q, float), k)
    assert case.problem is None, f"{verifier.name}: {case.describe()}"
    assert case.bias <= EXACT, f"{verifier.name}: output law differs from p by {case.bias:.3g} in TV (k={k})"


def check_acceptance(verifier: NodeVerifier, p, q, k: int) -> None:
    """Where the verifier's plan has a closed-form acceptance rate (found by override:
    ``NodePlan.has_formula``), it equals the enumeration over the children of P(output in set(x))
    (``method="enumerate"``, from the plan's branch law) to 1e-12 and ``"auto"`` is the formula;
    a plan without one refuses ``"formula"`` (one method: nothing to compare)."""
    plan = verifier.prepare(p, q, k)
    if not plan.has_formula():
        try:
            plan.acceptance_rate("formula")
        except ValueError as exc:
            assert "no closed-form" in str(exc), exc
            return
        raise AssertionError(f"{verifier.name}: method='formula' without a formula did not refuse")
    formula, enumerated = plan.acceptance_rate("formula"), plan.acceptance_rate("enumerate")
    assert abs(formula - enumerated) <= EXACT, f"{verifier.name}: formula {formula} != enumerated {enumerated}"
    assert plan.acceptance_rate("auto") == formula, f"{verifier.name}: method='auto' is not the formula"


def check_children_mass(verifier: NodeVerifier, p, q, k: int) -> None:
    """children_mass(x) equals output_distribution(x)[x] to 1e-12 for every enumerated x (the
    children-only fast path against the full law), and a prepared plan given checked=True
    answers as the validating one."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    plan = verifier.prepare(p, q, k)
    trusted = verifier.prepare(p, q, k, checked=True)
    tuples, _ = child_tuples(q, k, verifier.drafting)
    for x in tuples:
        fast, full = plan.children_mass(x), plan.output_distribution(x)[x]
        err = np.abs(fast - full).max()
        assert err <= EXACT, f"{verifier.name}: children_mass differs from the full law by {err:.3g} at x={x.tolist()}"
        assert np.array_equal(trusted.children_mass(x), fast), f"{verifier.name}: checked=True plan differs at x={x.tolist()}"
    if len(tuples):  # every child list at once (what a label grid asks of a node): each row bit for bit
        rows = np.stack([np.asarray(x) for x in tuples])
        batched = plan.children_masses(rows)
        for x, row in zip(tuples, batched):
            assert np.array_equal(row, plan.children_mass(x)), (
                f"{verifier.name}: children_masses differs from children_mass at x={np.asarray(x).tolist()}"
            )


def check_sampler_given_children(verifier: NodeVerifier, p, q, children, seed: int) -> None:
    """sample(children) agrees with output_distribution(children) (designed G-test, stats.py)."""
    plan = verifier.prepare(p, q, len(children))
    assert_sampler_matches(lambda rng: plan.sample(children, rng), plan.output_distribution(children), seed)


def check_sampler_end_to_end(verifier: NodeVerifier, p, q, k: int, seed: int) -> None:
    """Draft children from the verifier's drafting law, run sample: the output law is p (G-test)."""
    plan = verifier.prepare(p, q, k)
    q = plan.q

    def draw(rng):
        return plan.sample(draw_children(q, k, verifier.drafting, rng), rng)

    assert_sampler_matches(draw, plan.p, seed)


class ConstantGenerator(np.random.Generator):
    """A Generator whose uniforms are all ``value``: injected randomness for boundary tests."""

    def __init__(self, value: float):
        super().__init__(np.random.PCG64(0))
        self.value = value

    def random(self, size=None, dtype=np.float64, out=None):  # noqa: D401 - numpy signature
        return self.value if size is None else np.full(size, self.value)

    def permutation(self, x):
        return np.arange(x) if isinstance(x, (int, np.integer)) else np.asarray(x)


def check_zero_target_never_accepted(verifier: NodeVerifier) -> None:
    """With U = 0 exactly, a child with p(x) = 0 < q(x) must never be output; by a declared-lossy
    rule whose law accepts such a child (CoS, DIVERSE, SpecCascade at 0), never outside its law."""
    p = np.array([0.0, 0.5, 0.5])
    q = np.array([0.6, 0.2, 0.2])
    for children in ([0], [0, 0], [0, 1]) if verifier.drafting is Drafting.IID else ([0], [0, 1]):
        out = verifier.sample(p, q, children, ConstantGenerator(0.0))
        allowed = p if verifier.lossless_for else verifier.output_distribution(p, q, children)
        assert allowed[out] > 0, f"{verifier.name}: emitted token {out} with p = 0 at U = 0 (children {children})"


BOUNDARY_UNIFORMS = (0.0, 1.0 - 2.0**-53)
"""The ends of the uniform's range: 0 and the largest float below 1."""

_THIRDS = np.array([1 / 3, 1 / 3, 0.0, 1 / 3])
_TENTHS = np.array([0.7, 0.2, 0.0, 0.1])
BOUNDARY_CASES = {  # (p, q, children): the children cover p's support (a rounded residual mass is all that is left)
    "uniform, children cover the support": (_THIRDS, np.full(4, 0.25), [0, 1, 3]),
    "uneven, children cover the support": (_TENTHS, _TENTHS, [3, 0, 1]),
    "zeros and ties": (np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25]), np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20]), [0, 5, 1]),
    "one-hot p": (np.eye(6)[4], np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20]), [4, 0, 5]),
}
DRAW_CASES = (
    _THIRDS,
    np.eye(6)[3],
    np.array([5e-324, 0.0, 0.0]),
    np.array([0.0, 1e-310, 1e-310, 0.0]),
    np.array([0.0, 0.5, 0.5 - 2**-53, 0.0, 0.0]),
)
"""Vectors an inverse-CDF draw meets: zeros before and after the support, subnormal totals
(U * total rounds up to the total at U = 1 - 2^-53)."""


def check_draw_helper(draw) -> None:
    """``draw(probs, rng)`` returns an index of positive mass at both ends of the uniform's range."""
    for u in BOUNDARY_UNIFORMS:
        for probs in DRAW_CASES:
            i = draw(probs, ConstantGenerator(u))
            assert 0 <= i < probs.size and probs[i] > 0, f"draw: index {i} of {probs.tolist()} at U = {u!r}"


def check_boundary_uniforms(verifier: NodeVerifier) -> None:
    """At U = 0 and U = 1 - 2^-53, sample emits a token id in [0, V) of positive mass under the
    exact law of the given children (never an error: the inputs are valid)."""
    for u in BOUNDARY_UNIFORMS:
        for case, (p, q, children) in BOUNDARY_CASES.items():
            plan = verifier.prepare(p, q, len(children))
            try:
                out = plan.sample(children, ConstantGenerator(u))
            except ValueError as exc:
                raise AssertionError(f"{verifier.name}: {exc} at U = {u!r} ({case})") from None
            assert 0 <= out < p.size, f"{verifier.name}: token {out} outside [0, {p.size}) at U = {u!r} ({case})"
            assert plan.output_distribution(children)[out] > 0.0, (
                f"{verifier.name}: token {out} has no mass at U = {u!r} ({case})"
            )
