"""The selector network (DDTE Sec. 6): phi_1, phi_2, phi_3 project the three embeddings to d
(default 128), each followed by LayerNorm; the projections are concatenated with the
standardised scalars and passed through an MLP with hidden sizes 512 and 32, GELU and dropout,
to |A| logits.  The policy is categorical; inference takes the argmax."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SelectorConfig:
    """Sizes of the network.

    Args:
        dims: input sizes of the three embeddings (h_p_prev, h_q_prev, h_q_root).
        scalars: number of scalar features.
        actions: |A|.
        d: projection size.
        hidden: MLP hidden sizes.
        dropout: dropout probability after each hidden layer.
    """

    dims: tuple[int, int, int]
    scalars: int
    actions: int
    d: int = 128
    hidden: tuple[int, ...] = (512, 32)
    dropout: float = 0.1


class Selector(nn.Module):
    """The selector: ``forward(h_p_prev, h_q_prev, h_q_root, scalars)`` -> logits (B, |A|).

    Inputs are float32 (B, dims[i]) and (B, scalars), raw: the scalars are standardised
    inside with the training set's mean and standard deviation (``set_scaling``).
    """

    def __init__(self, config: SelectorConfig):
        super().__init__()
        self.config = config
        self.projections = nn.ModuleList(nn.Sequential(nn.Linear(n, config.d), nn.LayerNorm(config.d)) for n in config.dims)
        layers, width = [], 3 * config.d + config.scalars
        for size in config.hidden:
            layers += [nn.Linear(width, size), nn.GELU(), nn.Dropout(config.dropout)]
            width = size
        self.mlp = nn.Sequential(*layers, nn.Linear(width, config.actions))
        self.register_buffer("scalar_mean", torch.zeros(config.scalars))
        self.register_buffer("scalar_std", torch.ones(config.scalars))

    def set_scaling(self, scalars: torch.Tensor) -> None:
        """Standardise with the mean and standard deviation of (N, scalars) training features
        (a constant feature keeps std 1)."""
        std = scalars.std(0, unbiased=False)
        self.scalar_mean.copy_(scalars.mean(0))
        self.scalar_std.copy_(torch.where(std > 0, std, torch.ones_like(std)))

    def forward(self, h_p_prev, h_q_prev, h_q_root, scalars):
        parts = [proj(x) for proj, x in zip(self.projections, (h_p_prev, h_q_prev, h_q_root))]
        parts.append((scalars - self.scalar_mean) / self.scalar_std)
        return self.mlp(torch.cat(parts, -1))

    @torch.no_grad()
    def choose(self, h_p_prev, h_q_prev, h_q_root, scalars) -> torch.Tensor:
        """argmax_a pi(a | c) per context, in eval mode (deterministic): int64 (B,)."""
        was = self.training
        self.eval()
        try:
            return self.forward(h_p_prev, h_q_prev, h_q_root, scalars).argmax(-1)
        finally:
            self.train(was)

    def checkpoint(self) -> dict:
        return {"config": asdict(self.config), "state": self.state_dict()}

    @classmethod
    def from_checkpoint(cls, data: dict) -> "Selector":
        config = data["config"]
        model = cls(SelectorConfig(**{**config, "dims": tuple(config["dims"]), "hidden": tuple(config["hidden"])}))
        model.load_state_dict(data["state"])
        return model.eval()
