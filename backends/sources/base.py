"""The source protocol and its registry: ``Root``, ``Source``, ``Tables``, ``SOURCES``, ``register_source``.

Each source module (``backends.sources.synthetic``, ``.live``, ``.replay``) imports these from
here and registers itself; the package ``backends.sources`` imports the three modules (so that
all are registered) and re-exports everything.  Keeping the protocol out of the package's
``__init__`` keeps the source modules from importing the package that imports them.

A root's node table (``Root.table()``) is its source's ``table(root)`` (the optional capability
``Tables``): the live source evaluates a tree's nodes on the root's kept KV caches
(``backends.tree_cache.node_table``, ``--evaluation cached``) or by the pair's own forwards
(``plain``); the synthetic and capture sources, and a root that names no source, give
``simlab.trees.NodeTable(root.pair, root.context)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from simlab.grid import GridDraft
from simlab.pairs import ModelPair
from simlab.sampling import SamplingSettings


@dataclass(frozen=True)
class Root:
    """One root of one sampling setting.

    Attributes:
        setting: the setting's name (``SamplingSettings.name``).
        trajectory: trajectory (prompt) index; roots of one trajectory share a prefix.
        root: root id (trajectory * roots per trajectory + position along it).
        context: the root context (token ids); its length is l in the latency model.
        pair: the model pair, rooted at this context, with the setting.
        rng: for a source whose roots are one random walk (``SyntheticSource(stream="shared")``),
            the walk's generator: draws at the root continue it; else None (studies seed their
            draws per root).
        drafts: grid drafts replayed from a grid capture, else None.
        tree: the child lists of a captured tree (``backends.capture_store.captured_tree``), else None.
        labels: grid labels computed at capture time (``backends.capture --labels``):
            (verifier, K, L1, L2) -> (E, E_se, E_select, E_holdout[, accepted, unconditional]: the
            engines' metrics where the capture stored them, ``simlab.labels.METRIC_COLUMNS``), else None.
        prompt_length: tokens of the trajectory's prompt (real models: the encoded prompt), or
            None where the whole root context counts as the prompt (synthetic worlds).
        category: the workload category of the trajectory's prompt (a prompt file's
            ``category`` field, e.g. ``"maths"``; ``backends.prompt_sets``), or None.
        offset: target tokens sampled between the end of the trajectory's prompt and this root
            (``backends.roots.RootPlacement.offset_of``: 0 for the first root, ``spacing * j`` for
            the j-th): 0 means the root is the prompt's end (for a chat prompt, the template's
            opened assistant turn), above 0 that it lies that many tokens inside the target's
            reply; None where the root has no prompt (synthetic worlds).
        source: the source that yielded the root (``Root.table`` asks it for the root's node
            table), or None (a root made by hand: the plain table).  Not compared, not printed.
    """

    setting: str
    trajectory: int
    root: int
    context: tuple[int, ...]
    pair: ModelPair
    rng: np.random.Generator | None = None
    drafts: tuple[GridDraft, ...] | None = None
    tree: dict | None = None
    labels: dict | None = None
    prompt_length: int | None = None
    category: str | None = None
    offset: int | None = None
    source: object | None = field(default=None, repr=False, compare=False)

    def table(self):
        """The root's ``simlab.trees.NodeTable`` (p and q of every node below ``context``):
        ``source.table(self)`` where the source offers it (``Tables``), else
        ``NodeTable(pair, context)``.  A new table per call (its nodes fetched again)."""
        if self.source is not None and isinstance(self.source, Tables):
            return self.source.table(self)
        from simlab.trees import NodeTable

        return NodeTable(self.pair, self.context)


@runtime_checkable
class Tables(Protocol):
    """The optional source capability behind ``Root.table()``: the node table of one of its roots."""

    def table(self, root: Root):
        """A ``simlab.trees.NodeTable`` of ``root.context`` under ``root.pair`` (its settings).
        The values are the pair's p and q; how they are evaluated (kept KV caches or plain
        forwards) is the source's choice, equal to float32 rounding."""
        ...


@runtime_checkable
class Source(Protocol):
    """What every source offers.

    Attributes:
        name: the registry name (class attribute).
        honours: the ``SourceConfig`` fields this source reads (class attribute); a flag for any
            other source field is refused when given.
    """

    name: ClassVar[str]
    honours: ClassVar[frozenset[str]]

    def describe(self) -> str:
        """One line naming the source (printed in tables and chart subtitles)."""
        ...

    def slug(self) -> str:
        """A folder name for the source (studies write to ``out/<study>/<slug>`` by default)."""
        ...

    def fixed_settings(self) -> tuple[SamplingSettings, ...] | None:
        """The settings the source is bound to (captures), or None: any setting."""
        ...

    def roots(self, settings: SamplingSettings) -> Iterator[Root]:
        """Every root under ``settings``, in a fixed order."""
        ...

    def count(self, settings: SamplingSettings) -> int:
        """How many roots ``roots(settings)`` yields (for progress bars)."""
        ...

    def latency(self, largest_tree: int):
        """The source's own latency model (``simlab.latency.LatencyModel``) for trees of up to
        ``largest_tree`` drafted tokens, or None (the study falls back to a cost ratio)."""
        ...


SOURCES: dict[str, type] = {}
"""Registered sources by name (``register_source``)."""


def register_source(name: str):
    """Class decorator: register a source under ``name``."""

    def register(cls):
        if name in SOURCES:
            raise ValueError(f"source: {name!r} is registered twice")
        cls.name = name
        SOURCES[name] = cls
        return cls

    return register


def slug(text: str) -> str:
    """A file-name-safe version of ``text`` (letters, digits, ``._-``)."""
    out = "".join(c if c.isalnum() or c in "._-" else "-" for c in str(text).strip().rstrip("/"))
    return out.strip("-.") or "source"
