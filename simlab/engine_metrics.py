"""Acceptance metrics under the serving engines' names, exact from a verifier's law on a tree.

The engines and papers report one quantity under several conventions (issue 27; the table in
``docs/metrics.md`` maps each name to its source).  From P(accepted path = v | tree)
(``TreeVerifier.accept_masses``), with tau the accepted draft tokens of one verification step:

* ``accept_length``: E[tau + 1], bonus (or correction) token included: Spec-Bench's "mean accepted
  tokens", vLLM's "mean acceptance length" (1 + accepted / drafts), SGLang's ``accept_length``,
  EAGLE's average acceptance length tau; the lab's block efficiency ``E``;
* ``accepted``: E[tau], no bonus (vLLM's accepted tokens per draft, the papers' "accepted drafts");
* ``unconditional[d - 1]``: P(tau >= d), d = 1..depth: vLLM's per-position counter
  ``num_accepted_tokens_per_pos[d - 1] / num_drafts``;
* ``conditional[d - 1]``: P(tau >= d | tau >= d - 1), the papers' per-position acceptance rate
  (NaN where position d - 1 is never reached);
* ``chain``: SpecForge's ``simulated_acc_len``, sum_d prod_{j <= d} a_j over per-position
  acceptance rates a_j, no bonus (``chain_acceptance_length``).  For one tree it equals
  ``accepted``; over many roots it is computed from the roots' mean rates (``aggregate``), as
  SpecForge averages each position's accuracy over its data before the product.

**EOS truncation** (``eos``; vLLM issue 56101): an EOS inside the accepted prefix ends the
block, so no draft after it and no bonus token counts: the tokens kept are the prefix up to and
including the EOS (``simlab.tree_verifiers.base.counted_tokens``), ``accepted`` counts the
drafts kept, and position d counts only when no EOS sits among the first d - 1 accepted tokens.
Without an EOS the conventions agree with the plain ones; ``accept_length - accepted`` is then 1,
and with truncation P(no EOS accepted).

**Registered metrics** (``register_metric(name, fn)``, ``unregister_metric(name)``): a per-tree
expectation ``fn(masses, depth, eos) -> float`` from the same accepted-path masses, computed by
``path_metrics`` into ``EngineMetrics.extra``, averaged over steps by ``aggregate`` and written by
``EngineMetrics.row`` after the scalar columns; none is registered by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from simlab.tree_verifiers.base import counted_tokens

ENGINE_COLUMNS = ("accept_length", "accepted", "chain")
"""The scalar metrics, in the order studies print them (``EngineMetrics.row``)."""

METRICS: dict[str, Callable[[Mapping[tuple[int, ...], float], int, int | None], float]] = {}
"""Registered per-tree metrics, name -> ``fn(masses, depth, eos)`` (``register_metric``)."""


def register_metric(name: str, fn: Callable[[Mapping[tuple[int, ...], float], int, int | None], float]) -> None:
    """Add a per-tree metric: ``path_metrics`` computes ``fn(masses, depth, eos)`` into
    ``EngineMetrics.extra[name]``, ``aggregate`` averages it over steps (as ``accept_length``) and
    ``EngineMetrics.row`` writes it as column ``name``.

    Args:
        name: the column name, an identifier not among ``ENGINE_COLUMNS`` nor already registered.
        fn: ``masses`` (accepted path -> probability, summing to 1), ``depth`` (the tree's) and
            ``eos`` (the end-of-sequence id, or None) -> a finite float.

    Raises:
        ValueError: ``name: ...`` for a name that is not an identifier, a built-in column or one
            already registered; ``fn: ...`` for a value that is not callable.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"name: must be an identifier, got {name!r}")
    if name in ENGINE_COLUMNS or name in METRICS or name in EngineMetrics.__dataclass_fields__:
        raise ValueError(f"name: {name!r} is already a metric")
    if not callable(fn):
        raise ValueError(f"fn: must be callable, got {fn!r}")
    METRICS[name] = fn


def unregister_metric(name: str) -> None:
    """Remove a metric added by ``register_metric``.

    Raises:
        ValueError: ``name: ...`` for a name that is not registered.
    """
    if name not in METRICS:
        raise ValueError(f"name: {name!r} is not a registered metric")
    del METRICS[name]


@dataclass(frozen=True)
class EngineMetrics:
    """The metrics of one tree (or their aggregate over roots); see the module docstring.

    Attributes:
        accept_length: E[tau + 1] (tokens per verification step).
        accepted: E[tau] (draft tokens accepted per step).
        unconditional: P(tau >= d) for d = 1..depth, float64 (depth,).
        conditional: P(tau >= d | tau >= d - 1) for d = 1..depth, float64 (depth,), NaN where
            position d - 1 is never reached.
        chain: SpecForge's ``simulated_acc_len`` (no bonus).
        eos: True when EOS truncation was applied.
        extra: the registered metrics (``register_metric``), name -> value.
    """

    accept_length: float
    accepted: float
    unconditional: np.ndarray
    conditional: np.ndarray
    chain: float
    eos: bool = False
    extra: Mapping[str, float] = field(default_factory=dict)

    def row(self, prefix: str = "") -> dict:
        """The scalar metrics and the per-position rates as flat columns: ``accept_length``,
        ``accepted``, ``chain``, the registered metrics, ``uncond_1``.., ``cond_1``.. (each name
        after ``prefix``)."""
        out = {f"{prefix}{name}": float(getattr(self, name)) for name in ENGINE_COLUMNS}
        out.update({f"{prefix}{name}": float(value) for name, value in self.extra.items()})
        for d, (u, c) in enumerate(zip(self.unconditional, self.conditional), start=1):
            out[f"{prefix}uncond_{d}"] = float(u)
            out[f"{prefix}cond_{d}"] = float(c)
        return out


def chain_acceptance_length(rates: Sequence[float]) -> float:
    """SpecForge's ``simulated_acc_len``: sum_d prod_{j <= d} a_j (no bonus token).

    Args:
        rates: per-position acceptance rates a_1..a_D in [0, 1]; NaN (a position never reached)
            ends the chain.

    Raises:
        ValueError: ``rates: ...`` for a rate outside [0, 1].
    """
    total, product = 0.0, 1.0
    for j, a in enumerate(rates, start=1):
        a = float(a)
        if math.isnan(a):
            break
        if not -1e-9 <= a <= 1.0 + 1e-9:
            raise ValueError(f"rates: position {j} has rate {a}, outside [0, 1]")
        product *= min(max(a, 0.0), 1.0)  # rounding of a ratio of masses
        total += product
    return total


def conditional_rates(unconditional: Sequence[float]) -> np.ndarray:
    """P(tau >= d | tau >= d - 1) = u_d / u_{d-1} (u_0 = 1) from P(tau >= d), float64, at most 1
    (a ratio of summed masses can exceed it by rounding); NaN where u_{d-1} = 0."""
    u = np.asarray(unconditional, dtype=np.float64)
    before = np.concatenate([[1.0], u[:-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(before > 0, np.minimum(u / np.where(before > 0, before, 1.0), 1.0), np.nan)


def path_metrics(masses: Mapping[tuple[int, ...], float], depth: int, eos: int | None = None) -> EngineMetrics:
    """The metrics from P(accepted path = v) (``TreeVerifier.accept_masses``).

    Args:
        masses: accepted path (token ids) -> probability; the masses sum to 1.
        depth: positions reported (the tree's depth).
        eos: the end-of-sequence id for EOS truncation, or None (no truncation).

    Raises:
        ValueError: ``masses: ...`` when they do not sum to 1 (1e-9) or a path is deeper than ``depth``.
    """
    total = sum(masses.values())
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"masses: must sum to 1, got {total}")
    reach = np.zeros(depth)
    length = kept = 0.0
    for path, mass in masses.items():
        if len(path) > depth:
            raise ValueError(f"masses: path {path} is deeper than depth {depth}")
        # positions counted: up to the first EOS (inclusive) with truncation, else the whole path
        counted = min(len(path), path.index(eos) + 1) if eos is not None and eos in path else len(path)
        reach[:counted] += mass
        length += mass * counted_tokens(path, eos)
        kept += mass * counted
    conditional = conditional_rates(reach)
    extra = {name: float(fn(masses, depth, eos)) for name, fn in METRICS.items()}
    return EngineMetrics(length, kept, reach, conditional, chain_acceptance_length(conditional), eos is not None, extra)


def tree_metrics(tree, verifier, *, eos: bool = True) -> EngineMetrics:
    """The metrics of ``verifier`` on ``tree``, exact.

    Args:
        tree: a ``simlab.trees.DraftTree``.
        verifier: a ``simlab.tree_verifiers.TreeVerifier``.
        eos: apply EOS truncation with the pair's end-of-sequence id (``NodeTable.eos_id``; no
            truncation when the pair has none).

    Raises:
        ValueError: from the verifier (a pairing it is not lossless for).
    """
    return path_metrics(verifier.accept_masses(tree), tree.depth(), tree.table.eos_id if eos else None)


def aggregate(metrics: Sequence[EngineMetrics]) -> EngineMetrics:
    """The metrics over many verification steps (roots or sampled trees), each weighted once, as
    the engines' counters add them: ``accept_length``, ``accepted`` and ``unconditional`` are means
    (vLLM: counters over drafts); ``conditional`` is the ratio of the mean counters (the papers'
    rate over the data); ``chain`` is SpecForge's from the per-position rates averaged over the
    steps where the position is reached (its accuracies are averaged over the data first; a tree
    that ends at depth D with position D reached counts rate 0 at position D + 1, and no rate at
    positions beyond, which it never reaches).

    The registered metrics (``extra``) are means over the steps.

    Raises:
        ValueError: ``metrics: ...`` when empty, mixing EOS truncation with none, or with
            different registered metrics.
    """
    if not metrics:
        raise ValueError("metrics: need at least one")
    if len({m.eos for m in metrics}) > 1:
        raise ValueError("metrics: some with EOS truncation, some without")
    if len({tuple(m.extra) for m in metrics}) > 1:
        raise ValueError("metrics: with different registered metrics")
    depth = max(m.unconditional.size for m in metrics)

    def pad(a, fill):
        return np.concatenate([a, np.full(depth - a.size, fill)])

    unconditional = np.mean([pad(m.unconditional, 0.0) for m in metrics], axis=0)
    # a step whose tree ends before position d: its rate there is P(tau >= d | tau >= d - 1) of its
    # padded counters, 0 at the first position past the tree when the tree's last one is reached (the
    # draft could not go on), undefined (NaN) past that, where position d - 1 is never reached
    rates = np.array([conditional_rates(pad(m.unconditional, 0.0)) for m in metrics])
    reached = ~np.isnan(rates)
    with np.errstate(invalid="ignore"):
        mean_rates = np.where(reached.any(0), np.nansum(rates, 0) / np.maximum(reached.sum(0), 1), np.nan)
    return EngineMetrics(
        float(np.mean([m.accept_length for m in metrics])),
        float(np.mean([m.accepted for m in metrics])),
        unconditional,
        conditional_rates(unconditional),
        chain_acceptance_length(mean_rates),
        metrics[0].eos,
        {name: float(np.mean([m.extra[name] for m in metrics])) for name in metrics[0].extra},
    )


def expected_positions(table, shape, verifier, *, eos: bool = True) -> tuple[float, np.ndarray]:
    """E[tau] and P(tau >= d), d = 1..depth, over the law of the trees a builder draws, exact: the
    law-weighted means of ``tree_metrics`` over every tree ``shape.enumerate(table)`` lists (tiny
    vocabularies; the engines' metrics behind ``simlab.efficiency.expected_block_efficiency(...,
    method="exact")``).

    Args:
        table: a ``simlab.trees.NodeTable`` at the root.
        shape: a builder with ``enumerate(table)`` (e.g. ``simlab.builders.Delayed``).
        verifier: a ``simlab.tree_verifiers.TreeVerifier``.
        eos: as ``tree_metrics``.

    Returns:
        (accepted, unconditional: float64 (deepest tree's depth,)).

    Raises:
        ValueError: from the builder's enumeration (too many trees) or the verifier.
    """
    accepted, unconditional, weight = 0.0, np.zeros(0), 0.0
    for tree, prob in shape.enumerate(table):
        metrics = tree_metrics(tree, verifier, eos=eos)
        if metrics.unconditional.size > unconditional.size:
            unconditional = np.concatenate([unconditional, np.zeros(metrics.unconditional.size - unconditional.size)])
        accepted += prob * metrics.accepted
        unconditional[: metrics.unconditional.size] += prob * metrics.unconditional
        weight += prob
    return accepted / weight, unconditional / weight
