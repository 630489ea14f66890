"""The block drafter's network: K dependent slots in one forward, the layer-wise shift, the rank head.

Vocabulary (SpecBlock, arXiv 2605.07243; official code ``specforge/core/specblock.py``):

* a **seed** is where a block starts: the root (the target's hidden states at the previous
  token, at its low, middle and top layers, concatenated: the **feature**, with the root's
  last token), or a node of the tree (the drafter's own final hidden state of the slot that
  drafted it, **inherited**, with the node's token);
* a **block** is K **slots**: slot k drafts the token k + 1 positions after the seed token;
* the **rank head**: Linear(W + 15 -> 256) -> SiLU -> Linear(256 -> 4) on the slot's detached
  normed hidden state and the 15 statistics of its detached logits (``simlab.specblock.rank``),
  predicting the class of the rank of the target's token among the slot's draft ranking.

Two architectures (``DrafterSpec.arch``):

* ``"attention"`` (default, as the official drafter): pre-norm decoder layers (block-causal
  self-attention, then a SiLU-gated MLP) over the sequence [seed, slot 0, ..., slot K-1]: slot k
  attends to the seed (the prefix's features) and to slots <= k.  The **shift** comes before
  every layer but the first, **in parallel** on top of the attention: every slot's hidden state
  becomes W [h_k; h_{k-1}] at once (slot 0 takes itself as h_{-1}; W starts as [I, 0]), as the
  official ``shift_proj``; ``shift=False`` removes only the shift (the paper's "-shift"
  ablation: the slots still attend to each other);
* ``"attention_free"`` (the lab's earlier drafter, a departure: ``docs/departures.md``):
  residual MLP layers with no attention; between layers slot k gets a projection of
  [h'_{k-1}; h_k] added in slot order (h'_{k-1} already shifted), the only path between slots, so
  ``shift=False`` makes every slot a function of the seed and its own slot embedding alone.

The lab's network at the reference pair's scale: the slots see the prefix only through the
seed (the official drafter also attends across earlier positions and, in later blocks, to the
seed block's slots up to the seed through its cache), an untied LM head over the target's
vocabulary (the official drafter's is a reduced draft vocabulary).  ``rank_statistics`` is the
torch twin of ``simlab.specblock.rank.statistics`` (tested equal); ``valid_prefix_mask``,
``rank_chain_mask``, ``class_budget_weights``, ``distance_weights``, ``ordinal_targets`` and
``rank_labels`` are the training's masks, weights and labels (tested against plain loops).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from simlab.checks import check_in_range, check_int
from simlab.specblock.rank import CLASSES, EDGES, STATISTICS, TOP1


ARCHES = ("attention", "attention_free")
LOSSES = ("official", "corpus_masks")


@dataclass(frozen=True)
class DrafterSpec:
    """The block drafter's shape and training budget (one config; the CLI's flags).

    K: slots per block; width W (None: the target's, whose token embedding and LM head then
    initialise the drafter's, as EAGLE's drafters reuse them); layers (>= 1; ``layers - 1`` shifts); ``shift`` and
    ``valid_prefix`` (False: the paper's ablations); ``arch`` (module docstring) and its attention
    ``heads`` (dividing W); steps, roots per step, windows per step and the AdamW learning rate;
    ``rank_freeze``: first steps without the rank loss; ``losses``: ``"official"`` or the lab's
    earlier ``"corpus_masks"`` (``backends.block_drafter.train``); ``rank_budget``: the official
    per-class budget of the rank loss's weights; ``rank_smoothing``: the neighbour smoothing of
    ``"corpus_masks"``; ``rank_top1``: where the rank head's top-1 statistic is normalised,
    ``"top20"`` (official) or ``"vocabulary"`` (the whole vocabulary, a departure; a drafter whose
    manifest has no ``rank_top1`` field is loaded with it: ``backends.block_drafter.drafter.load``).
    """

    K: int = 4
    width: int | None = 128
    layers: int = 3
    shift: bool = True
    valid_prefix: bool = True
    steps: int = 1200
    roots_per_step: int = 192
    windows: int = 8
    learning_rate: float = 2e-3
    rank_freeze: int = 200
    rank_smoothing: float = 0.1
    arch: str = "attention"
    heads: int = 4
    losses: str = "official"
    rank_budget: int = 10
    rank_top1: str = "top20"

    def __post_init__(self):
        check_int(self.K, "K", 1, 16)
        if self.width is not None:
            check_int(self.width, "width", 4)
        check_int(self.layers, "layers", 1, 16)
        check_int(self.steps, "steps", 1)
        check_int(self.roots_per_step, "roots_per_step", 1)
        check_int(self.windows, "windows", 1)
        check_int(self.rank_freeze, "rank_freeze", 0)
        check_in_range(self.learning_rate, "learning_rate", low_open=True, high_open=True)
        check_in_range(self.rank_smoothing, "rank_smoothing", 0.0, 0.5, high_open=True)
        if self.arch not in ARCHES:
            raise ValueError(f"arch: must be one of {', '.join(ARCHES)}, got {self.arch!r}")
        if self.losses not in LOSSES:
            raise ValueError(f"losses: must be one of {', '.join(LOSSES)}, got {self.losses!r}")
        check_int(self.heads, "heads", 1)
        check_int(self.rank_budget, "rank_budget", 1)
        if self.rank_top1 not in TOP1:
            raise ValueError(f"rank_top1: must be one of {', '.join(TOP1)}, got {self.rank_top1!r}")
        if self.width is not None and self.width % self.heads:
            raise ValueError(f"heads: {self.heads} heads do not divide the width {self.width}")

    @classmethod
    def micro(cls, **changes) -> "DrafterSpec":
        """The tiny drafter of the tests (seconds on the micro pair)."""
        return cls(
            **{
                "width": None,
                "layers": 2,
                "steps": 40,
                "roots_per_step": 64,
                "windows": 4,
                "learning_rate": 5e-3,
                "rank_freeze": 10,
                **changes,
            }
        )

    @classmethod
    def pretrained(cls, **changes) -> "DrafterSpec":
        """The drafter of a pretrained target (``--pair smollm2``), shaped as the official one: the
        target's width (its embedding and LM head initialise the drafter's), two decoder layers,
        heads of 64 dimensions at SmolLM2's 576 (9, as the target's query heads); fewer roots per
        step than the reference pair's (the 49,152-column head dominates a CPU step)."""
        return cls(
            **{
                "width": None,
                "layers": 2,
                "heads": 9,
                "steps": 800,
                "roots_per_step": 64,
                "windows": 8,
                "learning_rate": 5e-4,
                "rank_freeze": 100,
                **changes,
            }
        )


class BlockDrafterModel(nn.Module):
    """The network (module docstring).  Float32 parameters; inputs and outputs on one device.

    Args:
        spec: the ``DrafterSpec``.
        feature_dim: width of the target's fused features (3 d_target).
        vocab_size: V of the target (the LM head's width).
        width: W when ``spec.width`` is None (the target's hidden size).
    """

    def __init__(self, spec: DrafterSpec, feature_dim: int, vocab_size: int, width: int | None = None):
        super().__init__()
        W, K = spec.width or check_int(width, "width", 4), spec.K
        self.width = W
        self.spec, self.feature_dim, self.vocab_size = (
            spec,
            check_int(feature_dim, "feature_dim", 1),
            check_int(vocab_size, "vocab_size", 2),
        )
        self.fuse = nn.Linear(feature_dim, W)
        self.inherit = nn.Linear(W, W)
        self.embed = nn.Embedding(vocab_size, W)
        self.slots = nn.Parameter(torch.randn(K, W) * 0.02)
        self.norms = nn.ModuleList(nn.LayerNorm(W) for _ in range(spec.layers))
        if spec.arch == "attention":
            if W % spec.heads:
                raise ValueError(f"heads: {spec.heads} heads do not divide the width {W}")
            self.attn_norms = nn.ModuleList(nn.LayerNorm(W) for _ in range(spec.layers))
            self.attns = nn.ModuleList(SlotAttention(W, spec.heads) for _ in range(spec.layers))
            self.mlps = nn.ModuleList(GatedMLP(W) for _ in range(spec.layers))
            self.shifts = nn.ModuleList(parallel_shift(W) for _ in range(spec.layers - 1)) if spec.shift else None
        else:
            self.mlps = nn.ModuleList(
                nn.Sequential(nn.Linear(W, 2 * W), nn.GELU(), nn.Linear(2 * W, W)) for _ in range(spec.layers)
            )
            self.shifts = nn.ModuleList(nn.Linear(2 * W, W) for _ in range(spec.layers - 1)) if spec.shift else None
        self.norm = nn.LayerNorm(W)
        self.lm_head = nn.Linear(W, vocab_size, bias=False)
        self.rank_head = nn.Sequential(nn.Linear(W + STATISTICS, 256), nn.SiLU(), nn.Linear(256, CLASSES))

    def initialise_from(self, target) -> None:
        """Copy the target's token embedding and LM head (a target of hidden size W, as ``width=None`` gives)."""
        with torch.no_grad():
            self.embed.weight.copy_(target.get_input_embeddings().weight[: self.vocab_size])
            self.lm_head.weight.copy_(target.get_output_embeddings().weight[: self.vocab_size])

    def heads(self) -> list[nn.Parameter]:
        """The output heads' parameters (LM head and rank head): what the "heads" update trains."""
        return list(self.lm_head.parameters()) + list(self.rank_head.parameters())

    def forward(self, token: torch.Tensor, feature: torch.Tensor | None = None, inherited: torch.Tensor | None = None):
        """One block per seed.

        Args:
            token: int64 (N,), the seed's token.
            feature: float32 (N, feature_dim), the target's fused features (a root seed), or
            inherited: float32 (N, W), the drafter's hidden state of the seed's slot (a node seed).

        Returns:
            (hidden (N, K, W) before the final norm: what later blocks inherit; logits
            (N, K, V); rank logits (N, K, 4)).
        """
        if (feature is None) == (inherited is None):
            raise ValueError("feature: give exactly one of feature (a root seed) and inherited (a node seed)")
        seed = self.fuse(feature) if inherited is None else self.inherit(inherited)
        start = seed + self.embed(token)
        h = start[:, None, :] + self.slots[None]
        if self.spec.arch == "attention":
            h = self._decode(start, h)
        else:
            for i, (norm, mlp) in enumerate(zip(self.norms, self.mlps)):
                if i and self.shifts is not None:
                    h = self._shift(self.shifts[i - 1], h)
                h = h + mlp(norm(h))
        normed = self.norm(h)
        logits = self.lm_head(normed)
        ranks = self.rank_head(torch.cat([normed.detach(), rank_statistics(logits.detach(), self.spec.rank_top1)], dim=-1))
        return h, logits, ranks

    def _decode(self, start: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """The attention layers over [seed, slots]; the slots' final hidden states (N, K, W)."""
        h = torch.cat([start[:, None, :], slots], dim=1)
        for i in range(self.spec.layers):
            if i and self.shifts is not None:
                s = h[:, 1:]
                previous = torch.cat([s[:, :1], s[:, :-1]], dim=1)  # slot 0 takes itself
                h = torch.cat([h[:, :1], self.shifts[i - 1](torch.cat([s, previous], dim=-1))], dim=1)
            h = h + self.attns[i](self.attn_norms[i](h))
            h = h + self.mlps[i](self.norms[i](h))
        return h[:, 1:]

    @staticmethod
    def _shift(shift: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        """h_k + shift([h'_{k-1}; h_k]) in slot order (h'_{-1} = 0, h'_{k-1} already shifted)."""
        out, previous = [], torch.zeros_like(h[:, 0])
        for k in range(h.shape[1]):
            previous = h[:, k] + shift(torch.cat([previous, h[:, k]], dim=-1))
            out.append(previous)
        return torch.stack(out, dim=1)


class SlotAttention(nn.Module):
    """Multi-head causal self-attention over [seed, slot 0, ..., slot K-1] (no bias, no positions:
    the slot embeddings tell the slots apart): position i attends to positions <= i."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        N, L, W = h.shape
        q, k, v = self.qkv(h).view(N, L, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (W // self.heads) ** 0.5
        causal = torch.ones(L, L, dtype=torch.bool, device=h.device).tril()
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(N, L, W))


class GatedMLP(nn.Module):
    """SiLU-gated MLP (2W hidden), as the official decoder layer's."""

    def __init__(self, width: int):
        super().__init__()
        self.gate, self.up, self.down = (
            nn.Linear(width, 2 * width, bias=False),
            nn.Linear(width, 2 * width, bias=False),
            nn.Linear(2 * width, width, bias=False),
        )

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(h)) * self.up(h))


def parallel_shift(width: int) -> nn.Linear:
    """The shift's W: Linear(2W -> W, no bias) on [h_k; h_{k-1}], starting as [I, 0] (h_k passes)."""
    shift = nn.Linear(2 * width, width, bias=False)
    with torch.no_grad():
        shift.weight.zero_()
        shift.weight[:, :width] = torch.eye(width)
    return shift


def rank_statistics(logits: torch.Tensor, top1: str = "top20") -> torch.Tensor:
    """The 15 rank-head statistics of (..., V) logits (V >= 20): torch twin of
    ``simlab.specblock.rank.statistics`` (``top1``: ``"top20"`` or ``"vocabulary"``) in the logits' dtype."""
    top = torch.topk(logits, 20, dim=-1).values
    lse = torch.logsumexp(top, dim=-1, keepdim=True)
    logp10 = top[..., :10] - lse
    gaps = torch.stack([top[..., 0] - top[..., 1], top[..., 0] - top[..., 2], top[..., 0] - top[..., 4]], dim=-1)
    norm = lse if top1 == "top20" else torch.logsumexp(logits, dim=-1, keepdim=True)
    first = torch.exp(top[..., :1] - norm)
    p20 = torch.exp(top - lse)
    entropy = -(p20 * torch.log(p20.clamp_min(torch.finfo(p20.dtype).tiny))).sum(-1, keepdim=True)
    return torch.cat([logp10, gaps, first, entropy], dim=-1)


def valid_prefix_mask(correct: torch.Tensor) -> torch.Tensor:
    """(N, K) float: slot k counts iff slots 0..k-1 are all correct (slot 0 always counts)."""
    ones = torch.ones_like(correct[:, :1], dtype=torch.float32)
    return torch.cat([ones, torch.cumprod(correct[:, :-1].float(), dim=1)], dim=1)


def rank_labels(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """int64 (...): the rank class (``simlab.specblock.rank.bucket``) of ``tokens`` (...) in the
    ranking of ``logits`` (..., V): 1-based rank = 1 + #higher logits + #equal logits at lower ids."""
    value = logits.gather(-1, tokens[..., None])
    ids = torch.arange(logits.shape[-1], device=logits.device)
    rank = 1 + (logits > value).sum(-1) + ((logits == value) & (ids < tokens[..., None])).sum(-1)
    return torch.bucketize(rank, torch.tensor(EDGES, device=logits.device), right=False)
