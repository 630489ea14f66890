"""Sources of roots: one placement rule, one flag group, and a new world picked up by every study."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest

from analyses import block_efficiency_grid, compare_verifiers, divergence_by_depth, train_selector
from backends.roots import RootPlacement, place_roots
from backends.sources import SOURCES, Source, SyntheticSource
from simlab.sampling import parse_settings
from backends.synthetic import WORLDS, register_world
from simlab.pairs import ModelPair, WithSettings, check_contexts, check_eos
from simlab.sampling import SamplingSettings


class CoinWorld:
    """A newcomer's world: context-free, p a seeded Dirichlet row, q halfway to uniform."""

    def __init__(self, vocab, seed=0, settings=None, eos_id=None):
        rng = np.random.default_rng(seed)
        self.vocab_size, self.seed = int(vocab), seed
        self.settings = settings or SamplingSettings()
        self.eos_id = check_eos(eos_id, self.vocab_size)
        self.base_p = rng.dirichlet(np.ones(self.vocab_size))
        self.base_q = 0.5 * self.base_p + 0.5 / self.vocab_size

    def with_settings(self, settings):
        return CoinWorld(self.vocab_size, self.seed, settings, self.eos_id)

    def distributions(self, contexts):
        n = len(check_contexts(contexts, self.vocab_size))
        return np.tile(self.settings.apply(self.base_p), (n, 1)), np.tile(self.settings.apply(self.base_q), (n, 1))


@pytest.fixture()
def coin_world():
    register_world("coin")(CoinWorld)
    yield "coin"
    del WORLDS["coin"]


def test_a_registered_world_is_a_pair_with_settings(coin_world):
    world = WORLDS[coin_world](vocab=5)
    assert isinstance(world, ModelPair) and isinstance(world, WithSettings)


def test_every_study_picks_up_a_new_world(coin_world, tmp_path):
    world = ["--world", coin_world, "--vocab", "5", "--quiet"]
    assert (
        divergence_by_depth.main(
            world + ["--roots-per-trajectory", "2", "--depth", "2", "--k", "2", "--out", str(tmp_path / "d")]
        )
        == 0
    )
    assert (
        block_efficiency_grid.main(
            world
            + [
                "--roots-per-trajectory",
                "2",
                "--K",
                "1,2",
                "--L1-max",
                "1",
                "--L2-max",
                "1",
                "--verifiers",
                "specinfer",
                "--out",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    grid = [
        "--trajectories",
        "3",
        "--roots-per-trajectory",
        "1",
        "--settings",
        "1",
        "--K-max",
        "2",
        "--L-max",
        "1",
        "--samples",
        "2",
        "--jobs",
        "1",
    ]
    assert compare_verifiers.main(world + grid + ["--verifiers", "specinfer,traversal", "--out", str(tmp_path / "c")]) == 0
    assert train_selector.main(world + grid + ["--verifiers", "specinfer", "--epochs", "2", "--out", str(tmp_path / "t")]) == 0
    assert pl.read_parquet(tmp_path / "d" / "nodes.parquet").height > 0
    assert set(pl.read_parquet(tmp_path / "c" / "labels.parquet")["verifier"]) == {"specinfer", "traversal"}


def test_sources_are_registered_and_declare_what_they_honour():
    assert list(SOURCES) == ["synthetic", "hf", "capture"]
    for cls in SOURCES.values():
        assert cls.honours and cls.name
    assert isinstance(SyntheticSource(), Source)


def test_root_placement():
    placement = RootPlacement(roots_per_trajectory=3, spacing=4, first=2)
    assert placement.offsets() == [2, 6, 10] and placement.sampled == 14 and placement.root_id(2, 1) == 7
    world = WORLDS["depth_profile"](vocab=6, seed=1)
    roots = list(place_roots(world, (5,), placement, np.random.default_rng(0), trajectory=2))
    assert [r for r, _ in roots] == [6, 7, 8] and [len(c) for _, c in roots] == [3, 7, 11]
    assert all(c[0] == 5 and roots[-1][1][: len(c)] == c for _, c in roots)  # one trajectory, shared prefixes
    rng = np.random.default_rng(0)  # without the tail after the last root: the same roots, 4 uniforms fewer
    assert list(place_roots(world, (5,), placement, rng, trajectory=2, whole=False)) == roots
    assert rng.random() == pytest.approx(np.random.default_rng(0).random(11)[-1])
    for bad in (dict(roots_per_trajectory=0), dict(spacing=0), dict(first=-1)):
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"^{name}: "):
            RootPlacement(**bad)


def test_the_two_synthetic_streams():
    """per_trajectory: independent trajectories from uniform start tokens; shared: one walk from the
    empty context whose generator the roots carry."""
    independent = SyntheticSource(vocab=8, trajectories=2, roots_per_trajectory=2, spacing=3)
    roots = list(independent.roots(SamplingSettings()))
    assert [len(r.context) for r in roots] == [4, 7, 4, 7] and all(r.rng is None for r in roots)
    assert [r.context for r in roots] == [r.context for r in independent.roots(SamplingSettings())]
    walk = list(
        SyntheticSource(vocab=8, trajectories=1, roots_per_trajectory=2, spacing=3, stream="shared").roots(SamplingSettings())
    )
    assert [len(r.context) for r in walk] == [3, 6] and walk[0].rng is walk[1].rng is not None


def test_settings_syntax():
    assert parse_settings("0.6, 1:0.9, 1::40, 0") == (
        SamplingSettings(0.6),
        SamplingSettings(1.0, top_p=0.9),
        SamplingSettings(1.0, top_k=40),
        SamplingSettings(0.0),
    )
    for bad, message in (
        ("hot", "is not T"),
        ("1:2", "top-p"),
        ("1::0", "top-k"),
        ("-1", "temperature"),
        ("1,1", "twice"),
        ("0,1::1", "one law"),
        ("1:0.5:3:4", "is not T"),
    ):
        with pytest.raises(ValueError, match=f"^settings: .*{message}"):
            parse_settings(bad)


def test_live_models_and_the_capture_tool_place_the_same_roots(micro_pair_dir, tmp_path):
    from backends.capture import main as capture_main
    from backends.sources import CaptureSource, HFSource
    from tests.test_capture import SHIPPED

    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(SHIPPED.read_text().splitlines()[:2]) + "\n")
    target, draft = str(micro_pair_dir / "target"), str(micro_pair_dir / "draft")
    assert (
        capture_main(
            [
                "--target",
                target,
                "--draft",
                draft,
                "--prompts",
                str(prompts),
                "--out",
                str(tmp_path / "c"),
                "--roots-per-prompt",
                "2",
                "--spacing",
                "3",
                "--depth",
                "2",
                "--full",
                "--quiet",
            ]
        )
        == 0
    )
    live = HFSource(target, draft, str(prompts), roots_per_trajectory=2, spacing=3, depth=2, device="cpu")
    replay = CaptureSource((str(tmp_path / "c"),), grid=False)
    a = [(r.root, r.trajectory, r.context) for r in live.roots(SamplingSettings())]
    b = [(r.root, r.trajectory, r.context) for r in replay.roots(SamplingSettings())]
    assert a == b and len(a) == 4


def test_live_roots_by_either_trajectory_method_agree_and_are_sampled_once(micro_pair_dir, tmp_path, monkeypatch):
    """``trajectory="cached"`` (the default, the target's KV cache) and ``"forward"`` (the reference)
    place the same roots; a second ``roots`` call under the same settings samples nothing (a sharded
    run's merge reads them again), another setting samples its own; a bad method is refused."""
    from backends.roots import prompt_roots
    from backends.sources import HFSource, live

    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nThe river\n")
    target, draft = str(micro_pair_dir / "target"), str(micro_pair_dir / "draft")
    with pytest.raises(ValueError, match="^trajectory: must be one of"):
        HFSource(target, draft, str(prompts), device="cpu", trajectory="kv")
    placed = {}
    for method in ("forward", "cached"):
        source = HFSource(
            target, draft, str(prompts), roots_per_trajectory=3, spacing=4, depth=2, device="cpu", trajectory=method
        )
        placed[method] = [(r.root, r.trajectory, r.context) for r in source.roots(SamplingSettings(0.8))]
    assert placed["cached"] == placed["forward"] and len(placed["cached"]) == 6
    assert len({c for _, _, c in placed["cached"]}) == 6  # the roots lie 4 tokens apart along each reply
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[-1])  # the trajectory method
        return prompt_roots(*args, **kwargs)

    monkeypatch.setattr(live, "prompt_roots", counted)
    again = [(r.root, r.trajectory, r.context) for r in source.roots(SamplingSettings(0.8))]
    assert again == placed["cached"] and calls == []  # kept from the first pass
    other = [(r.root, r.context) for r in source.roots(SamplingSettings(0.0))]
    assert calls == ["cached"] and len(other) == 6
    partial = HFSource(target, draft, str(prompts), roots_per_trajectory=3, spacing=4, depth=2, device="cpu")
    first = next(iter(partial.roots(SamplingSettings(0.8))))  # a pass left unfinished keeps nothing
    assert (first.root, first.trajectory, first.context) == placed["cached"][0]
    assert [(r.root, r.trajectory, r.context) for r in partial.roots(SamplingSettings(0.8))] == placed["cached"]
    assert calls == ["cached"] * 3
    exact = HFSource(target, draft, str(prompts), roots_per_trajectory=3, spacing=4, depth=2, device="cpu")
    taken = list(itertools.islice(exact.roots(SamplingSettings(0.8)), exact.count(SamplingSettings(0.8))))
    assert [(r.root, r.trajectory, r.context) for r in exact.roots(SamplingSettings(0.8))] == placed["cached"]
    assert len(taken) == 6 and calls == ["cached"] * 4  # kept at the last root, though never resumed past it
