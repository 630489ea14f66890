"""Offline training of the block drafter on the reference pair's corpus (SpecBlock's losses, lab scale).

Each step draws ``windows`` windows of the pair's training documents (the same split as the
pair: ``backends.reference_pair.split_corpus``), runs the frozen target once over them (its
hidden states at the low, middle and top layers and its distributions p at every position), and
draws ``roots_per_step`` roots n.  For a root, block 1 is seeded with the target's features at
n - 1 and the token w_n; slot k is trained towards the target's law p(. | w_{<= n+k}) (soft
cross-entropy: distillation, so T > 0 trees learn the target's law, not the corpus's).  Block 2
(training-time test, two blocks as in evaluation) is seeded at a uniformly drawn slot j of block
1 with the corpus token w_{n+1+j} and slot j's hidden state (gradients flow through it).

* **valid prefix**: slot k's losses count only while the drafter's greedy tokens of slots < k
  equal the corpus tokens (block 2: and block 1's slots < j); ``valid_prefix=False`` counts all;
* **rank loss**: label = the class of the rank of the target's greedy token among the slot's
  draft logits; cross-entropy against ordinally smoothed labels (``rank_smoothing`` moved to the
  neighbouring classes), each class weighted by the inverse of its running frequency; zero for
  the first ``rank_freeze`` steps.

Deterministic: one ``torch.Generator`` (seed) draws windows, roots and seed slots; the thread
count is pinned (``threads``).  ``slot_acceptance`` measures, on held-out roots, how often block
1's greedy chain equals the target's greedy continuation through slot k (T = 0 acceptance by
slot) and the rank head's accuracy.
Source: SpecBlock@b7938c5 ``specforge/core/specblock.py`` (``../shared/reference/tree_builders.md`` Sec. 6).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from backends.block_drafter.model import BlockDrafterModel, DrafterSpec, rank_labels, valid_prefix_mask
from simlab.specblock.rank import CLASSES


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


class Trainer:
    """The training state: model, optimiser, generator, running class frequencies."""

    def __init__(self, spec: DrafterSpec, target, layers, train_ids: torch.Tensor, seed: int):
        self.spec, self.target, self.layers, self.ids = spec, target, tuple(layers), train_ids
        self.context = int(target.config.n_positions)
        if len(train_ids) <= self.context + 1:
            raise ValueError(f"corpus: {len(train_ids)} tokens, need more than the context of {self.context}")
        if self.context < 2 * spec.K + 2:
            raise ValueError(f"K: {spec.K} slots need a context of at least {2 * spec.K + 2}, the target has {self.context}")
        torch.manual_seed(seed)
        width = int(target.config.hidden_size) * len(self.layers)
        self.model = BlockDrafterModel(spec, width, int(target.get_output_embeddings().weight.shape[0]), int(target.config.hidden_size))
        if spec.width is None:
            self.model.initialise_from(target)
        self.generator = torch.Generator().manual_seed(seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=spec.learning_rate, total_steps=spec.steps,
                                                            pct_start=0.1)
        self.frequency = torch.ones(CLASSES)
        self.step_count = 0

    def batch(self):
        """Windows, the target's pass over them, and the roots (window index, position n, seed slot j)."""
        K, L, g = self.spec.K, self.context, self.generator
        starts = torch.randint(0, len(self.ids) - L, (self.spec.windows,), generator=g)
        windows = torch.stack([self.ids[s : s + L] for s in starts.tolist()])
        features, p = target_pass(self.target, windows, self.layers)
        b = torch.randint(0, self.spec.windows, (self.spec.roots_per_step,), generator=g)
        n = torch.randint(1, L - 2 * K, (self.spec.roots_per_step,), generator=g)
        j = torch.randint(0, K, (self.spec.roots_per_step,), generator=g)
        return windows, features, p, b, n, j

    def losses(self, windows, features, p, b, n, j, rank_on: bool):
        """(draft loss, rank loss, block-1 greedy correctness) of one batch of roots."""
        K = self.spec.K
        slots = torch.arange(K)
        h1, logits1, ranks1 = self.model(windows[b, n], feature=features[b, n - 1])
        pos1 = n[:, None] + slots  # slot k's target law sits at position n + k, its corpus token at n + 1 + k
        correct1 = logits1.argmax(-1) == windows[b[:, None], pos1 + 1]
        seed_ok = valid_prefix_mask(correct1)[torch.arange(len(j)), j]  # block-1 slots < j correct
        h2, logits2, ranks2 = self.model(windows[b, n + 1 + j], inherited=h1[torch.arange(len(j)), j])
        pos2 = (n + 1 + j)[:, None] + slots
        correct2 = logits2.argmax(-1) == windows[b[:, None], pos2 + 1]
        draft = rank = 0.0
        for logits, ranks, pos, correct, gate in ((logits1, ranks1, pos1, correct1, None), (logits2, ranks2, pos2, correct2, seed_ok)):
            mask = valid_prefix_mask(correct) if self.spec.valid_prefix else torch.ones_like(correct, dtype=torch.float32)
            if gate is not None and self.spec.valid_prefix:
                mask = mask * gate[:, None]
            target_p = p[b[:, None], pos]
            ce = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)
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
        return draft, rank, correct1

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
        return {"draft": float(draft.detach()), "rank": float(torch.as_tensor(rank).detach()), "slot0": float(correct1[:, 0].float().mean())}

    def train(self, log) -> float:
        started = time.time()
        self.model.train()
        for s in range(self.spec.steps):
            out = self.step()
            if s % max(1, self.spec.steps // 10) == 0 or s == self.spec.steps - 1:
                log(f"block drafter: step {s + 1}/{self.spec.steps} draft loss {out['draft']:.3f} rank loss {out['rank']:.3f} "
                    f"slot-0 corpus accuracy {out['slot0']:.2f}")
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


def slot_acceptance(model: BlockDrafterModel, target, layers, test_ids: torch.Tensor, roots: int = 256,
                    prefix: int = 24) -> dict:
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
    return {"roots": len(contexts), "acceptance_by_slot": [round(float(v), 4) for v in chained.mean(0)],
            "expected_chain_length": round(1.0 + float(chained.sum(1).mean()), 4),
            "rank_head_accuracy_slot0": round(float((ranks[:, 0].argmax(-1) == labels).float().mean()), 4)}
