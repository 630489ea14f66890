"""What the action-grid studies (``compare_verifiers``, ``train_selector``) share: their config, the
grid and parallelism flags on top of the source and latency flags, and the set-up of source,
settings and latency from those flags (one line and exit 2 on any bad argument)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from backends.cli import ToolParser, check_flags, fail, progress
from simlab.checks import check_device
from analyses._flags import LatencyConfig, SourceConfig, add_latency_flags, add_source_flags, make_latency, make_source
from simlab.grid import GridAxes

_EXACT = ("--method exact enumerates the trees of synthetic worlds only", ("mc",))
_JOBS = ("worker processes run over the settings of synthetic worlds only", (1,))
GRID_REFUSALS = {
    "capture": {"method": _EXACT, "jobs": _JOBS},
    "hf": {"method": _EXACT, "jobs": _JOBS},
}

GPU_PROFILE = "specblock-a100"
"""The latency profile (``simlab.latency_profiles``) on a pretrained pair without --latency: the grid studies' default on the pretrained pair: DDTE publishes no timing (simlab.latency_profiles.UNPUBLISHED), so the closest published A100 verify/draft times (SpecBlock's, an 8B target with an EAGLE-style draft)."""


@dataclass(frozen=True)
class GridStudyConfig(SourceConfig, LatencyConfig):
    """The flags every action-grid study shares: the source of roots (``SourceConfig``), the latency
    model (``LatencyConfig``), the grid {1..K_max} x {0..L_max}^2, parallelism; a study extends it."""

    settings: str = "ddte"
    K_max: int = 4
    L_max: int = 8
    samples: int = 4
    method: str = "mc"
    engine: str = "numpy"
    engine_device: str = "cpu"
    jobs: int = 2
    quiet: bool = False

    def axes(self) -> GridAxes:
        """The grid's axes: {1..K_max} x {0..L_max}^2 (``simlab.grid.GridAxes``)."""
        Ls = tuple(range(self.L_max + 1))
        return GridAxes(tuple(range(1, self.K_max + 1)), Ls, Ls)


def add_grid_study_flags(parser: ToolParser, d: GridStudyConfig) -> None:
    """The source, latency and grid flags with the defaults of ``d`` (a study's ``Config()``)."""
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    group = parser.add_argument_group("action grid")
    group.add_argument("--K-max", type=int, default=d.K_max, help="largest K of the grid (1..8)")
    group.add_argument("--L-max", type=int, default=d.L_max, help="largest L1 and L2 of the grid (0..16)")
    group.add_argument(
        "--samples", type=int, default=d.samples, help="trees drawn per L1 and root (DDTE: s = 4; >= 2: half choose, half report)"
    )
    group.add_argument(
        "--method",
        choices=["mc", "exact"],
        default=d.method,
        help="exact: enumerate every tree of every action (tiny synthetic worlds only)",
    )
    group.add_argument(
        "--engine",
        choices=["numpy", "torch"],
        default=d.engine,
        help="labels from the numpy plans, or from the batched torch engine (simlab.batched) for the verifiers it implements",
    )
    group.add_argument("--engine-device", default=d.engine_device, help="--engine torch: its device (auto, cpu, cuda, cuda:N)")
    group.add_argument(
        "--jobs", type=int, default=min(d.jobs, os.cpu_count() or 1), help="worker processes over settings (synthetic worlds)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no table")


def check_grid_study_flags(prog: str, args, checks, *, min_trajectories: int = 1) -> None:
    """Exit 2 with one line on the first failing check: the study's own ``checks`` first, then
    the grid flags (``min_trajectories``: 3 where roots are split train / validation / test)."""
    engine_device, device_error = args.engine_device, None
    if args.engine == "torch":
        try:
            engine_device = check_device(args.engine_device, "--engine-device")
        except ValueError as exc:
            device_error = str(exc)
    check_flags(
        prog,
        list(checks)
        + [
            (args.trajectories >= min_trajectories, f"--trajectories: must be >= {min_trajectories}, got {args.trajectories}"),
            (args.trajectories <= 10_000, f"--trajectories: at most 10000, got {args.trajectories}"),
            (1 <= args.K_max <= 8, f"--K-max: must lie in [1, 8], got {args.K_max}"),
            (0 <= args.L_max <= 16, f"--L-max: must lie in [0, 16], got {args.L_max}"),
            (args.samples >= 2, f"--samples: must be >= 2 (half the draws choose, half report), got {args.samples}"),
            (args.jobs >= 1, f"--jobs: must be >= 1, got {args.jobs}"),
            (
                args.engine == "numpy" or args.method == "mc",
                "--engine: --method exact enumerates trees; only --method mc uses an engine",
            ),
            (args.engine_device == "cpu" or args.engine == "torch", "--engine-device: only with --engine torch"),
            (device_error is None, device_error),
            (
                args.engine == "numpy" or not engine_device.startswith("cuda") or args.jobs == 1,
                "--jobs: must be 1 with a CUDA --engine-device (worker processes are forked)",
            ),
        ],
    )


def grid_source(prog: str, parser: ToolParser, config: GridStudyConfig, study_honours: dict | None = None):
    """(source, settings, latency) for a grid study's flags, or exit 2 with one line
    (``study_honours``: see ``analyses._flags.check_honoured``)."""
    source, settings = make_source(
        prog,
        parser,
        config,
        stream="per_trajectory",
        grid=True,
        depth=2 * config.L_max,
        study_refusals=GRID_REFUSALS,
        study_honours=study_honours,
        quiet=config.quiet,
    )
    if source.name == "capture":
        for folder, stored in source.captures.values():
            if "samples" in parser.given and config.samples != stored.samples:
                fail(
                    prog,
                    f"--samples: the capture source cannot honour it ({folder!r} holds {stored.samples} trees per L1; "
                    "a capture brings its own trees)",
                )
            held, wanted = stored.grid_axes(), config.axes()
            if held.width < wanted.width or held.depth < wanted.depth:
                fail(
                    prog,
                    f"--capture: {folder!r} holds K <= {stored.width} and L1, L2 <= {stored.depth}; "
                    f"pass --K-max {stored.width} --L-max {stored.depth} or less",
                )
    gpu_default = getattr(source, "named_pair", None) and "latency" not in parser.given  # make_latency's GPU profile
    if (
        source.name == "hf"
        and "cost_ratio" not in parser.given
        and (config.latency == "probe" or not (config.latency or gpu_default))
    ):
        progress(prog, "measuring the forward times of both models on this machine (warm-up benchmark)", config.quiet)
    latency = make_latency(prog, parser, config, source, config.axes().largest_tree, gpu_profile=GPU_PROFILE)
    return source, settings, latency
