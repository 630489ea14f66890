"""The untrained self-drafts every named pretrained pair takes: drafts made of the target's own weights.

* ``early-exit:L`` (``early_exit``): the target's embedding, its first L decoder layers, its final
  norm and its head, sharing the target's modules (no weight copied); untrained and weak for small L.
* ``quant:B:G`` (``backends.drafts.quant``): the target's weights re-quantised to B bits in groups of
  G, built on load.

``parse`` normalises their specs, ``build`` makes the draft of a loaded target, ``weight_ratio``
gives its weight bytes read per token over the 16-bit target's (``precision_ratio`` times the share
of the target's linear weights it reads, ``backends.model_cache.config_weights``).  The pairs
(``backends.pretrained`` for ``smollm2``, which adds its trained adapter drafts ``adapter:L``;
``backends.qwen_pair`` for ``qwen2.5-coder``, which adds its independent 0.5B draft) reach them
through their own ``parse_draft`` and ``draft_model``.
"""

from __future__ import annotations

from backends.drafts import quant
from backends.model_cache import config_weights

EARLY_EXIT = "early-exit"
"""The early exit's spec prefix (``early-exit:L``)."""
KINDS = (EARLY_EXIT, quant.PREFIX)
"""The spec prefixes of the self-drafts (the text before the first ``:``)."""


def parse(spec: str) -> str | None:
    """The normalised spec of the self-draft ``spec`` (``early-exit:L`` with L decimal digits, leading
    zeros dropped; ``quant:B:G`` by ``backends.drafts.quant``); None for any other text (another kind
    of draft, or ``early-exit:`` without a decimal depth).

    Raises:
        ValueError: ``draft: ...`` (``quant.parse_spec``) for a text of the ``quant`` kind
            (before its first ``:``) that is no valid ``quant:B:G``.
    """
    kind, _, value = str(spec).partition(":")
    if kind == quant.PREFIX:
        return quant.name_of(*quant.parse_spec(spec))
    if kind == EARLY_EXIT and value.isascii() and value.isdigit():
        return f"{EARLY_EXIT}:{int(value)}"
    return None


def build(target, spec: str):
    """The draft model of the normalised self-draft ``spec`` (``parse``) for the loaded ``target``:
    ``early_exit`` (sharing the target's modules) or ``quant.build`` (a re-quantised copy).

    Raises:
        ValueError: ``draft: ...`` for a bad depth or group, or a spec that is no self-draft.
    """
    kind, _, value = spec.partition(":")
    if kind == EARLY_EXIT:
        return early_exit(target, int(value))
    if kind == quant.PREFIX:
        return quant.build(target, spec)
    raise ValueError(f"draft: {spec!r} is not a self-draft ({EARLY_EXIT}:L or {quant.PREFIX}:B:G)")


def early_exit(target, layers: int):
    """The early-exit self-draft of a llama or qwen2 ``target``: its embedding, its first ``layers``
    decoder layers, its final norm, rotary table and head, as a model of the target's class whose
    modules **are** the target's (no weight copied; a KV cache of ``layers`` layers).

    Raises:
        ValueError: ``draft: ...`` for ``layers`` outside [1, the target's layers].
    """
    import torch

    from backends.drafts.adapter import build as build_adapter

    n = int(target.config.num_hidden_layers)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= n:
        raise ValueError(f"draft: early-exit:L needs 1 <= L <= {n} (the target's layers), got {layers!r}")
    return build_adapter(target, layers, torch.nn.ModuleList(), target.model.norm, f"early-exit:{layers}")


def precision_ratio(spec: str) -> float:
    """Bits per weight the draft ``spec`` reads over the 16-bit target's: ``quant.bytes_ratio``
    for ``quant:B:G``, 1 for the drafts that read the target's own weights (early exit, adapter)."""
    return quant.bytes_ratio(spec) if spec.startswith(quant.PREFIX + ":") else 1.0


def weight_ratio(spec: str, config: dict, layers: int | None = None) -> float:
    """Weight bytes read per token by the draft ``spec`` (normalised) of the target's own weights over
    the target's (all its layers, 16-bit), each plus the head, from the target's llama or qwen2
    ``config`` (dict): ``config_weights(config, layers) / config_weights(config) *
    precision_ratio(spec)``, the relative cost of a forward where decoding is memory-bound (one
    token on a GPU reads every weight once).  ``layers``: the decoder layers the draft reads (None:
    the spec's own, every layer for ``quant:B:G`` and L for ``early-exit:L``; a trained adapter
    draft passes its own count).

    Raises:
        ValueError: ``draft: ...`` where ``layers`` is None and ``spec`` is no self-draft (an
            independent model: its ratio needs its own config).
    """
    kind, _, value = spec.partition(":")
    if layers is None:
        if kind == quant.PREFIX:  # every layer, at fewer bits (precision_ratio)
            layers = int(config["num_hidden_layers"])
        elif kind == EARLY_EXIT:
            layers = int(value)
        else:
            raise ValueError(
                f"draft: {spec} is an independent model, not a draft of the target's weights; its ratio needs its own config"
            )
    return config_weights(config, layers) / config_weights(config) * precision_ratio(spec)
