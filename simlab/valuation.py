"""A builder's tree valued at one root: block efficiency E[tau+1], T-hat and throughput.

Every study that values a builder at a root goes through here (``analyses.compare_builders``,
``analyses.specblock``, ``analyses.treegraft`` and ``simlab.treegraft.schedules``):

* ``value_tree(tree, verifier, latency)``: one tree, exact (the verifier's closed-form
  E[tau+1] on the tree's table; T-hat from the tree's drafting cost, ``LatencyModel.tree_step_time``);
* ``tree_value(builder, table, verifier, latency, ...)``: a builder at a root.  A deterministic
  builder gives one tree, built on ``drafting`` (the drafters' ranking law, e.g.
  ``NodeTable.untempered``) and valued on ``table``: exact.  A sampled builder gives ``samples``
  trees drawn from ``table`` with ``rng``; E is the mean of their exact values (unbiased) with its
  standard error; the same seed for every verifier pairs the verifiers on the same trees.
"""

from __future__ import annotations

import numpy as np

from simlab import tree_verifiers
from simlab.engine_metrics import aggregate, path_metrics
from simlab.tree_verifiers.base import accepted_lengths, reach_probabilities


def _verifier(verifier):
    return tree_verifiers.get(verifier) if isinstance(verifier, str) else verifier


def value_tree(tree, verifier, latency) -> dict:
    """One tree's exact value: ``{"E", "T", "TPS", "tokens"}``.

    Args:
        tree: a ``simlab.trees.DraftTree`` (valued on its own table).
        verifier: a tree verifier or its name (``simlab.tree_verifiers``).
        latency: a ``simlab.latency.LatencyModel`` (T in seconds; TPS = E / T in tokens per second).

    Raises:
        ValueError: from the verifier (a pairing it is not lossless for) or the latency model.
    """
    E = _verifier(verifier).expected_block_efficiency(tree)
    T = latency.tree_step_time(len(tree.table.context), tree)
    return {"E": E, "T": T, "TPS": E / T, "tokens": tree.tokens()}


def tree_value(builder, table, verifier, latency, *, drafting=None, samples: int = 1, rng=None) -> dict | None:
    """The builder's tree(s) at the root ``table`` valued by ``verifier`` (module docstring).

    Args:
        builder: a ``simlab.builders.Builder``.
        table: the root's ``NodeTable`` (the pair and the setting's law).
        verifier: a tree verifier or its name.
        latency: a ``simlab.latency.LatencyModel``.
        drafting: the table a deterministic builder ranks on (default ``table``); ignored by sampled ones.
        samples: trees drawn by a sampled builder, >= 1.
        rng: the ``numpy.random.Generator`` of those draws.

    Returns:
        ``{"E", "se", "T", "tokens", "reach", "accepted", "metrics", "trees"}``: E the mean exact
        E[tau+1] (float), se its standard error (0.0 for one tree), T the mean T-hat (seconds), tokens
        the mean draft tokens, reach the mean P(tau >= d) by depth (float64 array, index d - 1),
        accepted the mean E[tau] (EOS-truncated as E), metrics the engines' metrics over the trees
        (``simlab.engine_metrics.aggregate``, EOS-truncated), trees the trees; None when
        the verifier is not lossless on a tree drawn (never valued lossily).

    Raises:
        ValueError: from the builder (a tree it cannot draft here) or the verifier.
    """
    v = _verifier(verifier)
    if getattr(builder, "deterministic", False):
        trees = [builder.sample(table if drafting is None else drafting).on(table)]
    else:
        trees = [builder.sample(table, rng) for _ in range(samples)]
    if not all(v.lossless_on(tree) for tree in trees):
        return None
    E, T, reach, metrics = [], [], [], []
    for tree in trees:
        E.append(v.expected_block_efficiency(tree))
        T.append(latency.tree_step_time(len(table.context), tree))
        masses = v.accept_masses(tree)  # once: the reach by depth and the engines' metrics
        reach.append(reach_probabilities(accepted_lengths(masses, tree.depth())))
        metrics.append(path_metrics(masses, tree.depth(), table.eos_id))
    depth = max(len(r) for r in reach)
    padded = np.array([np.pad(r, (0, depth - len(r))) for r in reach])
    se = float(np.std(E, ddof=1) / np.sqrt(len(E))) if len(E) > 1 else 0.0
    return {
        "E": float(np.mean(E)),
        "se": se,
        "T": float(np.mean(T)),
        "tokens": float(np.mean([t.tokens() for t in trees])),
        "reach": padded.mean(0),
        "accepted": float(np.mean([m.accepted for m in metrics])),
        "metrics": aggregate(metrics),
        "trees": trees,
    }
