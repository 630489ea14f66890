"""The trained self-draft of a pretrained target: an early exit with a trained adapter (``adapter:L``).

The draft (Kangaroo, Liu et al. 2024, arXiv 2404.18911, and LayerSkip, Elhoushi et al. 2024,
arXiv 2404.16710: a shallow sub-network of the target plus a small trained part) is

    q(. | x_1..x_j) = softmax(W_head norm_a(A(h^L_1..h^L_j))_j)

where h^L is the target's residual stream after its first L decoder layers (the target's own
embedding and layers, shared, frozen), A is ``adapter_layers`` trained decoder layers of the
target's architecture (rotary positions, grouped KV heads; initialised as copies of the target's
layers L, L+1, ...), norm_a a trained copy of the target's final norm, and W_head the target's
(tied) head.  It is an ordinary Hugging Face model of the target's class (``build``): its first
L layers, embedding, rotary table and head **are** the target's modules, so tree attention, KV
caches, captures and the latency probe run on it unchanged, and its KV cache holds L +
``adapter_layers`` layers.  Cost per token: L + ``adapter_layers`` of the target's layers plus
the shared head.

Trained weights live in the user cache (``backends.pretrained.cache_dir() / "drafts" / name``):
``adapter.safetensors`` (the adapter layers and norm only) and ``manifest.json`` (the
``DraftRecipe``, seed, data, torch version, threads, device, seconds, held-out acceptance by
depth), written by ``python -m backends.train_draft`` (``backends.train_draft``).  ``load`` refuses
a draft that is not trained yet in one line saying which command trains it.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from dataclasses import dataclass, fields
from pathlib import Path

PREFIX = "adapter"


@dataclass(frozen=True)
class DraftRecipe:
    """One adapter draft's training recipe (``backends.train_draft``'s module docstring says what
    each field does); ``layers`` is its exit layer L.  Kept here, beside the cache format, so that
    ``load`` can refuse a default-recipe draft trained with other settings.

    Raises:
        ValueError: ``<field>: ...`` for a field out of range.
    """

    layers: int
    adapter_layers: int = 1
    prompts: int = 384
    reply_tokens: int = 160
    text_tokens: int = 49_152
    length: int = 256
    steps: int = 1400
    batch: int = 4
    positions: int = 256
    learning_rate: float = 1e-3
    warmup: int = 50
    generate_batch: int = 32
    paths: int = 4
    depth: int = 9
    seed: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "learning_rate":
                if not (isinstance(value, float) and 0 < value < 1):
                    raise ValueError(f"learning_rate: must be a float in (0, 1), got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < (0 if f.name in ("seed", "text_tokens", "warmup") else 1)
            ):
                raise ValueError(
                    f"{f.name}: must be an integer >= {0 if f.name in ('seed', 'text_tokens', 'warmup') else 1}, got {value!r}"
                )
        if self.positions > self.batch * self.length:
            raise ValueError(f"positions: at most batch x length = {self.batch * self.length}, got {self.positions}")


def parse_spec(spec: str) -> tuple[int, str]:
    """(L, variant) of ``adapter:L`` or ``adapter:L:variant`` (variant ``""`` by default: the
    recipe ``python -m backends.train_draft`` trains without ``--variant``).

    Raises:
        ValueError: ``draft: ...`` for any other text.
    """
    kind, _, rest = str(spec).partition(":")
    layers, _, variant = rest.partition(":")
    if (
        kind != PREFIX
        or not (layers.isascii() and layers.isdigit())
        or int(layers) < 1
        or (variant and not (variant.isascii() and variant.replace("-", "").isalnum()))
    ):
        raise ValueError(f"draft: expected adapter:L or adapter:L:VARIANT (L >= 1), got {spec!r}")
    return int(layers), variant


def name_of(layers: int, variant: str = "") -> str:
    """The cache folder's name (and draft spec) of an adapter draft."""
    return f"{PREFIX}:{layers}" + (f":{variant}" if variant else "")


def folder_of(root: Path, layers: int, variant: str = "") -> Path:
    """Where ``name_of(layers, variant)`` is kept under ``root`` (``adapter-L`` or ``adapter-L-variant``)."""
    return Path(root) / name_of(layers, variant).replace(":", "-")


def adapter_modules(target, layers: int, adapter_layers: int = 1):
    """Fresh trainable adapter modules for ``target``: (ModuleList of ``adapter_layers`` copies of
    the target's decoder layers L, L+1, ..., a copy of its final norm).

    Raises:
        ValueError: ``draft: ...`` when L + adapter_layers exceeds the target's layers.
    """
    import torch

    n = int(target.config.num_hidden_layers)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers or layers + adapter_layers > n:
        raise ValueError(f"draft: adapter:L needs 1 <= L and L + {adapter_layers} adapter layer(s) <= {n}, got L = {layers!r}")
    stack = torch.nn.ModuleList([copy.deepcopy(target.model.layers[layers + i]) for i in range(adapter_layers)])
    norm = copy.deepcopy(target.model.norm)
    for p in [*stack.parameters(), *norm.parameters()]:
        p.requires_grad_(True)
    return stack, norm


def build(target, layers: int, stack, norm, name: str | None = None):
    """The draft model (module docstring): a model of ``target``'s class whose embedding, first
    ``layers`` layers, rotary table and head are the target's modules, then ``stack`` and ``norm``.
    No weight is copied; the adapter modules are used as given (not copied either).  With an empty
    ``stack`` and the target's own norm it is the untrained early exit (``backends.pretrained.early_exit``).

    Raises:
        RuntimeError: the target's class has a module the draft does not set (not a llama-like model)."""
    import torch

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers + len(stack)
    config._name_or_path = f"{target.name_or_path}::{name or name_of(layers)}"
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[: config.num_hidden_layers]
    with torch.device("meta"):
        draft = type(target)(config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList([*target.model.layers[:layers], *stack])
    draft.model.norm = norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    left = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"backends.drafts.adapter: {type(target).__name__} has modules the draft does not set: {left[:3]}")
    return draft.eval()


def adapter_forward(stack, norm, rotary, hidden, positions):
    """norm(A(hidden)) for (B, T, H) float32 ``hidden`` = h^L at ``positions`` (1, T) under a causal
    mask: the draft's final hidden state computed from the target's layer-L states (what training
    runs on labelled h^L; tested equal to the draft model's own forward)."""
    import torch

    T = hidden.shape[1]
    mask = torch.full((T, T), float("-inf"), dtype=hidden.dtype, device=hidden.device).triu(1)[None, None]
    embeddings = rotary(hidden, positions)
    for layer in stack:
        hidden = layer(hidden, attention_mask=mask, position_embeddings=embeddings, position_ids=positions)
    return norm(hidden)


def save(folder: Path, stack, norm, manifest: dict) -> None:
    """Write ``adapter.safetensors`` (stack and norm) and ``manifest.json`` into ``folder``
    atomically (a temporary sibling renamed into place; an existing folder is replaced)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        state = {f"stack.{k}": v.detach().contiguous() for k, v in stack.state_dict().items()}
        state |= {f"norm.{k}": v.detach().contiguous() for k, v in norm.state_dict().items()}
        save_file(state, str(tmp / "adapter.safetensors"), metadata={"format": "pt"})
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        if folder.exists():
            os.rename(folder, old)
        os.rename(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(target, spec: str, root: Path):
    """The trained draft ``spec`` (``adapter:L[:variant]``) for ``target`` from ``root`` (a folder
    of drafts), as a model (``build``) and its manifest.

    Raises:
        ValueError: ``draft: ...`` for a bad spec, a draft not trained yet (saying which command
            trains it), one trained for another number of target layers or another exit layer, a
            default-recipe draft (no variant) whose recipe is not today's default
            ``DraftRecipe``, or a damaged folder.
    """
    from safetensors.torch import load_file

    layers, variant = parse_spec(spec)
    folder = folder_of(root, layers, variant)
    if not (folder / "manifest.json").is_file():
        flag = f" --variant {variant}" if variant else ""
        raise ValueError(
            f"draft: {spec} is not trained yet (no {folder}); train it once with "
            f"python -m backends.train_draft --layers {layers}{flag} (see the README)"
        )
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        recipe = dict(manifest["recipe"])
        trained_on, adapter_layers, exit_layer = (
            int(manifest["target_layers"]),
            int(recipe["adapter_layers"]),
            int(recipe["layers"]),
        )
        state = load_file(str(folder / "adapter.safetensors"))
    except Exception as exc:  # noqa: BLE001 - json, key and safetensors errors alike: one line
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise ValueError(f"draft: cannot load {spec} from {folder} ({first}); delete it and train it again") from None
    if trained_on != int(target.config.num_hidden_layers):
        raise ValueError(
            f"draft: {spec} in {folder} was trained on a target of {trained_on} layers, "
            f"this one has {target.config.num_hidden_layers}"
        )
    if exit_layer != layers:
        raise ValueError(f"draft: {spec} in {folder} was trained as adapter:{exit_layer}; delete it and train it again")
    if not variant:
        from dataclasses import asdict

        default = asdict(DraftRecipe(layers=layers))
        changed = sorted(k for k in default.keys() | recipe.keys() if default.get(k) != recipe.get(k))
        if changed:
            raise ValueError(
                f"draft: {spec} in {folder} was trained with another recipe than today's default (differs in "
                f"{', '.join(changed)}); train it again with python -m backends.train_draft --layers {layers}"
            )
    stack, norm = adapter_modules(target, layers, adapter_layers)
    try:
        stack.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("stack.")})
        norm.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("norm.")})
    except RuntimeError as exc:
        first = str(exc).splitlines()[0][:160]
        raise ValueError(f"draft: cannot load {spec} from {folder} ({first}); delete it and train it again") from None
    for p in [*stack.parameters(), *norm.parameters()]:
        p.requires_grad_(False)
    return build(target, layers, stack, norm, name_of(layers, variant)), manifest
