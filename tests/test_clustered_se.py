"""simlab.stats: the cluster-robust (CR1) standard error of a mean over roots grouped by prompt."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simlab.stats import clustered_mean_se, clustered_se, grouped_mean_se, mean_influence


def test_one_root_per_cluster_is_the_ordinary_standard_error_of_the_mean():
    x = np.random.default_rng(3).normal(size=17) * 4.0 + 1.0
    mean, se = clustered_mean_se(x, list(range(17)))
    assert mean == pytest.approx(x.mean(), rel=1e-14)
    assert se == pytest.approx(x.std(ddof=1) / math.sqrt(17), rel=1e-12)


def test_against_a_hand_computation():
    # mean 3, influence (-2, -1, 0, 3) / 4, cluster sums -0.75, 0, 0.75: se^2 = 3/2 (0.5625 + 0.5625)
    assert clustered_mean_se([1.0, 2.0, 3.0, 6.0], ["a", "a", "b", "c"]) == pytest.approx((3.0, math.sqrt(1.6875)), abs=1e-12)
    # two prompts of two roots: cluster sums -0.75, 0.75: se^2 = 2 (0.5625 + 0.5625) = 2.25
    assert clustered_mean_se([1, 2, 3, 6], [0, 0, 1, 1]) == pytest.approx((3.0, 1.5), abs=1e-12)
    # an influence given directly (a ratio's, say): sums -0.2, 0.2 over two clusters
    assert clustered_se([0.1, -0.3, 0.5, -0.3], [7, 7, 9, 9]) == pytest.approx(math.sqrt(2 * 0.08), rel=1e-12)


def test_labels_only_group_the_roots():
    x = [0.5, 1.5, 4.0, 2.0, 3.0]
    a = clustered_mean_se(x, ["p", "q", "p", "r", "q"])
    b = clustered_mean_se(x, [(2,), (0,), (2,), (1,), (0,)])
    assert a == b


def test_float64_and_influence():
    mean, psi = mean_influence(np.array([1, 2, 6], dtype=np.int32))
    assert psi.dtype == np.float64 and mean == 3.0
    np.testing.assert_array_equal(psi, np.array([-2.0, -1.0, 3.0]) / 3)


def test_one_cluster_has_no_standard_error():
    assert math.isnan(clustered_mean_se([1.0, 2.0, 4.0], [0, 0, 0])[1])
    assert math.isnan(clustered_mean_se([1.0], ["only"])[1])


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: clustered_mean_se([], []), "values"),
        (lambda: clustered_mean_se([1.0, 2.0], [0]), "clusters"),
        (lambda: clustered_mean_se([[1.0, 2.0]], [0]), "values"),
        (lambda: clustered_se([], []), "influence"),
        (lambda: clustered_se([0.1, 0.2], [0, 1, 2]), "clusters"),
        (lambda: mean_influence([]), "values"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        call()


def test_grouped_mean_se_is_clustered_mean_se_per_group():
    values, clusters = [[1.0, 2.0, 4.0], [3.0, 5.0], [7.0]], [["a", "a", "b"], [0, 1], ["x"]]
    got = grouped_mean_se(values, clusters)
    assert got[:2] == [clustered_mean_se(v, c)[1] for v, c in zip(values[:2], clusters[:2])] and math.isnan(got[2])
    with pytest.raises(ValueError, match="clusters: need one label list per group"):
        grouped_mean_se(values, clusters[:2])
