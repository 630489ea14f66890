"""The study kit: the one source config and flag group of every study, and the latency flags of the grid studies.

``SourceConfig`` holds every source field once; a study's own config extends it (its defaults
differ: ``divergence_by_depth`` walks one trajectory of 24 roots, the grid studies four of two).
``add_source_flags`` adds the group to a ``backends.cli.ToolParser``; ``make_source`` builds
the source the flags ask for:

* ``--capture DIR...`` replays captures (``capture``); else ``--backend`` picks ``synthetic``
  or ``hf``; ``--pair NAME`` (``backends.pretrained``) is the ``hf`` source on a named pretrained
  pair, ``--draft`` then naming its draft (``early-exit:L``, ``adapter:L``, ``quant:B:G``) and ``--target`` refused;
* a source field given on the command line that the chosen source does not honour (its
  ``honours``) is refused with one line (the field's own reason where it has one, ``FIELD_REASONS``:
  ``--evaluation``, ``--trajectory``, ``--device`` and ``--dtype`` apply to live models only; else the source's, ``NOT_HONOURED``), and so is any
  study flag the study lists as not honoured by that source (for example ``--shape`` with a
  capture, whose trees are captured);
* a flag that names a file, folder or model (``NAMING_FLAGS``) given an empty value is refused
  with one line naming it, before any other check of the study's (``check_named``);
* live models open on ``--device``; ``auto`` or ``cuda`` in a sharded run (``WORLD_SIZE`` > 1) is the rank's
  own GPU, ``cuda:LOCAL_RANK`` modulo the GPUs it sees (``live_device``, as the capture does: ``backends.cli.shard_device``);
* errors of the core and the backends (``"vocab: must be ..."``) come back as the flag's error
  (``"--vocab: must be ..."``): ranges are checked once, where they are defined;
* every file and folder the flags name (model folders, prompt file, capture folders, latency
  profile file) is checked before a model loads or the output folder is made (``check_paths``).

Sampling settings: ``--settings`` takes ``ddte`` (DDTE's eight) or a comma list of entries
``T``, ``T:top_p`` or ``T:top_p:top_k`` (an empty field means off, e.g. ``1::40``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace
from pathlib import Path

from backends.cli import ToolParser, fail, flag_message, prepare_out, progress, shard_device, shard_environment, slow_step
from backends.pretrained import DEFAULT_DRAFT, PAIRS, pair_gpu_profile, pair_study_defaults, parse_draft
from backends.sources import SOURCES, CaptureSource, HFSource, SyntheticSource
from backends.synthetic import WORLDS
from backends.tree_cache import EVALUATIONS
from simlab.latency import LatencyModel
from simlab.latency_profiles import listing, load
from simlab.pairs import TRAJECTORY_METHODS
from simlab.sampling import parse_settings
from simlab.trees import DRAFT_LAWS

SOURCE_FIELDS = (
    "backend",
    "pair",
    "world",
    "vocab",
    "target",
    "draft",
    "prompts",
    "capture",
    "trajectories",
    "roots_per_trajectory",
    "spacing",
    "settings",
    "seed",
    "device",
    "dtype",
    "evaluation",
    "trajectory",
)
NOT_HONOURED = {
    "synthetic": "it applies to --backend hf only",
    "hf": "it applies to synthetic worlds only",
    "capture": "a capture brings its own roots, trees and sampling settings",
}
"""Why a source cannot honour a source field it does not read (``check_honoured``)."""
LIVE_ONLY = "it applies to live models only: --backend hf or --pair"
FIELD_REASONS = {
    "evaluation": LIVE_ONLY,
    "trajectory": LIVE_ONLY,
    "device": LIVE_ONLY,
    "dtype": LIVE_ONLY + " (a capture's models, where a study opens them, load at the dtype the capture recorded)",
}
"""A source field's own reason, said instead of ``NOT_HONOURED``'s for every source that does not read it."""
NAMING_FLAGS = ("target", "draft", "prompts", "capture", "drafters", "selector")
"""The dests of the flags that name a file, folder or model (a study's own among them, where it has
the flag): an empty value is refused (``check_named``)."""


@dataclass(frozen=True)
class SourceConfig:
    """Where a study's roots come from (the shared flags; every field is one flag)."""

    backend: str = "synthetic"
    pair: str | None = None
    world: str = "depth_profile"
    vocab: int = 32
    target: str | None = None
    draft: str | None = None
    prompts: str | None = None
    capture: tuple[str, ...] = ()
    trajectories: int = 4
    roots_per_trajectory: int = 2
    spacing: int = 16
    settings: str = "1"
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    evaluation: str = "cached"
    trajectory: str = "cached"


def add_source_flags(parser: ToolParser, d: SourceConfig, *, many_settings: bool = True) -> None:
    """Add the source flags to ``parser`` with the defaults of ``d`` (a study's ``Config()``)."""
    group = parser.add_argument_group("source of roots")
    group.add_argument(
        "--backend",
        choices=[n for n in SOURCES if n != "capture"],
        default=d.backend,
        action=_Backend,
        help="a synthetic world, or two live Hugging Face models (--target, --draft)",
    )
    group.add_argument(
        "--pair",
        choices=list(PAIRS),
        default=d.pair,
        action=_Pair,
        help=f"a named pretrained pair on --backend hf (fetched and converted on first use; --draft: "
        f"early-exit:L, a trained adapter:L or the quantised self-draft quant:B:G, default {DEFAULT_DRAFT})",
    )
    group.add_argument("--world", default=d.world, help=f"synthetic world: {', '.join(WORLDS)}")
    group.add_argument("--vocab", type=int, default=d.vocab, help="synthetic: vocabulary size V (2..50000)")
    group.add_argument("--target", default=d.target, help="hf: target model folder or hub id")
    group.add_argument("--draft", default=d.draft, help="hf: draft model folder or hub id")
    group.add_argument(
        "--prompts", default=d.prompts, help="hf: prompt file, text or .jsonl (default: the shipped reference prompts)"
    )
    group.add_argument(
        "--capture",
        nargs="+",
        default=d.capture,
        help="replay captures (python -m backends.capture --full), one folder per sampling setting",
    )
    group.add_argument(
        "--trajectories",
        type=int,
        default=d.trajectories,
        help="trajectories (hf: prompts used, from the top of the file; a study that captures every prompt refuses it)",
    )
    group.add_argument("--roots-per-trajectory", type=int, default=d.roots_per_trajectory, help="roots along each trajectory")
    group.add_argument("--spacing", type=int, default=d.spacing, help="tokens between roots")
    group.add_argument(
        "--settings",
        default=d.settings,
        help=("'ddte' (DDTE's eight) or a comma list of " if many_settings else "one sampling setting: ")
        + "T, T:top_p or T:top_p:top_k (e.g. 0.6, 1:0.9, 1::40; T = 0 is greedy)",
    )
    group.add_argument("--seed", type=int, default=d.seed, help="seed of the world, trajectories and draws")
    group.add_argument("--device", default=d.device, help="hf: device of the models (auto, cpu, cuda, cuda:N)")
    group.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=d.dtype, help="hf: model weights")
    group.add_argument(
        "--evaluation",
        choices=EVALUATIONS,
        default=d.evaluation,
        help="hf: how a root's tree nodes are evaluated: 'cached' (the root's context prefilled once, each node "
        "evaluated once for every tree and table of the root: backends.tree_cache.RootCache) or 'plain' (the "
        "pair's tree forward per fetch, the reference; the same values to float32 rounding)",
    )
    group.add_argument(
        "--trajectory",
        choices=TRAJECTORY_METHODS,
        default=d.trajectory,
        help="hf: how the target's p is evaluated while it continues each prompt to place the roots: 'cached' "
        "(its KV cache, one prefill per prompt, as the capture tool does) or 'forward' (the whole context at "
        "every token, the reference; the same law and uniforms, p equal to float32 rounding)",
    )


class _Backend(argparse.Action):
    """``--backend``: also records the value written (``--pair`` refuses another backend than hf)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        parser.backend_written = values


class _Pair(argparse.Action):
    """``--pair``: a named pair is the hf source."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.backend = "hf"


def source_kind(config: SourceConfig) -> str:
    return "capture" if config.capture else config.backend


def check_honoured(
    prog: str, parser: ToolParser, config: SourceConfig, study_refusals: dict | None = None, study_honours: dict | None = None
) -> None:
    """Exit 2 if a flag given on the command line cannot be honoured by the chosen source, or if a
    file or folder the flags name is not usable (``check_paths``: before any model is loaded).

    ``study_refusals``: ``{source name: {dest: reason}}`` for the study's own flags, or
    ``{dest: (reason, values)}`` to refuse only values outside ``values`` (what the source does anyway);
    ``study_honours``: ``{source name: {dest, ...}}`` source fields the study itself uses with
    that source (for example ``--device`` for the live feature models of a capture).
    """
    kind = source_kind(config)
    given = parser.given
    if kind == "capture" and "backend" in given:
        fail(prog, f"--backend: the capture source cannot honour it ({NOT_HONOURED['capture']}); drop --backend or --capture")
    if "pair" in given and getattr(parser, "backend_written", "hf") != "hf":
        fail(prog, f"--pair: a named pair is the hf source; drop --backend {parser.backend_written}")
    if "pair" in given and "target" in given:
        fail(prog, "--target: --pair brings its own target; drop --target (--draft names the pair's draft)")
    honoured = SOURCES[kind].honours | {"backend", "capture"} | set((study_honours or {}).get(kind, ()))
    for dest in SOURCE_FIELDS:
        if dest in given and dest not in honoured:
            fail(prog, f"{parser.flag(dest)}: the {kind} source cannot honour it ({FIELD_REASONS.get(dest, NOT_HONOURED[kind])})")
    for dest, refusal in (study_refusals or {}).get(kind, {}).items():
        reason, allowed = refusal if isinstance(refusal, tuple) else (refusal, ())
        if dest in given and getattr(config, dest) not in allowed:
            fail(prog, f"{parser.flag(dest)}: the {kind} source cannot honour it ({reason})")
    check_paths(prog, config, given)


def check_named(prog: str, parser: ToolParser, args: argparse.Namespace) -> None:
    """Exit 2 with one line (``"--drafters: got an empty value; ..."``) when a flag of
    ``NAMING_FLAGS`` was written on the command line (``parser.given``) with an empty or blank
    value (for ``--capture``, any of its folders).  ``analyses._study.parse`` calls it on the parsed
    flags before the study's own checks."""
    for dest in NAMING_FLAGS:
        if dest not in parser.given:
            continue
        value = getattr(args, dest, None)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            fail(prog, f"{parser.flag(dest)}: got an empty value; name a file, folder or model, or leave the flag out")


def live_device(prog: str, device: str) -> str:
    """The device live models open on for ``--device`` ``device`` in this process:
    ``backends.cli.shard_device`` over the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``: ``backends.cli.shard_environment``), so ``auto`` (or ``cuda``) in a sharded run
    is ``cuda:LOCAL_RANK`` modulo the visible GPUs where CUDA is usable (``auto`` else ``cpu``) and any other value is kept as given.
    Exit 2 with one line for an environment that cannot shard."""
    try:
        _, world, local = shard_environment(os.environ)
    except ValueError as exc:
        fail(prog, str(exc))
    return shard_device(device, world, local)


PATH_FLAGS = {"target": "--target", "draft": "--draft", "prompts": "--prompts", "capture": "--capture", "latency": "--latency"}
"""The source and latency fields that name files or folders, and their flags."""


def check_paths(prog: str, config, given=frozenset()) -> None:
    """Exit 2 with one line unless every file and folder ``config`` names is usable, reading no model:
    on ``--backend hf`` the model folders (``backends.sources.live.check_models``; hub ids pass) and
    the prompt file (read in full, ``backends.roots.read_prompt_records``); each ``--capture``
    folder's settings.json (``backends.capture_store.load_settings``); a ``--latency`` profile
    (a published name, or a .json/.toml file read in full; ``probe`` and ``''`` pass; with
    ``--cost-ratio`` also among ``given``, the flags written, ``make_latency`` refuses the pair).  Called by
    ``check_honoured`` (so ``make_source``) and ``study_out`` before they load or create anything, so that
    a wrong path costs no model load and leaves no folder behind."""
    from backends import capture_store
    from backends.roots import read_prompt_records
    from backends.sources.live import check_models

    try:
        if config.capture:
            for folder in config.capture:
                capture_store.load_settings(folder)
        elif config.backend == "hf":
            check_models(config.target, config.draft, config.pair)
            if config.prompts is not None:
                read_prompt_records(config.prompts)
        latency = getattr(config, "latency", None)
        if latency and latency != "probe" and "cost_ratio" not in given:
            load(latency)
    except ValueError as exc:
        fail(prog, flag_message(exc, None, PATH_FLAGS))


def make_source(
    prog: str,
    parser: ToolParser,
    config: SourceConfig,
    *,
    stream: str = "per_trajectory",
    grid: bool = True,
    depth: int = 16,
    max_settings: int | None = None,
    study_refusals: dict | None = None,
    study_honours: dict | None = None,
    quiet: bool = False,
    record=None,
):
    """(source, settings) for a study's flags, or exit 2 with one line.

    Args:
        stream: the synthetic source's seeding convention (``backends.sources.synthetic``).
        grid: captures must be grid captures (the action-grid studies).
        depth: the deepest tree the study draws below a root (checked against real models' context).
        max_settings: the most sampling settings the study takes at once (None: any).
        study_refusals, study_honours: see ``check_honoured``.
        quiet: no progress line even for a slow step (loading models, reading captures).
        record: a ``backends.sources.recorded.RecordedTrees`` (a study's keyword, not a flag): with
            ``--backend hf`` the live pair is recorded on those trees and replayed (``_recorded``).
    """
    check_honoured(prog, parser, config, study_refusals, study_honours)
    if record is not None and config.backend == "hf" and not config.capture:
        return _recorded(prog, parser, config, record, grid=grid, max_settings=max_settings, quiet=quiet)
    try:
        if config.capture:
            with slow_step(prog, f"reading {len(config.capture)} capture folder(s)", quiet):
                source = CaptureSource(tuple(config.capture), grid=grid)
            settings = source.fixed_settings()
        else:
            settings = parse_settings(config.settings)
            if config.backend == "hf":
                draft = parse_draft(config.draft, config.pair) if config.pair else config.draft
                with slow_step(prog, f"loading {config.pair or config.target} and {draft}", quiet):
                    source = HFSource(
                        config.target,
                        config.draft,
                        config.prompts,
                        config.trajectories,
                        config.roots_per_trajectory,
                        config.spacing,
                        depth=depth,
                        seed=config.seed,
                        device=live_device(prog, config.device),
                        dtype=config.dtype,
                        pair=config.pair,
                        evaluation=config.evaluation,
                        trajectory=config.trajectory,
                    )
            else:
                source = SyntheticSource(
                    config.world,
                    config.vocab,
                    config.trajectories,
                    config.roots_per_trajectory,
                    config.spacing,
                    config.seed,
                    stream=stream,
                )
    except ValueError as exc:
        fail(prog, flag_message(exc, parser, {"backend": "--backend"}))
    _check_count(prog, config, settings, max_settings)
    return source, settings


def _check_count(prog: str, config: SourceConfig, settings, max_settings: int | None) -> None:
    """Exit 2 with one line when ``settings`` hold more than ``max_settings`` sampling settings."""
    if max_settings is not None and len(settings) > max_settings:
        where = "--capture" if config.capture else "--settings"
        fail(
            prog,
            f"{where}: this study takes {max_settings} sampling setting{'s' if max_settings > 1 else ''} at a time, got {len(settings)}",
        )


def _recorded(prog: str, parser: ToolParser, config, trees, *, grid: bool, max_settings: int | None, quiet: bool):
    """``make_source``'s ``record``: (the live pair recorded into ``<out>/capture-<hash>``, one capture
    per sampling setting, and replayed: ``backends.sources.recorded.record``; its settings).  The
    settings and the output folder (``study_out`` under ``live_slug``) are checked before a model
    loads; a rerun with the same flags resumes the same folders.  The capture tool's errors
    (``prompts: ...``, ``out: ...``) propagate as ``ValueError`` to the caller (the study runner
    maps them onto flags)."""
    from backends.sources import recorded

    try:
        settings = parse_settings(config.settings)
    except ValueError as exc:
        fail(prog, flag_message(exc, parser, {"backend": "--backend"}))
    _check_count(prog, config, settings, max_settings)
    slug = recorded.live_slug(config.target, config.draft, config.pair)
    out = study_out(prog, config, slug)
    progress(prog, f"capturing p and q on the draft trees of every root into {out}/capture-*", quiet)
    captures = [
        recorded.recording_settings(
            trees,
            setting,
            target=config.target,
            draft=config.draft,
            pair=config.pair,
            prompts=config.prompts,
            roots_per_prompt=config.roots_per_trajectory,
            spacing=config.spacing,
            dtype=config.dtype,
            seed=config.seed,
            evaluation=config.evaluation,
            trajectory=config.trajectory,
        )
        for setting in settings
    ]
    device = live_device(prog, config.device)
    return recorded.record(captures, out, device=device, quiet=quiet, grid=grid, slug=slug), settings


# -- latency flags (the action-grid studies) ------------------------------------------------------
@dataclass(frozen=True)
class LatencyConfig:
    """How a study times a step: a profile file, a cost ratio, or the source's own latency."""

    cost_ratio: float = 0.1
    per_token: float = 0.01
    latency: str | None = None


def study_parser(prog: str, doc: str, defaults) -> ToolParser:
    """A study's parser with the source and latency flag groups (defaults from its ``Config()``);
    the description is the first paragraph of ``doc``."""
    parser = ToolParser(prog=prog, description=doc.split("\n\n")[0])
    add_source_flags(parser, defaults)
    add_latency_flags(parser, defaults)
    return parser


def study_config(config_type, args: argparse.Namespace, **fields):
    """A study's config dataclass from its parsed flags: every flag's value, ``--capture`` as a
    tuple of folders, and ``fields`` (the values a study normalised, e.g. parsed lists) overriding."""
    return config_type(**{**vars(args), "capture": tuple(args.capture), **fields})


def default_out(prog: str, slug: str) -> str:
    """Where a study's run goes without ``--out``: ``out/<study>/<slug>`` (the study named by
    ``prog``, ``python -m analyses.<study>``; ``slug`` names the source, ``Source.slug()``)."""
    return f"out/{prog.rsplit('.', 1)[-1]}/{slug}"


def study_out(prog: str, config, slug: str) -> Path:
    """The run's output folder, ready to write (``backends.cli.prepare_out``): ``config.out``, else
    ``default_out(prog, slug)``; exits 2 with one line when it cannot be written, or, before it
    creates anything, when a file or folder the source flags name is not usable (``check_paths``)."""
    check_paths(prog, config)
    return prepare_out(prog, config.out if config.out is not None else default_out(prog, slug))


def note_hf_defaults(parser: ToolParser, defaults: dict) -> None:
    """Say in ``--help`` which flags take another default with ``--backend hf`` (``defaults``:
    field -> value, as ``with_hf_defaults`` applies them); call before ``parse_args``."""
    for action in parser._actions:
        if action.dest in defaults and action.help and defaults[action.dest] != action.default:
            if "(default" in action.help:
                action.help = f"{action.help} (with --backend hf: {defaults[action.dest]})"
            else:
                action.help = f"{action.help} (default: {action.default}; with --backend hf: {defaults[action.dest]})"


def with_hf_defaults(config, parser: ToolParser, defaults: dict, **also):
    """``config`` with a study's live-model defaults (``defaults``, then ``also``, then the named
    pair's own, ``backends.pretrained.pair_study_defaults``: ``--pair qwen2.5-coder`` places 3 roots
    along each reply) for every field not given on the command line, when it runs on
    ``--backend hf`` (else unchanged)."""
    if config.backend != "hf" or config.capture:
        return config
    merged = {**defaults, **also, **pair_study_defaults(getattr(config, "pair", None))}
    return replace(config, **{k: v for k, v in merged.items() if k not in parser.given})


def add_draft_law_flag(group, default: str = "raw") -> None:
    """``--draft-law``: what deterministic trees are ranked by (``drafting_table``)."""
    group.add_argument(
        "--draft-law",
        choices=DRAFT_LAWS,
        default=default,
        help="what deterministic trees rank by: the drafters' untempered (T = 1) law, as EAGLE's, TreeGraft's "
        "and SpecBlock's code do, or the setting's tempered q (at T = 0 one-hot: every tree a chain)",
    )


class _Latency(argparse.Action):
    """``--latency list`` prints the published profiles and exits 0; any other value is stored."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values == "list":
            print(listing())
            parser.exit(0)
        setattr(namespace, self.dest, values)


def add_latency_flags(parser: ToolParser, d: LatencyConfig) -> None:
    group = parser.add_argument_group("latency model")
    group.add_argument(
        "--latency",
        default=d.latency,
        action=_Latency,
        help="a published profile NAME (--latency list shows them; simlab.latency_profiles), 'probe' (the "
        "source's measured forward times: live models on this machine, or a capture's latency.json), "
        "or a profile file (.json or .toml; see simlab.latency)",
    )
    group.add_argument(
        "--cost-ratio",
        type=float,
        default=d.cost_ratio,
        help="c = t_q / t_p of a synthetic latency model (the default for synthetic worlds and for captures without latency.json)",
    )
    group.add_argument(
        "--per-token",
        type=float,
        default=d.per_token,
        help="extra time per extra token in a forward, as a fraction of the one-token time (cost-ratio model)",
    )


def make_latency(prog: str, parser: ToolParser, config, source, largest_tree: int, gpu_profile: str | None = None):
    """The latency model, in this order: ``--latency NAME|probe|FILE`` (a published profile,
    ``simlab.latency_profiles``; the source's own measured times; a profile file); an explicit
    ``--cost-ratio``; on a pretrained pair (``--pair``, or a capture of one) without ``--latency``
    (``--latency ''`` asks for no profile) the study's published
    GPU profile ``gpu_profile`` (the seed-claim studies name one: the papers time their claims on
    GPUs, where a target forward is nearly flat in tokens, not on this CPU), said on stderr; the
    source's own (a capture's ``latency.json``, a warm-up benchmark of live models); else the
    cost-ratio model with the defaults.  Exit 2 on conflicting or unusable flags."""
    given = parser.given
    if gpu_profile and getattr(source, "named_pair", None):  # a pair's own published profile comes first
        gpu_profile = pair_gpu_profile(source.named_pair) or gpu_profile
    if gpu_profile and "latency" not in given and "cost_ratio" not in given and getattr(source, "named_pair", None):
        if "per_token" in given:
            fail(
                prog,
                f"--per-token: the pretrained pair's default is the published GPU profile {gpu_profile!r}; "
                "--per-token applies to the cost-ratio model (give --cost-ratio too)",
            )
        model = load(gpu_profile)
        ratio = source.draft_weight_ratio() if hasattr(source, "draft_weight_ratio") else None
        if ratio is None:
            said = "its own draft time (the pair's draft cost is unknown here: the target was never converted on this machine)"
        else:
            said = f"the draft timed as {ratio:.3f} x its target forward (the weights the pair's draft reads per token)"
            model = replace(
                model,
                draft=model.target.scaled(ratio),
                source=f"{model.source}; draft {getattr(source, 'draft', '')}: {ratio:.3f} x the target's forward "
                "(weights read per token, memory-bound decoding), not the profile's draft",
            )
        progress(
            prog,
            f"latency: the published GPU profile {gpu_profile!r}, {said} (this study's default on the pretrained pair "
            f"{source.named_pair}; --latency probe for this machine's times)",
            getattr(config, "quiet", False),
        )
        return model
    if config.latency and "cost_ratio" in given:
        how = "was given" if "latency" in given else f"is this study's default ({config.latency!r}; pass --latency '' to drop it)"
        fail(prog, f"--cost-ratio: a latency profile (--latency) {how}; use one of the two")
    try:
        if config.latency:
            if "per_token" in given:
                fail(prog, "--per-token: a latency profile (--latency) was given; --per-token applies to the cost-ratio model")
            if config.latency == "probe":
                own = source.latency(largest_tree)
                if own is None:
                    fail(
                        prog,
                        f"--latency: probe measures live models (--backend hf, --pair) or replays a capture's latency.json; "
                        f"the {source.name} source has none",
                    )
                return own
            return load(config.latency)
        if "cost_ratio" not in given:
            own = source.latency(largest_tree)
            if own is not None:
                if "per_token" in given:
                    fail(
                        prog,
                        f"--per-token: the {source.name} source brings its own latency ({own.source}); "
                        "--per-token applies to the cost-ratio model",
                    )
                return own
        return LatencyModel.from_cost_ratio(config.cost_ratio, per_token=config.per_token)
    except ValueError as exc:
        fail(prog, flag_message(exc, parser, {"c": "--cost-ratio", "per_token": "--per-token"}))


def with_drafter_time(latency, name: str, ratio: float, flag: str, parser: ToolParser):
    """``latency`` with the forward time of the extra drafter ``name`` (TreeGraft's ``small``,
    SpecBlock's ``block``): the latency model's own when it has one (a published profile that
    gives it) and ``flag`` was not given, else ``ratio`` times a one-token target forward."""
    from simlab.latency import ForwardTime

    if any(n == name for n, _ in latency.drafters) and flag not in parser.given:
        return latency
    return latency.with_drafter(name, ForwardTime.constant(ratio * latency.target(0, 1)))
