"""TPS-hat of a policy and DDTE's selector loss (Sec. 6, App. E).

For a context c with action values E(c, a) (tokens per step) and T(c, a) (seconds):

    TPS_pi(c) = sum_a pi(a|c) E(c, a) / sum_a pi(a|c) T(c, a)

    L = mean_i -log(TPS_pi(c_i) / TPS_base(c_i))
        + lambda * mean over the worst alpha-fraction of i of max(1 - TPS_pi / TPS_base, 0)^2

TPS_base(c) = E(c, a_base) / T(c, a_base) for the static baseline action a_base of c's
sampling setting.  DDTE does not give lambda or alpha; our defaults are ``LAMBDA`` = 1 and
``ALPHA`` = 0.1 (the worst tenth of each batch, at least one example).
"""

from __future__ import annotations

import math

import torch

from simlab.checks import check_in_range

LAMBDA = 1.0
ALPHA = 0.1


def policy_throughput(probs: torch.Tensor, E: torch.Tensor, T: torch.Tensor) -> torch.Tensor:
    """TPS_pi per context: probs, E, T of shape (B, |A|) -> (B,) (tokens per second)."""
    return (probs * E).sum(-1) / (probs * T).sum(-1)


def selector_loss(
    logits: torch.Tensor, E: torch.Tensor, T: torch.Tensor, base_tps: torch.Tensor, *, lam: float = LAMBDA, alpha: float = ALPHA
) -> torch.Tensor:
    """DDTE's loss for a batch (Sec. 6, App. E): logits, E (tokens per step), T (seconds), all
    (B, |A|), base_tps (B,) tokens per second -> scalar tensor.

    Raises:
        ValueError: alpha outside (0, 1], lambda negative or infinite, shapes that disagree or an
            empty batch, E < 0, T <= 0 or base_tps <= 0.
    """
    check_in_range(alpha, "alpha", low_open=True)
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not 0 <= lam < math.inf:
        raise ValueError(f"lam: must be a finite number >= 0, got {lam!r}")
    if logits.ndim != 2 or logits.shape[0] == 0 or E.shape != logits.shape or T.shape != logits.shape:
        raise ValueError(
            f"logits, E, T: must share one shape (B >= 1, |A|), got {tuple(logits.shape)}, {tuple(E.shape)}, {tuple(T.shape)}"
        )
    if base_tps.shape != logits.shape[:1]:
        raise ValueError(f"base_tps: must have shape ({logits.shape[0]},), got {tuple(base_tps.shape)}")
    if not (torch.all(T > 0) and torch.all(E >= 0) and torch.all(base_tps > 0)):
        raise ValueError("E, T, base_tps: need E >= 0, T > 0 and base_tps > 0")
    ratio = policy_throughput(torch.softmax(logits, -1), E, T) / base_tps
    shortfall = torch.clamp(1 - ratio, min=0) ** 2
    worst = torch.topk(shortfall, max(1, math.ceil(alpha * shortfall.numel()))).values
    return (-torch.log(ratio)).mean() + lam * worst.mean()
