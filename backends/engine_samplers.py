"""Other codebases' verification functions as black-box samplers and exact laws, for
``simlab.conformance`` (adapters of a few lines: the functions are called, never copied).

transformers: ``transformers.generation.utils._speculative_sampling(candidate_input_ids,
candidate_logits, candidate_length, new_logits, assistant_ensemble_weight=None)`` (standard
speculative sampling, or DIVERSE's static ensemble verification when ``assistant_ensemble_weight``
is set; arXiv 2604.07622).  One drafted token, first emitted token only.

* ``transformers_inputs(p, q, x)``: the function's inputs for laws p, q (float64 (V,)) and the
  drafted token x: ids (1, 1), draft logits (1, 1, V), target logits (1, 2, V), the logs of the
  laws in float32 (p at the drafted position and at the bonus position).
* ``transformers_sampler(weight)``: a sampler ``(p, q, drafts, generator) -> emitted tokens`` for
  ``simlab.conformance.check_sampler``; the function draws from torch's global generator, which the
  sampler seeds from ``generator`` at its first call with it.
* ``transformers_law(ids, draft_logits, target_logits, weight)``: the exact law (float64 (V,)) of the
  first emitted token under the function's own float32 arithmetic: its acceptance ratio r is read
  where it is handed to ``torch.rand_like`` and its correction law where it is handed to
  ``torch.multinomial``; P(accept) = P(U < r) for torch's float32 uniform on the grid of 2^-24.
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import torch


def speculative_sampling():
    """transformers' ``_speculative_sampling`` (imported on use: transformers loads slowly)."""
    from transformers.generation import utils

    return utils._speculative_sampling


def transformers_inputs(p, q, x: int):
    """(ids, draft logits, target logits) for laws ``p``, ``q`` and the drafted token ``x`` (module docstring)."""
    with np.errstate(divide="ignore"):
        lp, lq = np.log(np.asarray(p, dtype=np.float64)), np.log(np.asarray(q, dtype=np.float64))
    ids = torch.tensor([[int(x)]])
    return ids, torch.tensor(lq, dtype=torch.float32)[None, None, :], torch.tensor(np.stack([lp, lp]), dtype=torch.float32)[None]


def transformers_sampler(weight: float | None = None):
    """transformers' function as a black-box sampler (module docstring); ``weight``: its
    ``assistant_ensemble_weight`` (None: standard mode)."""
    function, seeded = speculative_sampling(), []

    def sampler(p, q, drafts, generator):
        if not seeded or seeded[-1] is not generator:
            torch.manual_seed(int(generator.integers(2**62)))
            seeded.append(generator)
        ids, draft_logits, target_logits = transformers_inputs(p, q, drafts[0])
        tokens, _ = function(ids, draft_logits, 1, target_logits, weight)
        return tokens[0].tolist()

    return sampler


def transformers_law(ids, draft_logits, target_logits, weight: float | None = None) -> np.ndarray:
    """The exact law of the first token transformers' function emits (module docstring); float64 (V,).

    Raises:
        ValueError: where a rejection has positive probability and the function's correction law is
            0/0 (p and q equal to float32 rounding in standard mode: the function itself raises there).
    """
    seen = {}

    def rand_like(ratio):
        seen["ratio"] = float(ratio.reshape(-1)[0])
        return torch.full_like(ratio, 1.0 - 2.0**-24)  # the largest uniform: the rejection branch

    def multinomial(probs, num_samples):
        seen["correction"] = probs.reshape(-1).double().numpy().copy()
        return torch.zeros(probs.shape[:-1] + (num_samples,), dtype=torch.long)

    with mock.patch.object(torch, "rand_like", rand_like), mock.patch.object(torch, "multinomial", multinomial):
        speculative_sampling()(ids, draft_logits, 1, target_logits, weight)
    r = seen["ratio"]
    accept = 0.0 if not r > 0 else 1.0 if r >= 1.0 else math.ceil(r * 2**24) / 2**24
    x = int(ids[0, -1])
    correction = seen.get("correction", np.eye(draft_logits.shape[-1])[x])  # accepted: no correction drawn
    out = (1.0 - accept) * correction / correction.sum()
    out[x] += accept
    if not np.all(np.isfinite(out)):  # a rejection would hand torch.multinomial a 0/0 residual: the function raises
        raise ValueError(
            f"the function has no law here: its correction law is {correction.tolist()} (0/0), which torch.multinomial refuses"
        )
    return out
