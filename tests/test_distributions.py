from __future__ import annotations

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
    sample_categorical,
    top_positive,
    top_ranked,
    total_variation,
)
from simlab.sampling import sampling_distribution


def test_check_distribution_keeps_values():
    x = [0.2, 0.3, 0.5]
    out = check_distribution(x, "p")
    assert out.dtype == np.float64 and out.tolist() == x


def test_sum_tolerance_is_1e_9():
    check_distribution([0.5, 0.5 + 0.9e-9], "p")
    with pytest.raises(ValueError, match="p: sums to"):
        check_distribution([0.5, 0.5 + 1.1e-9], "p")


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
