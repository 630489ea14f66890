"""The target's continuation from its KV cache (``HFPair.target_steps``, ``target_trajectory(method=
"cached")``) against the reference that evaluates the whole context at every step."""

from __future__ import annotations

import numpy as np
import pytest

from backends.hf import HFPair
from simlab.pairs import TargetSteps, target_trajectory
from simlab.sampling import SamplingSettings
from backends.synthetic.base import make_world


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


@pytest.fixture(scope="module")
def prompt(pair):
    return pair.encode("The for statement is used to iterate over")


@pytest.mark.parametrize("settings", [SamplingSettings(), SamplingSettings(0.6, 20, 0.9)], ids=["T1", "T0.6"])
def test_each_cached_step_equals_the_whole_context_forward(pair, prompt, settings):
    """Every p the cache yields equals ``distributions`` on the context so far (float32 rounding:
    1e-5 in total variation), the context growing by tokens that are not the argmax."""
    pair = pair.with_settings(settings)
    steps = pair.target_steps(prompt)
    context = list(prompt)
    p = next(steps)
    for i in range(12):
        reference = pair.distributions([tuple(context)])[0][0]
        assert p.dtype == np.float64 and p.shape == (pair.vocab_size,)
        assert 0.5 * np.abs(p - reference).sum() < 1e-5
        token = int(np.argsort(reference)[-1 - i % 3])  # the top-1, -2 or -3 token: the path is not greedy
        context.append(token)
        p = steps.send(token)
    steps.close()


def test_cached_trajectory_equals_the_reference_for_these_seeds(pair, prompt):
    """Same uniforms, same law: the sampled tokens agree with the reference path for 4 seeds x 24
    tokens (a token can differ only where a uniform falls within float32 rounding of a boundary of
    the cumulative p, probability below 1e-4 over these 96 draws)."""
    assert isinstance(pair, TargetSteps)
    for seed in range(4):
        forward = target_trajectory(pair, 24, np.random.default_rng(seed), prefix=prompt, method="forward")
        cached = target_trajectory(pair, 24, np.random.default_rng(seed), prefix=prompt, method="cached")
        assert cached == forward
        assert cached[: len(prompt)] == tuple(prompt)


def test_a_pair_without_steps_is_refused_for_cached_and_bad_methods_named():
    world = make_world("depth_profile", vocab=16, seed=0)
    assert not isinstance(world, TargetSteps)
    with pytest.raises(ValueError, match="^method: 'cached' needs"):
        target_trajectory(world, 4, np.random.default_rng(0), prefix=(1,), method="cached")
    with pytest.raises(ValueError, match="^method: one of"):
        target_trajectory(world, 4, np.random.default_rng(0), prefix=(1,), method="kv")
    assert len(target_trajectory(world, 4, np.random.default_rng(0), prefix=(1,))) == 5


def test_steps_refuse_bad_tokens_and_empty_prefixes(pair, prompt):
    with pytest.raises(ValueError, match="^prefix: empty"):
        next(pair.target_steps(()))
    steps = pair.target_steps(prompt)
    next(steps)
    with pytest.raises(ValueError):
        steps.send(pair.vocab_size)


def test_a_capture_before_the_trajectory_field_reads_as_forward_and_keeps_its_hash():
    """A format-1 settings.json (no ``trajectory``) was sampled ``forward``: the upgrade says so, and
    the settings hash of such a capture is the hash its shards recorded (the field left out of it)."""
    from dataclasses import asdict, replace

    from backends import capture_format
    from backends import capture_store as store

    new = store.CaptureSettings("t", "d", "p")
    assert new.trajectory == "cached"
    old = {k: v for k, v in asdict(new).items() if k != "trajectory"}
    upgraded = capture_format.upgrade_settings({"format": 1, **old})
    assert upgraded["trajectory"] == "forward"
    assert capture_format.upgrade_settings({**old})["trajectory"] == "forward"  # format 0 as well
    forward = replace(new, trajectory="forward")
    legacy_hash = store.settings_hash(forward)
    import hashlib
    import json

    before = {k: v for k, v in old.items() if k != "prompts" and not (k in store.MODEL_KEYS and not v)}
    assert legacy_hash == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert legacy_hash != store.settings_hash(new)  # a cached capture never resumes a forward one
