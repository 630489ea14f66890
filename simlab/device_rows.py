"""p and q where the model produced them: the logits transform and the node summaries in torch.

The batched engine (``simlab.batched``) reads [N, V] rows of p and q; when a model's logits
are torch tensors on its device (``backends.hf.HFPair.with_resident_logits``), these twins of
the numpy references turn them into p and q and summarise them there, so that only the
engine's [N, k] masses and the summaries' scalars and top tokens reach the host:

* ``probabilities(settings, logits)``: ``simlab.sampling.sampling_distribution`` (the same
  operations in the same order: max subtracted before the division by T, T = 0 one-hot on the
  lowest-id argmax, top-k by a stable descending sort, lowest ids first among ties).  Top-p is
  refused: its nucleus is cut where a cumulative sum crosses top_p, and a device's parallel
  scan rounds that sum differently from the host's sequential one, so a token at the threshold
  could be kept on one and dropped on the other (a law that differs by that token, not by
  rounding);
* ``summaries(P, Q, top)``: ``simlab.measures.node_divergences`` (L1, TV, KL both ways with inf
  where q = 0 < p, both entropies, nats) and the ``top`` most probable tokens of p and of q
  (ties: lowest id first, as the capture's stable argsort).

Both are tested equal to the references to 1e-12 (float64) on random and edge-case rows
(tests/test_device_rows.py); the numpy functions stay the reference.  ``is_tensor`` and
``to_host`` let the numpy core (``simlab.trees``) and the backends take tensors or arrays
without importing torch themselves.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import numpy as np

from simlab.sampling import check_settings

if TYPE_CHECKING:  # torch is imported on first use: simlab's numpy core does not need it
    import torch


def is_tensor(x) -> bool:
    """True for a torch tensor, without importing torch (a tensor exists only if torch was imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_host(x) -> np.ndarray:
    """``x`` as a host numpy array: a tensor is copied from its device (the same values and dtype),
    anything else goes through ``np.asarray``."""
    return x.detach().cpu().numpy() if is_tensor(x) else np.asarray(x)


SUMMARY_COLUMNS = ("l1", "tv", "kl_pq", "kl_qp", "h_p", "h_q")
"""The columns of ``simlab.measures.node_divergences``, in its order."""


def probabilities(settings, logits: "torch.Tensor", dtype=None) -> "torch.Tensor":
    """The distribution sampled from under ``settings`` for a batch of logits, on their device.

    Args:
        settings: a ``simlab.sampling.SamplingSettings`` with ``top_p`` None.
        logits: [N, V] floating tensor (model logits; -inf masks a token).
        dtype: the result's dtype (default torch.float64; the logits are converted first).

    Returns:
        [N, V] tensor of ``dtype`` on the logits' device, each row summing to 1.

    Raises:
        ValueError: ``settings`` with top-p (see the module docstring), logits that are not a
            2-D floating tensor, contain NaN or +inf, or have a row of -inf only.
    """
    import torch

    settings = check_settings(settings)
    if settings.top_p is not None and settings.top_p < 1.0:
        raise ValueError(
            "settings: top-p is not computed on the device (its nucleus cut could differ from the host's by a "
            "token at the threshold); keep the logits on the host (simlab.sampling.sampling_distribution)"
        )
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or not logits.dtype.is_floating_point or logits.shape[1] == 0:
        raise ValueError(
            f"logits: must be a 2-D floating torch tensor, got {type(logits).__name__} {getattr(logits, 'shape', '')}"
        )
    z = logits.to(torch.float64 if dtype is None else dtype, copy=True)
    if bool(torch.isnan(z).any()) or bool((z == float("inf")).any()):
        raise ValueError("logits: contains NaN or +inf entries")
    top = z.max(dim=1, keepdim=True).values
    if not bool(torch.isfinite(top).all()):
        raise ValueError("logits: a row has every entry -inf")
    if settings.temperature == 0.0:
        out = torch.zeros_like(z)
        return out.scatter_(1, z.argmax(dim=1, keepdim=True), 1.0)  # argmax: the first maximum, the lowest id
    z -= top
    if settings.temperature != 1.0:
        z /= settings.temperature
    z.exp_()
    z /= z.sum(dim=1, keepdim=True)
    vocab = z.shape[1]
    if settings.top_k is not None and settings.top_k < vocab:
        order = torch.sort(z, dim=1, descending=True, stable=True).indices
        keep = torch.zeros_like(z, dtype=torch.bool).scatter_(1, order[:, : settings.top_k], True)
        z = torch.where(keep, z, torch.zeros_like(z))
        z /= z.sum(dim=1, keepdim=True)
    return z


def check_rows(P: "torch.Tensor", Q: "torch.Tensor", names) -> None:
    """Validate rows of p and q on their device as ``simlab.distributions.check_distribution``
    does (finite, nonnegative, summing to 1 within 1e-9); only booleans reach the host.

    Raises:
        ValueError: ``p at node ...`` or ``q at node ...`` (``names[i]`` names row i).
    """
    import torch

    for label, rows in (("p", P), ("q", Q)):
        bad = ~torch.isfinite(rows).all(dim=1) | (rows.min(dim=1).values < 0) | ((rows.sum(dim=1) - 1.0).abs() > 1e-9)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(
                f"{label} at node {names[i]}: not a probability vector (NaN, inf or negative entries, or a sum off 1 by more than 1e-9)"
            )


def summaries(P: "torch.Tensor", Q: "torch.Tensor", top: int) -> dict:
    """Per node: ``SUMMARY_COLUMNS`` (float64 numpy (N,)) and the ``top`` most probable tokens
    of p and q (``p_top_ids``, ``p_top_probs``, ``q_top_ids``, ``q_top_probs``: numpy (N, top)).

    Args:
        P: [N, V] float64 tensor of validated target rows.
        Q: [N, V] float64 tensor of validated draft rows, on P's device.
        top: the number of top tokens, 1 <= top (at most V are returned).

    Returns:
        dict of numpy arrays (the only data that leaves the device).
    """
    import torch

    def kl(a, b):  # sum_{a > 0} a (log a - log b); inf where b = 0 < a; clipped at 0 as the reference
        support = a > 0
        terms = torch.where(
            support, a * (torch.log(torch.where(support, a, 1.0)) - torch.log(torch.where(support, b, 1.0))), torch.zeros_like(a)
        )
        value = terms.sum(dim=1).clamp_min(0.0)
        return torch.where((support & (b == 0)).any(dim=1), torch.full_like(value, float("inf")), value)

    def entropy(a):
        support = a > 0
        return -torch.where(support, a * torch.log(torch.where(support, a, 1.0)), torch.zeros_like(a)).sum(dim=1)

    l1 = (P - Q).abs().sum(dim=1)
    values = {"l1": l1, "tv": 0.5 * l1, "kl_pq": kl(P, Q), "kl_qp": kl(Q, P), "h_p": entropy(P), "h_q": entropy(Q)}
    out = {name: values[name].cpu().numpy() for name in SUMMARY_COLUMNS}
    top = min(int(top), P.shape[1])
    for label, rows in (("p", P), ("q", Q)):
        order = torch.sort(rows, dim=1, descending=True, stable=True).indices[:, :top]
        out[f"{label}_top_ids"] = order.cpu().numpy()
        out[f"{label}_top_probs"] = rows.gather(1, order).cpu().numpy()
    return out
