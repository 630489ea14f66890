"""Acceptance profiles, engine conversions and the two aggregations (``simlab.acceptance_profiles``)
against hand-computed values, and an exported profile replayed by a written-out synthetic sampler
(designed G-test: false alarm 1e-6, power 0.99 at TV 0.02, ``simlab.conformance``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simlab import acceptance_profiles as ap
from simlab.conformance import FALSE_ALARM, POWER, TV_ALTERNATIVE, g_test_pvalue, sample_size
from simlab.engine_metrics import aggregate, path_metrics

COND = [0.9, 0.7, 0.5]
# u = (.9, .9 * .7, .9 * .7 * .5) = (.9, .63, .315); E[tau] = 1.845; L = 2.845
UNCOND = [0.9, 0.63, 0.315]


# --------------------------------------------------------------------------------- aggregations


def test_pooled_and_per_request_against_hand_values():
    # request 1: 3 steps, P(tau = 0, 1, 2) = (.5, .25, .25) -> E[tau] = .75 per step
    # request 2: 1 step, P(tau = 2) = 1 -> E[tau] = 2
    r1 = ap.RequestLaw.from_tau_laws([0.5, 0.25, 0.25], steps=3)
    r2 = ap.RequestLaw.from_tau_laws([[0.0, 0.0, 1.0]])
    # pooled: 1 + (3 * .75 + 2) / (3 + 1) = 1 + 4.25 / 4 = 2.0625
    assert ap.pooled([r1, r2]) == pytest.approx(2.0625, abs=1e-15)
    # per request: 1.75 and 3.0; SpecForge's mean: 2.375
    assert np.allclose(ap.per_request_means([r1, r2]), [1.75, 3.0], atol=1e-15)
    assert ap.per_request_mean([r1, r2]) == pytest.approx(2.375, abs=1e-15)
    # pooled per position: P(tau >= 1) = .5 (x3) and 1; P(tau >= 2) = .25 (x3) and 1 -> (2.5, 1.75) / 4
    assert np.allclose(ap.pooled_positions([r1, r2]), [0.625, 0.4375], atol=1e-15)


def test_steps_with_different_laws_and_from_engine_metrics():
    # one request, two steps with different laws, given per step
    r = ap.RequestLaw.from_tau_laws([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5]])
    assert r.steps == 2 and np.allclose(r.accepted, [0.0, 1.5])
    assert ap.pooled([r]) == ap.per_request_mean([r]) == pytest.approx(1.75, abs=1e-15)
    # the same step laws as EngineMetrics from accepted-path masses
    steps = [path_metrics({(): 1.0}, 2), path_metrics({(0,): 0.5, (0, 1): 0.5}, 2)]
    m = ap.RequestLaw.from_metrics(steps)
    assert np.allclose(m.accepted, r.accepted, atol=1e-15) and np.allclose(m.unconditional, r.unconditional, atol=1e-15)
    # pooled over the steps of one request is the engine metrics' own aggregate mean
    assert ap.pooled([m]) == pytest.approx(1.0 + aggregate(steps).accepted, abs=1e-15)


def test_the_42508_disagreement_exactly():
    """Two configurations on the same two prompts, K = 4: A accepts more on the long request
    (100 steps) and less on the short one (10 steps) than B, so pooling (weighted by steps) ranks
    A > B while the mean of per-request means ranks B > A (the kind of flip vLLM 42508 reports)."""
    # P(tau = j), j = 0..4, with the stated means
    long_a = [0.0, 0.0, 0.25, 0.25, 0.5]  # E = .5 + .75 + 2 = 3.25
    short_a = [0.5, 0.5, 0.0, 0.0, 0.0]  # E = .5
    long_b = [0.0, 0.25, 0.25, 0.25, 0.25]  # E = .25 + .5 + .75 + 1 = 2.5
    short_b = [0.0, 0.5, 0.5, 0.0, 0.0]  # E = 1.5
    a = [ap.RequestLaw.from_tau_laws(long_a, steps=100), ap.RequestLaw.from_tau_laws(short_a, steps=10)]
    b = [ap.RequestLaw.from_tau_laws(long_b, steps=100), ap.RequestLaw.from_tau_laws(short_b, steps=10)]
    cmp = ap.compare_aggregations(a, b)
    # pooled: A = 1 + (325 + 5) / 110 = 4.0, B = 1 + (250 + 15) / 110 = 3.40909...
    assert cmp.pooled_a == pytest.approx(4.0, abs=1e-14)
    assert cmp.pooled_b == pytest.approx(1 + 265 / 110, abs=1e-14)
    # per request: A = 1 + (3.25 + .5) / 2 = 2.875, B = 1 + (2.5 + 1.5) / 2 = 3.0
    assert cmp.per_request_a == pytest.approx(2.875, abs=1e-14)
    assert cmp.per_request_b == pytest.approx(3.0, abs=1e-14)
    assert cmp.disagree and "disagree in sign" in cmp.note()
    # the same workload with equal step counts: both aggregations agree (no flip)
    a_eq = [ap.RequestLaw.from_tau_laws(long_a, steps=10), ap.RequestLaw.from_tau_laws(short_a, steps=10)]
    b_eq = [ap.RequestLaw.from_tau_laws(long_b, steps=10), ap.RequestLaw.from_tau_laws(short_b, steps=10)]
    assert not ap.compare_aggregations(a_eq, b_eq).disagree


# --------------------------------------------------------------------------------- converters


def test_converters_against_hand_values():
    assert np.allclose(ap.survival_from_conditional(COND), UNCOND, atol=1e-15)
    assert np.allclose(ap.conditional_from_survival(UNCOND), COND, atol=1e-15)
    assert ap.accept_length_from_survival(UNCOND) == pytest.approx(2.845, abs=1e-15)
    # P(tau = 0..3) = (.1, .27, .315, .315)
    assert np.allclose(ap.tau_law(UNCOND), [0.1, 0.27, 0.315, 0.315], atol=1e-15)
    assert np.allclose(ap.survival_from_tau_law([0.1, 0.27, 0.315, 0.315]), UNCOND, atol=1e-15)
    # a position never reached: conditional 0 there (the canonical value)
    assert np.array_equal(ap.conditional_from_survival([0.5, 0.0, 0.0]), [0.5, 0.0, 0.0])
    p = ap.AcceptanceProfile.from_conditional([0.5, 0.0, 0.7])
    assert np.array_equal(p.conditional, [0.5, 0.0, 0.0]) and np.array_equal(p.unconditional, [0.5, 0.0, 0.0])


def test_round_trips():
    rng = np.random.default_rng(4301)
    for _ in range(50):
        c = rng.uniform(0.05, 1.0, size=int(rng.integers(1, 9)))
        u = ap.survival_from_conditional(c)
        back = ap.conditional_from_survival(u)
        assert np.allclose(back, c, rtol=1e-14, atol=0)  # a product then a ratio: a few ulp
        assert np.allclose(ap.survival_from_conditional(back), u, rtol=1e-14, atol=0)
        assert np.allclose(ap.survival_from_tau_law(ap.tau_law(u)), u, rtol=0, atol=1e-15)
        profile = ap.AcceptanceProfile.from_conditional(c)
        assert np.array_equal(profile.conditional, c)  # kept as given
        again = ap.AcceptanceProfile.from_json(profile.to_json())
        assert again == profile
        assert np.array_equal(again.conditional, profile.conditional)  # exact, bit for bit
        assert np.array_equal(again.unconditional, profile.unconditional)
        assert again.conditional.dtype == again.unconditional.dtype == np.float64
        via_u = ap.AcceptanceProfile.from_unconditional(profile.unconditional)
        assert np.allclose(via_u.conditional, c, rtol=1e-14, atol=0)


def test_json_document_is_versioned_and_readable():
    doc = json.loads(ap.AcceptanceProfile.from_conditional(COND).to_json())
    assert doc["format"] == "simlab.acceptance_profile" and doc["version"] == 1 and doc["depth"] == 3
    assert doc["accept_length"] == pytest.approx(2.845) and doc["accepted"] == pytest.approx(1.845)
    assert doc["conditional"] == COND


def test_from_engine_metrics():
    # test_engine_metrics' tree: P(tau >= 1) = .35 + .15 + .24 + .06 = .8, P(tau >= 2) = .15 + .06 = .21
    masses = {(): 0.2, (0,): 0.35, (0, 1): 0.15, (1,): 0.24, (1, 2): 0.06}
    profile = ap.AcceptanceProfile.from_engine_metrics(path_metrics(masses, 2))
    assert np.allclose(profile.unconditional, [0.8, 0.21], atol=1e-15)
    assert np.allclose(profile.conditional, [0.8, 0.21 / 0.8], atol=1e-15)
    assert profile.accept_length == pytest.approx(2.01, abs=1e-15)


def test_a_request_whose_steps_drafted_nothing():
    """llama.cpp drops a draft below --draft-min: the step's tree is empty (depth 0).  A request of
    such steps only is a law (it accepts nothing), not an error; mixed with others it adds nothing."""
    empty = path_metrics({(): 1.0}, 0)
    alone = ap.RequestLaw.from_metrics([empty, empty])
    assert alone.unconditional.shape == (2, 1) and not alone.unconditional.any()
    assert ap.pooled([alone]) == 1.0 and ap.per_request_mean([alone]) == 1.0
    mixed = ap.RequestLaw.from_metrics([empty, path_metrics({(): 0.2, (0,): 0.8}, 1)])
    assert ap.pooled([mixed]) == pytest.approx(1.4, abs=1e-15)


# --------------------------------------------------------------------------------- engines


def test_exports_for_an_example_profile():
    profile = ap.AcceptanceProfile.from_conditional(COND)
    assert ap.llama_cpp_args(profile) == ["--spec-synthetic-acceptance-rates", "0.9,0.63,0.315"]
    assert ap.llama_cpp_args(profile, "length") == ["--spec-synthetic-acceptance-length", repr(1.0 + (0.9 + 0.63 + 0.315))]
    config = ap.vllm_speculative_config(profile)
    assert config == {"num_speculative_tokens": 3, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": UNCOND}
    assert ap.vllm_speculative_config(profile, "length")["synthetic_acceptance_length"] == profile.accept_length
    assert ap.sglang_env(profile) == {"SGLANG_SIMULATE_ACC_LEN": repr(profile.accept_length)}


def test_llama_cpp_length_conversion_against_the_cubic():
    # p + p^2 + p^3 = L - 1 = 1.6: the real root in [0, 1] of p^3 + p^2 + p - 1.6
    roots = np.roots([1.0, 1.0, 1.0, -1.6])
    written = float(next(r.real for r in roots if abs(r.imag) < 1e-12 and 0 <= r.real <= 1))
    rates = ap.llama_cpp_length_to_conditional(2.6, 3)
    assert rates.shape == (3,) and np.all(rates == rates[0])
    assert rates[0] == pytest.approx(written, abs=1e-15)
    assert abs(sum(rates[0] ** d for d in (1, 2, 3)) - 1.6) <= 4e-16
    # the ends: L = 1 -> p = 0; L = K + 1 -> p = 1; K = 1 -> p = L - 1
    assert ap.geometric_rate(1.0, 4) == 0.0 and ap.geometric_rate(5.0, 4) == 1.0
    assert ap.geometric_rate(1.3, 1) == pytest.approx(0.3, abs=1e-16)


def test_llama_cpp_and_vllm_rate_conversions():
    # unconditional (.9, .63, .315) -> conditional (.9, .63/.9, .315/.63) = (.9, .7, .5)
    for convert in (ap.llama_cpp_rates_to_conditional, ap.vllm_rates_to_conditional):
        assert np.allclose(convert(UNCOND), COND, atol=1e-15)
        assert np.array_equal(convert([1.0, 0.0, 0.0]), [1.0, 0.0, 0.0])


def test_vllm_length_schedule_as_written():
    # num_drafts = 1.6, num_full = 1: [1.0] + [0.6] + [0.0] * (3 - 1 - 1)
    assert ap.vllm_length_to_rates(2.6, 3) == [1.0, 2.6 - 1 - 1, 0.0]
    assert ap.vllm_length_to_rates(1.0, 3) == [0.0, 0.0, 0.0]
    assert ap.vllm_length_to_rates(3.0, 3) == [1.0, 1.0, 0.0, 0.0][:3]
    # at length = n + 1 the written expression gives n + 1 entries ([0.0] * -1 is empty)
    assert ap.vllm_length_to_rates(4.0, 3) == [1.0, 1.0, 1.0, 0.0]


def test_sglang_laws():
    # match-expected: L = 2.6 -> accept length 2 w.p. .4, 3 w.p. .6 -> tau = 1, 2
    assert np.allclose(ap.sglang_tau_law(2.6, 3), [0.0, 0.4, 0.6, 0.0], atol=1e-15)
    assert np.array_equal(ap.sglang_tau_law(3.0, 3), [0.0, 0.0, 1.0, 0.0])
    assert np.array_equal(ap.sglang_tau_law(9.0, 3), [0.0, 0.0, 0.0, 1.0])  # clipped to K + 1
    # multinomial: round(clip(N(2.6, 1), 1, 4)), written out with erf
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    written = [phi(1.5 - 2.6), phi(2.5 - 2.6) - phi(1.5 - 2.6), phi(3.5 - 2.6) - phi(2.5 - 2.6), 1 - phi(3.5 - 2.6)]
    assert np.allclose(ap.sglang_tau_law(2.6, 3, "multinomial"), written, atol=1e-15)


def test_constant_rate_misstatement_against_hand_values():
    profile = ap.AcceptanceProfile.from_conditional(COND)
    m = ap.constant_rate_misstatement(profile)
    p = ap.geometric_rate(profile.accept_length, 3)
    assert m.rate == p and p + p**2 + p**3 == pytest.approx(1.845, abs=1e-15)
    assert np.allclose(m.conditional_error, [p - 0.9, p - 0.7, p - 0.5], atol=1e-15)
    assert np.allclose(m.unconditional_error, [p - 0.9, p**2 - 0.63, p**3 - 0.315], atol=1e-15)
    assert abs(m.unconditional_error.sum()) < 1e-15  # the mean is matched at K
    assert np.allclose(m.exact_accept_length, [1.9, 2.53, 2.845], atol=1e-15)
    assert np.allclose(m.constant_rate_accept_length, [1 + p, 1 + p + p**2, 2.845], atol=1e-15)
    assert np.isnan(m.length_flag_accept_length[0]) and np.allclose(m.length_flag_accept_length[1:], 2.845)
    assert m.worst_position == 3  # p^3 - .315 ~ .152


# --------------------------------------------------------------------------------- replay (G-test)


def synthetic_sampler(conditional, n, rng):
    """The engines' synthetic mode written out: at each position d of a step draw U ~ U(0, 1) and
    accept while U < c_d (vLLM PR 41035's ``u < rate``; llama.cpp PR 27711's conditional
    probabilities); tau = the accepted drafts before the first rejection.  Returns tau, int (n,)."""
    c = np.asarray(conditional, dtype=np.float64)
    accept = rng.random((n, c.size)) < c
    return np.cumprod(accept, axis=1).sum(axis=1)


def replay_pvalue(conditional, exact_law, seed, tv=TV_ALTERNATIVE):
    n = sample_size(len(exact_law), tv)
    tau = synthetic_sampler(conditional, n, np.random.default_rng(seed))
    return g_test_pvalue(np.bincount(tau, minlength=len(exact_law)), exact_law)


REAL = [0.92, 0.81, 0.74, 0.66, 0.55]  # a decaying conditional profile, K = 5


def test_exported_profiles_replay_the_exact_rates():
    """Each export, parsed back and converted as its engine does, drawn by the written-out sampler,
    matches the exact law of tau (equivalently the per-position rates): false alarm <= 1e-6 each,
    power >= 0.99 at TV 0.02 (``sample_size``)."""
    profile = ap.AcceptanceProfile.from_conditional(REAL)
    exact = profile.tau_law()
    # vLLM: synthetic_acceptance_rates (unconditional) -> conditional in the kernel
    rates = ap.vllm_speculative_config(profile)["synthetic_acceptance_rates"]
    assert replay_pvalue(ap.vllm_rates_to_conditional(rates), exact, 43001) > FALSE_ALARM
    # llama.cpp: --spec-synthetic-acceptance-rates "u1,...,uK" -> conditional probabilities
    flag, value = ap.llama_cpp_args(profile)
    parsed = [float(x) for x in value.split(",")]
    assert replay_pvalue(ap.llama_cpp_rates_to_conditional(parsed), exact, 43002) > FALSE_ALARM
    # llama.cpp's length flag replays the constant rate's law (not the profile's): p^d survival
    p = ap.geometric_rate(float(ap.llama_cpp_args(profile, "length")[1]), profile.depth)
    geometric = ap.tau_law(p ** np.arange(1, profile.depth + 1))
    assert replay_pvalue(ap.llama_cpp_length_to_conditional(profile.accept_length, profile.depth), geometric, 43003) > FALSE_ALARM


def test_the_replay_test_has_its_power():
    """A planted fault, replaying the unconditional list as if it were conditional (the misreading
    PR 39359 discusses), is at TV >= 0.02 from the exact law and is rejected."""
    profile = ap.AcceptanceProfile.from_conditional(REAL)
    exact = profile.tau_law()
    wrong = ap.AcceptanceProfile.from_conditional(profile.unconditional).tau_law()
    assert 0.5 * np.abs(wrong - exact).sum() >= TV_ALTERNATIVE
    assert replay_pvalue(profile.unconditional, exact, 43004) <= FALSE_ALARM
    assert sample_size(profile.depth + 1) == sample_size(profile.depth + 1, TV_ALTERNATIVE) and POWER == 0.99


# --------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: ap.survival_from_conditional([0.5, 1.2]), "conditional"),
        (lambda: ap.survival_from_conditional([0.5, float("nan")]), "conditional"),
        (lambda: ap.survival_from_conditional([]), "conditional"),
        (lambda: ap.conditional_from_survival([0.5, 0.6]), "unconditional"),
        (lambda: ap.conditional_from_survival([[0.5]]), "unconditional"),
        (lambda: ap.conditional_from_survival(["a"]), "unconditional"),
        (lambda: ap.AcceptanceProfile([0.5, 0.5], [0.5, 0.3]), "unconditional"),
        (lambda: ap.AcceptanceProfile([0.5], [0.5, 0.25]), "unconditional"),
        (lambda: ap.AcceptanceProfile([0.0, 0.5], [0.0, 0.0]), "conditional"),
        (lambda: ap.AcceptanceProfile.from_json("{"), "text"),
        (lambda: ap.AcceptanceProfile.from_json(json.dumps({"format": "x"})), "text"),
        (
            lambda: ap.AcceptanceProfile.from_json(
                ap.AcceptanceProfile.from_conditional(COND).to_json().replace('"version": 1', '"version": 2')
            ),
            "text",
        ),
        (lambda: ap.geometric_rate(4.5, 3), "length"),
        (lambda: ap.geometric_rate(0.5, 3), "length"),
        (lambda: ap.geometric_rate(2.0, 0), "depth"),
        (lambda: ap.vllm_length_to_rates(2.0, 1.5), "n"),
        (lambda: ap.sglang_tau_law(2.0, 3, "uniform"), "method"),
        (lambda: ap.llama_cpp_args(ap.AcceptanceProfile.from_conditional(COND), "mean"), "mode"),
        (lambda: ap.survival_from_tau_law([0.5, 0.6]), "law"),
        (lambda: ap.RequestLaw.from_tau_laws([0.5, 0.5]), "steps"),
        (lambda: ap.RequestLaw.from_tau_laws([[0.5, 0.6]]), "laws"),
        (lambda: ap.RequestLaw.from_metrics([]), "metrics"),
        (lambda: ap.RequestLaw([1.0], [[0.5, 0.25]]), "accepted"),
        (lambda: ap.RequestLaw([0.75], [[0.25, 0.5]]), "unconditional"),
        (lambda: ap.pooled([]), "requests"),
        (lambda: ap.compare_aggregations([], [ap.RequestLaw.from_tau_laws([[1.0, 0.0]])]), "a"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name}: "):
        call()


def test_wrong_types():
    with pytest.raises(TypeError, match="^profile: "):
        ap.sglang_env({"conditional": COND})
    with pytest.raises(TypeError, match="^metrics: "):
        ap.AcceptanceProfile.from_engine_metrics(COND)
    with pytest.raises(TypeError, match="^text: "):
        ap.AcceptanceProfile.from_json(None)
