"""Where the roots of the action-grid studies come from: a synthetic world, two live Hugging Face
models, or grid captures replayed from disk.

A **root** is a context on a target-sampled trajectory at which a speculative step starts.
Roots sit every ``spacing`` tokens along ``trajectories`` trajectories (synthetic: seeded
target samples from a seeded start token; real models: one continuation per prompt), so a
train/test split by trajectory never shares a context prefix.  Each source yields the roots of
one sampling setting at a time, with the model pair rooted there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.synthetic import SamplingSettings, make_world
from backends.synthetic.base import seeded_rng
from simlab.efficiency import GridDraft
from simlab.pairs import ModelPair, rooted, target_trajectory

DDTE_SETTINGS = tuple(SamplingSettings(t) for t in (0.2, 0.4, 0.6, 0.8, 1.0, 1.2)) + (
    SamplingSettings(1.0, top_p=0.9), SamplingSettings(1.0, top_p=0.99))
"""DDTE's eight sampling settings: T in {0.2, ..., 1.2} and T = 1 with top-p 0.9 and 0.99."""


def setting_name(s: SamplingSettings) -> str:
    """``"T=0.6"`` or ``"T=1,p=0.9"`` (and ``",k=K"`` for top-k)."""
    name = f"T={s.temperature:g}"
    if s.top_p not in (None, 1.0):
        name += f",p={s.top_p:g}"
    if s.top_k is not None:
        name += f",k={s.top_k}"
    return name


def parse_settings(text: str) -> tuple[SamplingSettings, ...]:
    """``"ddte"`` (the eight) or a comma list of ``T`` or ``T:top_p`` entries, e.g. ``"0.6,1:0.9"``.

    Raises:
        ValueError: an entry that is not a number, a temperature < 0, a top-p outside (0, 1].
    """
    if text.strip() == "ddte":
        return DDTE_SETTINGS
    out = []
    for entry in (e.strip() for e in text.split(",")):
        parts = entry.split(":")
        try:
            values = [float(x) for x in parts]
        except ValueError:
            raise ValueError(f"--settings: {entry!r} is not T or T:top_p") from None
        if not entry or len(values) > 2:
            raise ValueError(f"--settings: {entry!r} is not T or T:top_p")
        if not (np.isfinite(values[0]) and values[0] >= 0):
            raise ValueError(f"--settings: temperature must be a finite number >= 0, got {entry!r}")
        if len(values) == 2 and not 0 < values[1] <= 1:
            raise ValueError(f"--settings: top-p must lie in (0, 1], got {entry!r}")
        out.append(SamplingSettings(values[0], top_p=values[1] if len(values) == 2 else None))
    names = [setting_name(s) for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"--settings: {text!r} names a setting twice")
    return tuple(out)


@dataclass(frozen=True)
class Root:
    """One root of one sampling setting.

    Attributes:
        setting: the setting's name (``setting_name``).
        trajectory: trajectory (prompt) index; roots of one trajectory share a prefix.
        root: root id within the setting (trajectory * roots_per_trajectory + position).
        context: the root context (token ids); its length is l in the latency model.
        pair: the model pair, rooted at this context.
        drafts: pre-drawn grid drafts (captures), or None to draw them here.
    """

    setting: str
    trajectory: int
    root: int
    context: tuple[int, ...]
    pair: ModelPair
    drafts: tuple[GridDraft, ...] | None = None


@dataclass(frozen=True)
class SyntheticSource:
    """Roots along seeded target trajectories of a synthetic world (``backends.synthetic``)."""

    world: str = "depth_profile"
    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 16
    seed: int = 0

    def describe(self) -> str:
        return f"{self.world}, V={self.vocab}"

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        world = make_world(self.world, vocab=self.vocab, seed=self.seed, settings=settings)
        for i in range(self.trajectories):
            rng = seeded_rng(self.seed, 2, i)
            start = (int(rng.integers(self.vocab)),)
            tokens = target_trajectory(world, self.spacing * self.roots_per_trajectory, rng, prefix=start)
            for j in range(self.roots_per_trajectory):
                context = tokens[: 1 + self.spacing * (j + 1)]
                yield Root(setting_name(settings), i, i * self.roots_per_trajectory + j, context, rooted(world, len(context)))


@dataclass
class HFSource:
    """Roots along target continuations of prompts, with p and q from two live models (``HFPair``)."""

    target: str
    draft: str
    prompts: str
    roots_per_prompt: int = 2
    spacing: int = 16
    depth: int = 16
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"

    def __post_init__(self):
        from backends.capture import read_prompts
        from backends.hf import HFPair

        self.texts = read_prompts(self.prompts)
        self.pair = HFPair(self.target, self.draft, device=self.device, dtype=self.dtype)

    def describe(self) -> str:
        return f"{self.target} / {self.draft}"

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        from backends.capture import CaptureSettings, roots_of

        self.pair.settings = settings
        plan = CaptureSettings(self.target, self.draft, self.prompts, self.roots_per_prompt, self.spacing,
                               depth=self.depth, temperature=settings.temperature, top_p=settings.top_p,
                               top_k=settings.top_k, seed=self.seed)
        for root, prompt, context in roots_of(self.pair, plan, self.texts):
            yield Root(setting_name(settings), prompt, root, context, self.pair)


@dataclass
class CaptureSource:
    """Roots and their grid drafts replayed from ``--shape grid --full`` captures (one per setting).

    Settings, drafts and completeness are read up front; a capture's logits (p and q of every
    node, float64) are loaded only while its setting's roots are labelled, so memory holds one
    setting at a time.

    Raises:
        ValueError: a capture that is not a grid, has fewer than 2 trees per L1, repeats a
            setting, holds no completed root, or has damaged files.
    """

    folders: tuple[str, ...]

    def __post_init__(self):
        import sys

        from backends.capture import load_settings, read_grid_drafts

        self.captures, self.drafts = {}, {}
        for folder in self.folders:
            stored = load_settings(folder)
            if stored.shape != "grid":
                raise ValueError(f"--capture: {folder!r} holds {stored.shape!r} trees; the grid studies need --shape grid")
            if stored.samples < 2:
                raise ValueError(f"--capture: {folder!r} has {stored.samples} tree per L1; the studies need >= 2 (half choose, half report)")
            name = setting_name(stored.sampling())
            if name in self.captures:
                raise ValueError(f"--capture: two captures with the setting {name}")
            self.captures[name] = (folder, stored)
            self.drafts[name] = _read_capture(folder, lambda f: list(read_grid_drafts(f)))
            if not self.drafts[name]:
                raise ValueError(f"--capture: {folder!r} holds no completed root")
            started = len(list(Path(folder).glob("drafts-r*.parquet")))
            if started > len(self.drafts[name]):
                print(f"note: {folder}: {started - len(self.drafts[name])} interrupted roots skipped (rerun the capture to finish them)",
                      file=sys.stderr)

    def describe(self) -> str:
        stored = next(iter(self.captures.values()))[1]
        return f"capture of {stored.target} / {stored.draft}"

    def settings(self) -> tuple[SamplingSettings, ...]:
        return tuple(stored.sampling() for _, stored in self.captures.values())

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        from backends.capture import CapturedPair

        name = setting_name(settings)
        folder, _ = self.captures[name]
        pair = _read_capture(folder, CapturedPair)
        for root, prompt, context, drafts in self.drafts[name]:
            yield Root(name, prompt, root, context, pair, drafts)


def _read_capture(folder: str, read):
    """``read(folder)``, with any error of a damaged file (polars, numpy, zip) as one ValueError."""
    try:
        return read(folder)
    except Exception as exc:
        if isinstance(exc, ValueError) and str(exc).startswith("--capture"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"--capture: {folder!r} is damaged ({type(exc).__name__}: {first})") from None


def make_source(config):
    """The root source a study's flags ask for (fields backend, target, draft, prompts, capture,
    world, vocab, trajectories, roots_per_trajectory, spacing, L_max, seed, device).

    Raises:
        ValueError: from the backends (missing models, bad prompt files, bad captures).
    """
    if config.capture:
        source = CaptureSource(config.capture)
        for folder, stored in source.captures.values():
            if stored.width < config.K_max or stored.depth < config.L_max:
                raise ValueError(f"--capture: {folder!r} holds K <= {stored.width} and L1, L2 <= {stored.depth}; "
                                 f"pass --K-max {stored.width} --L-max {stored.depth} or less")
        return source
    if config.backend == "hf":
        from pathlib import Path

        prompts = config.prompts or str(Path(__file__).resolve().parent.parent / "backends" / "prompts" / "reference_prompts.txt")
        source = HFSource(config.target, config.draft, prompts, config.roots_per_trajectory, config.spacing,
                          depth=2 * config.L_max, seed=config.seed, device=config.device)
        source.texts = source.texts[: config.trajectories]
        return source
    return SyntheticSource(config.world, config.vocab, config.trajectories, config.roots_per_trajectory, config.spacing, config.seed)


def make_latency(config, source):
    """The latency model: ``config.latency`` (a profile file) if given; else a capture's
    ``latency.json``; else, for live models, a warm-up benchmark on this machine sized to the
    grid and the model's context; else ``LatencyModel.from_cost_ratio(cost_ratio, per_token)``."""
    from pathlib import Path

    from simlab.latency import LatencyModel

    if config.latency:
        return LatencyModel.load(config.latency)
    if config.capture and (Path(config.capture[0]) / "latency.json").is_file():
        return LatencyModel.load(Path(config.capture[0]) / "latency.json")
    if isinstance(source, HFSource):
        from backends.latency_probe import measure

        largest = 1 + config.L_max + config.K_max * config.L_max  # the target's forward over the biggest tree
        tokens = tuple(sorted({n for n in (1, 4, 16, largest) if n <= largest}))
        room = (source.pair.max_context or 10**9) - largest
        contexts = tuple(c for c in (16, 64, 256) if c <= room) or (max(1, room),)
        return measure(source.pair, contexts=contexts, tokens=tokens)
    return LatencyModel.from_cost_ratio(config.cost_ratio, per_token=config.per_token)


@dataclass(frozen=True)
class GridStudyConfig:
    """The flags every action-grid study shares: the source of roots, the grid, the latency model,
    parallelism and seed.  ``compare_verifiers`` and ``train_selector`` extend it."""

    backend: str = "synthetic"
    target: str | None = None
    draft: str | None = None
    prompts: str | None = None
    capture: tuple[str, ...] = ()
    world: str = "depth_profile"
    vocab: int = 32
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 16
    settings: str = "ddte"
    K_max: int = 4
    L_max: int = 8
    samples: int = 4
    method: str = "mc"
    cost_ratio: float = 0.1
    per_token: float = 0.01
    latency: str | None = None
    device: str = "auto"
    jobs: int = 2
    seed: int = 0
    quiet: bool = False


def add_grid_study_flags(parser, d: GridStudyConfig) -> None:
    """Add the shared flags to ``parser`` with the defaults of ``d`` (a study's Config())."""
    import os

    from backends.synthetic import WORLDS

    parser.add_argument("--backend", choices=["synthetic", "hf"], default=d.backend, help="synthetic world, or two live models")
    parser.add_argument("--target", default=None, help="hf: target model folder or hub id")
    parser.add_argument("--draft", default=None, help="hf: draft model folder or hub id")
    parser.add_argument("--prompts", default=None, help="hf: prompt file (default: the shipped reference prompts)")
    parser.add_argument("--capture", nargs="+", default=(),
                        help="replay grid captures (python -m backends.capture --shape grid --full), one per setting")
    parser.add_argument("--world", default=d.world, help=f"synthetic world: {', '.join(WORLDS)}")
    parser.add_argument("--vocab", type=int, default=d.vocab, help="synthetic: vocabulary size V (2..50000)")
    parser.add_argument("--trajectories", type=int, default=d.trajectories, help="trajectories (hf: prompts used, from the top of the file)")
    parser.add_argument("--roots-per-trajectory", type=int, default=d.roots_per_trajectory, help="roots along each trajectory")
    parser.add_argument("--spacing", type=int, default=d.spacing, help="tokens between roots")
    parser.add_argument("--settings", default=d.settings, help="'ddte' (the eight) or a comma list of T or T:top_p, e.g. 0.6,1:0.9")
    parser.add_argument("--K-max", type=int, default=d.K_max, help="largest K of the grid (1..8)")
    parser.add_argument("--L-max", type=int, default=d.L_max, help="largest L1 and L2 of the grid (0..16)")
    parser.add_argument("--samples", type=int, default=d.samples,
                        help="trees drawn per L1 and root (DDTE: s = 4; >= 2: half choose, half report; captures bring their own)")
    parser.add_argument("--method", choices=["mc", "exact"], default=d.method,
                        help="exact: enumerate every tree of every action (tiny synthetic worlds only)")
    parser.add_argument("--cost-ratio", type=float, default=d.cost_ratio, help="synthetic latency: c = t_q / t_p")
    parser.add_argument("--per-token", type=float, default=d.per_token,
                        help="synthetic latency: extra time per extra token in a forward, as a fraction")
    parser.add_argument("--latency", default=None, help="latency profile file (.json or .toml; see simlab.latency)")
    parser.add_argument("--device", default=d.device, help="hf: device of the models (auto, cpu, cuda, cuda:N)")
    parser.add_argument("--jobs", type=int, default=min(d.jobs, os.cpu_count() or 1), help="worker processes over settings (synthetic worlds)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of the world, trajectories and tree draws")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def check_grid_study_flags(prog: str, args, checks, *, min_trajectories: int = 1) -> None:
    """Exit 2 with one line on the first failing check: the study's own ``checks`` first, then
    the shared flags (``min_trajectories``: 3 where roots are split train / validation / test)."""
    from analyses._tool import check_flags, fail
    from backends.synthetic import WORLDS

    inf = float("inf")
    shared = [
        (args.world in WORLDS, f"--world: unknown world {args.world!r}; choose one of {', '.join(WORLDS)}"),
        (args.backend != "hf" or args.capture or (args.target and args.draft), "--backend hf: needs --target and --draft"),
        (2 <= args.vocab <= 50_000, f"--vocab: must lie in [2, 50000], got {args.vocab}"),
        (min_trajectories <= args.trajectories <= 10_000,
         f"--trajectories: must lie in [{min_trajectories}, 10000], got {args.trajectories}"),
        (args.roots_per_trajectory >= 1, f"--roots-per-trajectory: must be >= 1, got {args.roots_per_trajectory}"),
        (args.spacing >= 1, f"--spacing: must be >= 1, got {args.spacing}"),
        (1 <= args.K_max <= 8, f"--K-max: must lie in [1, 8], got {args.K_max}"),
        (0 <= args.L_max <= 16, f"--L-max: must lie in [0, 16], got {args.L_max}"),
        (args.samples >= 2, f"--samples: must be >= 2 (half the draws choose, half report), got {args.samples}"),
        (args.method == "mc" or (args.backend == "synthetic" and not args.capture),
         "--method exact: only for synthetic worlds (real models have too many trees)"),
        (0 < args.cost_ratio < inf, f"--cost-ratio: must be a finite number > 0, got {args.cost_ratio}"),
        (0 <= args.per_token < inf, f"--per-token: must be a finite number >= 0, got {args.per_token}"),
        (args.jobs >= 1, f"--jobs: must be >= 1, got {args.jobs}"),
        (args.seed >= 0, f"--seed: must be >= 0, got {args.seed}"),
    ]
    check_flags(prog, list(checks) + shared)
    try:
        parse_settings(args.settings)
    except ValueError as exc:
        fail(prog, str(exc))
