"""A live pair recorded, then replayed: the ``hf`` source of a study that reads p and q at every node
of a tree, and keeps them.

``record`` runs the capture tool in this process (``backends.capture.run``, as
``python -m backends.capture --full``) into ``<folder>/capture-<hash>``, one capture per sampling
setting, and returns the ``CaptureSource`` over those folders (a ``RecordedSource``).  The hash is
the first 10 hex digits of the SHA-256 of the capture settings as sorted JSON (``capture_folder``):
a rerun with the same flags resumes the same folder (the capture tool skips the roots it holds
already) and other settings never collide.  ``analyses._flags.make_source`` calls it for
``--backend hf`` when a study passes ``record=RecordedTrees(...)`` (the main job,
``analyses.divergence_by_depth``): the study then replays the capture and can keep its own
per-root results beside it.

Sources: the capture format is ``backends.capture_store``; the tool, ``backends.capture``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from backends.capture import run
from backends.capture_store import SHAPES, CaptureSettings
from backends.pretrained import parse_draft
from backends.roots import SHIPPED_PROMPTS
from backends.sources.replay import CaptureSource
from simlab.checks import check_int
from simlab.pairs import TRAJECTORY_METHODS
from simlab.sampling import SamplingSettings


@dataclass(frozen=True)
class RecordedTrees:
    """The draft trees a recording captures at every root: the capture tool's ``--shape``,
    ``--width`` (K), ``--depth`` (tokens below the root) and ``--trunk`` (L1 of a delayed tree;
    recorded, and part of the folder's hash, with every shape).

    Raises:
        ValueError: ``shape: ...`` for a shape outside ``backends.capture_store.SHAPES``;
            ``width: ...`` or ``depth: ...`` for an integer below 1; ``trunk: ...`` below 0.
    """

    shape: str = "iid"
    width: int = 4
    depth: int = 4
    trunk: int = 1

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"shape: must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        object.__setattr__(self, "width", check_int(self.width, "width", 1))
        object.__setattr__(self, "depth", check_int(self.depth, "depth", 1))
        object.__setattr__(self, "trunk", check_int(self.trunk, "trunk", 0))


CAPTURE_EVALUATION = {"cached": "cached", "plain": "forward"}
"""The studies' ``--evaluation`` as the capture tool's (``backends.capture --evaluation``)."""


def recording_settings(
    trees: RecordedTrees,
    setting: SamplingSettings,
    *,
    target: str | None,
    draft: str | None,
    pair: str | None = None,
    prompts: str | None = None,
    roots_per_prompt: int = 4,
    spacing: int = 8,
    dtype: str = "float32",
    seed: int = 0,
    evaluation: str = "cached",
    trajectory: str = "cached",
) -> CaptureSettings:
    """The ``--full`` capture settings of a recording: ``trees`` drawn at ``roots_per_prompt`` roots
    ``spacing`` tokens apart along each prompt's continuation under ``setting`` (temperature, top-p,
    top-k), on ``target`` and ``draft`` (model folders or hub ids) or on the named pair ``pair``
    (``backends.pretrained``; ``target`` is then ignored and ``draft`` is the pair's draft spec,
    None: its default), from ``prompts`` (None: the shipped reference prompts); ``evaluation``:
    the studies' ``--evaluation`` (``backends.tree_cache.EVALUATIONS``: ``cached`` keeps the KV caches
    from level to level, ``plain`` is the capture's ``forward``); ``trajectory``: the studies'
    ``--trajectory`` (``simlab.pairs.TRAJECTORY_METHODS``, the capture's own field).  Checks nothing
    beyond ``trees``, ``evaluation`` and ``trajectory``: the capture tool checks the rest when it runs."""
    if evaluation not in CAPTURE_EVALUATION:
        raise ValueError(f"evaluation: must be one of {', '.join(CAPTURE_EVALUATION)}, got {evaluation!r}")
    if trajectory not in TRAJECTORY_METHODS:
        raise ValueError(f"trajectory: must be one of {', '.join(TRAJECTORY_METHODS)}, got {trajectory!r}")
    if not isinstance(trees, RecordedTrees):
        raise ValueError(f"trees: must be a RecordedTrees, got {type(trees).__name__}")
    if not isinstance(setting, SamplingSettings):
        raise ValueError(f"setting: must be a SamplingSettings, got {type(setting).__name__}")
    if pair:
        target, draft = "", parse_draft(draft, pair)
    return CaptureSettings(
        target,
        draft,
        prompts or str(SHIPPED_PROMPTS),
        roots_per_prompt,
        spacing,
        trees.shape,
        trees.width,
        trees.depth,
        trees.trunk,
        setting.temperature,
        setting.top_p,
        setting.top_k,
        dtype=dtype,
        full=True,
        seed=seed,
        pair=pair or "",
        evaluation=CAPTURE_EVALUATION[evaluation],
        trajectory=trajectory,
    )


def capture_folder(settings: CaptureSettings, folder) -> Path:
    """``<folder>/capture-<hash>``: the first 10 hex digits of the SHA-256 of ``settings`` (every
    field, as JSON with sorted keys), so that equal settings name the same folder."""
    digest = hashlib.sha256(json.dumps(asdict(settings), sort_keys=True).encode()).hexdigest()[:10]
    return Path(folder) / f"capture-{digest}"


def live_slug(target: str | None, draft: str | None, pair: str | None = None) -> str:
    """The name of a recording study's output folder: ``hf-<pair>-<draft spec or 'default'>`` on a
    named pair, else ``hf-<target folder name>-<draft folder name>``."""
    return f"hf-{pair}-{draft or 'default'}" if pair else f"hf-{Path(target).name}-{Path(draft).name}"


class RecordedSource(CaptureSource):
    """The ``CaptureSource`` (``grid`` as there) over a recording's capture folders ``captures`` (one
    per sampling setting), which lie in the study's output folder ``out``; ``slug()`` names that
    folder (``live_slug``)."""

    def __init__(self, captures, out, slug: str, grid: bool = False):
        super().__init__(tuple(str(c) for c in captures), grid=grid)
        self.out, self._slug = Path(out), slug

    def slug(self) -> str:
        return self._slug


def record(settings, folder, *, device: str = "auto", quiet: bool = False, grid: bool = False, slug: str = "") -> RecordedSource:
    """Capture every root of ``settings`` (one ``CaptureSettings``, or several: one capture each, one
    sampling setting each) not yet in its ``capture_folder(settings, folder)`` (created if absent;
    ``folder`` is the study's output folder) with ``backends.capture.run`` on ``device`` (``quiet``:
    no progress bar), then return the source replaying them (``RecordedSource``, named ``slug``).

    Raises:
        ValueError: ``settings: ...`` for settings that are not ``CaptureSettings`` with ``full``
            (a recording replays p and q), or none; the capture tool's errors (``prompts: ...``,
            ``target: ...``, ``out: ...`` for a folder held by another run...); ``capture: ...``
            from the replay (``CaptureSource``: two captures of one setting, among others).
    """
    captures = (settings,) if isinstance(settings, CaptureSettings) else tuple(settings)
    if not captures or not all(isinstance(c, CaptureSettings) and c.full for c in captures):
        raise ValueError("settings: a recording replays p and q; pass CaptureSettings with full=True (recording_settings)")
    folders = [capture_folder(c, folder) for c in captures]
    for capture, path in zip(captures, folders):
        path.mkdir(parents=True, exist_ok=True)
        run(capture, path, device=device, quiet=quiet)
    return RecordedSource(folders, folder, slug, grid=grid)
