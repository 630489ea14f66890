"""Deterministic training of the selector, with a split by root trajectory.

``SelectorData`` holds, per root: the three embeddings, the scalar features, and the action
values E (tokens per step) and T (seconds) over the action grid, plus the baseline throughput
TPS_base = E(c, a_base) / T(c, a_base) of the root's static baseline action.  ``train`` fits
the network with Adam on DDTE's loss (``simlab.selector.loss``), keeps the weights with the
best validation loss, and is bit-for-bit repeatable for a seed on the CPU.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from simlab.checks import check_device
from simlab.selector.loss import ALPHA, LAMBDA, selector_loss
from simlab.selector.model import Selector, SelectorConfig


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (DDTE gives none of these; ours are documented defaults).

    Args:
        epochs: passes over the training roots.
        batch: roots per step.
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        lam: the loss's tail weight.
        alpha: the loss's tail fraction.
        dropout: dropout of the MLP.
        d: projection size.
        hidden: MLP hidden sizes.
        patience: epochs without a better validation loss before stopping.
        seed: initialisation and shuffling seed.
        device: ``"cpu"``, ``"cuda"``, or ``"auto"`` (CUDA when present).
    """

    epochs: int = 200
    batch: int = 64
    lr: float = 1e-3
    weight_decay: float = 1e-4
    lam: float = LAMBDA
    alpha: float = ALPHA
    dropout: float = 0.1
    d: int = 128
    hidden: tuple[int, ...] = (512, 32)
    patience: int = 40
    seed: int = 0
    device: str = "cpu"


@dataclass
class SelectorData:
    """Per-root tensors: h (three float32 (N, d_i)), scalars float32 (N, S), E and T float64
    (N, |A|), base_tps float64 (N,)."""

    h: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    scalars: torch.Tensor
    E: torch.Tensor
    T: torch.Tensor
    base_tps: torch.Tensor

    def __len__(self) -> int:
        return self.scalars.shape[0]

    def subset(self, index) -> "SelectorData":
        index = torch.as_tensor(index, dtype=torch.long)
        return SelectorData(
            tuple(x[index] for x in self.h), self.scalars[index], self.E[index], self.T[index], self.base_tps[index]
        )

    def to(self, device) -> "SelectorData":
        return SelectorData(
            tuple(x.to(device) for x in self.h),
            self.scalars.to(device),
            self.E.to(device),
            self.T.to(device),
            self.base_tps.to(device),
        )


def split_by_trajectory(trajectories, seed: int = 0, fractions=(0.6, 0.2, 0.2)) -> np.ndarray:
    """``"train"``, ``"validation"`` or ``"test"`` per root, by a seeded hash of its trajectory id,
    so roots that share a prefix never cross the split; every part gets >= 1 trajectory when
    there are >= 3.

    Raises:
        ValueError: fractions that are negative or do not sum to 1.
    """
    if min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions: must be >= 0 and sum to 1, got {fractions!r}")
    ids = sorted(set(int(t) for t in trajectories))
    rank = sorted(ids, key=lambda t: hashlib.blake2b(f"{seed}:{t}".encode(), digest_size=8).digest())
    n = len(ids)
    n_test = max(1, round(fractions[2] * n)) if n >= 3 else 0
    n_val = max(1, round(fractions[1] * n)) if n >= 3 else 0
    part = {t: "test" if i < n_test else "validation" if i < n_test + n_val else "train" for i, t in enumerate(rank)}
    return np.array([part[int(t)] for t in trajectories])


def train(train_set: SelectorData, validation: SelectorData, config: TrainConfig = TrainConfig(), log=None):
    """Fit a selector on DDTE's loss; returns (model in eval mode on the CPU, history: one dict
    per epoch with epoch, train_loss, validation_loss).

    Raises:
        ValueError: an empty training or validation set, or a validation loss that is never
            finite (training diverged).
    """
    if len(train_set) == 0:
        raise ValueError("train_set: no training roots")
    if len(validation) == 0:
        raise ValueError("validation: no validation roots (the split needs >= 3 trajectories)")
    device = check_device(config.device, "device")
    torch.manual_seed(config.seed)
    model = Selector(
        SelectorConfig(
            tuple(x.shape[1] for x in train_set.h),
            train_set.scalars.shape[1],
            train_set.E.shape[1],
            config.d,
            tuple(config.hidden),
            config.dropout,
        )
    )
    model.set_scaling(train_set.scalars)
    model.to(device)
    train_set, validation = train_set.to(device), validation.to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    shuffle = torch.Generator().manual_seed(config.seed)
    best, best_state, history, stale = float("inf"), None, [], 0

    def loss_of(data):
        logits = model(*data.h, data.scalars)
        return selector_loss(
            logits,
            data.E.to(logits.dtype),
            data.T.to(logits.dtype),
            data.base_tps.to(logits.dtype),
            lam=config.lam,
            alpha=config.alpha,
        )

    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(len(train_set), generator=shuffle)
        total = 0.0
        for start in range(0, len(order), config.batch):
            batch = train_set.subset(order[start : start + config.batch].to(device))
            optimiser.zero_grad()
            loss = loss_of(batch)
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(batch)
        model.eval()
        with torch.no_grad():
            val = float(loss_of(validation))
        history.append({"epoch": epoch, "train_loss": total / len(train_set), "validation_loss": val})
        if log:
            log(history[-1])
        if val < best - 1e-9:
            best, stale = val, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            stale += 1
            if stale >= config.patience:
                break
    if best_state is None:
        raise ValueError("train: the validation loss was never finite (training diverged); lower the learning rate or lambda")
    model.load_state_dict(best_state)
    return model.cpu().eval(), history
