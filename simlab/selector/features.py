"""Selector inputs at a root (DDTE Sec. 6), all available before drafting.

* Three embeddings: the target's and the draft's hidden state at the previous token (the one
  whose prediction was the root token) and the draft's at the root token.  Real models give
  their last-layer hidden states (``HFPair.hidden_states``).  Synthetic worlds have none; their
  documented stand-in is the model's own next-token log-probabilities at that position,
  log max(p, 1e-12) (V values), which determine everything a hidden state feeds forward.
* Scalars (``SCALARS``): entropies H(p_prev), H(q_prev), H(q_root) (nats), KL(p||q) and
  KL(q||p) at the previous token (nats, capped at ``KL_CAP`` so an infinite KL from q = 0 < p
  stays usable after standardisation), ||p_prev - q_prev||_1, the context length (tokens),
  the temperature, the top-p threshold (1 when off), and the draft and target latency
  estimates t_q(l, 1), t_p(l, 1) (seconds).
"""

from __future__ import annotations

import numpy as np

from simlab.distributions import entropy, kl_divergence, l1_distance
from simlab.latency import LatencyModel
from simlab.pairs import HiddenStates, rooted

SCALARS = (
    "H_p_prev",
    "H_q_prev",
    "H_q_root",
    "kl_pq_prev",
    "kl_qp_prev",
    "l1_prev",
    "context_length",
    "temperature",
    "top_p",
    "t_q",
    "t_p",
)
KL_CAP = 100.0
LOG_FLOOR = 1e-12


def _log(probs: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(probs, LOG_FLOOR)).astype(np.float32)


def root_features(pair, context, settings, latency: LatencyModel) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """(embeddings, scalars) at a root.

    Args:
        pair: the model pair rooted at ``context`` (synthetic worlds: re-rooted one token
            earlier for the previous token's draft).
        context: the root context, at least 2 tokens.
        settings: the ``SamplingSettings`` in force.
        latency: the latency model (for t_q, t_p at this context length).

    Returns:
        ({"h_p_prev", "h_q_prev", "h_q_root"}: float32 vectors, {name in SCALARS: float}).

    Raises:
        ValueError: a context shorter than 2 tokens.
    """
    context = tuple(int(t) for t in context)
    if len(context) < 2:
        raise ValueError(f"context: the selector needs at least 2 tokens (a previous token and the root), got {len(context)}")
    prev_pair = rooted(pair, len(context) - 1)
    p_prev, q_prev = (row[0] for row in prev_pair.distributions([context[:-1]]))
    _, q_root = (row[0] for row in pair.distributions([context]))
    if isinstance(pair, HiddenStates):
        h_p_prev, h_q_prev, h_q_root = pair.hidden_states(context)
    else:
        h_p_prev, h_q_prev, h_q_root = _log(p_prev), _log(q_prev), _log(q_root)
    l = len(context)
    scalars = {
        "H_p_prev": entropy(p_prev),
        "H_q_prev": entropy(q_prev),
        "H_q_root": entropy(q_root),
        "kl_pq_prev": min(kl_divergence(p_prev, q_prev), KL_CAP),
        "kl_qp_prev": min(kl_divergence(q_prev, p_prev), KL_CAP),
        "l1_prev": l1_distance(p_prev, q_prev),
        "context_length": float(l),
        "temperature": float(settings.temperature),
        "top_p": float(settings.top_p if settings.top_p is not None else 1.0),
        "t_q": latency.draft(l, 1),
        "t_p": latency.target(l, 1),
    }
    return {
        "h_p_prev": np.asarray(h_p_prev, np.float32),
        "h_q_prev": np.asarray(h_q_prev, np.float32),
        "h_q_root": np.asarray(h_q_root, np.float32),
    }, {k: float(v) for k, v in scalars.items()}
