"""The neural dynamic selector for delayed tree expansion (NDE, DDTE Sec. 6).

* ``features``: what the selector sees at a root (hidden states or a synthetic stand-in,
  entropies, divergences at the previous token, context length, sampling settings, latency);
* ``model``: the network (projections + LayerNorm, MLP 512-32, GELU, dropout, |A| logits);
* ``loss``: TPS-hat of a policy and DDTE's relative-throughput loss with a tail penalty;
* ``train``: deterministic training with a split by root trajectory.

torch is imported by ``model``, ``loss`` and ``train`` only.
"""
