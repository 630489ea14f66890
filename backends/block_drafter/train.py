"""Offline training of the block drafter on the reference pair's corpus (SpecBlock's losses, lab scale).

Each step draws ``windows`` windows of the pair's training documents (the same split as the
pair: ``backends.reference_pair.split_corpus``), runs the frozen target once over them (its
hidden states at the low, middle and top layers and its distributions p at every position:
``TargetWindows``; for a pretrained target on the CPU, ``FeatureRows`` computes the features of
fixed training rows once and p at the drawn positions only, through the target's head), and
draws ``roots_per_step`` roots n.  For a root, block 1 is seeded with the target's features at
n - 1 and the token w_n; slot k is trained towards the target's law p(. | w_{<= n+k}) (soft
cross-entropy: distillation, so T > 0 trees learn the target's law, not the corpus's).  Block 2
(training-time test, two blocks as in evaluation) is seeded at a uniformly drawn slot j of block
1 (the official M - 1, M uniform in 1..K) with the corpus token w_{n+1+j} and slot j's hidden
state (gradients flow through it).

Losses (``DrafterSpec.losses``), summed over the two blocks:

* ``"official"`` (default, as SpecBlock's ``_compute_batched_loss_acc_and_rank``): the **draft
  loss** is the soft cross-entropy to p at each slot, averaged per slot over the roots where the
  **chain mask** holds (the drafter's argmax equals the **target's argmax** at every earlier
  slot of the block), summed over the slots; block 2 is not gated by block 1 (the official code
  trains every position in every block).  The **rank loss**: label = the class of the rank of
  the target's argmax among the slot's draft logits; its own chain mask (slot k counts while the
  rank head's predicted class was right at every earlier slot: up to and including the first
  rank error); per slot and batch, class c weighted min(1, ``rank_budget`` / count_c) (counts
  within the mask); soft targets by the asymmetric ordinal kernel 1 / (1 + |c - t| + max(t - c,
  0))^2; each root's cross-entropy times the distance weight 1 + |t - p| + max(t - p, 0) (p the
  predicted class); the weighted sum divided by the sum of the class weights.
* ``"corpus_masks"`` (the lab's earlier losses, a departure: ``docs/departures.md``):
  ``docs/derivations/block_drafter_train.md``.

``valid_prefix=False`` (the paper's ablation) drops the draft loss's chain mask.  The rank loss
is zero for the first ``rank_freeze`` steps.

Deterministic: one ``torch.Generator`` (seed) draws windows, roots and seed slots; the thread
count is pinned (``threads``).  ``slot_acceptance`` measures, on held-out roots, how often block
1's greedy chain equals the target's greedy continuation through slot k (T = 0 acceptance by
slot) and the rank head's accuracy.
Source: SpecBlock (arXiv 2605.07243); shiweijiezero/SpecBlock@b7938c5 ``specforge/core/specblock.py``.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from backends.block_drafter.model import BlockDrafterModel, DrafterSpec, rank_labels, valid_prefix_mask
from simlab.specblock.rank import CLASSES


def soft_cross_entropy(logits: torch.Tensor, target_p: torch.Tensor) -> torch.Tensor:
    """-sum_v p log softmax(logits) over the last axis: (...)."""
    return -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)


def draft_loss(logits: torch.Tensor, target_p: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The official draft loss of one block: per slot, the masked mean of the soft cross-entropy
    over the roots; summed over the K slots.  logits, target_p (N, K, V); mask (N, K) float."""
    ce = soft_cross_entropy(logits, target_p)
    return ((ce * mask).sum(0) / mask.sum(0).clamp_min(1.0)).sum()


def class_budget_weights(labels: torch.Tensor, mask: torch.Tensor, budget: int) -> torch.Tensor:
    """(N, K) float: min(1, budget / count) of each root's class, counted per slot among the
    masked roots (a count of 0 read as 1), times the mask."""
    counts = (F.one_hot(labels, CLASSES).to(mask.dtype) * mask[..., None]).sum(0)  # (K, C)
    weights = (budget / counts.clamp_min(1.0)).clamp(max=1.0)
    return weights.gather(1, labels.T).T * mask


def distance_weights(labels: torch.Tensor, predicted: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """1 + |t - p| + max(t - p, 0): an under-estimated class costs twice the slope of an over-estimated one."""
    diff = (labels - predicted).to(dtype)
    return 1.0 + diff.abs() + diff.clamp_min(0.0)


def ordinal_targets(labels: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """(..., C): soft targets 1 / (1 + |c - t| + max(t - c, 0))^2, normalised (the official kernel)."""
    diff = (labels[..., None] - torch.arange(CLASSES, device=labels.device)).to(dtype)
    raw = 1.0 / (1.0 + diff.abs() + diff.clamp_min(0.0)) ** 2
    return raw / raw.sum(-1, keepdim=True)


def rank_loss(rank_logits: torch.Tensor, labels: torch.Tensor, budget: int) -> torch.Tensor:
    """The official rank loss of one block: rank_logits (N, K, 4), labels (N, K) int64 (module docstring)."""
    predicted, dtype = rank_logits.argmax(-1), rank_logits.dtype
    chain = valid_prefix_mask(predicted == labels).to(dtype)  # up to and including the first rank error
    weight = class_budget_weights(labels, chain, budget)
    ce = -(ordinal_targets(labels, dtype) * torch.log_softmax(rank_logits, dim=-1)).sum(-1)
    return (ce * distance_weights(labels, predicted, dtype) * weight).sum() / weight.sum().clamp_min(1e-12)


def target_pass(target, windows: torch.Tensor, layers) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen target over int64 (B, L) windows: fused features float32 (B, L, 3 d) and p (B, L, V)."""
    with torch.no_grad():
        out = target(windows, output_hidden_states=True)
        features = torch.cat([out.hidden_states[l] for l in layers], dim=-1).float()
        return features, torch.softmax(out.logits.float(), dim=-1)


def smoothed(labels: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Ordinal label smoothing: ``smoothing`` of the mass split over the neighbouring classes."""
    out = F.one_hot(labels, CLASSES).float()
    if smoothing:
        left = F.one_hot((labels - 1).clamp_min(0), CLASSES).float() * (labels > 0)[..., None]
        right = F.one_hot((labels + 1).clamp_max(CLASSES - 1), CLASSES).float() * (labels < CLASSES - 1)[..., None]
        share = smoothing / (left.sum(-1, keepdim=True) + right.sum(-1, keepdim=True))
        out = out * (1 - smoothing) + (left + right) * share
    return out


def official_block_losses(
    logits: torch.Tensor,
    ranks: torch.Tensor,
    target_p: torch.Tensor,
    corpus: torch.Tensor,
    valid_prefix: bool,
    budget: int,
    rank_on: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft loss, rank loss) of one block under ``losses="official"`` (module docstring).

    Args:
        logits: (N, K, V) the drafter's; ranks: (N, K, 4) its rank head's logits.
        target_p: (N, K, V) the target's law at each slot.
        corpus: (N, K) int64, the corpus tokens: the official masks do not read them (they check
            the target's argmax; SpecBlock trains on target-regenerated text, where the two agree).
        valid_prefix: False drops the draft loss's chain mask; budget: ``rank_budget``;
        rank_on: False gives a zero rank loss.
    """
    target_argmax = target_p.argmax(-1)
    mask = valid_prefix_mask(logits.argmax(-1) == target_argmax) if valid_prefix else torch.ones(logits.shape[:2])
    mask = mask.to(logits.dtype)
    draft = draft_loss(logits, target_p, mask)
    rank = rank_loss(ranks, rank_labels(logits.detach(), target_argmax), budget) if rank_on else torch.zeros(())
    return draft, rank


class TargetWindows:
    """Windows of a 1-D id stream and the frozen target's pass over them at every draw (the
    reference pair: a small target, whose forward is cheaper than storing its features).

    Raises:
        ValueError: ``corpus: ...`` for a stream no longer than ``context`` + 1.
    """

    def __init__(self, target, layers, ids: torch.Tensor, context: int):
        if len(ids) <= context + 1:
            raise ValueError(f"corpus: {len(ids)} tokens, need more than the context of {context}")
        self.target, self.layers, self.ids, self.length = target, tuple(layers), ids, int(context)

    def draw(self, count: int, generator: torch.Generator):
        """(windows int64 (count, L), fused features float32 (count, L, 3 d), law): ``law(rows, positions)``
        is the target's p at those indices, (..., V)."""
        starts = torch.randint(0, len(self.ids) - self.length, (count,), generator=generator)
        windows = torch.stack([self.ids[s : s + self.length] for s in starts.tolist()])
        features, p = target_pass(self.target, windows, self.layers)
        return windows, features, lambda rows, positions: p[rows, positions]


class FeatureRows:
    """Rows of ids with the frozen target's fused features computed once (a large target on the
    CPU: one forward per row for the whole training); the target's law at a position is its head
    over the top feature, the final normed hidden state (``layers[-1]`` must be the last layer).

    Args:
        target: the frozen target (a Hugging Face causal LM).
        layers: its feature layers (``backends.hf.feature_layers``).
        rows: int64 (n, L) training rows.
        chunk: rows per forward.

    Raises:
        ValueError: ``layers: ...`` when the top layer is not the target's last (its head would not
            give p), ``rows: ...`` for fewer than one row or rows of fewer than 4 tokens.
    """

    def __init__(self, target, layers, rows: torch.Tensor, chunk: int = 4, log=None):
        from backends.hf import feature_layers

        last = feature_layers(target.config)[-1]
        if tuple(layers)[-1] != last:
            raise ValueError(f"layers: the top feature layer must be the target's last ({last}), got {tuple(layers)}")
        if rows.ndim != 2 or len(rows) < 1 or rows.shape[1] < 4:
            raise ValueError(f"rows: need (n >= 1, L >= 4) ids, got shape {tuple(rows.shape)}")
        self.target, self.layers, self.ids, self.length = target, tuple(layers), rows, int(rows.shape[1])
        self.head = target.get_output_embeddings()
        self.width = int(target.config.hidden_size)
        parts, started = [], time.time()
        with torch.no_grad():
            for i in range(0, len(rows), chunk):
                out = target(rows[i : i + chunk], output_hidden_states=True, logits_to_keep=1)
                parts.append(torch.cat([out.hidden_states[l] for l in self.layers], dim=-1).float())
                if log and (i // chunk) % 25 == 0:
                    log(
                        f"block drafter: target features {min(i + chunk, len(rows))}/{len(rows)} rows, {time.time() - started:.0f} s"
                    )
        self.features = torch.cat(parts)

    def law(self, features: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The target's p (..., V) at ``features[rows, positions]`` through its head."""
        with torch.no_grad():
            return torch.softmax(self.head(features[rows, positions, -self.width :]).float(), dim=-1)

    def draw(self, count: int, generator: torch.Generator):
        """As ``TargetWindows.draw``: ``count`` rows drawn uniformly (with replacement)."""
        picked = torch.randint(0, len(self.ids), (count,), generator=generator)
        windows, features = self.ids[picked], self.features[picked]
        return windows, features, lambda rows, positions: self.law(features, rows, positions)


class Trainer:
    """The training state: model, optimiser, generator, running class frequencies.

    ``data``: a 1-D int64 id stream (windows of the target's context, the target run at every
    step: ``TargetWindows``) or a ``FeatureRows`` (features computed once).
    """

    def __init__(self, spec: DrafterSpec, target, layers, data, seed: int):
        from backends.hf import context_length

        self.spec, self.target, self.layers = spec, target, tuple(layers)
        if isinstance(data, FeatureRows):
            self.source = data
        else:
            self.source = TargetWindows(target, self.layers, data, context_length(target.config))
        self.context = self.source.length
        if self.context < 2 * spec.K + 2:
            raise ValueError(f"K: {spec.K} slots need a context of at least {2 * spec.K + 2}, the target has {self.context}")
        torch.manual_seed(seed)
        width = int(target.config.hidden_size) * len(self.layers)
        self.model = BlockDrafterModel(
            spec, width, int(target.get_output_embeddings().weight.shape[0]), int(target.config.hidden_size)
        )
        if spec.width is None:
            self.model.initialise_from(target)
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=spec.learning_rate, total_steps=spec.steps, pct_start=0.1
        )
        self.frequency = torch.ones(CLASSES)
        self.step_count = 0

    def batch(self):
        """Windows, their features, the target's law on them, and the roots (window index, position n, seed slot j)."""
        K, L, g = self.spec.K, self.context, self.generator
        windows, features, law = self.source.draw(self.spec.windows, g)
        b = torch.randint(0, self.spec.windows, (self.spec.roots_per_step,), generator=g)
        n = torch.randint(1, L - 2 * K, (self.spec.roots_per_step,), generator=g)
        j = torch.randint(0, K, (self.spec.roots_per_step,), generator=g)
        return windows, features, law, b, n, j

    def losses(self, windows, features, law, b, n, j, rank_on: bool):
        """(draft loss, rank loss, block-1 greedy correctness against the corpus) of one batch of roots."""
        K = self.spec.K
        slots, rows = torch.arange(K), torch.arange(len(j))
        h1, logits1, ranks1 = self.model(windows[b, n], feature=features[b, n - 1])
        pos1 = n[:, None] + slots  # slot k's target law sits at position n + k, its corpus token at n + 1 + k
        h2, logits2, ranks2 = self.model(windows[b, n + 1 + j], inherited=h1[rows, j])
        pos2 = (n + 1 + j)[:, None] + slots
        blocks = ((logits1, ranks1, pos1), (logits2, ranks2, pos2))
        correct1 = logits1.argmax(-1) == windows[b[:, None], pos1 + 1]
        if self.spec.losses == "official":
            draft = rank = 0.0
            for logits, ranks, pos in blocks:
                d, r = official_block_losses(
                    logits,
                    ranks,
                    law(b[:, None], pos),
                    windows[b[:, None], pos + 1],
                    self.spec.valid_prefix,
                    self.spec.rank_budget,
                    rank_on,
                )
                draft, rank = draft + d, rank + r
            return draft, rank, correct1
        return self._corpus_mask_losses(windows, law, b, j, blocks, rank_on) + (correct1,)

    def _corpus_mask_losses(self, windows, law, b, j, blocks, rank_on: bool):
        """``losses="corpus_masks"``: the lab's earlier masks and rank weights (module docstring)."""
        draft = rank = 0.0
        seed_ok = None
        for logits, ranks, pos in blocks:
            correct = logits.argmax(-1) == windows[b[:, None], pos + 1]
            mask = valid_prefix_mask(correct) if self.spec.valid_prefix else torch.ones_like(correct, dtype=torch.float32)
            if seed_ok is not None and self.spec.valid_prefix:
                mask = mask * seed_ok[:, None]
            seed_ok = valid_prefix_mask(correct)[torch.arange(len(j)), j]  # block-1 slots < j correct
            target_p = law(b[:, None], pos)
            ce = soft_cross_entropy(logits, target_p)
            draft = draft + (ce * mask).sum() / mask.sum().clamp_min(1.0)
            if rank_on:
                labels = rank_labels(logits.detach(), target_p.argmax(-1))
                counts = torch.bincount(labels[mask > 0], minlength=CLASSES).float()
                self.frequency = 0.99 * self.frequency + 0.01 * counts / counts.sum().clamp_min(1.0) * CLASSES
                weight = (1.0 / self.frequency.clamp_min(1e-3))[labels]
                weight = weight / weight.mean()
                soft = smoothed(labels, self.spec.rank_smoothing)
                r = -(soft * torch.log_softmax(ranks, dim=-1)).sum(-1) * weight
                rank = rank + (r * mask).sum() / mask.sum().clamp_min(1.0)
        return draft, rank

    def step(self) -> dict:
        """One optimiser step; returns its losses and block-1 slot-0 accuracy on the corpus."""
        rank_on = self.step_count >= self.spec.rank_freeze
        draft, rank, correct1 = self.losses(*self.batch(), rank_on=rank_on)
        loss = draft + rank
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.schedule.step()
        self.step_count += 1
        return {
            "draft": float(draft.detach()),
            "rank": float(torch.as_tensor(rank).detach()),
            "slot0": float(correct1[:, 0].float().mean()),
        }

    def train(self, log) -> float:
        started = time.time()
        self.model.train()
        for s in range(self.spec.steps):
            out = self.step()
            if s % max(1, self.spec.steps // 10) == 0 or s == self.spec.steps - 1:
                log(
                    f"block drafter: step {s + 1}/{self.spec.steps} draft loss {out['draft']:.3f} rank loss {out['rank']:.3f} "
                    f"slot-0 corpus accuracy {out['slot0']:.2f}"
                )
        self.model.eval()
        return time.time() - started


def greedy_chain(target, contexts: torch.Tensor, K: int) -> torch.Tensor:
    """int64 (N, K): the target's greedy continuation of K tokens after each (N, l) context."""
    out, ids = [], contexts
    with torch.no_grad():
        for _ in range(K):
            nxt = target(ids).logits[:, -1].float().argmax(-1)
            out.append(nxt)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


def slot_acceptance(model: BlockDrafterModel, target, layers, test_ids: torch.Tensor, roots: int = 256, prefix: int = 24) -> dict:
    """On ``roots`` held-out roots (prefixes of ``prefix`` tokens at a fixed stride): the share of
    roots whose block-1 greedy chain equals the target's greedy continuation through slot k (the
    T = 0 acceptance by slot, chain), the per-slot agreement given the correct prefix, and the
    rank head's accuracy on slot 0 (class of the target's greedy token's rank)."""
    K = model.spec.K
    stride = max(1, (len(test_ids) - prefix - 1) // roots)
    contexts = torch.stack([test_ids[s : s + prefix] for s in range(0, stride * roots, stride)][:roots])
    chain = greedy_chain(target, contexts, K)
    with torch.no_grad():
        features, _ = target_pass(target, contexts, layers)
        _, logits, ranks = model(contexts[:, -1], feature=features[:, -2])
    drafted = logits.argmax(-1)
    chained = torch.cumprod((drafted == chain).float(), dim=1)
    labels = rank_labels(logits[:, 0], chain[:, 0])
    return {
        "roots": len(contexts),
        "acceptance_by_slot": [round(float(v), 4) for v in chained.mean(0)],
        "expected_chain_length": round(1.0 + float(chained.sum(1).mean()), 4),
        "rank_head_accuracy_slot0": round(float((ranks[:, 0].argmax(-1) == labels).float().mean()), 4),
    }


def fit(spec: DrafterSpec, variant: str, target, data, held_ids: torch.Tensor, seed: int, log, pair: str = "", **measure):
    """(model, manifest fields) of ``variant`` of ``spec`` trained on ``data`` (as ``Trainer``) and
    measured on ``held_ids`` (``slot_acceptance``; ``measure``: its roots and prefix): variant, seed,
    pair, feature layers, machine, training seconds, held-out acceptance, torch threads.

    Raises:
        ValueError: what ``Trainer`` raises.
    """
    from dataclasses import replace

    from backends.block_drafter.drafter import VARIANTS
    from backends.hf import feature_layers
    from backends.reference_pair import machine

    layers = feature_layers(target.config)
    spec = replace(spec, **VARIANTS[variant])
    trainer = Trainer(spec, target, layers, data, seed)
    log(
        f"block drafter ({variant}): {sum(p.numel() for p in trainer.model.parameters()) / 1e6:.2f}M parameters, "
        f"{spec.steps} steps on {trainer.source.ids.numel()} training tokens"
    )
    seconds = trainer.train(log)
    acceptance = slot_acceptance(trainer.model, target, layers, held_ids, **measure)
    log(f"block drafter ({variant}): held-out acceptance by slot {acceptance['acceptance_by_slot']}")
    info = {
        "variant": variant,
        "seed": seed,
        "pair": pair,
        "feature_layers": list(layers),
        **machine(),
        "seconds": round(seconds, 1),
        "held_out": acceptance,
        "torch_threads": torch.get_num_threads(),
    }
    return trainer.model, info
