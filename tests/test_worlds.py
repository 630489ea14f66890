"""Synthetic worlds: deterministic, the profile they promise, divergence that grows by itself."""

from __future__ import annotations

import numpy as np
import pytest

from backends.synthetic import DepthProfileWorld, DistilledWorld, LinearProfile, make_world
from simlab.sampling import SamplingSettings
from simlab.distributions import total_variation
from simlab.pairs import ModelPair, rooted, target_trajectory
from simlab.builders import iid
from simlab.trees import NodeTable


def tv_by_depth(world, roots=24, spacing=16, depth=8, width=4, seed=0):
    rng = np.random.default_rng(seed)
    trajectory = target_trajectory(world, spacing * (roots + 1), rng)
    by_depth: dict[int, list[float]] = {}
    for r in range(roots):
        context = tuple(trajectory[: spacing * (r + 1)])
        pair = rooted(world, len(context))
        table = NodeTable(pair, context)
        tree = iid(width, depth).sample(table, rng)
        for path in tree.nodes():
            by_depth.setdefault(len(path), []).append(total_variation(table.p(path), table.q(path)))
    return {d: float(np.mean(v)) for d, v in sorted(by_depth.items())}


@pytest.mark.parametrize("name", ["depth_profile", "distilled"])
def test_worlds_are_model_pairs_and_deterministic(name):
    a = make_world(name, vocab=32, seed=5, train_tokens=2000) if name == "distilled" else make_world(name, vocab=32, seed=5)
    b = make_world(name, vocab=32, seed=5, train_tokens=2000) if name == "distilled" else make_world(name, vocab=32, seed=5)
    assert isinstance(a, ModelPair)
    contexts = [(), (1,), (1, 2, 3), (31, 0)]
    for x, y in zip(a.distributions(contexts), b.distributions(contexts)):
        assert np.array_equal(x, y) and x.shape == (4, 32) and x.dtype == np.float64
        np.testing.assert_allclose(x.sum(axis=1), 1.0, atol=1e-12)


def test_depth_profile_reproduces_its_profile():
    """TV(p, q) at depth d equals the profile exactly (it is set, not sampled), node by node."""
    profile = LinearProfile(0.1, 0.5, 8)
    measured = tv_by_depth(DepthProfileWorld(vocab=64, seed=1, profile=profile), roots=8)
    for d, tv in measured.items():
        assert tv == pytest.approx(profile(d), abs=1e-9)


def test_depth_profile_is_lazy_and_bounded_at_50k():
    world = DepthProfileWorld(vocab=50_000, seed=2)
    p, q = world.rooted(1).distributions([(7,), (7, 9, 11)])
    assert p.shape == (2, 50_000)
    assert total_variation(p[0], q[0]) == pytest.approx(0.1, abs=1e-9)
    assert total_variation(p[1], q[1]) == pytest.approx(0.2, abs=1e-9)
    assert world._memo.size * 16 * 50_000 <= 2**27 + 64 * 16 * 50_000


def test_distilled_divergence_grows_with_depth():
    """Measured property: along draft-sampled paths the mean TV at depths 5..8 exceeds the mean
    TV at the roots (depth 0) by more than 0.05 (seed 0: about 0.14 at the roots, 0.28 deep)."""
    measured = tv_by_depth(DistilledWorld(vocab=64, seed=0))
    deep = np.mean([measured[d] for d in range(5, 9)])
    assert deep - measured[0] > 0.05, measured


def test_sampling_settings_apply_to_both_models():
    world = DepthProfileWorld(vocab=16, seed=3, settings=SamplingSettings(temperature=0.0))
    p, q = world.rooted(1).distributions([(2, 5)])
    assert sorted(p[0].tolist()).count(1.0) == 1 and sorted(q[0].tolist()).count(1.0) == 1
    world = DepthProfileWorld(vocab=16, seed=3, settings=SamplingSettings(top_p=0.5))
    p, q = world.distributions([(2,)])
    assert np.count_nonzero(p[0]) < 16 and np.count_nonzero(q[0]) < 16


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(name="nope", vocab=8), "world"),
        (dict(name="depth_profile", vocab=1), "vocab"),
        (dict(name="depth_profile", vocab=60_000), "vocab"),
        (dict(name="distilled", vocab=8, smoothing=0), "smoothing"),
    ],
)
def test_bad_world_arguments(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}: "):
        make_world(kwargs.pop("name"), **kwargs)


def test_bad_settings():
    with pytest.raises(ValueError, match="^temperature: "):
        SamplingSettings(temperature=-1)
    with pytest.raises(ValueError, match="^top_p: "):
        SamplingSettings(top_p=1.5)
