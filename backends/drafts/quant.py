"""The quantised self-draft of a pretrained target: its own weights re-quantised coarser (``quant:B:G``).

The draft (quantised self-speculation as in QSpec, Zhao et al., EMNLP 2025, arXiv 2410.11305: the
target's own weights drafting at a lower precision, verified at the higher one; QSpec's draft
quantises activations too, this lab's re-quantises the weights only) is the target with every ``nn.Linear`` weight W replaced by its round-to-
nearest asymmetric quantisation to ``B`` bits in groups of ``G`` consecutive weights along the
input dimension (the block layout of GGUF's ``Q4_1``, which stores one scale and one minimum per
block of 32):

    for each group g of G weights:  lo = min g,  d = (max g - lo) / (2^B - 1),
    W'[i] = lo + d * round((W[i] - lo) / d)          (W'[i] = W[i] where d = 0)

dequantised back to float32 (``quantise``).  Nothing is trained and nothing is cached: the draft
is a deterministic function of the target, built in about a second (``build``); it is an ordinary
Hugging Face model of the target's class with all of its layers, so tree attention, KV caches,
captures and the latency probe run on it unchanged.  SmolLM2's head is tied to its embedding, so
both are quantised (the GGUF file keeps them at 8 bits, its layers at ``Q4_1``).

Cost (``bytes_ratio``): the draft reads ``B + 32 / G`` bits per weight (B-bit codes plus a 16-bit
scale and minimum per group) where the target, served as the published GPU profiles serve theirs,
reads 16: a forward costs ``(B + 32 / G) / 16`` of the target's where decoding is memory-bound.
Against the GGUF file's own ``Q4_1`` storage (5 bits per weight) the saving would be small; the
profiles are 16-bit targets, and the tables say which ratio they used.
"""

from __future__ import annotations

import copy

PREFIX = "quant"
BITS = (2, 8)
"""The bit widths ``quant:B:G`` takes (inclusive)."""


def parse_spec(spec: str) -> tuple[int, int]:
    """(B, G) of ``quant:B:G``: B bits per weight in [2, 8], groups of G >= 2 weights.

    Raises:
        ValueError: ``draft: ...`` for any other text.
    """
    kind, _, rest = str(spec).partition(":")
    bits, _, group = rest.partition(":")
    if (
        kind != PREFIX
        or not all(s.isascii() and s.isdigit() for s in (bits, group))
        or not BITS[0] <= int(bits) <= BITS[1]
        or int(group) < 2
    ):
        raise ValueError(f"draft: expected quant:B:G (B bits in [{BITS[0]}, {BITS[1]}], groups of G >= 2 weights), got {spec!r}")
    return int(bits), int(group)


def name_of(bits: int, group: int) -> str:
    """The draft spec of ``B`` bits in groups of ``G``."""
    return f"{PREFIX}:{bits}:{group}"


def bytes_ratio(spec: str) -> float:
    """Bits the draft ``quant:B:G`` reads per weight over a 16-bit target's: ``(B + 32 / G) / 16``."""
    bits, group = parse_spec(spec)
    return (bits + 32 / group) / 16


def quantise(weight, bits: int, group: int):
    """``weight`` (a float tensor (out, in), ``in`` divisible by ``group``) round-to-nearest quantised
    to ``bits`` bits in groups of ``group`` consecutive entries of a row, asymmetric (each group's
    minimum and maximum are kept exactly), dequantised: a new tensor of the same shape and dtype.

    Raises:
        ValueError: ``weight: ...`` (not 2-D, not finite, rows not divisible by ``group``),
            ``bits``/``group`` out of range.
    """
    import torch

    if isinstance(bits, bool) or not isinstance(bits, int) or not BITS[0] <= bits <= BITS[1]:
        raise ValueError(f"bits: must be an integer in [{BITS[0]}, {BITS[1]}], got {bits!r}")
    if isinstance(group, bool) or not isinstance(group, int) or group < 2:
        raise ValueError(f"group: must be an integer >= 2, got {group!r}")
    if weight.dim() != 2 or weight.shape[1] % group:
        raise ValueError(
            f"weight: expected a 2-D tensor whose rows divide into groups of {group}, got shape {tuple(weight.shape)}"
        )
    if not bool(torch.isfinite(weight).all()):
        raise ValueError("weight: has a non-finite entry")
    groups = weight.reshape(-1, group)
    lo, hi = groups.amin(1, keepdim=True), groups.amax(1, keepdim=True)
    step = (hi - lo) / (2**bits - 1)
    flat = step == 0
    step = torch.where(flat, torch.ones_like(step), step)
    codes = torch.clamp(torch.round((groups - lo) / step), 0, 2**bits - 1)
    out = torch.where(flat, groups, lo + codes * step)
    return out.reshape(weight.shape)


def build(target, spec: str):
    """The quantised self-draft ``spec`` (``quant:B:G``) of ``target``: a deep copy (the target is
    left untouched) whose every ``nn.Linear`` weight is ``quantise``d, tied weights quantised once;
    in eval mode with ``name_or_path`` set to the spec.

    Raises:
        ValueError: ``draft: ...`` for a bad spec or a layer whose input size ``G`` does not divide.
    """
    import torch

    bits, group = parse_spec(spec)
    draft = copy.deepcopy(target)
    done = set()
    with torch.no_grad():
        for name, module in draft.named_modules():
            if isinstance(module, torch.nn.Linear) and id(module.weight) not in done:
                if module.weight.shape[1] % group:
                    raise ValueError(
                        f"draft: {spec}: the input size {module.weight.shape[1]} of {name} is not divisible by {group}"
                    )
                module.weight.copy_(quantise(module.weight, bits, group))
                done.add(id(module.weight))
    draft.config.name_or_path = name_of(bits, group)
    return draft.eval()
