"""Roots along seeded walks of a synthetic world (``backends.synthetic``).

Two seeding conventions (``stream``), each a fixed function of ``seed``:

* ``"per_trajectory"`` (the action-grid studies): trajectory i has its own generator
  ``seeded_rng(seed, Stream.WALK, i)``, which first draws a uniform start token, then the trajectory;
  trajectories are independent, so a split by trajectory, or workers over settings, change
  nothing; studies seed their own draws per root;
* ``"shared"`` (``divergence_by_depth``, ``block_efficiency_grid``): one generator
  ``numpy.random.default_rng(seed)`` walks the world from its start (the empty context):
  trajectory 0, then the study's draws at its roots (``Root.rng`` is that generator), then
  trajectory 1, and so on.

Roots: ``RootPlacement(roots_per_trajectory, spacing, first=spacing)`` (``backends.roots``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from backends.roots import RootPlacement, place_roots
from backends.sources.base import Root, register_source, slug
from backends.synthetic import WORLDS, make_world
from backends.synthetic.base import check_vocab
from simlab.checks import check_int, check_seed
from simlab.pairs import rooted
from simlab.sampling import SamplingSettings, Stream, seeded_rng

STREAMS = ("per_trajectory", "shared")


@register_source("synthetic")
@dataclass(frozen=True)
class SyntheticSource:
    """Roots of a synthetic world (see the module docstring).

    Raises:
        ValueError: ``world: ...``, ``vocab: ...``, ``trajectories: ...``,
            ``roots_per_trajectory: ...``, ``spacing: ...``, ``seed: ...`` or ``stream: ...``.
    """

    world: str = "depth_profile"
    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 16
    seed: int = 0
    stream: str = "per_trajectory"

    honours: ClassVar[frozenset[str]] = frozenset(
        {"world", "vocab", "trajectories", "roots_per_trajectory", "spacing", "seed", "settings"}
    )

    def __post_init__(self):
        if self.world not in WORLDS:
            raise ValueError(f"world: unknown world {self.world!r}; choose one of {', '.join(WORLDS)}")
        check_vocab(self.vocab)
        check_int(self.trajectories, "trajectories", 1)
        check_seed(self.seed)
        self.placement()
        if self.stream not in STREAMS:
            raise ValueError(f"stream: must be one of {', '.join(STREAMS)}, got {self.stream!r}")

    def placement(self) -> RootPlacement:
        return RootPlacement(self.roots_per_trajectory, self.spacing, first=self.spacing)

    def describe(self) -> str:
        return f"{self.world}, V={self.vocab}"

    def slug(self) -> str:
        return slug(f"synthetic-{self.world}-V{self.vocab}")

    def fixed_settings(self) -> None:
        return None

    def latency(self, largest_tree: int) -> None:
        return None

    def table(self, root: Root):
        """``root``'s ``simlab.trees.NodeTable`` on the world rooted at its context (exact float64)."""
        from simlab.trees import NodeTable

        return NodeTable(root.pair, root.context)

    def count(self, settings: SamplingSettings) -> int:
        return self.trajectories * self.roots_per_trajectory

    def make_world(self, settings: SamplingSettings):
        """The world under ``settings`` (not rooted)."""
        return make_world(self.world, vocab=self.vocab, seed=self.seed, settings=settings)

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        world = self.make_world(settings)
        placement = self.placement()
        shared = np.random.default_rng(self.seed) if self.stream == "shared" else None
        for i in range(self.trajectories):
            if shared is not None:
                rng, prefix = shared, ()
            else:
                rng = seeded_rng(self.seed, Stream.WALK, i)
                prefix = (int(rng.integers(self.vocab)),)
            for root, context in place_roots(world, prefix, placement, rng, trajectory=i):
                yield Root(settings.name, i, root, context, rooted(world, len(context)), rng=shared, source=self)
