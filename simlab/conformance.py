"""Is it lossless?  Public checks of a node verifier (exact) and of any sampler (a designed G-test).

**Exact path** (``check_verifier``, ``assert_lossless``): a node verifier of the lab's protocol
(``simlab.verifiers.base.NodeVerifier``, a class or an instance) is run on the standards' edge cases
(``EDGE_CASES``: p == q, one-hot p or q, disjoint supports, q(x) = 0 < p(x), p(x) = 0 < q(x), tiny
masses, ties) and on ``RANDOM_CASES`` (seeded Dirichlet pairs with exact zeros), at k = 1, 2, 3
children, for every drafting law it declares lossless (``lossless_for``).  At each instance every
child tuple x of positive probability is enumerated (``simlab.drafting.child_tuples``), its branch
law B(x, .) read from the verifier's plan and checked to be a distribution, and the output law
m = sum_x Q(x) B(x, .) compared with p: the **exact bias** is TV(m, p) = sum |m - p| / 2.  The
result (``ExactReport``) holds every instance's output law and bias and the worst instance found;
the verifier conforms when every bias is at most ``TOLERANCE`` (1e-12, the lab's own tests') and
every branch law is a distribution.  A verifier that needs a greedy target (``needs_greedy_target``)
is checked at the one-hot target at each case's argmax of p.

**The gate** (``certified_lossless_for``): a node verifier class that is not one of the lab's own
(``simlab.verifiers.LAB_VERIFIERS``: registered by ``simlab.verifiers.register``, or built by
hand) is lossless, for the studies, only for the declared laws the exact path confirms; every tree
verifier built on it (``simlab.tree_verifiers.TopDown``) refuses the others and names the exact bias
found (``refutation``).  The check runs once per verifier state (a cache keyed by the class and a
digest of the instance's pickled state, so an option changed after the check is checked anew; an
instance whose state cannot be pickled is cached by its identity); the lab's own classes are proved
by its test suite and are not re-checked.

**Statistical path** (``check_sampler``, ``assert_sampler_lossless``): any callable
``sampler(p, q, drafts, generator)`` returning the emitted token (or a sequence of emitted tokens,
whose first entry is read: an engine's verification function behind a few-line adapter) is run N
times on drafts drawn from q by a drafting law, and a G-test compares the counts of the emitted
token with the target p (or a stated reference law).  The design (``sample_size``): false-alarm
probability ``FALSE_ALARM`` = 1e-6 (the G statistic's asymptotic chi-square law, df = cells - 1),
power ``POWER`` = 0.99 against every law at total variation ``TV_ALTERNATIVE`` = 0.02 or more
(asymptotic non-central chi-square with non-centrality at least N chi2-divergence >= N (2 TV)^2;
N the smallest multiple of 1,000 that reaches it).  Cells whose expected count is below 5 are
merged, and N is raised until the power holds on the merged cells too (``designed_draws``: an
alternative can hide inside the merged tail); a draw in a zero-probability cell fails at once.  The
exact law of a black-box callable from its uniforms is not computed here: an engine's function
draws from its framework's global generator (torch), not from the one it is given.

Sources: the designed tests are the lab's (tests/stats.py reads them from here); Leviathan et al.
2023 (speculative sampling's losslessness, the property checked).
"""

from __future__ import annotations

import hashlib
import math
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from simlab import verifiers as node_verifiers
from simlab.checks import check_int
from simlab.distributions import check_pair
from simlab.drafting import Drafting, child_tuples, draw_children, lossless_pairing
from simlab.verifiers.base import NodeVerifier

FALSE_ALARM = 1e-6
"""The statistical path's false-alarm probability: a lossless sampler fails with at most this."""
POWER = 0.99
"""The statistical path's power against every law at ``TV_ALTERNATIVE`` (or the stated ``tv``) or more."""
TV_ALTERNATIVE = 0.02
"""The stated alternative: the total variation from the null law the G-test detects with ``POWER``."""
TOLERANCE = 1e-12
"""The exact path's bound on the bias (TV from p) and on a branch law's deviation from a distribution."""
KS = (1, 2, 3)
"""The numbers of children the exact path enumerates."""

EDGE_CASES = {
    "p==q": ([0.2, 0.3, 0.5], [0.2, 0.3, 0.5]),
    "one-hot p": ([0.0, 1.0, 0.0, 0.0], [0.4, 0.3, 0.2, 0.1]),
    "one-hot q": ([0.4, 0.3, 0.2, 0.1], [0.0, 0.0, 1.0, 0.0]),
    "one-hot both, same": ([0.0, 1.0, 0.0], [0.0, 1.0, 0.0]),
    "disjoint supports": ([0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.3, 0.7]),
    "q(t)=0<p(t)": ([0.3, 0.3, 0.4], [0.0, 0.5, 0.5]),
    "p(t)=0<q(t)": ([0.0, 0.5, 0.5], [0.6, 0.2, 0.2]),
    "tiny masses": ([1.0, 1e-300, 1e-300, 0.0], [0.5, 0.5, 1e-300, 1e-300]),
    "tiny q": ([0.25, 0.25, 0.25, 0.25], [1.0, 1e-300, 1e-300, 1e-300]),
    "ties": ([0.25, 0.25, 0.25, 0.25], [0.4, 0.4, 0.1, 0.1]),
}
"""(p, q) at one node: the standards' edge cases (p == q, one-hot p or q, disjoint supports,
q(x) = 0 < p(x), tiny masses, ties); the lab's tests and the exact path share them."""


def edge_case(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The float64 (p, q) of ``EDGE_CASES[name]`` (KeyError for an unknown name)."""
    return tuple(np.array(v, dtype=float) for v in EDGE_CASES[name])


def _random_cases(count: int = 6, seed: int = 20260) -> dict[str, tuple[list, list]]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(count):
        vocab = 3 + i % 3
        p, q = rng.dirichlet(np.full(vocab, 0.7)), rng.dirichlet(np.full(vocab, 0.7))
        p[i % vocab] = 0.0  # an exact zero of p, at a token q drafts
        out[f"random {i}"] = ((p / p.sum()).tolist(), q.tolist())
    return out


RANDOM_CASES = _random_cases()
"""Six fixed (p, q) pairs (V = 3, 4, 5; Dirichlet(0.7) with one exact zero of p; seed 20260): generic
instances beside the edge cases."""

CASES = {**EDGE_CASES, **RANDOM_CASES}
"""Every instance of the exact path, by name."""


# -- the designed G-test ---------------------------------------------------------------------------
def sample_size(cells: int, tv: float = TV_ALTERNATIVE, *, false_alarm: float = FALSE_ALARM, power: float = POWER) -> int:
    """Smallest N (a multiple of 1,000) whose G-test over ``cells`` cells at level ``false_alarm``
    has power >= ``power`` against every law at total variation >= ``tv`` (the module docstring).

    Raises:
        ValueError: ``cells`` not a positive integer, ``tv`` not in (0, 1], ``false_alarm`` or
            ``power`` not in (0, 1).
    """
    cells = check_int(cells, "cells", 1)
    for value, name, top in ((tv, "tv", "1]"), (false_alarm, "false_alarm", "1)"), (power, "power", "1)")):
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not number or not 0.0 < value <= 1.0 or (value == 1.0 and top == "1)"):
            raise ValueError(f"{name}: must be a number in (0, {top}, got {value!r}")
    df = max(cells - 1, 1)
    critical = stats.chi2.isf(false_alarm, df)
    n = 1000
    while stats.ncx2.sf(critical, df, 4.0 * n * tv**2) < power:
        n += 1000
    return n


def g_test_pvalue(counts, law) -> float:
    """p-value of the G-test of ``counts`` (V,) against ``law`` (V,) (cells expected below 5 merged);
    0.0 when a cell of zero law was hit."""
    counts = np.asarray(counts, dtype=np.float64)
    law = np.asarray(law, dtype=np.float64)
    if np.any(counts[law <= 0] > 0):
        return 0.0
    n = counts.sum()
    expected = n * law / law.sum()
    keep = expected >= 5
    rest = bool(np.any(~keep & (law > 0)))
    obs = list(counts[keep]) + ([counts[~keep].sum()] if rest else [])
    exp = list(expected[keep]) + ([expected[~keep].sum()] if rest else [])
    if len(obs) < 2:
        return 1.0
    obs, exp = np.array(obs), np.array(exp)
    exp *= obs.sum() / exp.sum()
    return float(stats.power_divergence(obs, exp, lambda_="log-likelihood").pvalue)


@dataclass(frozen=True)
class SamplerReport:
    """A designed G-test of a sampler's emitted token against a null law.

    Attributes:
        law: the null law, float64 (V,) (p for a losslessness test).
        counts: int64 (V,) emitted tokens.
        n: the draws.
        pvalue: the G-test's.
        false_alarm: the design's false-alarm probability.
        power: the design's power.
        tv: the design's alternative (TV from the null law).
        passed: pvalue > false_alarm (a lossless sampler passes with probability >= 1 - false_alarm).
    """

    law: np.ndarray
    counts: np.ndarray
    n: int
    pvalue: float
    false_alarm: float
    power: float
    tv: float

    @property
    def passed(self) -> bool:
        return self.pvalue > self.false_alarm

    @property
    def estimate(self) -> np.ndarray:
        """The empirical law of the emitted token, float64 (V,)."""
        return self.counts / self.n

    @property
    def tv_estimate(self) -> float:
        """TV between the empirical law and the null law (a biased-up estimate of the sampler's TV)."""
        return 0.5 * float(np.abs(self.estimate - self.law).sum())

    def summary(self) -> str:
        verdict = "passes" if self.passed else "rejects"
        return (
            f"G-test {verdict} (p-value {self.pvalue:.3g}, N = {self.n}, false alarm {self.false_alarm:g}, power "
            f"{self.power:g} at TV {self.tv:g}): counts {self.counts.tolist()} vs law {np.round(self.law, 4).tolist()}"
        )


MAX_DRAWS = 10_000_000
"""The most draws ``designed_draws`` asks for."""


def designed_draws(law, tv: float = TV_ALTERNATIVE, **design) -> int:
    """N for a G-test against ``law`` (float64 (V,)) with the stated power at every alternative at TV
    >= ``tv``, although the test merges the cells expected below 5 (``g_test_pvalue``): an
    alternative can move mass inside the merged tail T unseen, so on the merged cells its TV is
    only >= tv - law(T).  N is raised until ``sample_size`` at tv - law(T) (T the cells below 5 / N)
    is reached: 39,000 for five cells of 0.2, 9,808,000 for a Zipf(1) law over 150,000 tokens
    (the plain ``sample_size``, 2,452,000, merged 10.7% of its mass).

    Raises:
        ValueError: ``tv: ...`` when no N up to ``MAX_DRAWS`` leaves law(T) below tv (test a
            coarser partition of the tokens, or a larger tv); design values as ``sample_size``.
    """
    law = np.asarray(law, dtype=np.float64)
    cells = int(np.count_nonzero(law))
    n = sample_size(cells, tv, **design)
    while True:
        tail = float(law[(law > 0) & (n * law < 5)].sum())
        if tail < tv:
            needed = sample_size(cells, tv - tail, **design)
            if needed <= n:
                return n
        else:
            needed = n * 2
        if needed > MAX_DRAWS:
            raise ValueError(
                f"tv: {tail:.3g} of the law lies in cells expected below 5 at N = {n}: the G-test cannot keep power "
                f"{design.get('power', POWER)} at TV {tv} within {MAX_DRAWS:,} draws; test a coarser partition or a larger tv"
            )
        n = needed


def gtest_draws(draw: Callable, law, seed: int, tv: float = TV_ALTERNATIVE, **design) -> SamplerReport:
    """Draw N tokens with ``draw(rng)`` (N = ``designed_draws(law, tv)``) and G-test their counts
    against ``law`` (float64 (V,)); the generator is ``default_rng(seed)``.

    Raises:
        ValueError: a drawn token that is not an integer in [0, V); design values as ``designed_draws``.
    """
    law = np.asarray(law, dtype=np.float64)
    n = designed_draws(law, tv, **design)
    rng = np.random.default_rng(seed)
    tokens = np.fromiter((_token(draw(rng), law.size) for _ in range(n)), dtype=np.int64, count=n)
    counts = np.bincount(tokens, minlength=law.size)
    return SamplerReport(
        law,
        counts,
        n,
        g_test_pvalue(counts, law),
        design.get("false_alarm", FALSE_ALARM),
        design.get("power", POWER),
        float(tv),
    )


def _token(out, vocab: int) -> int:
    """The emitted token of a sampler's return value: an integer, or the first of a sequence."""
    value = out
    if isinstance(out, (bool, np.bool_)):
        raise ValueError(f"sampler: must return integer token ids, got {out!r}")
    if not isinstance(out, (int, np.integer)):
        flat = np.asarray(out).reshape(-1)
        if flat.size == 0:
            raise ValueError("sampler: returned no token")
        value = flat[0]
        if not (np.issubdtype(flat.dtype, np.integer)):
            raise ValueError(f"sampler: must return integer token ids, got dtype {flat.dtype}")
    value = int(value)
    if not 0 <= value < vocab:
        raise ValueError(f"sampler: returned token {value} outside [0, V) with V = {vocab}")
    return value


def check_sampler(
    sampler: Callable,
    p,
    q,
    k: int = 1,
    *,
    law: Drafting = Drafting.IID,
    reference=None,
    seed: int = 0,
    tv: float = TV_ALTERNATIVE,
    false_alarm: float = FALSE_ALARM,
    power: float = POWER,
) -> SamplerReport:
    """G-test a black-box sampler's emitted token against p (or ``reference``).

    Each of the N runs draws k children from q by ``law`` (``simlab.drafting.draw_children``) and
    calls ``sampler(p, q, drafts, generator)`` with fresh copies of p, q (float64 (V,)), the drafts
    (int64 (k,)) and the run's ``numpy.random.Generator``; it returns the emitted token id, or a
    sequence of emitted token ids whose first entry is the token emitted at this node.

    Args:
        p: the target distribution, (V,).
        q: the draft distribution, (V,).
        k: children per run.
        law: their drafting law (a ``Drafting``).
        reference: the null law, (V,); default p (a losslessness test).  Give the exact law of a
            lossy rule to test that the sampler implements that rule.
        seed: the generator's seed.
        tv: the design's alternative, TV from the null law (``sample_size``).
        false_alarm: the design's false-alarm probability.
        power: the design's power against ``tv``.

    Returns:
        ``SamplerReport`` (``passed``, the p-value, the counts, the design).

    Raises:
        ValueError: invalid p, q, k, law, reference or design; a sampler's output that is not a
            token id in [0, V).  (TypeError for a sampler that is not callable.)
    """
    if not callable(sampler):
        raise TypeError(f"sampler: must be callable (p, q, drafts, generator) -> token(s), got {type(sampler).__name__}")
    p, q = check_pair(p, q)
    k = check_int(k, "k", 1)
    if not isinstance(law, Drafting):
        raise ValueError(f"law: must be a simlab.drafting.Drafting, got {law!r}")
    if law in (Drafting.WITHOUT_REPLACEMENT, Drafting.DETERMINISTIC, Drafting.MIXED) and k > np.count_nonzero(q):
        raise ValueError(f"k: drafting {k} distinct children {law.description} needs {k} tokens with q > 0")
    null = p if reference is None else check_pair(reference, p)[0]

    def draw(rng):
        drafts = draw_children(q, k, law, rng)
        return sampler(p.copy(), q.copy(), drafts, rng)

    return gtest_draws(draw, null, seed, tv, false_alarm=false_alarm, power=power)


def assert_sampler_lossless(sampler: Callable, p, q, k: int = 1, **options) -> SamplerReport:
    """``check_sampler`` as a pytest assertion: AssertionError (with the report) when the G-test
    rejects the null law at level ``false_alarm``; returns the report otherwise."""
    report = check_sampler(sampler, p, q, k, **options)
    assert report.passed, report.summary()
    return report


# -- the exact path --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One enumerated instance: ``name`` (a key of ``CASES``), the drafting ``law``, k children,
    p and q (float64 (V,)), the exact ``output_law`` m (float64 (V,)), its ``bias`` TV(m, p), and
    ``problem``: why a branch law is not a distribution (or what the verifier raised), else None."""

    name: str
    law: Drafting
    k: int
    p: np.ndarray
    q: np.ndarray
    output_law: np.ndarray
    bias: float
    problem: str | None = None

    def describe(self) -> str:
        where = f"case {self.name!r}, {self.law.value} drafting, k = {self.k}"
        if self.problem:
            return f"{where}: {self.problem}"
        return (
            f"{where}: output law {np.round(self.output_law, 6).tolist()} vs p {np.round(self.p, 6).tolist()} "
            f"(TV {self.bias:.3g})"
        )


@dataclass(frozen=True)
class ExactReport:
    """The exact path's result for one verifier.

    Attributes:
        verifier: its registry name.
        declared: the laws it declares lossless for.
        laws: the laws checked (the declared ones; the verifier's own ``drafting`` law for a
            declared-lossy one).
        cases: every enumerated ``Case``.
        tolerance: the bound on the bias.
    """

    verifier: str
    declared: frozenset
    laws: tuple
    cases: tuple = field(repr=False)
    tolerance: float = TOLERANCE

    def _fails(self, case: Case) -> bool:
        return case.problem is not None or not case.bias <= self.tolerance

    @property
    def worst(self) -> Case | None:
        """The failing case of largest bias (a case with a problem first), else the case of largest bias."""
        if not self.cases:
            return None
        return max(self.cases, key=lambda c: (c.problem is not None, c.bias if not math.isnan(c.bias) else math.inf))

    @property
    def bias(self) -> float:
        """The largest exact bias found, TV(output law, p) (inf where a case raised)."""
        worst = self.worst
        return 0.0 if worst is None else (math.inf if math.isnan(worst.bias) else worst.bias)

    @property
    def output_law(self) -> np.ndarray | None:
        """The exact output law at the worst case, float64 (V,)."""
        return None if self.worst is None else self.worst.output_law

    @property
    def lossless(self) -> bool:
        """True when every checked case of every checked law conforms."""
        return not any(self._fails(c) for c in self.cases)

    def lossless_laws(self) -> frozenset:
        """The declared laws whose every case conforms (what the gate certifies)."""
        bad = {c.law for c in self.cases if self._fails(c)}
        return frozenset(law for law in self.declared if law not in bad)

    def refuted_laws(self) -> frozenset:
        """The declared laws some case refutes."""
        return frozenset(self.declared) - self.lossless_laws()

    def summary(self) -> str:
        laws = ", ".join(law.value for law in self.laws)
        if self.lossless:
            return f"{self.verifier}: lossless on {len(self.cases)} enumerated instances ({laws}; bias <= {self.tolerance:g})"
        return f"{self.verifier}: exact bias {self.bias:.3g} (TV from p) at {self.worst.describe()}"


def _instance(verifier) -> NodeVerifier:
    if isinstance(verifier, type) and issubclass(verifier, NodeVerifier):
        try:
            return verifier()
        except TypeError as exc:
            raise ValueError(f"verifier: {verifier.__name__} needs options; pass an instance ({exc})") from None
    if not isinstance(verifier, NodeVerifier):
        raise TypeError(
            f"verifier: must be a simlab.verifiers.base.NodeVerifier class or instance, got {type(verifier).__name__}"
        )
    return verifier


def exact_case(verifier, p, q, k: int, law: Drafting | None = None, name: str = "") -> Case:
    """The exact output law of ``verifier`` (a NodeVerifier instance) at one instance: k children
    drawn from ``q`` by ``law`` (default the verifier's ``drafting``), every child tuple enumerated;
    a branch law that is not a distribution, or an error the verifier raises on these valid inputs,
    is reported in ``Case.problem``.

    Raises:
        ValueError: invalid p or q; ``k: ...`` where ``law`` cannot draw k children from q (or the
            enumeration would exceed ``simlab.drafting.MAX_ENUMERATED_TUPLES``).
    """
    p, q = check_pair(p, q)
    node = _instance(verifier)
    law = node.drafting if law is None else law
    if not isinstance(law, Drafting):
        raise ValueError(f"law: must be a simlab.drafting.Drafting, got {law!r}")
    tuples, probs = child_tuples(q, check_int(k, "k", 1), law)
    total = np.zeros_like(p)
    try:  # private copies: a verifier that edits its inputs cannot move the law it is compared with
        plan = node.for_law(law).prepare(p.copy(), q.copy(), k, law)
        for x, prob in zip(tuples, probs):
            branch = np.asarray(plan.output_distribution(x), dtype=np.float64)
            if branch.shape != p.shape or not np.all(np.isfinite(branch)) or branch.min() < -TOLERANCE:
                return Case(name, law, k, p, q, total, math.nan, f"negative or invalid branch law at children {x.tolist()}")
            if abs(branch.sum() - 1.0) > TOLERANCE:
                return Case(name, law, k, p, q, total, math.nan, f"branch law at children {x.tolist()} sums to {branch.sum()!r}")
            total += prob * branch
    except Exception as exc:  # any error on valid inputs refutes the declaration (reported, never raised)
        return Case(name, law, k, p, q, total, math.nan, f"raised {type(exc).__name__}: {exc}")
    return Case(name, law, k, p, q, total, 0.5 * float(np.abs(total - p).sum()))


def check_verifier(verifier, laws: Iterable[Drafting] | None = None, *, ks=KS, cases=None, tolerance=TOLERANCE) -> ExactReport:
    """The exact path (module docstring) for a node verifier class (built with no options) or instance.

    Args:
        verifier: a ``NodeVerifier`` subclass or instance.
        laws: the drafting laws to check; default the declared ``lossless_for`` (the verifier's own
            ``drafting`` law when it declares none: its exact bias there).
        ks: the numbers of children.
        cases: ``{name: (p, q)}`` (default ``CASES``).
        tolerance: the bound on the bias (default 1e-12).

    Returns:
        ``ExactReport``: ``lossless``, ``bias``, ``worst``, ``output_law``, every ``Case``.

    Raises:
        TypeError: ``verifier`` is not a NodeVerifier class or instance.
        ValueError: a class that needs options; a law that is not a ``Drafting``; invalid cases.
    """
    node = _instance(verifier)
    declared = frozenset(node.lossless_for)
    if laws is not None:
        laws = list(laws) if not isinstance(laws, (str, Drafting)) else [laws]
        if not laws or not all(isinstance(law, Drafting) for law in laws):
            raise ValueError(f"laws: must be a non-empty list of simlab.drafting.Drafting values, got {laws!r}")
    chosen = tuple(sorted(declared if laws is None else frozenset(laws), key=list(Drafting).index)) or (node.drafting,)
    ks = tuple(check_int(k, "ks", 1) for k in ks)
    if not ks:
        raise ValueError("ks: name at least one number of children")
    if cases is not None and not (isinstance(cases, dict) and cases):
        raise ValueError(f"cases: must be a non-empty dict {{name: (p, q)}}, got {cases!r}")
    out = []
    for name, (p, q) in (CASES if cases is None else cases).items():
        p, q = check_pair(p, q)
        if node.needs_greedy_target:
            p = np.eye(p.size)[int(np.argmax(p))]
        for law in chosen:
            for k in ks:
                try:
                    out.append(exact_case(node, p, q, k, law, name))
                except ValueError as exc:
                    if not str(exc).startswith("k:"):
                        raise
                    # the law cannot draw k children from this q (too few tokens with q > 0)
    return ExactReport(
        node.name if isinstance(getattr(node, "name", None), str) else type(node).__name__,
        declared,
        chosen,
        tuple(out),
        tolerance,
    )


def assert_lossless(verifier, laws: Iterable[Drafting] | None = None, **options) -> ExactReport:
    """``check_verifier`` as a pytest assertion: AssertionError naming the exact bias and the worst
    case when the verifier is not lossless for a law it declares (or one of ``laws``), or when it
    declares no lossless law and ``laws`` is not given; returns the report otherwise."""
    node = _instance(verifier)
    if laws is None and not node.lossless_for:
        raise AssertionError(f"{node.name}: declares no lossless drafting law (lossless_for is empty)")
    report = check_verifier(node, laws, **options)
    assert report.lossless, report.summary()
    return report


# -- the gate --------------------------------------------------------------------------------------
_CERTIFICATES: dict = {}


def _is_lab_verifier(node: NodeVerifier) -> bool:
    return node_verifiers.is_lab_verifier(node)


def refutation(verifier: NodeVerifier) -> ExactReport | None:
    """The exact path's report on a verifier that is not one of the lab's own and declares a lossless
    law the enumeration refutes; None otherwise (a lab verifier, a declared-lossy one, or one the
    check confirms).  Cached per class and state (``_state_key``)."""
    if _is_lab_verifier(verifier) or not verifier.lossless_for:
        return None
    key = _state_key(verifier)
    if key not in _CERTIFICATES:
        report = check_verifier(verifier)
        _CERTIFICATES[key] = None if report.lossless else report
    return _CERTIFICATES[key]


def _state_key(verifier) -> tuple:
    """The certificate's key: the class and a digest of the instance's whole state (its ``__dict__``
    and slots, pickled), so an option changed after the check, even in place, is checked anew;
    where the state cannot be pickled, the class and the object's identity (an option changed on
    such an object keeps its verdict: build a new instance to have it checked)."""
    state = dict(getattr(verifier, "__dict__", {}))
    for slot in getattr(type(verifier), "__slots__", ()):
        if hasattr(verifier, slot):
            state[slot] = getattr(verifier, slot)
    try:
        digest = hashlib.sha256(pickle.dumps(state, protocol=4)).hexdigest()
    except Exception:  # an unpicklable option (a lambda, a lock): keyed by the object itself
        return (type(verifier), "id", id(verifier))
    return (type(verifier), digest)


def certified_lossless_for(verifier: NodeVerifier) -> frozenset:
    """The drafting laws the studies treat ``verifier`` as lossless for: its declared ``lossless_for``
    for the lab's own classes, the declared laws the exact path confirms for any other."""
    report = refutation(verifier)
    return frozenset(verifier.lossless_for) if report is None else report.lossless_laws()


def certified_lossless(verifier: NodeVerifier, law: Drafting, k: int) -> bool:
    """``verifier.is_lossless(law, k)`` restricted to the certified laws (``certified_lossless_for``)."""
    if not verifier.is_lossless(law, k):
        return False
    return _is_lab_verifier(verifier) or lossless_pairing(certified_lossless_for(verifier), law, k)


__all__ = [
    "CASES",
    "EDGE_CASES",
    "FALSE_ALARM",
    "KS",
    "POWER",
    "RANDOM_CASES",
    "TOLERANCE",
    "TV_ALTERNATIVE",
    "Case",
    "ExactReport",
    "SamplerReport",
    "assert_lossless",
    "assert_sampler_lossless",
    "certified_lossless",
    "certified_lossless_for",
    "check_sampler",
    "check_verifier",
    "edge_case",
    "exact_case",
    "g_test_pvalue",
    "gtest_draws",
    "refutation",
    "MAX_DRAWS",
    "designed_draws",
    "sample_size",
]
