"""Real models as a model pair: two Hugging Face causal LMs (``backends.hf.HFPair``).

``HFPair(target, draft)`` loads both with ``AutoModelForCausalLM`` / ``AutoTokenizer`` from a
local folder or a hub id (hub ids need network access; the lab's machines use local folders,
for example the reference pair of ``python -m backends.reference_pair``).  It implements the
``simlab.pairs.ModelPair`` protocol, so every tree, verifier and study runs on it unchanged:

* ``distributions(contexts)``: contexts of equal length are batched into one forward per
  model (no padding), chunked by ``max_batch``;
* ``node_distributions(root, paths)``: p and q for every node of a draft tree in **one**
  forward per model: the root prefix is run once for its KV cache, then all tree tokens go
  in one call with a 4-D tree attention mask (each token sees the prefix, its ancestors and
  itself, never a sibling) and position ids = prefix length + depth - 1.  Models that reject
  custom masks fall back to batching the root-to-node paths (``tree_attention=False`` forces
  the fallback).

Logits are cast to float32 on the device, then to float64, and turned into p and q by the same
temperature / top-k / top-p transform as the synthetic worlds (``SamplingSettings``).  The
tokenizers must agree on every shared id; a smaller draft vocabulary is aligned by id (q = 0
beyond it).  Device: ``"auto"`` picks CUDA when available, else the CPU.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from backends.synthetic.base import SamplingSettings
from simlab.distributions import sampling_distribution

DTYPES = ("float32", "bfloat16", "float16")


def _torch():
    import torch

    return torch


def pick_device(device: str = "auto") -> str:
    """``"cuda"`` when available for ``"auto"``, else ``"cpu"``; other values are checked.

    Raises:
        ValueError: an unknown device string, or a CUDA device without CUDA.
    """
    torch = _torch()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but this torch build has no usable CUDA device")
    return device


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
    looks_local = name.startswith((".", "/", "~")) or Path(name).expanduser().exists()
    if looks_local and not Path(name).expanduser().is_dir():
        raise ValueError(f"{what}: model folder {name!r} does not exist")
    if looks_local and not (Path(name).expanduser() / "config.json").is_file():
        raise ValueError(f"{what}: {name!r} is not a model folder (no config.json)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(Path(name).expanduser()) if looks_local else name)
        model = AutoModelForCausalLM.from_pretrained(str(Path(name).expanduser()) if looks_local else name,
                                                     dtype=getattr(_torch(), dtype))
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


class HFPair:
    """A ``ModelPair`` over two causal LMs (see the module docstring).

    Args:
        target, draft: local folder or hub id of each model.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (weights); softmax is float32+.
        settings: the sampling transform applied to both models.
        max_batch: the largest batch of sequences in one forward.
        tree_attention: use the one-forward tree evaluation (else batch the paths).

    Raises:
        ValueError: missing folder, unloadable model, disagreeing tokenizers, bad dtype.
    """

    def __init__(self, target: str, draft: str, *, device: str = "auto", dtype: str = "float32",
                 settings: SamplingSettings | None = None, max_batch: int = 64, tree_attention: bool = True):
        self.device = pick_device(device)
        self.settings = settings or SamplingSettings()
        self.target, self.target_tokenizer = load_model(target, self.device, dtype, "target")
        self.draft, self.draft_tokenizer = load_model(draft, self.device, dtype, "draft")
        check_tokenizers(self.target_tokenizer, self.draft_tokenizer)
        self.vocab_size = int(self.target.get_output_embeddings().weight.shape[0])
        self.max_batch = max_batch
        self.tree_attention = tree_attention
        self.max_context = int(getattr(self.target.config, "n_positions", None) or getattr(self.target.config, "max_position_embeddings", 0) or 0)

    # -- helpers ---------------------------------------------------------------------------
    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of ``text`` under the shared tokenizer."""
        return tuple(self.target_tokenizer(text)["input_ids"])

    def _check_length(self, length: int) -> None:
        if self.max_context and length > self.max_context:
            raise ValueError(f"context: {length} tokens exceed the model's context of {self.max_context}")

    def _logits(self, logits) -> np.ndarray:
        """float32 (n, V) logits of one model, aligned to the target vocabulary by id."""
        z = logits.float().cpu().numpy()
        if z.shape[1] < self.vocab_size:  # a smaller draft vocabulary: q = 0 beyond it
            z = np.concatenate([z, np.full((z.shape[0], self.vocab_size - z.shape[1]), -np.inf, dtype=np.float32)], axis=1)
        return z[:, : self.vocab_size]

    def transform(self, logits: np.ndarray) -> np.ndarray:
        """float64 (n, V) distributions from float32 logits (n, V) by the pair's sampling settings."""
        s = self.settings
        return np.array([sampling_distribution(row.astype(np.float64), temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
                         for row in logits])

    @staticmethod
    def _cache_kwarg(model) -> str:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @staticmethod
    def _cache_of(output):
        return getattr(output, "cache", None) or getattr(output, "past_key_values", None)

    def hidden_states(self, context: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The selector's embeddings at a root (DDTE Sec. 6): last-layer hidden states of the
        target and the draft at the previous token (position len - 2) and of the draft at the
        root token (position len - 1); float32 vectors (d_target,), (d_draft,), (d_draft,).

        Raises:
            ValueError: a context shorter than 2 tokens or longer than the model's.
        """
        context = tuple(int(t) for t in context)
        if len(context) < 2:
            raise ValueError(f"context: needs at least 2 tokens, got {len(context)}")
        self._check_length(len(context))
        torch = _torch()
        with torch.no_grad():
            ids = torch.tensor([context], device=self.device)
            target = self.target(ids, output_hidden_states=True).hidden_states[-1][0].float().cpu().numpy()
            draft = self.draft(ids, output_hidden_states=True).hidden_states[-1][0].float().cpu().numpy()
        return target[-2], draft[-2], draft[-1]

    # -- the ModelPair protocol -----------------------------------------------------------
    def distributions(self, contexts: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """p and q for each context (grouped by length, one forward per group and model; float64 (n, V))."""
        contexts = [tuple(int(t) for t in c) for c in contexts]
        if any(not c for c in contexts):
            raise ValueError("context: empty; a real model needs at least one token (for example a BOS token)")
        logits_p, logits_q = self._path_logits(contexts)
        return self.transform(logits_p), self.transform(logits_q)

    def node_distributions(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """p and q at ``root + path`` for each path, with one tree forward per model (float64 (n, V))."""
        logits_p, logits_q = self.node_logits(root, paths)
        return self.transform(logits_p), self.transform(logits_q)

    def node_logits(self, root: Sequence[int], paths: Sequence[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
        """float32 (n, V) logits of target and draft at ``root + path`` for each path.

        One tree-attention forward per model (the ancestors of every path are added to the
        evaluated tree); models that reject custom masks fall back to batching the paths.
        """
        root = tuple(int(t) for t in root)
        paths = [tuple(int(t) for t in pth) for pth in paths]
        if not root:
            raise ValueError("context: empty; a real model needs at least one token (for example a BOS token)")
        if self.tree_attention:
            nodes = sorted({pth[:d] for pth in paths for d in range(1, len(pth) + 1)}, key=lambda x: (len(x), x))
            self._check_length(len(root) + max((len(n) for n in nodes), default=0))
            try:
                rows_p = self._logits(self._tree_rows(self.target, root, nodes))
                rows_q = self._logits(self._tree_rows(self.draft, root, nodes))
                index = {(): 0, **{n: i + 1 for i, n in enumerate(nodes)}}
                take = [index[pth] for pth in paths]
                return rows_p[take], rows_q[take]
            except (RuntimeError, TypeError):
                self.tree_attention = False  # this model rejects custom masks: batch the paths
        return self._path_logits([root + pth for pth in paths])

    def _path_logits(self, contexts):
        torch = _torch()
        out_p = np.empty((len(contexts), self.vocab_size), dtype=np.float32)
        out_q = np.empty_like(out_p)
        by_length: dict[int, list[int]] = {}
        for i, c in enumerate(contexts):
            self._check_length(len(c))
            by_length.setdefault(len(c), []).append(i)
        with torch.no_grad():
            for indices in by_length.values():
                for start in range(0, len(indices), self.max_batch):
                    chunk = indices[start : start + self.max_batch]
                    ids = torch.tensor([contexts[i] for i in chunk], device=self.device)
                    out_p[chunk] = self._logits(self.target(ids).logits[:, -1])
                    out_q[chunk] = self._logits(self.draft(ids).logits[:, -1])
        return out_p, out_q

    def _tree_rows(self, model, root: tuple[int, ...], nodes: list[tuple[int, ...]]):
        """Logits (1 + len(nodes), V_model) on the device: the root's, then each node's, by tree attention."""
        torch = _torch()
        with torch.no_grad():
            prefix = model(torch.tensor([root], device=self.device), use_cache=True)
            if not nodes:
                return prefix.logits[0, -1:].clone()
            n, length = len(nodes), len(root)
            position = {node: i for i, node in enumerate(nodes)}
            allowed = torch.zeros((n, length + n), dtype=torch.bool, device=self.device)
            allowed[:, :length] = True
            for i, node in enumerate(nodes):
                for d in range(1, len(node) + 1):
                    allowed[i, length + position[node[:d]]] = True
            dtype = next(model.parameters()).dtype
            mask = torch.zeros((1, 1, n, length + n), dtype=dtype, device=self.device)
            mask[0, 0][~allowed] = torch.finfo(dtype).min
            tokens = torch.tensor([[node[-1] for node in nodes]], device=self.device)
            positions = torch.tensor([[length + len(node) - 1 for node in nodes]], device=self.device)
            kwargs = {self._cache_kwarg(model): self._cache_of(prefix)}
            tree = model(tokens, attention_mask=mask, position_ids=positions, **kwargs)
            return torch.cat([prefix.logits[0, -1:], tree.logits[0]], dim=0)
