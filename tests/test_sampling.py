"""The one logits-to-p transform: stable at tiny temperatures, greedy at 0, batched rows equal single rows."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from backends.synthetic import DepthProfileWorld, DistilledWorld
from simlab.pairs import WithSettings
from simlab.distributions import check_distribution
from simlab.sampling import DDTE_SETTINGS, SamplingSettings, sampling_distribution


@pytest.mark.parametrize("temperature", [1e-310, 1e-300, 5e-324])
def test_tiny_temperature_is_finite_and_one_hot_on_the_maximum(temperature):
    z = np.array([0.3, 2.0, -1.0, 1.999])
    probs = sampling_distribution(z, temperature=temperature)
    assert np.isfinite(probs).all() and probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_tiny_temperature_splits_tied_maxima_evenly():
    assert sampling_distribution([1.0, 3.0, 3.0], temperature=1e-310).tolist() == [0.0, 0.5, 0.5]


def test_temperature_zero_is_greedy_with_lowest_id_ties():
    assert sampling_distribution([[1.0, 3.0, 3.0], [5.0, 0.0, 5.0]], temperature=0).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_huge_logits_are_stable():
    probs = sampling_distribution([1e308, -1e308, 1e308], temperature=0.5)
    assert probs.tolist() == [0.5, 0.0, 0.5]


def test_the_maximum_is_subtracted_before_dividing():
    """(z - max) / T, not z / T - max(z / T): at T = 1e-310 the latter is inf - inf."""
    z = np.array([1.0, 0.5])
    with np.errstate(over="ignore", invalid="ignore"):
        naive = z / 1e-310 - np.max(z / 1e-310)
    assert np.isnan(naive).any()
    assert sampling_distribution(z, temperature=1e-310).tolist() == [1.0, 0.0]


def test_input_is_not_modified_and_float32_is_widened():
    z = np.array([0.1, 0.7, -2.0], dtype=np.float32)
    before = z.copy()
    probs = sampling_distribution(z, temperature=0.7, top_k=2)
    assert probs.dtype == np.float64 and np.array_equal(z, before)


@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 12)), elements=st.floats(-30, 30)),
    st.sampled_from([0.0, 0.3, 1.0, 1.7]),
    st.sampled_from([None, 1, 3]),
    st.sampled_from([None, 0.5, 0.9, 1.0]),
)
def test_a_batch_equals_its_rows_bit_for_bit(z, temperature, top_k, top_p):
    batch = sampling_distribution(z, temperature=temperature, top_k=top_k, top_p=top_p)
    rows = np.array([sampling_distribution(row, temperature=temperature, top_k=top_k, top_p=top_p) for row in z])
    assert np.array_equal(batch, rows)
    np.testing.assert_allclose(batch.sum(axis=1), 1.0, atol=1e-12)


def test_logits_refused_as_a_law_name_the_way_forward():
    """Issue 40 item 17: float32 logits passed where p belongs are refused with a message naming
    ``sampling_distribution``, whose float64 law check_distribution then takes unchanged."""
    z = (2.0 * np.random.default_rng(3).standard_normal(1_000)).astype(np.float32)
    with pytest.raises(ValueError, match=r"^p: sums to .*; for logits use simlab\.sampling\.sampling_distribution$"):
        check_distribution(np.abs(z), "p")
    p = sampling_distribution(z)
    assert p.dtype == np.float64 and np.array_equal(check_distribution(p, "p"), p)


def test_settings_validate_and_name_themselves():
    assert SamplingSettings(0.6).name == "T=0.6" and SamplingSettings(1, 40, 0.9).name == "T=1,p=0.9,k=40"
    assert SamplingSettings(np.float64(0.5), np.int64(3)).top_k == 3
    for bad, name in (
        (dict(temperature=-1), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.0), "top_k"),
        (dict(top_p=0.0), "top_p"),
    ):
        with pytest.raises(ValueError, match=f"^{name}: "):
            SamplingSettings(**bad)
    assert len(DDTE_SETTINGS) == 8


@pytest.mark.parametrize(
    "make",
    [
        lambda s: DepthProfileWorld(vocab=12, seed=1, settings=s),
        lambda s: DistilledWorld(vocab=12, seed=1, settings=s, train_tokens=500),
    ],
)
def test_with_settings_returns_a_new_pair_and_leaves_the_old_one_alone(make):
    world = make(SamplingSettings())
    assert isinstance(world, WithSettings)
    before = world.distributions([(1, 2)])[0].copy()
    cold = world.with_settings(SamplingSettings(0.3))
    assert cold is not world and world.settings == SamplingSettings() and cold.settings == SamplingSettings(0.3)
    assert np.array_equal(world.distributions([(1, 2)])[0], before)
    assert np.array_equal(cold.distributions([(1, 2)])[0], make(SamplingSettings(0.3)).distributions([(1, 2)])[0])
