from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simlab.distributions import (
    check_distribution,
    entropy,
    kl_divergence,
    l1_distance,
    residual,
    inverse_cdf,
    sample_categorical,
    sum_tolerance,
    top_positive,
    top_ranked,
    total_variation,
)
from checks import ConstantGenerator
from simlab.sampling import sampling_distribution


def test_check_distribution_keeps_values():
    x = [0.2, 0.3, 0.5]
    out = check_distribution(x, "p")
    assert out.dtype == np.float64 and out.tolist() == x


def test_sum_tolerance_is_1e_9():
    check_distribution([0.5, 0.5 + 0.9e-9], "p")
    with pytest.raises(ValueError, match="p: sums to"):
        check_distribution([0.5, 0.5 + 1.1e-9], "p")


def _float32_softmax(vocab: int, seed: int) -> np.ndarray:
    """A law computed in float32 as a model's softmax is (float32 (V,)), its sum off 1 by more than 1e-9."""
    z = (3.0 * np.random.default_rng(seed).standard_normal(vocab)).astype(np.float32)
    e = np.exp(z - z.max())
    p = e / e.sum(dtype=np.float32)
    assert p.dtype == np.float32 and 1e-9 < abs(float(p.astype(np.float64).sum()) - 1.0) <= sum_tolerance(np.float32, vocab)
    return p


@pytest.mark.parametrize("vocab, seed", [(32_000, 0), (151_936, 1), (50, 4)])
def test_a_float32_law_within_its_rounding_is_renormalised_in_float64(vocab, seed):
    """Issue 40 item 17: a float32 softmax (sum off by ~1e-8) was refused against float64's 1e-9
    with no way forward; it is taken and divided by its float64 sum."""
    p32 = _float32_softmax(vocab, seed)
    out = check_distribution(p32, "p")
    assert out.dtype == np.float64 and abs(out.sum() - 1.0) <= 1e-12
    p64 = p32.astype(np.float64)
    np.testing.assert_array_equal(out, p64 / p64.sum())


def test_torch_float32_probabilities_are_taken():
    """The issue's case: probabilities straight from a torch model (sum 0.99999996 there)."""
    import torch

    logits = torch.randn(32_000, generator=torch.Generator().manual_seed(0), dtype=torch.float32) * 3
    probs = torch.softmax(logits, dim=-1)
    assert abs(float(probs.double().sum()) - 1.0) > 1e-9  # the refused case, not one within 1e-9 already
    out = check_distribution(probs, "p")
    assert abs(out.sum() - 1.0) <= 1e-12 and out.dtype == np.float64


@pytest.mark.parametrize("total", [0.9, 1.1, 0.99, 1.0 + 5e-3, 1.0 - 5e-4])
def test_a_float32_law_off_by_more_than_its_rounding_is_refused(total):
    """Garbage in float32 is still garbage: refused with the bound, the dtype and the way forward
    for logits (V = 32,000: the bound is 4 sqrt(32,000) 2^-23 = 8.5e-5)."""
    p = (np.full(32_000, total / 32_000)).astype(np.float32)
    with pytest.raises(ValueError) as info:
        check_distribution(p, "p")
    message = str(info.value)
    bound = 4 * math.sqrt(32_000) * 2.0**-23
    assert message.startswith("p: sums to ") and f"not 1 within {bound:g} (float32 rounding at V = 32000)" in message
    assert message.endswith("; for logits use simlab.sampling.sampling_distribution") and "\n" not in message


@pytest.mark.parametrize(
    "vector",
    [
        np.full(256_000, 0.97 / 256_000, np.float32),  # 3% short: passed a bound of V eps32 (0.03)
        np.eye(1, 2**23 - 1, 5, dtype=np.float32)[0] * np.float32(1e-6),  # one entry of 1e-6: passed V eps32 (1.0)
    ],
)
def test_a_float32_vector_far_from_a_law_is_refused_at_any_vocabulary(vector):
    """The bound grows like sqrt(V), not V: a float32 vector summing to 0.97 at V = 256,000, or to
    1e-6 at V = 2^23 - 1, was renormalised to a law under V eps32."""
    with pytest.raises(ValueError, match=r"^p: sums to "):
        check_distribution(vector, "p")


@pytest.mark.parametrize("vocab", [8, 1_000, 32_000, 151_936])
def test_torch_float32_softmaxes_stay_within_the_bound(vocab):
    """Real float32 softmaxes (torch's softmax and exp(log_softmax) of N(0, s^2) logits, s up to 10)
    sum to 1 within ``sum_tolerance`` with room: their largest deviation below half of it."""
    import torch

    generator = torch.Generator().manual_seed(vocab)
    for scale in (0.5, 2.0, 10.0):
        logits = torch.randn(vocab, generator=generator) * scale
        for probs in (torch.softmax(logits, -1), torch.exp(torch.log_softmax(logits, -1))):
            deviation = abs(float(probs.double().sum()) - 1.0)
            assert deviation <= sum_tolerance(np.float32, vocab) / 2, (vocab, scale, deviation)


def test_the_sum_bound_of_each_dtype():
    """float64 (and every dtype but float32, float16 included) keeps 1e-9; float32: 4 sqrt(V) 2^-23."""
    assert sum_tolerance(np.float64, 10**6) == 1e-9 and sum_tolerance(np.float16, 50) == 1e-9
    assert sum_tolerance(np.float32, 128_000) == 4 * math.sqrt(128_000) * 2.0**-23
    assert sum_tolerance(np.dtype("float32"), 3) == 4 * math.sqrt(3) * 2.0**-23
    with pytest.raises(ValueError, match=r"^p: sums to .*not 1 within 1e-09; for logits use simlab.sampling"):
        check_distribution(np.array([0.5, 0.5 + 2e-9]), "p")  # float64: 1e-9, as before
    with pytest.raises(ValueError, match=r"^p: sums to .*not 1 within 1e-09; "):
        check_distribution(np.array([0.5, 0.4995], dtype=np.float16), "p")


def test_temperature_zero_is_argmax_lowest_index():
    assert sampling_distribution([1.0, 3.0, 3.0, 2.0], temperature=0).tolist() == [0, 1, 0, 0]


def test_temperature_scales_logits():
    z = np.array([0.0, 1.0, 2.0])
    np.testing.assert_allclose(sampling_distribution(z, temperature=0.5), np.exp(2 * z) / np.exp(2 * z).sum(), rtol=1e-14)


def test_top_k_ties_lowest_index():
    probs = sampling_distribution(np.log([0.3, 0.2, 0.3, 0.2]), top_k=3)
    np.testing.assert_allclose(probs, [0.375, 0.25, 0.375, 0.0], rtol=1e-12)


def test_top_p_keeps_the_crossing_token():
    probs = sampling_distribution(np.log([0.5, 0.3, 0.15, 0.05]), top_p=0.7)
    np.testing.assert_allclose(probs, [0.625, 0.375, 0.0, 0.0], rtol=1e-12)
    probs = sampling_distribution(np.log([0.5, 0.3, 0.15, 0.05]), top_p=0.5)
    np.testing.assert_allclose(probs, [1.0, 0.0, 0.0, 0.0], rtol=1e-12)


def test_masked_logits():
    probs = sampling_distribution([-np.inf, 0.0, 0.0])
    assert probs.tolist() == [0.0, 0.5, 0.5]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(logits=[0.0, np.nan]), "logits"),
        (dict(logits=[0.0, np.inf]), "logits"),
        (dict(logits=[-np.inf, -np.inf]), "logits"),
        (dict(logits=[[[0.0, 1.0]]]), "logits"),  # (V,) or (n, V) only
        (dict(logits=[0.0, 1.0], temperature=-1.0), "temperature"),
        (dict(logits=[0.0, 1.0], temperature=np.nan), "temperature"),
        (dict(logits=[0.0, 1.0], top_k=0), "top_k"),
        (dict(logits=[0.0, 1.0], top_p=0.0), "top_p"),
        (dict(logits=[0.0, 1.0], top_p=1.5), "top_p"),
    ],
)
def test_bad_sampling_arguments(kwargs, message):
    logits = kwargs.pop("logits")
    with pytest.raises(ValueError, match=f"^{message}: "):
        sampling_distribution(logits, **kwargs)


def test_divergences_by_hand():
    p, q = np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])
    assert total_variation(p, q) == pytest.approx(0.5)
    assert l1_distance(p, q) == pytest.approx(1.0)
    assert kl_divergence(p, q) == pytest.approx(np.log(2))
    assert kl_divergence(q, p) == np.inf
    assert entropy(p) == pytest.approx(np.log(2))
    assert entropy([1.0, 0.0]) == 0.0


@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8), st.lists(st.floats(0.01, 1.0), min_size=2, max_size=8))
def test_divergence_identities(a, b):
    n = min(len(a), len(b))
    p, q = np.array(a[:n]) / sum(a[:n]), np.array(b[:n]) / sum(b[:n])
    assert total_variation(p, q) == pytest.approx(1 - np.minimum(p, q).sum(), abs=1e-12)
    assert l1_distance(p, q) == pytest.approx(2 * total_variation(p, q), abs=1e-12)
    assert kl_divergence(p, q) >= 2 * total_variation(p, q) ** 2 - 1e-12  # Pinsker
    assert kl_divergence(p, p) == pytest.approx(0.0, abs=1e-12)


def test_residual_of_equal_laws_is_p_itself():
    p = np.array([0.2, 0.8])
    assert residual(p, p).tolist() == p.tolist()
    np.testing.assert_allclose(residual(p, np.array([0.5, 0.5])), [0.0, 1.0])


def test_sample_categorical_uses_one_uniform_and_skips_zero_mass():
    probs = np.array([0.0, 0.5, 0.0, 0.5])
    assert sample_categorical(probs, np.random.default_rng(0)) in (1, 3)
    from checks import ConstantGenerator

    assert sample_categorical(probs, ConstantGenerator(0.0)) == 1
    assert sample_categorical(probs, ConstantGenerator(0.5)) == 3


BAD_LAWS = {  # probs -> the start of the refusal
    "negative (index 0 never drawn)": ([0.5, -0.5, 1.0], "probs: contains negative entries (min -0.5)"),
    "-inf": ([0.5, -np.inf, 1.0], "probs: contains negative entries (min -inf)"),
    "NaN": ([0.5, np.nan, 0.5], "probs: contains NaN"),
    "inf": ([0.5, np.inf, 0.5], "probs: total mass inf is not finite"),
    "no mass": ([0.0, 0.0], "probs: total mass 0.0 is not positive"),
    "2-D (index 3 of a 2 x 2 law)": ([[0.25, 0.25], [0.25, 0.25]], "probs: must be a non-empty 1-D array, got shape (2, 2)"),
    "0-D": (1.0, "probs: must be a non-empty 1-D array, got shape ()"),
    "empty": ([], "probs: must be a non-empty 1-D array, got shape (0,)"),
    "text": (["0.5", "0.5"], "probs: not a numeric array"),
    "None inside": ([0.5, None], "probs: not a numeric array (got None"),
    "complex": ([0.5 + 1j, 0.5], "probs: must be real"),
}


@pytest.mark.parametrize("case", list(BAD_LAWS))
@pytest.mark.parametrize("form", ["list", "ndarray"])
def test_sample_categorical_refuses_what_is_not_a_law(case, form):
    """Issue 40 item 8: negative, infinite and 2-D laws were drawn from silently, an empty one raised
    IndexError; each is refused naming ``probs`` (as a list and as an ndarray, which takes the fast path)."""
    from checks import ConstantGenerator

    probs, message = BAD_LAWS[case]
    if form == "ndarray":
        probs = np.array(probs)
    with pytest.raises(ValueError) as info:
        sample_categorical(probs, ConstantGenerator(0.3))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "rng", [None, 42, "0", np.random.RandomState(0), random], ids=["None", "int", "str", "RandomState", "random"]
)
def test_the_draws_refuse_an_rng_that_is_not_a_generator(rng):
    """``rng=None`` raised AttributeError: refused naming ``rng`` (``simlab.checks.check_generator``)."""
    probs = np.array([0.25, 0.75])
    with pytest.raises(ValueError, match=r"^rng: must be a numpy.random.Generator"):
        sample_categorical(probs, rng)
    with pytest.raises(ValueError, match=r"^rng: must be a numpy.random.Generator"):
        inverse_cdf(np.cumsum(probs), rng)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_low_precision_law_is_drawn_in_float64(dtype):
    """A float16 or float32 law's own cumulative sum drifts (float16: it stalls at 0.5 for 4,096
    masses of 1/4,096, so indices >= 2,048 were never drawn): the draw casts it to float64 first,
    giving the float64 law's index for every uniform."""
    probs = np.full(4096, 1 / 4096, dtype=dtype)
    exact = np.cumsum(probs.astype(np.float64))
    for u in (0.0, 0.3, 0.5, 0.75, 0.999, 1.0 - 2.0**-53):
        assert sample_categorical(probs, ConstantGenerator(u)) == inverse_cdf(exact, ConstantGenerator(u)), u
    assert sample_categorical(probs, ConstantGenerator(0.75)) == 3072


def test_inverse_cdf_refuses_an_empty_or_infinite_cdf():
    with pytest.raises(ValueError, match=r"^probs: is empty"):
        inverse_cdf(np.zeros(0), np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^probs: total mass inf is not finite"):
        inverse_cdf(np.cumsum([0.5, np.inf]), np.random.default_rng(0))


def test_sample_categorical_keeps_its_draws():
    """The checks take no uniform and change no index: the draws of a seeded stream as the plain
    inverse CDF gives them, for float64, float32 and integer weights, lists and arrays."""
    rng = np.random.default_rng(11)
    for dtype in (np.float64, np.float32, np.int64):
        weights = (rng.dirichlet(np.full(50, 0.3)) * (1000 if dtype is np.int64 else 1)).astype(dtype)
        a, b = np.random.default_rng(5), np.random.default_rng(5)
        for _ in range(200):
            cdf = np.cumsum(weights)
            expected = int(np.searchsorted(cdf, a.random() * cdf[-1], side="right"))
            assert sample_categorical(weights, b) == expected
    a, b = np.random.default_rng(6), np.random.default_rng(6)
    assert [sample_categorical([0.2, 0.3, 0.5], a) for _ in range(50)] == [
        sample_categorical(np.array([0.2, 0.3, 0.5]), b) for _ in range(50)
    ]


@given(st.integers(1, 400), st.integers(0, 12), st.integers(0, 2**31 - 1), st.sampled_from(["ties", "zeros", "smooth"]))
def test_top_ranked_equals_the_stable_argsort(vocab, n, seed, kind):
    """The partition fast path against the full stable sort: ties to the lowest id, zeros included."""
    rng = np.random.default_rng(seed)
    if kind == "ties":
        x = rng.integers(0, 4, vocab).astype(float) / 4
    elif kind == "zeros":
        x = rng.dirichlet(np.full(vocab, 0.05))
        x[rng.random(vocab) < 0.7] = 0.0
    else:
        x = rng.dirichlet(np.ones(vocab))
    np.testing.assert_array_equal(top_ranked(x, n), np.argsort(-x, kind="stable")[:n])


def _positive_reference(x, n):
    """The first n of the full stable sort, positive entries only."""
    order = np.argsort(-x, kind="stable")
    return order[x[order] > 0][:n]


def _top_positive_cases(vocab, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "ties":
        return rng.integers(0, 4, vocab).astype(float) / 4
    if kind == "zeros":
        x = rng.dirichlet(np.full(vocab, 0.05))
        x[rng.random(vocab) < 0.7] = 0.0
        return x
    if kind == "rising":  # the block holds the smallest entries: many candidates
        return np.sort(rng.dirichlet(np.ones(vocab)))
    return rng.dirichlet(np.ones(vocab))


@given(
    st.integers(1, 5000),
    st.integers(0, 12),
    st.integers(0, 2**31 - 1),
    st.sampled_from(["ties", "zeros", "smooth", "rising"]),
    st.sampled_from([4, 64, 2048]),
)
def test_top_positive_equals_the_stable_argsort_of_the_positive_entries(vocab, n, seed, kind, block):
    """EAGLE-2's proposal fast path (a block's n-th largest as the threshold) against the full sort."""
    x = _top_positive_cases(vocab, seed, kind)
    np.testing.assert_array_equal(top_positive(x, n, block=block), _positive_reference(x, n))


def test_a_top_positive_that_drops_ties_at_the_threshold_is_caught():
    """The planted fault (candidates strictly above the block's n-th largest) fails the reference
    comparison above on a tie case, so that test can fail."""

    def broken(x, n, block=4):
        head = x[:block]
        t = np.partition(head, head.size - n)[head.size - n]
        candidates = np.flatnonzero(x > t)
        return candidates[np.argsort(-x[candidates], kind="stable")[:n]]

    x = np.array([0.25, 0.25, 0.125, 0.125, 0.25])
    assert np.array_equal(top_positive(x, 2, block=4), _positive_reference(x, 2))
    assert not np.array_equal(broken(x, 2), _positive_reference(x, 2))
