"""The draft kinds of ``--pair smollm2``, found by the prefix of their spec (the text before the first ``:``).

==============  =======================  ================================  ===================================
prefix          spec                     made by                           weights it reads
==============  =======================  ================================  ===================================
``early-exit``  ``early-exit:L``         ``backends.drafts.self_drafts``   the target's first L layers (shared)
``adapter``     ``adapter:L[:VARIANT]``  ``backends.drafts.adapter``       the first L layers + trained layers
                                                                           loaded from a folder
``quant``       ``quant:B:G``            ``backends.drafts.quant``         every target layer at B bits
==============  =======================  ================================  ===================================

Modules: ``self_drafts`` (the untrained self-drafts ``early-exit:L`` and ``quant:B:G`` both named
pairs take: spec, build, cost), ``adapter`` (the trained adapter draft: model, cache format,
``DraftRecipe``), ``quant`` (the re-quantisation of ``quant:B:G``).

``kind_of(spec)`` is the ``DraftKind`` of a spec (None for a prefix no kind has); ``backends.pretrained``
reads every per-kind step through it (normalise, decoder layers read, precision, folder, build), so
a new kind is its ``DraftKind`` added with ``register``.  The folders beside this file
(``smollm2/adapter-L``) are the trained adapter drafts shipped with the lab
(``backends.pretrained.SHIPPED_DRAFTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from backends.drafts import adapter, quant, self_drafts


@dataclass(frozen=True)
class DraftKind:
    """One kind of draft of a pretrained target.

    Attributes:
        prefix: the spec's text before its first ``:``.
        syntax: the spec and what it is, as an error message lists it (``"quant:B:G (...)"``).
        normalise: ``spec -> normalised spec``, or None for a spec of this prefix that is no valid
            one and that the kind leaves to the generic refusal; ``ValueError("draft: ...")`` for one
            it refuses itself.
        layers: ``(normalised spec, target config dict, adapter layers) -> decoder layers read``
            per token (the adapter layers count only for a kind with trained layers).
        precision: ``normalised spec -> bits per weight over 16``.
        folder: ``(normalised spec, root folder) -> the draft's folder under root`` for a kind
            loaded from files; None for a kind built from the target's weights alone.
        build: ``(target model, normalised spec, folder or None) -> draft model``.
    """

    prefix: str
    syntax: str
    normalise: Callable[[str], str | None]
    layers: Callable[[str, dict, int], int]
    precision: Callable[[str], float]
    folder: Callable[[str, Path], Path] | None
    build: Callable[[object, str, Path | None], object]


def _adapter_folder(spec: str, root: Path) -> Path:
    return adapter.folder_of(root, *adapter.parse_spec(spec))


KINDS: dict[str, DraftKind] = {}
"""prefix -> ``DraftKind``, in the order an error message lists them."""


def register(kind: DraftKind) -> DraftKind:
    """Add ``kind`` under its prefix.

    Raises:
        ValueError: ``kind: ...`` for an object that is no ``DraftKind``, or a prefix already taken.
    """
    if not isinstance(kind, DraftKind):
        raise ValueError(f"kind: must be a DraftKind, got {kind!r}")
    if kind.prefix in KINDS:
        raise ValueError(f"kind: the prefix {kind.prefix!r} is already registered")
    KINDS[kind.prefix] = kind
    return kind


for _kind in (
    DraftKind(
        self_drafts.EARLY_EXIT,
        "early-exit:L (the target's first L layers, its norm and head)",
        self_drafts.parse,
        lambda spec, config, adapter_layers: int(spec.partition(":")[2]),
        self_drafts.precision_ratio,
        None,
        lambda target, spec, folder: self_drafts.build(target, spec),
    ),
    DraftKind(
        adapter.PREFIX,
        "adapter:L[:VARIANT] (a trained adapter draft, python -m backends.train_draft)",
        lambda spec: adapter.name_of(*adapter.parse_spec(spec)),
        lambda spec, config, adapter_layers: adapter.parse_spec(spec)[0] + adapter_layers,
        self_drafts.precision_ratio,
        _adapter_folder,
        lambda target, spec, folder: adapter.load(target, spec, folder.parent)[0],
    ),
    DraftKind(
        quant.PREFIX,
        "quant:B:G (the target re-quantised to B bits in groups of G)",
        self_drafts.parse,
        lambda spec, config, adapter_layers: int(config["num_hidden_layers"]),
        self_drafts.precision_ratio,
        None,
        lambda target, spec, folder: self_drafts.build(target, spec),
    ),
):
    register(_kind)


def kind_of(spec) -> DraftKind | None:
    """The registered kind of ``spec`` by its prefix (the text before the first ``:``), or None."""
    return KINDS.get(str(spec).partition(":")[0])


def listed() -> str:
    """Every kind's ``syntax``, joined as an error message lists them (``a, b or c``)."""
    syntaxes = [kind.syntax for kind in KINDS.values()]
    return syntaxes[0] if len(syntaxes) == 1 else f"{', '.join(syntaxes[:-1])} or {syntaxes[-1]}"


__all__ = ["KINDS", "DraftKind", "kind_of", "listed", "register"]
