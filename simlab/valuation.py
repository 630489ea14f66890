"""A builder's tree valued at one root: block efficiency E[tau+1], T-hat and throughput.

Every study that values a builder at a root goes through here (``analyses.compare_builders``,
``analyses.parallel_drafters``, ``analyses.sweep`` and ``analyses.serve_estimate`` through
``analyses._engine_valuation``, ``analyses.specblock``, ``analyses.treegraft`` and
``simlab.treegraft.schedules``):

* ``value_tree(tree, verifier, latency)``: one tree, exact (the verifier's closed-form
  E[tau+1] on the tree's table; T-hat from the tree's drafting cost, ``LatencyModel.tree_step_time``);
* ``tree_value(builder, table, verifier, latency, ...)``: a builder at a root, a frozen
  ``TreeValue``.  A deterministic builder gives one tree, built on ``drafting`` (the drafters'
  ranking law, e.g. ``NodeTable.untempered``) and valued on ``table``: exact.  A sampled builder
  gives ``samples`` trees drawn from ``table`` with ``rng``; E is the mean of their exact values
  (unbiased) with its standard error; the same seed for every verifier pairs the verifiers on the
  same trees.  It is ``trees_value(draw_trees(...), ...)``: a study that values the same trees
  under several verifiers draws them once (``draw_trees``) and values them per verifier
  (``trees_value``).

Verifiers are taken by name or object through ``simlab.tree_verifiers.as_verifier``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from simlab.engine_metrics import EngineMetrics, aggregate, path_metrics
from simlab.tree_verifiers import as_verifier
from simlab.tree_verifiers.base import accepted_lengths, reach_probabilities


def value_tree(tree, verifier, latency) -> dict:
    """One tree's exact value: ``{"E", "T", "TPS", "tokens"}``.

    Args:
        tree: a ``simlab.trees.DraftTree`` (valued on its own table).
        verifier: a tree verifier or its name (``simlab.tree_verifiers.as_verifier``).
        latency: a ``simlab.latency.LatencyModel`` (T in seconds; TPS = E / T in tokens per second).

    Raises:
        ValueError: from the verifier (a pairing it is not lossless for) or the latency model.
    """
    E = as_verifier(verifier).expected_block_efficiency(tree)
    T = latency.tree_step_time(len(tree.table.context), tree)
    return {"E": E, "T": T, "TPS": E / T, "tokens": tree.tokens()}


@dataclass(frozen=True, eq=False)
class TreeValue:
    """A builder's tree(s) at one root valued by one verifier (``tree_value``, ``trees_value``).

    Attributes:
        E: the mean exact E[tau+1] over the trees (``TreeVerifier.expected_block_efficiency``;
            EOS-truncated where the pair has an EOS id), float, tokens per step; computed on first
            read (a study reading only the engines' metrics does not pay for it).
        se: its standard error over the trees (0.0 for one tree), float; on first read too.
        T: the mean T-hat (``LatencyModel.tree_step_time``), float, seconds.
        tokens: the mean draft tokens (root excluded), float.
        reach: the mean P(tau >= d) by depth, float64 (depth,), index d - 1.
        accepted: the mean E[tau] (EOS-truncated as E), float.
        metrics: the engines' metrics aggregated over the trees, EOS-truncated
            (``simlab.engine_metrics.aggregate``).
        plain: the same without EOS truncation.
        per_tree: each tree's EOS-truncated metrics (``EngineMetrics``), in draw order.
        trees: the trees (``simlab.trees.DraftTree``), in draw order.
        verifier: the ``simlab.tree_verifiers.TreeVerifier`` that valued them.

    ``value[name]`` reads the attribute ``name`` (a row built from named fields).
    """

    T: float
    tokens: float
    reach: np.ndarray
    accepted: float
    metrics: EngineMetrics
    plain: EngineMetrics
    per_tree: tuple[EngineMetrics, ...]
    trees: tuple
    verifier: object = field(repr=False)

    @cached_property
    def _efficiencies(self) -> tuple[float, ...]:
        return tuple(self.verifier.expected_block_efficiency(tree) for tree in self.trees)

    @property
    def E(self) -> float:
        """The mean exact E[tau+1] over the trees (class docstring)."""
        return float(np.mean(self._efficiencies))

    @property
    def se(self) -> float:
        """The standard error of ``E`` over the trees (0.0 for one tree)."""
        E = self._efficiencies
        return float(np.std(E, ddof=1) / np.sqrt(len(E))) if len(E) > 1 else 0.0

    @property
    def TPS(self) -> float:
        """E / T: tokens per second at this root."""
        return self.E / self.T

    @property
    def metrics_se(self) -> float:
        """The standard error over the trees of the EOS-truncated ``accept_length`` (0.0 for one tree)."""
        lengths = [m.accept_length for m in self.per_tree]
        return float(np.std(lengths, ddof=1) / np.sqrt(len(lengths))) if len(lengths) > 1 else 0.0

    def __getitem__(self, name: str):
        if name not in self.__dataclass_fields__ and name not in ("E", "se", "TPS"):
            raise KeyError(name)
        return getattr(self, name)


def draw_trees(builder, table, *, drafting=None, samples: int = 1, rng=None) -> list:
    """The tree(s) ``tree_value`` values: one tree of a deterministic builder, built on ``drafting``
    (default ``table``) and read on ``table`` (``DraftTree.on``); else ``samples`` trees drawn from
    ``table`` with ``rng``.  Their nodes are not fetched here (``DraftTree.fill`` fetches them).

    Raises:
        ValueError: from the builder (a tree it cannot draft here, ``rng`` missing for a sampled one).
    """
    if getattr(builder, "deterministic", False):
        return [builder.sample(table if drafting is None else drafting).on(table)]
    return [builder.sample(table, rng) for _ in range(samples)]


def trees_value(trees, verifier, latency) -> TreeValue | None:
    """``trees`` (drawn at one root, ``draw_trees``) valued exactly by ``verifier``: a ``TreeValue``,
    or None when the verifier is not lossless on one of them (never valued lossily).

    Args:
        trees: a non-empty sequence of ``simlab.trees.DraftTree`` of one root.
        verifier: a tree verifier or its name (``simlab.tree_verifiers.as_verifier``).
        latency: a ``simlab.latency.LatencyModel``.

    Raises:
        ValueError: ``trees: ...`` when empty; from the verifier or the latency model.
    """
    trees = tuple(trees)
    if not trees:
        raise ValueError("trees: need at least one tree")
    v = as_verifier(verifier)
    if not all(v.lossless_on(tree) for tree in trees):
        return None
    T, reach, metrics, plain = [], [], [], []
    for tree in trees:
        T.append(latency.tree_step_time(len(tree.table.context), tree))
        masses = v.accept_masses(tree)  # once: the reach by depth and the engines' metrics
        reach.append(reach_probabilities(accepted_lengths(masses, tree.depth())))
        metrics.append(path_metrics(masses, tree.depth(), tree.table.eos_id))
        plain.append(path_metrics(masses, tree.depth(), None))
    depth = max(len(r) for r in reach)
    padded = np.array([np.pad(r, (0, depth - len(r))) for r in reach])
    return TreeValue(
        T=float(np.mean(T)),
        tokens=float(np.mean([t.tokens() for t in trees])),
        reach=padded.mean(0),
        accepted=float(np.mean([m.accepted for m in metrics])),
        metrics=aggregate(metrics),
        plain=aggregate(plain),
        per_tree=tuple(metrics),
        trees=trees,
        verifier=v,
    )


def tree_value(builder, table, verifier, latency, *, drafting=None, samples: int = 1, rng=None) -> TreeValue | None:
    """The builder's tree(s) at the root ``table`` valued by ``verifier`` (module docstring):
    ``trees_value(draw_trees(builder, table, ...), verifier, latency)``.

    Args:
        builder: a ``simlab.builders.Builder``.
        table: the root's ``NodeTable`` (the pair and the setting's law).
        verifier: a tree verifier or its name.
        latency: a ``simlab.latency.LatencyModel``.
        drafting: the table a deterministic builder ranks on (default ``table``); ignored by sampled ones.
        samples: trees drawn by a sampled builder, >= 1.
        rng: the ``numpy.random.Generator`` of those draws.

    Returns:
        a ``TreeValue``; None when the verifier is not lossless on a tree drawn.

    Raises:
        ValueError: from the builder (a tree it cannot draft here) or the verifier.
    """
    v = as_verifier(verifier)
    return trees_value(draw_trees(builder, table, drafting=drafting, samples=samples, rng=rng), v, latency)
