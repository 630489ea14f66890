"""The capture store: the file format of captures of p and q on draft trees, its writer, its
reader, and ``CapturedPair``, which replays p and q bit for bit.  (The tool that makes
captures is ``python -m backends.capture``.)

A capture folder holds:

* ``settings.json``: the ``CaptureSettings`` that determine its content, with the number of its
  format (``backends.capture_format``: an older file is read through ``upgrade_settings``);
* ``nodes-r<root>.parquet``: one shard per root (its presence marks the root as done): root id,
  prompt index, prompt category (``category``; null without one; absent before the column), root position (context length), root context, node path, depth, token,
  multiplicity (drafts through the node; 1 for grid captures), number of children, TV, L1, KL
  both ways, entropies, and the top-``store_top`` ids and probabilities of p and q;
* ``drafts-r<root>.parquet`` (``shape="grid"``): the grid drafts (L1, sample, trunk, branches);
* ``labels-r<root>.parquet`` (``labels``, a grid capture with ``--labels``): the grid labels of
  the root computed at capture time (``simlab.labels.grid_labels`` rows with root and prompt;
  ``save_labels``, ``read_labels``);
* ``logits-r<root>.npz`` (``full=True``): both models' float32 logits per node, in node-row
  order (members ``target`` and ``draft``), the settings hash and the root id (``settings_sha256``,
  ``root``; archives written before the root member lack it), from which ``CapturedPair``
  recomputes p and q with the capture's sampling settings.

Every file is written atomically.  A damaged file (garbage, wrong schema, truncated archive,
bad CRC) raises ``simlab.errors.CaptureError`` (``"capture: ... is damaged (...)"``), never a library's own exception;
so does a shard holding another root than its file name says (its ``root`` column, or the logits
archive's ``root`` member, checked by every reader: a shard copied or renamed under another root's
name would count that root twice), and a settings.json field of the wrong type or out of range (the
message names the field).

The settings hash, the model fingerprints and what each reader and the writer refuse:
``docs/derivations/capture_store.md``.

**Resume.** A root counts as captured only when its files pass ``check_root`` (the node, drafts and
labels shards read in full with their root ids, the logits archive read through: every member's
CRC-32, its stamp, array headers and root id), so a damaged or misnamed root is captured again
rather than skipped.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import types
import typing
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import polars as pl

from backends import capture_format
from backends.cli import atomic_write, write_parquet
from backends.roots import RootPlacement
from simlab.errors import ArgumentError, CaptureError
from simlab.grid import GridAxes, GridDraft
from simlab.files import staging_file, umask
from simlab.pairs import TRAJECTORY_METHODS, check_contexts
from simlab.sampling import SamplingSettings
from simlab.builders import Delayed, named_shape

SHAPES = ("iid", "chain", "delayed", "grid")
LABEL_ENGINES = ("", "numpy", "torch", "unrecorded")
HASH_KEY = "simlab.settings_sha256"
"""The key of a parquet shard's metadata (and the member of a logits archive) holding its settings hash."""
NODE_COLUMNS = (
    "root",
    "prompt",
    "position",
    "root_context",
    "path",
    "depth",
    "token",
    "multiplicity",
    "children",
    "l1",
    "tv",
    "kl_pq",
    "kl_qp",
    "h_p",
    "h_q",
    "p_top_ids",
    "p_top_probs",
    "q_top_ids",
    "q_top_probs",
)
DRAFT_COLUMNS = ("root", "prompt", "root_context", "L1", "sample", "trunk", "branches")


@dataclass(frozen=True)
class CaptureSettings:
    """Everything that determines a capture's content (stored as settings.json).

    ``shape`` is ``iid``, ``chain``, ``delayed`` (``width`` K, ``depth``, ``trunk`` L1) or
    ``grid`` (``samples`` trees ``Delayed(width, L1, depth)`` for every L1 in 0..depth).
    """

    target: str
    draft: str
    prompts: str
    roots_per_prompt: int = 4
    spacing: int = 8
    shape: str = "iid"
    width: int = 4
    depth: int = 4
    trunk: int = 1
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    dtype: str = "float32"
    store_top: int = 8
    full: bool = False
    seed: int = 0
    prompts_sha256: str = ""  # of the prompt texts; the prompts path itself may differ on resume
    samples: int = 4  # --shape grid: draws per L1
    labels: str = ""  # --shape grid --labels: comma-separated verifiers labelled at capture time
    roots_per_forward: int = 8  # roots whose trees share one forward (format 0 without it: 1; backends.capture_format)
    evaluation: str = (
        "cached"  # "cached": kept KV caches, each node once; "forward" (format 0 without it): levels re-run ancestors
    )
    labels_engine: str = ""  # --labels: the engine the labels were computed with (numpy or torch; "unrecorded": unknown)
    trim_draft_vocab: bool = (
        False  # --trim-draft-vocab: a draft with more ids than the target, q cut to the target's ids and renormalised
    )
    pair: str = ""  # --pair: the named pretrained pair (backends.pretrained; target is then ""), else ""
    target_fingerprint: str = ""  # which target (backends.capture.model_fingerprints); "": unknown (format 0 without it)
    draft_fingerprint: str = ""  # which draft, as target_fingerprint
    trajectory: str = (
        "cached"  # the continuations' target p (simlab.pairs.target_trajectory): "cached" KV, "forward" (format < 2)
    )

    def grid_axes(self) -> GridAxes:
        """``shape == "grid"``: the stored width and depth as the grid's axes (K in 1..width, L1 and
        L2 in 0..depth; ``simlab.grid.GridAxes.from_width_depth``)."""
        return GridAxes.from_width_depth(self.width, self.depth)

    def tree_shape(self) -> Delayed:
        return named_shape(self.shape, self.width, self.depth, self.trunk)

    def tree_depth(self) -> int:
        """The deepest node a tree can have (grid: L1 + L2 up to twice ``depth``)."""
        return 2 * self.depth if self.shape == "grid" else self.depth

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_k, self.top_p)

    def placement(self) -> RootPlacement:
        """Roots along each prompt's continuation: the prompt's end first, then every ``spacing`` tokens."""
        return RootPlacement(self.roots_per_prompt, self.spacing, first=0)


MODEL_KEYS = ("target_fingerprint", "draft_fingerprint")
"""The settings that record which models a capture was drawn from (empty: unknown)."""


def settings_hash(settings: CaptureSettings) -> str:
    """SHA-256 (hex) of the settings that determine a capture's content: every field but the prompt
    file's path (``prompts_sha256`` stands for the prompts), an empty model fingerprint and the
    ``"forward"`` trajectory (so the hash of a capture made before those fields is unchanged), as
    sorted JSON."""
    data = {
        k: v
        for k, v in asdict(settings).items()
        if k != "prompts" and not (k in MODEL_KEYS and not v) and not (k == "trajectory" and v == "forward")
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def differing_settings(stored: dict, mine: dict) -> list[str]:
    """Names of the settings that differ between a stored capture and this run (the prompt file's
    path is compared through the digest of its prompts, not as a string, except in a capture made
    before the digest, whose prompts are named by the path; model paths by folder;
    a model fingerprint only when both are known: a stored one is empty in a capture made before
    the fields, this run's before its models load)."""

    def same(key):
        a, b = stored[key], mine.get(key)
        if key == "labels_engine" and a == "unrecorded":  # the engine unknown (capture_format): either engine resumes it
            return True
        if key in MODEL_KEYS and not (a and b):
            return True
        if key == "prompts_sha256" and not a:  # a capture before the digest: its prompts named by the file's path
            return _same_path(stored["prompts"], mine["prompts"])
        if key in ("target", "draft"):
            return _same_path(a, b)
        return a == b

    return [key for key in mine if key != "prompts" and not same(key)]


FROM_TARGET = "from-target"
"""The draft fingerprint of a named pair's draft computed from the target's own weights by its spec
(``early-exit:L``, ``quant:B:G``): the target's fingerprint and the spec (``draft``) determine it."""


def _same_path(a: str, b: str) -> bool:
    """Whether two recorded model names or prompt paths name the same thing: by resolved path where
    both exist here, else as strings."""
    if a and b and Path(a).expanduser().exists() and Path(b).expanduser().exists():
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    return a == b


def _model_name(settings: CaptureSettings, which: str) -> str:
    if which == "target":
        return f"pair {settings.pair}" if settings.pair else settings.target
    return settings.draft


def model_difference(a: CaptureSettings, b: CaptureSettings) -> tuple[str, str] | None:
    """What differs between the models captures with the settings ``a`` and ``b`` were drawn from, or
    None: (``"target"``, ``"draft"``, ``"target and draft"`` or ``"dtype"``, the values, ``a``'s first).
    A model is compared by its fingerprint (``target_fingerprint``, ``draft_fingerprint``) where both
    captures record one (a ``FROM_TARGET`` draft also by its spec), else by the recorded name (a named
    pair, a hub id, or a folder, compared by resolved path where both exist here); with the same
    models, by the dtype they ran at.  Used by ``backends.sources.replay.CaptureSource``."""
    differ = []
    for which in ("target", "draft"):
        fa, fb = getattr(a, f"{which}_fingerprint"), getattr(b, f"{which}_fingerprint")
        na, nb = _model_name(a, which), _model_name(b, which)
        if fa and fb and fa != fb:
            kinds = {fa.split(":", 1)[0], fb.split(":", 1)[0]} == {"hub", "sha256"}
            note = " (fingerprints of different kinds, a hub commit and a folder digest: the lab cannot tell them equal)"
            differ.append((which, f"{which} {_shown(fa)}, not {_shown(fb)}" + (note if kinds else "")))
        elif (fa and fb and fa == FROM_TARGET and na != nb) or (not (fa and fb) and not _same_path(na, nb)):
            differ.append((which, f"{which} {na!r}, not {nb!r}"))
    if differ:
        return " and ".join(w for w, _ in differ), "; ".join(d for _, d in differ)
    if a.dtype != b.dtype:
        return "dtype", f"dtype {a.dtype}, not {b.dtype}"
    return None


def check_models(stored: CaptureSettings, now: dict[str, str]) -> None:
    """Nothing where the models at a capture's recorded paths are the ones it was drawn from: ``now``
    (``target_fingerprint`` and ``draft_fingerprint`` of the models opened for ``stored``, as
    ``backends.capture.model_fingerprints`` computes them) against those ``stored`` records, each
    where recorded (a capture made before the fingerprints records none: nothing to compare).

    Raises:
        CaptureError: ``capture: ...`` naming the model (target, draft, or both) whose fingerprint
            differs, with its recorded name and both fingerprints.
    """
    differ = [key for key in MODEL_KEYS if getattr(stored, key) and now.get(key, "") != getattr(stored, key)]
    if not differ:
        return
    which = " and ".join(key.split("_")[0] for key in differ)
    detail = "; ".join(
        f"{key.split('_')[0]} {_model_name(stored, key.split('_')[0])!r} is {_shown(now.get(key, '') or '(none)')} now, "
        f"{_shown(getattr(stored, key))} in the capture"
        for key in differ
    )
    raise CaptureError(
        f"the {which} model at the capture's recorded path is not the one it was drawn from ({detail}): its files "
        "changed since the capture, or the name now means another model; restore that model, or capture again"
    )


def prompts_difference(a: CaptureSettings, b: CaptureSettings) -> str | None:
    """How the prompts of captures with the settings ``a`` and ``b`` differ (``a``'s first), or None:
    compared by the digest of their prompt records (``prompts_sha256``) where both record one, else
    by the prompt file's path (resolved where both exist here)."""
    if a.prompts_sha256 and b.prompts_sha256:
        if a.prompts_sha256 == b.prompts_sha256:
            return None
        return f"prompts {a.prompts!r} (digest {a.prompts_sha256[:12]}), not {b.prompts!r} (digest {b.prompts_sha256[:12]})"
    return None if _same_path(a.prompts, b.prompts) else f"prompts {a.prompts!r}, not {b.prompts!r}"


# -- paths ------------------------------------------------------------------------------------
def shard_path(out: Path, root: int) -> Path:
    """The node shard of one root; its presence marks the root as done."""
    return Path(out) / f"nodes-r{root:06d}.parquet"


def drafts_path(out: Path, root: int) -> Path:
    return Path(out) / f"drafts-r{root:06d}.parquet"


def labels_path(out: Path, root: int) -> Path:
    return Path(out) / f"labels-r{root:06d}.parquet"


def logits_path(out: Path, root: int) -> Path:
    return Path(out) / f"logits-r{root:06d}.npz"


# -- writer -----------------------------------------------------------------------------------
def save_settings(out: Path, settings: CaptureSettings) -> None:
    atomic_write(Path(out) / "settings.json", lambda tmp: Path(tmp).write_text(_settings_text(settings)))


def _settings_text(settings: CaptureSettings) -> str:
    """settings.json's text: the fields with the format number (``capture_format.stored_settings``)."""
    return json.dumps(capture_format.stored_settings(asdict(settings)), indent=2, sort_keys=True)


def _shown(fingerprint: str) -> str:
    kind, _, value = fingerprint.partition(":")
    return f"{kind}:{value[:12]}" if value else fingerprint


def check_resumable(out: Path, settings: CaptureSettings) -> None:
    """Nothing if ``out`` holds no settings.json or one equal to ``settings`` (``differing_settings``).

    Raises:
        ValueError: ``out: ...`` naming the stored and the asked values of every setting that differs;
            where only the models differ, naming which (target, draft) and both fingerprints.
    """
    if not (Path(out) / "settings.json").exists():
        return
    held = load_settings(out).__dict__
    differ = differing_settings(held, asdict(settings))
    models = [key for key in differ if key in MODEL_KEYS]
    if differ and models == differ:
        which = " and ".join(key.split("_")[0] for key in models)
        detail = ", ".join(f"{key.split('_')[0]} {_shown(held[key])}, not {_shown(getattr(settings, key))}" for key in models)
        raise ArgumentError(
            "out",
            f"{str(out)!r} holds a capture drawn from another {which} model ({detail}: its files changed since the "
            "capture began, or the name now means another model); resume it with the models it began with, or use a new folder",
        )
    if differ:
        detail = ", ".join(
            f"{key} {_shown(held[key])}, not {_shown(getattr(settings, key))}"
            if key in MODEL_KEYS
            else f"{key} {held[key]!r}, not {getattr(settings, key)!r}"
            for key in differ
        )
        raise ArgumentError(
            "out",
            f"{str(out)!r} holds a capture with other settings ({detail}); resume it with its own flags, or use a new folder",
        )


def check_legacy(out: Path) -> str | None:
    """For a resume of ``out`` whose settings.json records no model fingerprints (a capture made
    before them): the note that its models go unchecked; None for a folder without settings.json
    or with fingerprints.  Reads every shard's footer of such a folder once.

    Raises:
        ValueError: ``out: ...`` for such a folder holding a shard without a settings hash (a capture
            made before the hash): a resume would add stamped shards, after which the readers
            refuse its unstamped ones (``unstamped_allowed``).
    """
    if not (Path(out) / "settings.json").exists():
        return None
    held = load_settings(out)
    if held.target_fingerprint or held.draft_fingerprint:
        return None
    stray = next((file for file in _shards(out) if _readable_hash(file) is None), None)
    if stray is not None:
        raise ArgumentError(
            "out",
            f"{str(out)!r} holds shards made before the settings hash ({stray.name} records none), which the readers "
            "accept only in a folder without stamped shards; it cannot be resumed: recapture into a new folder",
        )
    return (
        "note: the folder's settings.json records no model fingerprints (a capture made before them): this resume "
        "cannot check that its models are the ones the capture began with"
    )


def claim_settings(out: Path, settings: CaptureSettings) -> str:
    """Write ``out/settings.json`` if absent (every rank does, before its first shard; created only
    if absent, atomically: of two runs racing, one writes it and the other compares), else check
    it equals ``settings``; returns the hash of the folder's settings, the one its shards record.

    Raises:
        ValueError: ``out: ...`` for other stored settings, or shards in a folder without settings.json.
    """
    out = Path(out)
    path = out / "settings.json"
    if not path.exists():
        if next(iter(_shards(out)), None) is not None:
            raise ArgumentError(
                "out", f"{str(out)!r} holds capture shards but no settings.json (drawn under unknown settings); use a new folder"
            )
        tmp = staging_file(out, "settings.json")
        try:
            tmp.write_text(_settings_text(settings))
            os.chmod(tmp, 0o666 & ~umask())
            try:
                os.link(tmp, path)  # fails if another run wrote it first: that one is compared below
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    check_resumable(out, settings)
    return settings_hash(load_settings(out))


def check_unchanged(out: Path, expected: str) -> None:
    """Raise ``ArgumentError`` (``"out: ..."``) if ``out/settings.json`` no longer has the hash ``expected``
    (another capture rewrote it during this run); checked before each group's shards are written."""
    held = settings_hash(load_settings(out))
    if held != expected:
        raise ArgumentError(
            "out",
            f"{str(out)!r}: settings.json changed during this run (settings hash {held[:12]}, not "
            f"{expected[:12]}): another capture with other settings wrote into the folder; use a new folder",
        )


def _shards(folder: Path):
    for pattern in ("nodes-r*.parquet", "drafts-r*.parquet", "labels-r*.parquet", "logits-r*.npz"):
        yield from Path(folder).glob(pattern)


def _stamped(settings_sha256: str) -> dict[str, str]:
    if not isinstance(settings_sha256, str) or len(settings_sha256) != 64:
        raise ArgumentError("settings_sha256", f"must be a settings hash (64 hex digits), got {settings_sha256!r}")
    return {HASH_KEY: settings_sha256}


def save_nodes(out: Path, root: int, rows: list[dict], *, settings_sha256: str) -> None:
    """The node shard of one root (written last: it marks the root as done), stamped with the hash
    of the settings it was drawn under; a ``category`` column (the prompt's workload category, or
    null) is stored as strings."""
    schema = {"category": pl.String} if rows and "category" in rows[0] else None
    write_parquet(pl.DataFrame(rows, schema_overrides=schema), shard_path(out, root), metadata=_stamped(settings_sha256))


def save_labels(out: Path, root: int, rows: list[dict], *, settings_sha256: str) -> None:
    """The grid labels of one root (``simlab.labels.grid_labels`` rows with root and prompt), stamped."""
    write_parquet(pl.DataFrame(rows), labels_path(out, root), metadata=_stamped(settings_sha256))


def save_drafts(out: Path, root: int, prompt: int, context, drafts, *, settings_sha256: str) -> None:
    """One row per grid draft: L1, sample index within its L1, trunk and branches (token ids)."""
    seen: dict[int, int] = {}
    rows = []
    for d in drafts:
        seen[d.L1] = seen.get(d.L1, -1) + 1
        rows.append(
            {
                "root": root,
                "prompt": prompt,
                "root_context": list(context),
                "L1": d.L1,
                "sample": seen[d.L1],
                "trunk": list(d.trunk),
                "branches": [list(b) for b in d.branches],
            }
        )
    write_parquet(
        pl.DataFrame(rows, schema_overrides={"trunk": pl.List(pl.Int64), "branches": pl.List(pl.List(pl.Int64))}),
        drafts_path(out, root),
        metadata=_stamped(settings_sha256),
    )


def save_logits(out: Path, root: int, target: np.ndarray, draft: np.ndarray, *, settings_sha256: str) -> None:
    """Atomically store both models' float32 logits (nodes, V) of one root (``logits_path``), stamped
    with the settings hash and the root id (members ``settings_sha256`` and ``root``)."""
    stamp = _stamped(settings_sha256)[HASH_KEY]

    def write(tmp):
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, target=target, draft=draft, settings_sha256=np.array(stamp), root=np.array(root))

    atomic_write(logits_path(out, root), write)


# -- reader -----------------------------------------------------------------------------------
def read_safely(folder, read):
    """``read(folder)``, with any error of a damaged file (polars, numpy, zip, json) as one
    ``CaptureError`` (``"capture: ... is damaged (...)"``); the store's own ``CaptureError`` passes through."""
    try:
        return read(folder)
    except CaptureError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise CaptureError(f"{str(folder)!r} is damaged ({type(exc).__name__}: {first})") from None


def load_settings(folder) -> CaptureSettings:
    """The ``CaptureSettings`` a capture folder was made with.

    Raises:
        CaptureError: ``capture: ...`` for a folder without settings.json or with a damaged one.
    """
    path = Path(folder) / "settings.json"
    if not Path(folder).is_dir():
        raise CaptureError(f"{str(folder)!r} is not a folder")
    if not path.is_file():
        raise CaptureError(f"{str(folder)!r} has no settings.json (not a capture folder)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CaptureError(f"{str(folder)!r} has a damaged settings.json") from None
    try:
        return _settings_from(data)
    except ValueError as exc:
        number = data.get(capture_format.KEY) if isinstance(data, dict) else None
        if type(number) is int and number > capture_format.FORMAT:
            raise CaptureError(f"{str(folder)!r} was written by a newer version of the lab ({exc})") from None
        raise CaptureError(f"{str(folder)!r} has a damaged settings.json ({exc})") from None


_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _field_value(name: str, value, hint):
    """``value`` of settings field ``name`` checked against its annotation ``hint`` (ints accepted as
    floats, and converted, so a stored 1 hashes as 1.0); raises ``ValueError("name: ...")``."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    for kind in options:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    wanted = " or ".join(_KINDS.get(kind, "null") for kind in options)
    raise ArgumentError(name, f"expected {wanted}, got {value!r}")


def _settings_from(data) -> CaptureSettings:
    """``CaptureSettings`` from settings.json's object, brought to the current format first
    (``capture_format.upgrade_settings``: an older file's missing fields take the values its capture
    was made with): every field present, type-checked and in range (``ValueError`` naming the field)."""
    if not isinstance(data, dict):
        raise ValueError("expected an object of settings")
    data = capture_format.upgrade_settings(data)
    hints = typing.get_type_hints(CaptureSettings)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise ArgumentError(unknown[0], "not a capture setting")
    missing = [f.name for f in fields(CaptureSettings) if f.name not in data]
    if missing:
        raise ArgumentError(missing[0], "missing")
    settings = CaptureSettings(**{k: _field_value(k, v, hints[k]) for k, v in data.items()})
    for name in ("roots_per_prompt", "spacing", "width", "depth", "samples", "store_top", "roots_per_forward"):
        if getattr(settings, name) < 1:
            raise ArgumentError(name, f"must be >= 1, got {getattr(settings, name)}")
    for name, allowed in (
        ("shape", SHAPES),
        ("evaluation", ("cached", "forward")),
        ("trajectory", TRAJECTORY_METHODS),
        ("labels_engine", LABEL_ENGINES),
    ):
        if getattr(settings, name) not in allowed:
            raise ArgumentError(name, f"must be one of {', '.join(map(repr, allowed))}, got {getattr(settings, name)!r}")
    settings.sampling()
    settings.placement()
    if settings.shape != "grid":
        settings.tree_shape()
    return settings


def folder_hash(folder) -> str:
    """The settings hash of a capture folder's settings.json (``settings_hash``), which its shards must record."""
    return settings_hash(load_settings(folder))


class MixedCapture(CaptureError):
    """A shard of a capture folder drawn under other settings than the folder's (or without a settings
    hash among stamped shards): the folder mixes two captures.  Raised by ``check_drawn_under``."""


def check_drawn_under(folder, file, recorded: str | None, expected: str) -> None:
    """Refuse a shard whose recorded settings hash is not ``expected`` (the folder's); a shard without
    one (``recorded`` None: written before the hash) is a legacy shard, accepted only where no shard
    of the folder records a hash (``unstamped_allowed``).

    Raises:
        MixedCapture: ``capture: ...`` naming the shard and both hashes, or the shard without one.
    """
    if recorded is None and not unstamped_allowed(folder):
        raise MixedCapture(
            f"{str(file)!r} records no settings hash, but other shards of {str(folder)!r} do: a shard of "
            "another capture (made before the hash); the folder mixes two captures; recapture into a new folder"
        )
    if recorded is not None and recorded != expected:
        raise MixedCapture(
            f"{str(file)!r} was drawn under other settings than {str(Path(folder) / 'settings.json')!r} "
            f"(settings hash {recorded[:12]}, not {expected[:12]}): the folder mixes two captures; recapture into a new folder"
        )


def _parquet_hash(file) -> str | None:
    return read_safely(file, pl.read_parquet_metadata).get(HASH_KEY)


def _logits_hash(file) -> str | None:
    def read(path):
        with np.load(path) as stored:  # a member is read only when asked for
            return str(stored["settings_sha256"]) if "settings_sha256" in stored.files else None

    return read_safely(file, read)


def _recorded_hash(file) -> str | None:
    """The settings hash a shard records (None: none, a shard made before the hash)."""
    return _logits_hash(file) if Path(file).suffix == ".npz" else _parquet_hash(file)


def _readable_hash(file) -> str | bool | None:
    """``_recorded_hash``, or False for a damaged shard (evidence of neither; its reader refuses it)."""
    try:
        return _recorded_hash(file)
    except ValueError:
        return False


_LEGACY: set[tuple[str, int, int]] = set()
"""Folders found to hold no stamped shard, by (path, the folder's and its settings.json's mtime in
ns): a legacy folder's readers scan it once, not once per shard.  A shard added, replaced or removed
(every writer renames into the folder) or a new settings.json changes the key."""


def unstamped_allowed(folder) -> bool:
    """Whether a shard without a settings hash may be read from ``folder``: only where no shard of
    the folder records one (a capture made before the hash).  Reads shard footers until the first
    stamped one (one in a folder written since the hash; every one, once, in a legacy folder); a
    damaged shard counts as neither (its own reader refuses it).
    """
    folder = Path(folder)
    settings = folder / "settings.json"
    key = (str(folder.resolve()), folder.stat().st_mtime_ns, settings.stat().st_mtime_ns if settings.exists() else 0)
    if key in _LEGACY:
        return True
    if any(_readable_hash(file) for file in _shards(folder)):
        return False
    _LEGACY.add(key)
    return True


def _read_shard(folder, file, expected: str | None) -> pl.DataFrame:
    """A parquet shard, after checking its settings hash against ``expected`` (None: the folder's)."""
    check_drawn_under(folder, file, _parquet_hash(file), folder_hash(folder) if expected is None else expected)
    return read_safely(file, pl.read_parquet)


def completed_roots(folder) -> list[int]:
    """Root ids whose node shard exists, ascending."""
    return sorted(int(f.stem.split("-r")[1]) for f in Path(folder).glob("nodes-r*.parquet"))


def _check_columns(table: pl.DataFrame, columns, file) -> pl.DataFrame:
    missing = set(columns) - set(table.columns)
    if table.height == 0 or missing:
        raise CaptureError(f"{str(file)!r} is damaged (missing columns {sorted(missing)} or no rows)")
    return table


def _check_root(recorded, root: int, file) -> None:
    """Refuse a shard whose recorded root ids (``recorded``: its ``root`` column, or the logits
    archive's ``root`` member) are not all ``root``, the one its file name says: another root's shard
    under this one's name (copied or renamed), whose rows would count twice."""
    other = next((int(r) for r in np.unique(np.asarray(recorded)) if int(r) != root), None)
    if other is not None:
        raise CaptureError(
            f"{str(file)!r} is damaged (it holds root {other}, not root {root} as its name says: another "
            "root's shard under this one's name)"
        )


def read_nodes(folder, root: int, expected: str | None = None) -> pl.DataFrame:
    """The node rows of one root (its settings hash checked against ``expected``, default the folder's,
    and its ``root`` column against ``root``), with the current shards' columns
    (``capture_format.upgrade_nodes``: ``category`` null in a shard written before it).

    Raises:
        CaptureError: ``capture: ...`` for a damaged shard (one holding another root among them) or one
            drawn under other settings.
    """
    file = shard_path(folder, root)
    table = _check_columns(_read_shard(folder, file, expected), NODE_COLUMNS, file)
    _check_root(table["root"].to_numpy(), root, file)
    return capture_format.upgrade_nodes(table)


def read_capture(folder) -> pl.DataFrame:
    """All node shards of a capture as one table (sorted by root, then node order within the root).

    Raises:
        CaptureError: ``capture: ...`` for a folder without shards, with a damaged shard or a shard
            drawn under other settings than its settings.json.
    """
    roots = completed_roots(folder)
    if not roots:
        raise CaptureError(f"no capture shards in {str(folder)!r}")
    expected = folder_hash(folder)
    return pl.concat(
        [read_nodes(folder, r, expected) for r in roots], how="diagonal"
    )  # shards from before the category column too


def root_category(folder, root: int) -> str | None:
    """The prompt category stored with one root's node shard (None: none, or a shard from before
    the column); the shard's ``root`` column is checked against ``root`` (``ValueError``)."""
    file = shard_path(folder, root)
    columns = read_safely(file, pl.read_parquet_schema)
    wanted = ["root", "category"] if "category" in columns else ["root"]
    table = read_safely(file, lambda f: pl.read_parquet(f, columns=wanted))
    _check_root(table["root"].to_numpy(), root, file)
    return table["category"][0] if "category" in columns else None


def read_grid_drafts(folder):
    """Yield (root, prompt, root context, drafts) for every completed root of a grid capture
    (each shard's settings hash and ``root`` column checked)."""
    expected = folder_hash(folder)
    for root in completed_roots(folder):
        file = drafts_path(folder, root)
        if not file.exists():
            raise CaptureError(f"{str(folder)!r} is damaged (root {root} has no drafts file)")
        table = _check_columns(_read_shard(folder, file, expected), DRAFT_COLUMNS, file)
        _check_root(table["root"].to_numpy(), root, file)
        drafts = tuple(
            GridDraft(int(L1), tuple(trunk), tuple(tuple(b) for b in branches))
            for L1, trunk, branches in table.select("L1", "trunk", "branches").iter_rows()
        )
        yield int(table["root"][0]), int(table["prompt"][0]), tuple(table["root_context"][0].to_list()), drafts


def read_labels(folder) -> pl.LazyFrame:
    """The grid labels of every completed root of a ``--labels`` capture, scanned lazily from the
    per-root shards (columns root, prompt, ``simlab.labels.LABEL_COLUMNS`` and, in captures made
    since, ``METRIC_COLUMNS``: the first shard's columns, null where a shard lacks one); each
    shard's settings hash (its footer) and ``root`` column are checked first.

    Raises:
        CaptureError: ``capture: ...`` for a capture made without ``--labels``, a completed root
            without its labels file, a labels shard drawn under other settings or holding another
            root than its name says.
    """
    stored = load_settings(folder)
    if not stored.labels:
        raise CaptureError(f"{str(folder)!r} was captured without --labels")
    roots = completed_roots(folder)
    files = [labels_path(folder, r) for r in roots]
    missing = [f for f in files if not f.exists()]
    if missing:
        raise CaptureError(f"{str(folder)!r} is damaged ({missing[0].name} is missing)")
    if not files:
        raise CaptureError(f"no capture shards in {str(folder)!r}")
    expected = settings_hash(stored)
    for root, file in zip(roots, files):
        check_drawn_under(folder, file, _parquet_hash(file), expected)
        _check_root(read_safely(file, lambda f: pl.read_parquet(f, columns=["root"]))["root"].to_numpy(), root, file)
    # shards written before the engines' metric columns (simlab.labels.METRIC_COLUMNS) and after,
    # in one resumed capture: the first shard's columns, nulls where a shard lacks one
    return pl.scan_parquet([str(f) for f in files], missing_columns="insert", extra_columns="ignore")


def check_root(folder, root: int, settings: CaptureSettings, expected: str) -> str | None:
    """Why the captured root ``root`` of ``folder`` cannot be read back (its files damaged, missing
    or holding another root than their names say: capture it again), or None: its node shard read in
    full (hash against ``expected``, columns, rows, root ids), its drafts (``shape="grid"``) and labels
    (``labels``) shards read (root ids checked), and its logits archive (``full``) read through
    (``_check_logits``: every member's CRC-32, both arrays' headers, float32 (nodes, V) with one row
    per node, and the root it records).

    Cost: the archive's read decompresses every logit without keeping it (zlib, one core), about
    what ``np.load`` of both its arrays costs.  Measured on a shared 2-core machine: 0.2 to 0.4 ms per
    archive of a capture of the micro pair (3 nodes, V = 400; 1 to 2.5 ms for the whole check); 0.27 s
    per root of 32 nodes at V = 128,000 (33 MB of float32 logits, 30 MB on disk; 0.12 s at V = 49,152),
    so about 4.5 minutes per 1,000 such roots on a resume.

    Raises:
        MixedCapture: a file drawn under other settings (the folder mixes two captures).
    """
    try:
        nodes = read_nodes(folder, root, expected)
        for wanted, path, columns in (
            (settings.shape == "grid", drafts_path, DRAFT_COLUMNS),
            (bool(settings.labels), labels_path, ("root", "prompt")),
        ):
            file = path(folder, root)
            if not wanted:
                continue
            if not file.exists():
                return f"{file.name} is missing"
            _check_root(_check_columns(_read_shard(folder, file, expected), columns, file)["root"].to_numpy(), root, file)
        if settings.full:
            file = logits_path(folder, root)
            if not file.exists():
                return f"{file.name} is missing"
            check_drawn_under(folder, file, _logits_hash(file), expected)
            shapes, recorded = read_safely(file, _check_logits)
            if recorded is not None:
                _check_root(recorded, root, file)
            if shapes[0] != shapes[1] or len(shapes[0]) != 2 or shapes[0][0] != nodes.height:
                return f"{file.name} holds logits of shapes {shapes[0]} and {shapes[1]} for {nodes.height} nodes"
    except MixedCapture:
        raise
    except CaptureError as exc:
        return exc.detail
    return None


def _check_logits(file) -> tuple[tuple[tuple, tuple], int | None]:
    """((target shape, draft shape), recorded root or None) of a logits archive, read through: the
    arrays' ``.npy`` headers (float32 required), then every member's data to its end, so that
    ``zipfile`` checks its CRC-32 (``BadZipFile``, ``zlib.error`` for damaged compressed data); the
    decompressed bytes are dropped block by block (4 MB), never held."""
    shapes, recorded = [], None
    with zipfile.ZipFile(file) as archive:
        names = archive.namelist()
        for name in ("target.npy", "draft.npy"):
            if name not in names:
                raise CaptureError(f"{str(file)!r} is damaged (it has no member {name})")
        for name in names:
            with archive.open(name) as member:
                if name in ("target.npy", "draft.npy"):
                    version = np.lib.format.read_magic(member)
                    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                    shape, _, dtype = read(member)
                    if dtype != np.float32:
                        raise ValueError(f"{name} holds {dtype}, not float32")
                    shapes.append(shape)
                elif name == "root.npy":
                    recorded = int(np.lib.format.read_array(member))
                while member.read(1 << 22):
                    pass
    return (shapes[0], shapes[1]), recorded


def read_logits(folder, root: int, expected: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) float32 logits (nodes, V) of one root of a ``full`` capture (its settings
    hash checked against ``expected``, default the folder's, and the root it records, where it
    records one, against ``root``).

    Raises:
        CaptureError: ``capture: ...`` for a missing or damaged archive (one holding another root
            among them) or one drawn under other settings.
    """

    def read(file):
        with np.load(file) as stored:  # each read of a member decompresses it: read once
            recorded = str(stored["settings_sha256"]) if "settings_sha256" in stored.files else None
            held = int(stored["root"]) if "root" in stored.files else None
            return stored["target"], stored["draft"], recorded, held

    file = logits_path(folder, root)
    if not file.exists():
        raise CaptureError(f"{str(folder)!r} is damaged (root {root} has no logits file)")
    target, draft, recorded, held = read_safely(file, read)
    check_drawn_under(folder, file, recorded, folder_hash(folder) if expected is None else expected)
    if held is not None:
        _check_root(held, root, file)
    return target, draft


def captured_tree(nodes: pl.DataFrame) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The child lists of one root's captured tree (multiplicities kept, grouped by token in
    order of first appearance), from its node rows."""
    children: dict[tuple[int, ...], list[int]] = {}
    for path, multiplicity in nodes.select("path", "multiplicity").iter_rows():
        path = tuple(path)
        if path:
            children.setdefault(path[:-1], []).extend([path[-1]] * int(multiplicity))
    return {k: tuple(v) for k, v in children.items()}


class LabelsOnlyPair:
    """The stand-in pair of a grid capture made with ``--labels`` and without ``--full``: it holds
    no p or q, so the studies can replay its stored labels (``Root.labels``: the verifiers and
    grid it was labelled for) and nothing else; any use of p or q (another verifier, another
    grid, a node-level study) raises a ``ValueError`` that says so.

    Args:
        folder: the capture folder; labels: the comma-separated verifiers it was labelled for.
    """

    def __init__(self, folder, labels: str):
        self.folder, self.labels = str(folder), labels

    def _refuse(self):
        raise CaptureError(
            f"{self.folder!r} was captured without --full and holds labels for {self.labels} only "
            "(with its grid); for other verifiers, grids or p and q, recapture with --full"
        )

    @property
    def vocab_size(self) -> int:
        self._refuse()

    def distributions(self, contexts):
        self._refuse()


class CapturedPair:
    """Replays a ``full`` capture: p and q at captured nodes, recomputed from the stored logits
    with the capture's sampling settings (``SamplingSettings.probabilities``, the transform every
    live pair uses), so p and q equal the live ones bit for bit.

    ``distributions(contexts)`` answers captured contexts only.  ``roots`` restricts the replay
    to some root ids (default: every completed root).

    Raises:
        CaptureError: ``capture: ...`` for a capture without ``full`` logits or with damaged files;
            ``context: ...`` for a context that was not captured.
    """

    def __init__(self, folder, roots=None):
        self.folder = str(folder)
        self.settings = load_settings(folder)
        if not self.settings.full:
            raise CaptureError(f"{self.folder!r} was captured without --full; recapture with --full to replay p and q")
        wanted = completed_roots(folder) if roots is None else list(roots)
        if not wanted:
            raise CaptureError(f"no capture shards in {self.folder!r}")
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        transform = self.settings.sampling().probabilities
        expected = settings_hash(self.settings)
        for root in wanted:
            nodes = read_nodes(folder, root, expected)
            target, draft = read_logits(folder, root, expected)
            if target.shape[0] != nodes.height or draft.shape != target.shape:
                raise CaptureError(
                    f"{self.folder!r} is damaged (root {root}: {target.shape[0]} logit rows for {nodes.height} nodes)"
                )
            p, q = transform(target), transform(draft)
            context = tuple(nodes["root_context"][0].to_list())
            for i, path in enumerate(nodes["path"].to_list()):
                self._rows[context + tuple(path)] = (p[i], q[i])
        self.vocab_size = next(iter(self._rows.values()))[0].size

    def holds(self, context) -> bool:
        """True when the capture stores p and q at ``context`` (a root context plus a node path)."""
        return tuple(int(t) for t in context) in self._rows

    def node_rows(self):
        """Iterate (context, p, q) over every captured node."""
        for context, (p, q) in self._rows.items():
            yield context, p, q

    def distributions(self, contexts):
        contexts = check_contexts(contexts, self.vocab_size)
        try:
            pairs = [self._rows[c] for c in contexts]
        except KeyError as exc:
            raise ArgumentError("context", f"{exc.args[0]} was not captured") from None
        return np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
