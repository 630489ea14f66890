"""Real models as a model pair: two Hugging Face causal LMs (``backends.hf.HFPair``).

``HFPair(target, draft)`` loads both with ``AutoModelForCausalLM`` / ``AutoTokenizer`` from a
local folder or a hub id (hub ids need network access; the lab's machines use local folders,
for example the reference pair of ``python -m backends.reference_pair``).  It implements
``simlab.pairs.ModelPair`` and the capabilities ``NodeBatch``, ``NodeLogits``, ``HiddenStates``,
``WithSettings`` and ``EndOfSequence``, so every tree, verifier and study runs on it unchanged:

* ``distributions(contexts)``: contexts of equal length are batched into one forward per
  model (no padding), in chunks of at most ``max_batch`` sequences;
* ``node_distributions(root, paths)`` / ``node_logits``: p and q (or the logits) for every
  node of a draft tree in **one** forward per model: the root prefix is run once for its KV
  cache, then the tree tokens go in with a 4-D tree attention mask (each token sees the
  prefix, its ancestors and itself, never a sibling) and position ids = prefix length +
  depth - 1; ``max_batch`` splits the tree tokens into several forwards on the same cache
  (the capture tool halves it after an out-of-memory error);
* ``forest_logits([(root, paths), ...])``: several roots' trees in **one** forward per model
  and no cache: each root is a row of the batch (its context left-padded so that every row's
  context ends in the same column, then its tree's nodes, then padding), under one 4-D mask
  (a context token sees the context before it, a node the context, its ancestors and itself);
  rows are packed while batch x row length stays within ``forest_tokens``, and only the
  positions from the last context column on go through the LM head.  The capture tool's
  ``--roots-per-forward`` uses it;
* ``prefix_distributions(context, last)``: the target's p at every prefix of one context from one
  causal forward (``simlab.pairs.PrefixRows``: TreeGraft's prompt score cache);

Logits are cast to float32 on the device, and turned into p and q (float64) by the lab's one
transform, ``SamplingSettings.probabilities`` (``simlab.sampling``), the same as the synthetic
worlds and the capture replay.  The tokenizers must agree on every shared id; a smaller draft
vocabulary is aligned by id (q = 0 beyond it: exact, the draft cannot draw those ids).  A pair is
refused at load (``ValueError`` naming both models) when the draft's context is shorter than the
target's (a deep root would overrun the draft's position table), or when the draft's vocabulary
is larger than the target's, unless the caller asks ``trim_draft_vocab=True`` (the capture's
``--trim-draft-vocab``): then q is the draft's softmax over the target's ids only, renormalised
(the mass the draft puts beyond them is dropped), and ``draft_vocab_size`` > ``vocab_size`` says
so.  Device: ``"auto"`` picks CUDA when available,
else the CPU.  ``with_settings`` returns a new pair sharing the loaded models.

The tree-attention probe and ``with_resident_logits()``: ``docs/derivations/hf.md``.
"""

from __future__ import annotations

import copy
import inspect
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simlab.checks import check_device, check_int
from simlab.pairs import check_contexts, check_eos
from backends.tree_cache import (
    CachedTree,
    TreeSession,
    additive_mask,
    cache_kwarg,
    cache_of,
    closed_nodes,
    last_only,
    left_padded,
)
from simlab.device_rows import to_host
from simlab.sampling import SamplingSettings, check_settings

DTYPES = ("float32", "bfloat16", "float16")
PROBE_TOLERANCE = 1e-3
"""Largest |p_tree - p_path| the tree-attention probe accepts (float32 or lower-precision weights)."""

MASK_REJECTIONS = (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError)
"""What a Hugging Face model raises when it rejects a 4-D tree mask (shape checks, unsupported
attention implementations, SDPA/flash kernels that take no custom mask).  The tree-attention
probe catches exactly these, after re-raising out-of-memory errors, and falls back to batching
root-to-node paths with one warning (tested in tests/test_hf_backend.py); it is deliberately
broad because transformers' attention back ends raise different types for the same refusal.
Only errors raised inside the model count: one whose innermost frame is in this module (a bug
of ours in building the mask, not the model's refusal) is re-raised (``_raised_here``)."""


def _raised_here(exc: BaseException) -> bool:
    """True if ``exc`` was raised by code of this module or of ``backends.tree_cache`` (its
    innermost traceback frame): the lab's own code, not the model."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = {Path(__file__).resolve(), Path(__file__).with_name("tree_cache.py").resolve()}
    return bool(frames) and Path(frames[-1].filename).resolve() in ours


def _torch():
    import torch

    return torch


def check_model_folder(name: str, what: str) -> bool:
    """Whether ``name`` names a local model folder (it starts with ``.``, ``/`` or ``~``, or exists);
    a hub id (any other name) is not checked here (it needs the network).  Reads no weights.

    Raises:
        ValueError: ``<what>: ...`` for a local name that is not a folder holding ``config.json``.
    """
    looks_local = name.startswith((".", "/", "~")) or Path(name).expanduser().exists()
    if looks_local and not Path(name).expanduser().is_dir():
        raise ValueError(f"{what}: model folder {name!r} does not exist")
    if looks_local and not (Path(name).expanduser() / "config.json").is_file():
        raise ValueError(f"{what}: {name!r} is not a model folder (no config.json)")
    return looks_local


def load_model(name: str, device: str, dtype: str, what: str):
    """(model, tokenizer) from a local folder or hub id, in eval mode on ``device``.

    Raises:
        ValueError: the folder does not exist, or the model or tokenizer cannot be loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    looks_local = check_model_folder(name, what)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(Path(name).expanduser()) if looks_local else name)
        model = AutoModelForCausalLM.from_pretrained(
            str(Path(name).expanduser()) if looks_local else name, dtype=getattr(_torch(), dtype)
        )
    except Exception as exc:  # OSError, ValueError, safetensors and config errors alike: one line naming the model
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{what}: cannot load {name!r} ({first})") from None
    return model.to(device).eval(), tokenizer


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Every id both tokenizers know must map to the same token string.

    Raises:
        ValueError: naming the first id where they disagree.
    """
    shared = min(len(target_tokenizer), len(draft_tokenizer))
    a = target_tokenizer.convert_ids_to_tokens(list(range(shared)))
    b = draft_tokenizer.convert_ids_to_tokens(list(range(shared)))
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            raise ValueError(f"draft: tokenizer disagrees with the target's at id {i}: {y!r} vs {x!r}")


def feature_layers(config) -> tuple[int, int, int]:
    """A model's low, middle and top layers: indices into its ``hidden_states`` (1 = after the first
    block, n_layer = the last, after the final norm), from its config."""
    n = int(getattr(config, "n_layer", None) or getattr(config, "num_hidden_layers"))
    return 1, max(1, n // 2), n


def context_length(config) -> int:
    """A model's context length in tokens from its config (``n_positions`` or
    ``max_position_embeddings``), 0 when the config names none."""
    return int(getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", 0) or 0)


def oom_errors() -> tuple[type[BaseException], ...]:
    """The exception types of running out of accelerator or host memory."""
    torch = _torch()
    return tuple(
        t
        for t in (getattr(torch.cuda, "OutOfMemoryError", None), getattr(torch, "OutOfMemoryError", None), MemoryError)
        if t is not None
    )


class HFPair:
    """A ``ModelPair`` over two causal LMs (see the module docstring).

    Args:
        target, draft: local folder or hub id of each model.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (weights); softmax is float64.
        settings: the sampling transform applied to both models.
        max_batch: the most sequences (path batching) or tree tokens (tree attention) in one forward.
        forest_tokens: the most tokens (rows x padded row length) in one ``forest_logits`` forward.
        tree_attention: allow the one-forward tree evaluation (it is still probed).
        eos_id: the end-of-sequence id block efficiency and decoding stop at (None: none;
            ``"tokenizer"``: the target tokenizer's EOS token).
        trim_draft_vocab: accept a draft whose vocabulary is larger than the target's, its q cut
            to the target's ids and renormalised (module docstring); refused otherwise.
        models: ``((target, tokenizer), (draft, tokenizer))`` already loaded on ``device`` (for
            example ``backends.pretrained``'s target and its early-exit draft); ``target`` and
            ``draft`` are then only their names, and ``dtype`` is the caller's business.

    Raises:
        ValueError: missing folder, unloadable model, disagreeing tokenizers, a draft context
            shorter than the target's, a larger draft vocabulary without ``trim_draft_vocab``, bad
            dtype, device, settings, max_batch, forest_tokens or eos_id.
    """

    def __init__(
        self,
        target: str,
        draft: str,
        *,
        device: str = "auto",
        dtype: str = "float32",
        settings: SamplingSettings | None = None,
        max_batch: int = 64,
        tree_attention: bool = True,
        eos_id: int | str | None = None,
        forest_tokens: int = 8192,
        trim_draft_vocab: bool = False,
        models=None,
    ):
        self.device = check_device(device, "device")
        self.settings = check_settings(settings or SamplingSettings())
        self.max_batch = check_int(max_batch, "max_batch", 1)
        self.forest_tokens = check_int(forest_tokens, "forest_tokens", 1)
        if models is None:
            models = (load_model(target, self.device, dtype, "target"), load_model(draft, self.device, dtype, "draft"))
        (self.target, self.target_tokenizer), (self.draft, self.draft_tokenizer) = models
        check_tokenizers(self.target_tokenizer, self.draft_tokenizer)
        self.vocab_size = int(self.target.get_output_embeddings().weight.shape[0])
        self.draft_vocab_size = int(self.draft.get_output_embeddings().weight.shape[0])
        if self.draft_vocab_size > self.vocab_size and not trim_draft_vocab:
            raise ValueError(
                f"draft: its vocabulary ({self.draft_vocab_size} ids, {draft!r}) is larger than the target's "
                f"({self.vocab_size} ids, {target!r}); cutting q to the target's ids renormalises it: ask for "
                "that explicitly (trim_draft_vocab=True, --trim-draft-vocab) or use a matching draft"
            )
        if eos_id == "tokenizer":
            eos_id = self.target_tokenizer.eos_token_id
        self.eos_id = check_eos(eos_id, self.vocab_size)
        self.max_context = context_length(self.target.config)
        draft_context = context_length(self.draft.config)
        if draft_context and (not self.max_context or draft_context < self.max_context):
            if self.max_context:
                raise ValueError(
                    f"draft: its context ({draft_context} tokens, {draft!r}) is shorter than the target's "
                    f"({self.max_context} tokens, {target!r}); use a draft that reads every context the target can"
                )
            self.max_context = draft_context
        self.resident = False
        self.tree_attention = bool(tree_attention) and self._probe_tree_attention()

    def with_settings(self, settings: SamplingSettings) -> "HFPair":
        """The same models under other sampling settings (a new pair; this one is unchanged)."""
        other = copy.copy(self)
        other.settings = check_settings(settings)
        other._check_resident()
        return other

    def with_resident_logits(self, resident: bool = True) -> "HFPair":
        """The same models with ``node_logits`` / ``forest_logits`` answering torch tensors on the
        device (``resident=True``) or host arrays (a new pair; this one is unchanged).

        Raises:
            ValueError: resident logits under top-p settings (``simlab.device_rows``).
        """
        other = copy.copy(self)
        other.resident = bool(resident)
        other._check_resident()
        return other

    def resident_possible(self) -> bool:
        """Whether this pair's settings allow resident logits (none with top-p: its nucleus is cut
        on the host, ``simlab.device_rows``)."""
        return self.settings.top_p is None or self.settings.top_p >= 1.0

    def _check_resident(self) -> None:
        if self.resident and not self.resident_possible():
            raise ValueError(
                f"settings: top-p ({self.settings.name}) is computed on the host; resident logits need settings without it"
            )

    def with_max_batch(self, max_batch: int) -> "HFPair":
        """The same models with another ``max_batch`` (a new pair; this one is unchanged): what a
        retry after an out-of-memory error drafts with."""
        other = copy.copy(self)
        other.max_batch = check_int(max_batch, "max_batch", 1)
        return other

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` under the shared tokenizer."""
        return tuple(self.target_tokenizer(text)["input_ids"])

    def _check_length(self, length: int) -> None:
        if self.max_context and length > self.max_context:
            raise ValueError(f"context: {length} tokens exceed the model's context of {self.max_context}")

    def _logits(self, logits):
        """float32 (n, V) logits of one model, aligned to the target vocabulary by id: a host array,
        or with ``resident`` a tensor on the device."""
        z = logits.float()
        if z.shape[1] < self.vocab_size:  # a smaller draft vocabulary: q = 0 beyond it
            pad = z.new_full((z.shape[0], self.vocab_size - z.shape[1]), float("-inf"))
            z = _torch().cat([z, pad], dim=1)
        z = z[:, : self.vocab_size]
        return z if self.resident else z.cpu().numpy()

    def _empty_logits(self, n: int):
        """An uninitialised float32 (n, V) output: a host array, or with ``resident`` a device tensor."""
        if self.resident:
            return _torch().empty((n, self.vocab_size), dtype=_torch().float32, device=self.device)
        return np.empty((n, self.vocab_size), dtype=np.float32)

    def _probe_tree_attention(self) -> bool:
        """True if a two-branch tree evaluated with the tree mask matches plain path forwards: one
        tree forward, a forest of two roots, and two roots of different lengths fed level by level
        on kept caches (``backends.tree_cache``), with rows of unequal sizes (padding)."""
        root = tuple(range(min(3, self.vocab_size)))
        paths = [(), (1 % self.vocab_size,), (2 % self.vocab_size,), (1 % self.vocab_size, 0)]
        other = root[1:]  # a second, shorter root: the forest pads it
        try:
            nodes = [pth for pth in paths if pth]
            tree = [self._logits(self._tree_rows(m, root, nodes, self.max_batch)) for m in (self.target, self.draft)]
            forest = [
                [self._logits(r) for r in self._forest_rows(m, [(root, nodes), (other, nodes)])]
                for m in (self.target, self.draft)
            ]
            levels = [[paths[:3], paths[:2]], [paths[3:], [paths[2], paths[3]]]]  # per level: (root, other)
            cached = []
            for m in (self.target, self.draft):
                session = CachedTree(self, m, [root, other])
                rows = [session.feed([[n for n in level[b] if n] for b in (0, 1)], self.max_batch, level) for level in levels]
                cached.append([self._logits(r) for level in rows for r in level])
        except oom_errors():
            raise
        except MASK_REJECTIONS as exc:
            if _raised_here(exc):
                raise
            warnings.warn(
                f"tree attention: {type(self.target).__name__} rejects a 4-D tree mask ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); evaluating trees by batching their paths",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        plain = self._path_logits([root + pth for pth in paths], self.max_batch)
        plain_other = self._path_logits([other + pth for pth in paths], self.max_batch)
        soft = SamplingSettings().probabilities
        pairs = [*zip(tree, plain), *zip((f[0] for f in forest), plain), *zip((f[1] for f in forest), plain_other)]
        for rows, mine, theirs in zip(cached, plain, plain_other):  # per model: level 1 root's (), (1,), (2,), other's (), (1,);
            pairs += [
                (rows[0], mine[:3]),
                (rows[1], theirs[:2]),
                (rows[2], mine[3:]),
                (rows[3], theirs[2:]),
            ]  # level 2: (1, 0); (2,), (1, 0)
        worst = max(float(np.abs(soft(t) - soft(p)).max()) for t, p in pairs)
        if worst > PROBE_TOLERANCE:
            warnings.warn(
                f"tree attention: {type(self.target).__name__} does not honour a 4-D tree mask (probe differs "
                f"by {worst:.2g}); evaluating trees by batching their paths",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True

    def hidden_states(self, context: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The selector's embeddings at a root (DDTE Sec. 6): last-layer hidden states of the
        target and the draft at the previous token (position len - 2) and of the draft at the
        root token (position len - 1); float32 vectors (d_target,), (d_draft,), (d_draft,).

        Raises:
            ValueError: a context shorter than 2 tokens, longer than the model's, or with an
                id outside [0, V).
        """
        (context,) = check_contexts([context], self.vocab_size)
        if len(context) < 2:
            raise ValueError(f"context: needs at least 2 tokens, got {len(context)}")
        self._check_length(len(context))
        torch = _torch()
        with torch.no_grad():
            ids = torch.tensor([context], device=self.device)
            target = self.target(ids, output_hidden_states=True).hidden_states[-1][0].float().cpu().numpy()
            draft = self.draft(ids, output_hidden_states=True).hidden_states[-1][0].float().cpu().numpy()
        return target[-2], draft[-2], draft[-1]

    def feature_layers(self) -> tuple[int, int, int]:
        """The target's layers ``target_features`` fuses (``feature_layers``)."""
        return feature_layers(self.target.config)

    def target_features(self, contexts: Sequence[Sequence[int]]) -> np.ndarray:
        """The target's hidden states at the previous token (position len - 2) of each context,
        at ``feature_layers()`` concatenated: float32 (n, 3 d_target).  Contexts of equal length
        share a forward (``max_batch`` per forward).  The block drafter's input
        (``backends.block_drafter``): in serving they come with the verification for free.

        Raises:
            ValueError: a context shorter than 2 tokens or longer than the model's, an id outside [0, V).
        """
        contexts = check_contexts(contexts, self.vocab_size)
        torch = _torch()
        layers = self.feature_layers()
        width = int(self.target.config.hidden_size) * len(layers)
        out = np.empty((len(contexts), width), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for i, c in enumerate(contexts):
            if len(c) < 2:
                raise ValueError(f"context: needs at least 2 tokens, got {len(c)}")
            self._check_length(len(c))
            by_length.setdefault(len(c), []).append(i)
        with torch.no_grad():
            for indices in by_length.values():
                for start in range(0, len(indices), self.max_batch):
                    chunk = indices[start : start + self.max_batch]
                    states = self.target(
                        torch.tensor([contexts[i] for i in chunk], device=self.device), output_hidden_states=True
                    ).hidden_states
                    out[chunk] = torch.cat([states[l][:, -2] for l in layers], dim=-1).float().cpu().numpy()
        return out

    # -- the ModelPair protocol and its capabilities -----------------------------------------
    def distributions(self, contexts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """p and q for each context (grouped by length, one forward per group and model; float64 (n, V)).

        Raises:
            ValueError: an empty context, an id outside [0, V), or a context too long.
        """
        contexts = check_contexts(contexts, self.vocab_size)
        if any(not c for c in contexts):
            raise ValueError("context: empty; a real model needs at least one token (for example a BOS token)")
        logits_p, logits_q = self._path_logits(contexts, self.max_batch)
        return self.settings.probabilities(to_host(logits_p)), self.settings.probabilities(to_host(logits_q))

    def target_steps(self, prefix: Sequence[int]):
        """The target's p along a growing context from its KV cache (``simlab.pairs.TargetSteps``):
        a generator that yields float64 (V,) p(. | prefix) after one forward of the prefix, then
        p(. | context + token) for each ``send(token)`` after a one-token forward (the
        ``distributions`` transform; equal to its rows to float32 rounding).

        Raises:
            ValueError: an empty prefix, ids outside [0, V), or a context longer than the model's.
        """
        torch = _torch()
        (prefix,) = check_contexts([prefix], self.vocab_size)
        if not prefix:
            raise ValueError("prefix: empty; a real model needs at least one token (for example a BOS token)")
        length = len(prefix)
        self._check_length(length)
        key, keep = cache_kwarg(self.target), last_only(self.target)
        with torch.no_grad():
            out = self.target(torch.tensor([prefix], device=self.device), use_cache=True, **keep)
            while True:
                p = self.settings.probabilities(to_host(self._logits(out.logits[:, -1])))[0]
                token = yield p
                length += 1
                self._check_length(length)
                (step,) = check_contexts([(token,)], self.vocab_size)
                position = torch.tensor([[length - 1]], device=self.device)
                out = self.target(
                    torch.tensor([step], device=self.device),
                    position_ids=position,
                    use_cache=True,
                    **keep,
                    **{key: cache_of(out)},
                )

    def prefix_distributions(self, context: Sequence[int], last: int, rows: int = 256) -> np.ndarray:
        """The target's p(. | context[:i]) for i = 1..last from one causal forward of
        ``context[:last]`` (``simlab.pairs.PrefixRows``; TreeGraft's prompt score cache): float64
        (last, V), the same transform as ``distributions`` (equal to its rows to float32 rounding),
        the softmax ``rows`` positions at a time.

        Raises:
            ValueError: an empty context, ids outside [0, V), ``last`` outside [1, len(context)],
                a context too long.
        """
        torch = _torch()
        (context,) = check_contexts([context], self.vocab_size)
        last = check_int(last, "last", 1)
        if last > len(context):
            raise ValueError(f"last: at most the context's {len(context)} tokens, got {last}")
        self._check_length(last)
        with torch.no_grad():
            logits = self.target(torch.tensor([context[:last]], device=self.device)).logits[0]
        return self.prefix_rows(logits, rows)

    def prefix_rows(self, logits, rows: int = 256) -> np.ndarray:
        """float64 (n, V) distributions under this pair's settings from the target's logits
        (n, V_model) (a tensor), aligned as ``distributions`` aligns them, the softmax ``rows``
        positions at a time (``prefix_distributions``' transform)."""
        n = int(logits.shape[0])
        out = np.empty((n, self.vocab_size), dtype=np.float64)
        for start in range(0, n, rows):
            out[start : start + rows] = self.settings.probabilities(to_host(self._logits(logits[start : start + rows])))
        return out

    def node_distributions(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """p and q at ``root + path`` for each path, with one tree forward per model (float64 (n, V))."""
        logits_p, logits_q = self.node_logits(root, paths)
        return self.settings.probabilities(to_host(logits_p)), self.settings.probabilities(to_host(logits_q))

    def node_logits(
        self, root: Sequence[int], paths: Sequence[tuple[int, ...]], max_batch: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """float32 (n, V) logits of target and draft at ``root + path`` for each path (host arrays;
        device tensors for a ``with_resident_logits`` pair).

        Tree attention evaluates the ancestors of every path too, ``max_batch`` (default: the
        pair's) tree tokens per forward; without it the paths are batched.

        Raises:
            ValueError: an empty root, ids outside [0, V), a tree deeper than the context.
        """
        (root,) = check_contexts([root], self.vocab_size)
        paths = check_contexts(paths, self.vocab_size)
        chunk = self.max_batch if max_batch is None else check_int(max_batch, "max_batch", 1)
        if not root:
            raise ValueError("context: empty; a real model needs at least one token (for example a BOS token)")
        if not self.tree_attention:
            return self._path_logits([root + pth for pth in paths], chunk)
        nodes = closed_nodes(paths)
        self._check_length(len(root) + max((len(n) for n in nodes), default=0))
        index = {(): 0, **{n: i + 1 for i, n in enumerate(nodes)}}
        take = [index[pth] for pth in paths]  # only these rows are kept (the ancestors' logits are dropped per chunk)
        return (
            self._logits(self._tree_rows(self.target, root, nodes, chunk, take)),
            self._logits(self._tree_rows(self.draft, root, nodes, chunk, take)),
        )

    def forest_logits(
        self,
        trees: Sequence[tuple[Sequence[int], Sequence[tuple[int, ...]]]],
        max_tokens: int | None = None,
        max_batch: int | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Logits of target and draft at ``root + path`` for every path of every ``(root, paths)``,
        several roots' trees in one masked forward per model: one pair of float32 (len(paths), V)
        arrays per tree, in order (device tensors for a ``with_resident_logits`` pair).

        Trees are packed in order while rows x longest row (context + nodes, the ancestors of
        every path included) stays within ``max_tokens`` (default ``forest_tokens``); a tree
        longer than that alone goes through ``node_logits`` (``max_batch`` tree tokens per
        forward), and so does every tree when tree attention is off.  The rows of one pack are
        computed together, so a tree's logits can differ in the last float32 bits from a pack of
        other trees (the capture tool's groups are fixed by root id for that reason).

        Raises:
            ValueError: an empty root, ids outside [0, V), a tree deeper than the context, a bad
                max_tokens or max_batch.
        """
        budget = self.forest_tokens if max_tokens is None else check_int(max_tokens, "max_tokens", 1)
        prepared = []
        for root, paths in trees:
            (root,) = check_contexts([root], self.vocab_size)
            paths = check_contexts(paths, self.vocab_size)
            if not root:
                raise ValueError("context: empty; a real model needs at least one token (for example a BOS token)")
            nodes = closed_nodes(paths)
            self._check_length(len(root) + max((len(n) for n in nodes), default=0))
            prepared.append((root, paths, nodes))
        out: list = [None] * len(prepared)
        pack: list[int] = []

        def flush():
            if pack:
                items = [(prepared[i][0], prepared[i][2]) for i in pack]
                rows = [[self._logits(r) for r in self._forest_rows(m, items)] for m in (self.target, self.draft)]
                for j, i in enumerate(pack):
                    index = {(): 0, **{n: k + 1 for k, n in enumerate(prepared[i][2])}}
                    take = [index[pth] for pth in prepared[i][1]]
                    out[i] = (rows[0][j][take], rows[1][j][take])
                pack.clear()

        def width(i):  # padded row length with tree i in the pack
            indices = [*pack, i]
            return max(len(prepared[j][0]) for j in indices) + max(len(prepared[j][2]) for j in indices)

        for i, (root, paths, nodes) in enumerate(prepared):
            if not self.tree_attention or len(root) + len(nodes) > budget:
                out[i] = self.node_logits(root, paths, max_batch)
                continue
            if pack and (len(pack) + 1) * width(i) > budget:
                flush()
            pack.append(i)
        flush()
        return out

    def _forest_rows(self, model, items: list[tuple[tuple[int, ...], list[tuple[int, ...]]]]):
        """Per item (root, nodes ancestor-closed and sorted by depth), the logits (1 + len(nodes),
        V_model) on the device of its root and nodes, all items in one forward of ``model``."""
        torch = _torch()
        C = max(len(root) for root, _ in items)  # every context ends at column C - 1
        S = C + max(len(nodes) for _, nodes in items)
        ids, positions, allowed = left_padded([root for root, _ in items], S)
        for b, (root, nodes) in enumerate(items):
            L, n, start = len(root), len(nodes), C - len(root)
            index = {node: k for k, node in enumerate(nodes)}
            ancestry = np.zeros((n, n), dtype=bool)
            for k, node in enumerate(nodes):  # sorted by depth: a parent's row is complete before its children's
                if len(node) > 1:
                    ancestry[k] = ancestry[index[node[:-1]]]
                ancestry[k, k] = True
            ids[b, C : C + n] = [node[-1] for node in nodes]
            positions[b, C : C + n] = [L + len(node) - 1 for node in nodes]
            allowed[b, C : C + n, start:C] = True
            allowed[b, C : C + n, C : C + n] = ancestry
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            mask = additive_mask(allowed, dtype, self.device)
            keep = {"logits_to_keep": S - C + 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
            logits = model(
                torch.from_numpy(ids).to(self.device),
                attention_mask=mask,
                position_ids=torch.from_numpy(positions).to(self.device),
                use_cache=False,
                **keep,
            ).logits
            logits = logits[:, -(S - C + 1) :]  # the last context column, then the node columns
            return [logits[b, : 1 + len(nodes)] for b, (_, nodes) in enumerate(items)]

    def _path_logits(self, contexts, max_batch: int):
        torch = _torch()
        out_p, out_q = self._empty_logits(len(contexts)), self._empty_logits(len(contexts))
        by_length: dict[int, list[int]] = {}
        for i, c in enumerate(contexts):
            self._check_length(len(c))
            by_length.setdefault(len(c), []).append(i)
        with torch.no_grad():
            for indices in by_length.values():
                for start in range(0, len(indices), max_batch):
                    chunk = indices[start : start + max_batch]
                    ids = torch.tensor([contexts[i] for i in chunk], device=self.device)
                    out_p[chunk] = self._logits(self.target(ids, **last_only(self.target)).logits[:, -1])
                    out_q[chunk] = self._logits(self.draft(ids, **last_only(self.draft)).logits[:, -1])
        return out_p, out_q

    def _tree_rows(self, model, root: tuple[int, ...], nodes: list[tuple[int, ...]], chunk: int, take=None):
        """Logits (len(take), V_model) on the device of rows ``take`` of [root, *nodes] (default:
        all 1 + len(nodes)), by tree attention; ``nodes`` are ancestor-closed and sorted by depth,
        ``chunk`` tokens per forward (``backends.tree_cache.CachedTree``: one ``feed`` of every
        node), so no more than the requested rows and one chunk's logits are alive at once."""
        rows = [(), *nodes]
        take = rows if take is None else [rows[i] for i in take]
        return CachedTree(self, model, [root]).feed([nodes], chunk, [take])[0]

    def session(self, roots: Sequence[Sequence[int]], max_batch: int | None = None) -> TreeSession:
        """A ``backends.tree_cache.TreeSession`` over ``roots``: their trees' nodes evaluated on both
        models' kept KV caches, all roots in one forward per model and level, each node once."""
        return TreeSession(self, roots, max_batch)
