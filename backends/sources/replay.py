"""Roots replayed from captures (``backends.capture_store``): one capture folder per sampling setting,
every one drawn from the same models and prompts.

A capture brings its own roots, trees and sampling settings (and possibly a ``latency.json``).
Grid captures (``--shape grid``) give each root its grid drafts (``Root.drafts``, the action-grid
studies); tree captures give each root its captured tree (``Root.tree``, the node-level studies;
grid captures give the union of their drafts there).  Settings, drafts and completeness are read
up front; a capture's p and q (float64, from its logits) are loaded only while its setting's
roots are in use, so memory holds one setting at a time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from backends import capture_store as store
from backends.sources.base import Root, register_source, slug
from simlab.errors import CaptureError
from simlab.labels import LABEL_COLUMNS, METRIC_COLUMNS
from simlab.latency import LatencyModel
from simlab.sampling import SamplingSettings


ROOT_PLACEMENT = ("roots_per_prompt", "spacing")
"""The capture settings that place the roots along the prompts' trajectories (``backends.roots``):
captures replayed together must agree on them."""


@register_source("capture")
class CaptureSource:
    """Captures replayed from disk.

    Args:
        folders: capture folders, one per sampling setting: ``--full`` (p and q replayed), or,
            for the grid studies, ``--labels`` grid captures without logits, whose stored
            labels are replayed (``Root.labels``; ``Root.pair`` is a
            ``backends.capture_store.LabelsOnlyPair`` that refuses any other use).
        grid: True: every capture must be a grid capture with at least 2 trees per L1 (half
            choose, half report); False: any capture (its trees' nodes).

    Several captures are compared across their settings, so they must differ in nothing else that
    determines p and q or the roots: every capture must be drawn from the same target and draft
    (their fingerprints where both captures record them, else their recorded names; and the same
    dtype), from the same prompts (the digest of their prompt records, else the prompt file's
    path) and with their roots placed alike (``ROOT_PLACEMENT``), every pair of captures compared,
    or the source is refused naming the first difference and the two captures.

    Raises:
        CaptureError: ``capture: ...`` for a folder that is not a capture, lacks logits, repeats a
            setting, was drawn from other models or prompts than the first capture, holds no
            completed root, has damaged files (a shard holding another root than its name says
            among them), or (``grid``) is not a grid.
    """

    honours: ClassVar[frozenset[str]] = frozenset({"capture", "seed"})

    def __init__(self, folders, grid: bool = True):
        folders = tuple(str(f) for f in folders)
        if not folders:
            raise CaptureError("name at least one capture folder")
        self.folders, self.grid = folders, grid
        self.captures: dict[str, tuple[str, store.CaptureSettings]] = {}
        self.entries: dict[str, list] = {}
        for folder in folders:
            stored = store.load_settings(folder)
            if not stored.full and not (grid and stored.labels):
                raise CaptureError(
                    f"{folder!r} was captured without --full; recapture with --full to replay p and q "
                    "(a --labels grid capture replays its stored labels in the grid studies)"
                )
            if grid and stored.shape != "grid":
                raise CaptureError(f"{folder!r} holds {stored.shape!r} trees; the grid studies need --shape grid")
            if grid and stored.samples < 2:
                raise CaptureError(
                    f"{folder!r} has {stored.samples} tree per L1; the studies need >= 2 (half choose, half report)"
                )
            name = stored.sampling().name
            if name in self.captures:
                raise CaptureError(f"two captures with the setting {name}")
            if self.captures:
                self._check_comparable(folder, stored)
            self.captures[name] = (folder, stored)
            self.entries[name] = self._entries(folder, stored)
            if not self.entries[name]:
                raise CaptureError(f"{folder!r} holds no completed root")
            started = len(list(Path(folder).glob("drafts-r*.parquet" if stored.shape == "grid" else "nodes-r*.parquet")))
            skipped = started - len(self.entries[name])
            if skipped > 0:
                print(f"note: {folder}: {skipped} interrupted roots skipped (rerun the capture to finish them)", file=sys.stderr)
        pairs = {(stored.pair or None, stored.draft) for _, stored in self.captures.values()}
        # the pretrained pair (and draft) every capture was taken on; None if any differs or none is one
        self.named_pair: str | None = next(iter(pairs))[0] if len(pairs) == 1 else None

    def _check_comparable(self, folder: str, stored: store.CaptureSettings) -> None:
        """Refuse a capture drawn from other models or prompts, or with its roots placed otherwise,
        than any capture accepted before it (every pair is compared: a capture without fingerprints
        compares by name and must not let two fingerprinted ones of other models through; the study
        compares the captures' settings: ``capture_store.model_difference``, ``prompts_difference``)."""
        for first, held in self.captures.values():
            models = store.model_difference(stored, held)
            if models is not None:
                which, detail = models
                what = "the models at another dtype" if which == "dtype" else f"another {which} model"
                raise CaptureError(
                    f"{folder!r} was drawn from {what} than {first!r} ({detail}); a study compares the "
                    "settings of one pair: replay captures of the same target and draft together"
                )
            prompts = store.prompts_difference(stored, held)
            if prompts is not None:
                raise CaptureError(
                    f"{folder!r} was drawn from other prompts than {first!r} ({prompts}); a study compares the "
                    "settings on the same prompts: replay captures of the same prompts together"
                )
            placed = [k for k in ROOT_PLACEMENT if getattr(stored, k) != getattr(held, k)]
            if placed:
                k = placed[0]
                raise CaptureError(
                    f"{folder!r} places its roots otherwise than {first!r} ({k} {getattr(stored, k)!r}, not "
                    f"{getattr(held, k)!r}); a study compares the settings at the same roots: capture with the same --{k.replace('_', '-')}"
                )

    def _entries(self, folder: str, stored: store.CaptureSettings) -> list:
        """(root, prompt, context, drafts or None, tree or None, category or None) for every completed root."""
        if self.grid:
            return [(r, p, c, d, None, store.root_category(folder, r)) for r, p, c, d in store.read_grid_drafts(folder)]
        out = []
        for root in store.completed_roots(folder):
            nodes = store.read_nodes(folder, root)
            category = nodes["category"][0]  # null in a shard written before the column (read_nodes)
            out.append(
                (
                    root,
                    int(nodes["prompt"][0]),
                    tuple(nodes["root_context"][0].to_list()),
                    None,
                    store.captured_tree(nodes),
                    category,
                )
            )
        return out

    @property
    def stored(self) -> store.CaptureSettings:
        """The settings of the first capture (its models, dtype and prompts are every capture's; its shape)."""
        return next(iter(self.captures.values()))[1]

    @property
    def draft(self) -> str:
        """The draft the captures name."""
        return self.stored.draft

    def draft_weight_ratio(self) -> float | None:
        """On a capture of a named pair, the weights its draft reads per token over the target's
        (``backends.pretrained.cached_weight_ratio``; None where the target is not cached here)."""
        if not self.named_pair:
            return None
        from backends.pretrained import cached_weight_ratio

        return cached_weight_ratio(self.stored.draft, self.named_pair)

    def describe(self) -> str:
        return f"capture of {self.stored.pair or self.stored.target} / {self.stored.draft}"

    def slug(self) -> str:
        return slug(f"capture-{Path(self.folders[0]).resolve().name}")

    def fixed_settings(self) -> tuple[SamplingSettings, ...]:
        return tuple(stored.sampling() for _, stored in self.captures.values())

    def latency(self, largest_tree: int):
        """The ``latency.json`` stored in the first capture folder, or None."""
        path = Path(self.folders[0]) / "latency.json"
        return LatencyModel.load(path) if path.is_file() else None

    def table(self, root: Root):
        """``root``'s ``simlab.trees.NodeTable`` on the captured pair (the stored p and q)."""
        from simlab.trees import NodeTable

        return NodeTable(root.pair, root.context)

    def count(self, settings: SamplingSettings) -> int:
        return len(self.entries.get(settings.name, ()))

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        name = settings.name
        if name not in self.captures:
            raise ValueError(f"settings: no capture holds the setting {name}")
        folder, stored = self.captures[name]
        pair = (
            store.CapturedPair(folder, roots=[e[0] for e in self.entries[name]])
            if stored.full
            else store.LabelsOnlyPair(folder, stored.labels)
        )
        labels: dict[int, dict] = {}
        if self.grid and stored.labels:
            frame = store.read_labels(folder)
            metrics = [c for c in METRIC_COLUMNS if c in frame.collect_schema()]  # absent from older captures
            table = frame.select("root", *LABEL_COLUMNS, *metrics).collect()
            for root, verifier, K, L1, L2, *values in table.iter_rows():
                labels.setdefault(root, {})[(verifier, K, L1, L2)] = tuple(values)
        placement = stored.placement()  # the capture tool's (backends.roots): root id -> offset
        for root, prompt, context, drafts, tree, category in self.entries[name]:
            offset = placement.offset_of(root)
            yield Root(
                name,
                prompt,
                root,
                context,
                pair,
                drafts=drafts,
                tree=tree,
                labels=labels.get(root),
                category=category,
                offset=offset,
                prompt_length=len(context) - offset,  # as the live source's: the prompt's tokens, not the reply's
                source=self,
            )
