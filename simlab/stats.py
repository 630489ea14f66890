"""Cluster-robust standard errors of means over roots grouped by prompt (or request).

Roots placed along one prompt's reply share that prompt, so they are not independent draws; the
studies report the standard error of a mean over roots clustered by prompt.  The estimator is the
cluster-robust sandwich with the CR1 small-sample factor G / (G - 1) (Stata's ``vce(cluster)``
for a mean: its other factor (N - 1) / (N - K) is 1 with K = 1 parameter).  For an estimator
whose linearisation over N roots has influence psi_i (for the mean, psi_i = (x_i - mean) / N):

    se = sqrt(G / (G - 1) * sum_g (sum_{i in g} psi_i)^2)

over the G clusters.  With one root per cluster (G = N) it is the ordinary standard error of the
mean, sd(x) / sqrt(N) with sd's N - 1 denominator.  Fewer than two clusters give NaN.

Arithmetic is float64; the sums run in the order of the roots (cluster sums) and of the clusters'
first appearance, so the result does not depend on how cluster labels sort.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np


def _checked(values, clusters, name: str) -> tuple[np.ndarray, list[int], int]:
    """(float64 values, cluster index per root in order of first appearance, number of clusters)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name}: must be one-dimensional (one value per root), got shape {x.shape}")
    labels = list(clusters)
    if x.size == 0:
        raise ValueError(f"{name}: need at least one value, got none")
    if len(labels) != x.size:
        raise ValueError(f"clusters: need one cluster per value, got {len(labels)} clusters for {x.size} {name}")
    index: dict = {}
    codes = [index.setdefault(c, len(index)) for c in labels]
    return x, codes, len(index)


def clustered_se(influence: Sequence[float], clusters: Sequence[Hashable]) -> float:
    """The cluster-robust (CR1) standard error of an estimator with per-root influence ``influence``.

    Args:
        influence: shape [N], psi_i per root (float64; e.g. (x_i - mean) / N for a mean, or the
            delta method's influence for a ratio).
        clusters: N hashable labels (the prompt or request of each root).

    Returns:
        sqrt(G / (G - 1) * sum_g (sum_{i in g} psi_i)^2) over the G clusters (module docstring);
        NaN when G < 2.

    Raises:
        ValueError: ``influence: ...`` when empty or not one-dimensional; ``clusters: ...`` when
            its length differs from ``influence``'s.
    """
    psi, codes, g = _checked(influence, clusters, "influence")
    if g < 2:
        return float("nan")
    sums = np.bincount(np.asarray(codes, dtype=np.intp), weights=psi, minlength=g)
    return math.sqrt(g / (g - 1) * sum((sums * sums).tolist()))


def mean_influence(values: Sequence[float]) -> tuple[float, np.ndarray]:
    """The mean of ``values`` (shape [N], float64) and its influence (x_i - mean) / N (shape [N]).

    Raises:
        ValueError: ``values: ...`` when empty or not one-dimensional.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"values: need a non-empty one-dimensional sequence, got shape {x.shape}")
    n = x.size
    mean = sum(x.tolist()) / n
    return mean, (x - mean) / n


def clustered_mean_se(values: Sequence[float], clusters: Sequence[Hashable]) -> tuple[float, float]:
    """The mean of ``values`` (one per root) and its standard error clustered by ``clusters``.

    Args:
        values: shape [N], float64 (one value per root).
        clusters: N hashable labels (the prompt of each root).

    Returns:
        (mean, se): se = ``clustered_se`` of the influence (x_i - mean) / N; with one root per
        cluster, sd(values) / sqrt(N); NaN with fewer than two clusters.

    Raises:
        ValueError: ``values: ...`` when empty or not one-dimensional; ``clusters: ...`` when its
            length differs from ``values``'.
    """
    _checked(values, clusters, "values")
    mean, psi = mean_influence(values)
    return mean, clustered_se(psi, clusters)


def grouped_mean_se(values: Sequence[Sequence[float]], clusters: Sequence[Sequence[Hashable]]) -> list[float]:
    """Per group g, the clustered standard error of the mean of ``values[g]`` by ``clusters[g]``
    (``clustered_mean_se``), for tables whose rows each hold a group's per-root values.

    Args:
        values: G sequences of float64 (one value per root of the group).
        clusters: G sequences of hashable labels, each as long as its ``values``.

    Returns:
        G standard errors (float; NaN for a group with fewer than two clusters).

    Raises:
        ValueError: ``values: ...`` / ``clusters: ...`` as ``clustered_mean_se`` raises for a group;
            ``clusters: ...`` when the number of groups differs.
    """
    if len(values) != len(clusters):
        raise ValueError(f"clusters: need one label list per group, got {len(clusters)} for {len(values)} groups")
    return [clustered_mean_se(v, c)[1] for v, c in zip(values, clusters)]
