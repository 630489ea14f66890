"""Serving-time adaptation of the block drafter (the updates SpecBlock's bandit chooses among).

An ``Adapter`` owns the drafter's model while serving (nobody else changes its weights) and a
frozen copy of the pretrained weights.  ``update(arm, sequences)`` trains on the verified text
of the prompts just served (their tokens and the target's distributions and features, which the
verification computed anyway): the offline draft loss of block 1 (soft cross-entropy to the
target's law, valid-prefix masked as the drafter was trained) plus ``kl`` times
KL(q_theta || q_theta0) to the pretrained drafter on the same slots, ``steps`` AdamW steps at
``learning_rate`` (a fresh optimiser each update) over

* ``"heads"``: the output heads (LM head, rank head) only;
* ``"full"``: every parameter;
* ``"skip"``: nothing.

``cost(arm, tokens, forward)``: the modelled seconds of an update, from the drafter's measured
forward time (``forward``: a ``simlab.latency.ForwardTime`` of the "block" drafter): a forward
over the update's slot tokens per step, plus the backward, twice the forward's FLOPs of the
parameters it trains (heads: the heads' share of the multiply-adds).  Deterministic, unlike the
wall-clock seconds ``update`` also returns.  ``snapshot`` / ``restore`` copy the weights out and
back bit for bit (the three-window rollback).  The lab's own design: the paper gives no code,
constants, features or windows (SpecBlock, arXiv 2605.07243; ``docs/sources.md``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import torch

from backends.block_drafter.model import BlockDrafterModel, valid_prefix_mask
from backends.block_drafter.train import target_pass
from simlab.checks import check_in_range, check_int
from simlab.specblock.bandit import ARMS


def _multiply_adds(modules) -> int:
    return sum(m.in_features * m.out_features for mod in modules for m in mod.modules() if isinstance(m, torch.nn.Linear))


class Adapter:
    """Skip / heads / full updates of a drafter's weights (module docstring).

    Args:
        model: the drafter's model (the adapter owns it from now on).
        target: the target model (``HFPair.target``) and its feature ``layers``.
        kl: weight of the KL anchor, >= 0.
        steps: optimiser steps per update, >= 1.
        learning_rate: in (0, 1).
    """

    def __init__(self, model: BlockDrafterModel, target, layers, *, kl: float = 0.1, steps: int = 4, learning_rate: float = 5e-4):
        if not kl >= 0:
            raise ValueError(f"kl: must be >= 0, got {kl!r}")
        check_in_range(learning_rate, "learning_rate", low_open=True, high_open=True)
        self.model, self.target, self.layers = model, target, tuple(layers)
        self.kl, self.steps, self.learning_rate = float(kl), check_int(steps, "steps", 1), float(learning_rate)
        self.pretrained = copy.deepcopy(model).eval()
        for p in self.pretrained.parameters():
            p.requires_grad_(False)
        everything = _multiply_adds([model])
        self.head_share = _multiply_adds([model.lm_head, model.rank_head]) / everything

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A copy of the current weights."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        """Put the weights of ``snapshot`` back (bit for bit)."""
        self.model.load_state_dict(snapshot)

    def cost(self, arm: str, tokens: int, forward) -> float:
        """Modelled seconds of an ``arm`` update on ``tokens`` roots (K slot tokens each)."""
        if arm not in ARMS:
            raise ValueError(f"arm: must be one of {', '.join(ARMS)}, got {arm!r}")
        if arm == "skip" or tokens == 0:
            return 0.0
        t = forward(0, max(1, tokens * self.model.spec.K))
        return self.steps * t * (1.0 + 2.0 * (1.0 if arm == "full" else self.head_share))

    def _examples(self, sequences: Sequence[Sequence[int]]):
        K, rows = self.model.spec.K, []
        for seq in sequences:
            ids = torch.tensor([list(seq)], dtype=torch.long)
            if ids.shape[1] < K + 2:
                continue
            features, p = target_pass(self.target, ids, self.layers)
            n = torch.arange(1, ids.shape[1] - K)
            rows.append(
                (features[0, n - 1], ids[0, n], p[0, n[:, None] + torch.arange(K)], ids[0, n[:, None] + 1 + torch.arange(K)])
            )
        if not rows:
            return None
        return tuple(torch.cat(parts) for parts in zip(*rows))

    def update(self, arm: str, sequences: Sequence[Sequence[int]]) -> tuple[int, float]:
        """Train ``arm``'s parameters on the served ``sequences``; (roots used, wall seconds)."""
        if arm not in ARMS:
            raise ValueError(f"arm: must be one of {', '.join(ARMS)}, got {arm!r}")
        examples = None if arm == "skip" else self._examples(sequences)
        if examples is None:
            return 0, 0.0
        started = time.perf_counter()
        feature, token, target_p, corpus = examples
        params = self.model.heads() if arm == "heads" else list(self.model.parameters())
        for p in self.model.parameters():
            p.requires_grad_(arm == "full")
        for p in params:
            p.requires_grad_(True)
        optimizer = torch.optim.AdamW(params, lr=self.learning_rate, weight_decay=0.0)
        with torch.no_grad():
            anchor = torch.log_softmax(self.pretrained(token, feature=feature)[1], dim=-1)
        self.model.train()
        for _ in range(self.steps):
            _, logits, _ = self.model(token, feature=feature)
            logq = torch.log_softmax(logits, dim=-1)
            mask = (
                valid_prefix_mask(logits.argmax(-1) == corpus) if self.model.spec.valid_prefix else torch.ones(logits.shape[:2])
            )
            ce = -(target_p * logq).sum(-1)
            kl = (logq.exp() * (logq - anchor)).sum(-1)
            loss = ((ce + self.kl * kl) * mask).sum() / mask.sum().clamp_min(1.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(True)
        return int(token.shape[0]), time.perf_counter() - started
