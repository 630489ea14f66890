"""Per-root action values: E[tau + 1] and T-hat of every delayed-tree action, for each verifier.

At each root, ``samples`` trees ``Delayed(K_max, L1, L2_max)`` are drawn per L1 (or replayed
from a capture) and every action a = (K, L1, L2) of the grid is valued by DDTE's unbiased
estimator (``simlab.grid.grid_block_efficiency``), the exact inner expectation averaged
over the drawn trees; the same trees serve every verifier.  The draws are split in two halves
by sample index, so a study can choose an action on one half (``E_select``) and report it on
the other (``E_holdout``) without the winner's curse of a maximum over noisy estimates;
``E`` is the mean of both.  T-hat(a) comes from the latency model at the root's context
length (``simlab.latency``).  These rows are the labels of the neural selector (DDTE Sec. 6).

Each row also carries the engines' metrics by the same estimator (``simlab.labels.METRIC_COLUMNS``:
``accepted`` = E[tau], ``unconditional`` = [P(tau >= j)]); ``by_position`` aggregates them over
roots into the long per-position table the grid studies write (``docs/metrics.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from simlab.sampling import seeded_rng
from simlab import tree_verifiers
from simlab.grid import DDTE_AXES, GridAxes, draw_grid
from simlab.labels import grid_labels, verifier_Ks
from simlab.latency import LatencyModel

DDTE_VERIFIERS = ("nss", "naive_chain", "khisti", "naive", "spectr", "bv", "specinfer", "traversal")
"""DDTE Tables 2-3 in order: NSS, Naive, Khisti, NaiveTree, SpecTr, BV, SpecInfer, Traversal."""


@dataclass(frozen=True)
class Grid:
    """The action grid A = K_values x L1_values x L2_values and the draws per L1.

    Raises:
        ValueError: empty axes, K < 1, negative lengths, samples < 1.
    """

    K_values: tuple[int, ...] = DDTE_AXES.K_values
    L1_values: tuple[int, ...] = DDTE_AXES.L1_values
    L2_values: tuple[int, ...] = DDTE_AXES.L2_values
    samples: int = 4
    method: str = "mc"
    engine: str = "numpy"
    device: str = "cpu"

    def __post_init__(self):
        if self.method not in ("mc", "exact"):
            raise ValueError(f"method: must be 'mc' or 'exact', got {self.method!r}")
        if self.engine not in ("numpy", "torch"):
            raise ValueError(f"engine: must be 'numpy' or 'torch', got {self.engine!r}")
        _ = self.axes  # validates the axes (``simlab.grid.GridAxes``)
        if self.samples < 1:
            raise ValueError(f"samples: must be >= 1, got {self.samples}")

    @property
    def axes(self) -> GridAxes:
        """The grid's axes (``simlab.grid.GridAxes``)."""
        return GridAxes(self.K_values, self.L1_values, self.L2_values)

    def actions(self) -> list[tuple[int, int, int]]:
        """Every action (K, L1, L2), K slowest (the order of the selector's logits)."""
        return self.axes.actions()


def root_drafts(root, grid: Grid, seed: int, key: int):
    """(table, drafts) at a root: its captured drafts, or ``grid.samples`` fresh ones per L1
    seeded by (seed, key, trajectory, root) alone."""
    table = root.table()
    if root.drafts is not None:
        return table, [d for d in root.drafts if d.L1 in grid.L1_values]
    rng = seeded_rng(seed, 3, key, root.trajectory, root.root)
    return table, draw_grid(
        table, K_max=max(grid.K_values), L1_values=grid.L1_values, L2_max=max(grid.L2_values), samples=grid.samples, rng=rng
    )


def label_root(root, verifiers, grid: Grid, latency: LatencyModel, *, seed: int = 0, key: int = 0) -> list[dict]:
    """One row per (verifier, action) at ``root``: E, its standard error, E_select, E_holdout, T-hat.

    Returns:
        dicts with keys setting, trajectory, root, context_length (tokens), category (the root's
        prompt category, or None), verifier, K, L1, L2,
        tokens (drafted), E, E_se, E_select, E_holdout (tokens per step), T (seconds), accepted
        (E[tau], tokens) and unconditional (list of P(tau >= j), j = 1..L1 + L2); NaN and None
        where a capture's stored labels predate them.
    """
    length = len(root.context)
    times = {a: latency.delayed_time(*a, length) for a in grid.actions()}  # T-hat depends on the action, not the verifier
    values = (
        _exact_values(root, verifiers, grid) if grid.method == "exact" else _estimated_values(root, verifiers, grid, seed, key)
    )
    return [
        {
            "setting": root.setting,
            "trajectory": root.trajectory,
            "root": root.root,
            "context_length": length,
            "category": root.category,
            "verifier": name,
            "K": K,
            "L1": L1,
            "L2": L2,
            "tokens": L1 + K * L2,
            "E": E,
            "E_se": se,
            "E_select": E_select,
            "E_holdout": E_holdout,
            "T": times[(K, L1, L2)],
            "accepted": accepted,
            "unconditional": unconditional,
        }
        for name, (K, L1, L2), E, se, E_select, E_holdout, accepted, unconditional in values
    ]


def _estimated_values(root, verifiers, grid: Grid, seed: int, key: int):
    """Yield (verifier, action, E, se, E_select, E_holdout, accepted, unconditional) from the two
    halves of the drafts (``simlab.labels.grid_labels``), or the labels a ``--labels`` capture
    stored for this root when they cover every verifier and action asked for (the same function
    computed them; NaN and None for the metrics of a capture made before them)."""
    if root.labels is not None:
        wanted = [
            (name, (K, L1, L2))
            for name in verifiers
            for L1 in grid.L1_values
            for K in verifier_Ks(name, grid.K_values)
            for L2 in grid.L2_values
        ]  # grid_labels' order
        if all((name, *a) in root.labels for name, a in wanted):
            for name, a in wanted:
                stored = root.labels[(name, *a)]
                yield (name, a, *stored, *(float("nan"), None)[len(stored) - 4 :])
            return
    table, drafts = root_drafts(root, grid, seed, key)
    for row in grid_labels(
        table, drafts, verifiers, K_values=grid.K_values, L2_values=grid.L2_values, engine=grid.engine, device=grid.device
    ):
        yield (
            *(row["verifier"], (row["K"], row["L1"], row["L2"])),
            *(row["E"], row["E_se"], row["E_select"], row["E_holdout"], row["accepted"], row["unconditional"]),
        )


def _exact_values(root, verifiers, grid: Grid):
    """Yield (verifier, action, E, 0, E, E, accepted, unconditional): exact E[tau + 1] of every
    action and the engines' metrics (``engine_metrics.expected_positions``), by enumerating its
    trees (tiny vocabularies only)."""
    from simlab.builders import Delayed
    from simlab.efficiency import expected_block_efficiency
    from simlab.engine_metrics import expected_positions

    table = root.table()
    for name in verifiers:
        verifier = tree_verifiers.get(name)
        for K in verifier_Ks(name, grid.K_values):
            for L1 in grid.L1_values:
                for L2 in grid.L2_values:
                    E = expected_block_efficiency(root.pair, root.context, Delayed(K, L1, L2), verifier, method="exact").mean
                    accepted, unconditional = expected_positions(table, Delayed(K, L1, L2), verifier)
                    yield name, (K, L1, L2), E, 0.0, E, E, accepted, unconditional.tolist()


def by_position(labels: pl.DataFrame, keys) -> pl.DataFrame:
    """The per-position metrics of label rows over roots, long format, by
    ``simlab.engine_metrics.aggregate`` (the engines' counters added over roots): one row per
    group of ``keys`` and position j with ``unconditional`` = the mean over the group's rows of
    P(tau >= j) (vLLM's per-position counter over drafts; a row whose tree ends before j counts
    0), ``conditional`` = the ratio of those means, P(tau >= j) / P(tau >= j - 1) (the papers'
    rate over the data), ``chain`` = SpecForge's ``simulated_acc_len`` of the group from the rows'
    per-position rates (the group's one value, on each of its rows) and ``roots`` (rows
    averaged).  Rows without metrics (None: a capture's labels made before them) are left out.

    Args:
        labels: a polars DataFrame of ``label_root`` rows (or with ``keys`` and ``unconditional``).
        keys: the columns to group by (e.g. setting, verifier, K, L1, L2).
    """
    from simlab.engine_metrics import EngineMetrics, aggregate, conditional_rates

    keys = list(keys)
    schema = {**{k: labels.schema[k] for k in keys}, "position": pl.Int64, "unconditional": pl.Float64}
    schema.update(conditional=pl.Float64, chain=pl.Float64, roots=pl.Int64)
    rows = []
    groups = labels.filter(pl.col("unconditional").is_not_null()).group_by(keys, maintain_order=True).agg("unconditional")
    for group in groups.iter_rows(named=True):
        lists = [np.asarray(u, dtype=np.float64) for u in group["unconditional"]]
        nan = float("nan")  # the scalar means are the studies' own columns
        total = aggregate([EngineMetrics(nan, nan, u, conditional_rates(u), nan) for u in lists])
        for j, (u, c) in enumerate(zip(total.unconditional, total.conditional), start=1):
            rows.append({**{k: group[k] for k in keys}, "position": j, "unconditional": float(u), "conditional": float(c)})
            rows[-1].update(chain=total.chain, roots=len(lists))
    return pl.DataFrame(rows, schema=schema)


def grid_of(config) -> Grid:
    """The grid {1..K_max} x {0..L_max}^2 with ``samples`` draws (and ``method``, ``engine``), from a study's
    flags (``analyses._grid_study.GridStudyConfig``)."""
    axes = config.axes()
    return Grid(axes.K_values, axes.L1_values, axes.L2_values, config.samples, config.method, config.engine, config.engine_device)


def feature_record(root, settings, latency: LatencyModel, feature_pair=None) -> dict:
    """The selector's features at ``root`` (``simlab.selector.features.root_features`` under
    ``settings``, the ``SamplingSettings`` of its setting): ``{"setting", "trajectory", "root"}``
    then the scalars (floats) and the embeddings (float32 vectors).  ``feature_pair``: the pair
    whose hidden states give the features (``label_all``); None: the root's own pair."""
    from simlab.selector.features import root_features

    pair = feature_pair.with_settings(settings) if feature_pair is not None else root.pair
    embeddings, scalars = root_features(pair, root.context, settings, latency)
    return {"setting": root.setting, "trajectory": root.trajectory, "root": root.root, **scalars, **embeddings}


def _label_setting(task):
    """Label every root of one setting (a worker task): (rows, feature records or [])."""
    source, settings, index, verifiers, grid, latency, seed, features, feature_pair = task
    rows, records = [], []
    for root in source.roots(settings):
        rows.extend(label_root(root, verifiers, grid, latency, seed=seed, key=index))
        if features:
            records.append(feature_record(root, settings, latency, feature_pair))
    return rows, records


def label_all(
    source,
    settings,
    verifiers,
    grid: Grid,
    latency: LatencyModel,
    *,
    seed: int = 0,
    jobs: int = 1,
    quiet: bool = False,
    features: bool = False,
    feature_pair=None,
):
    """Labels (a polars DataFrame of ``label_root`` rows) for every setting, and, with
    ``features``, one record per root of ``simlab.selector.features.root_features``.

    Args:
        feature_pair: the pair whose hidden states and distributions give the features (a
            ``simlab.pairs.WithSettings`` pair, for example live models for a capture, whose
            files hold no hidden states); None: each root's own pair.

    Settings of a synthetic source run in ``jobs`` worker processes (forked); every root is
    seeded by (seed, setting index, trajectory, root), so the rows do not depend on ``jobs``.
    Progress goes to stderr.
    """
    from backends.cli import progress_bar
    from backends.sources import SyntheticSource

    tasks = [(source, s, i, tuple(verifiers), grid, latency, seed, features, feature_pair) for i, s in enumerate(settings)]
    bar = progress_bar(total=len(tasks), desc="settings", unit="setting", quiet=quiet)
    parts = []
    if jobs > 1 and len(tasks) > 1 and isinstance(source, SyntheticSource):
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(min(jobs, len(tasks))) as pool:
            for part in pool.imap(_label_setting, tasks):
                parts.append(part)
                bar.update()
    else:
        for task in tasks:
            parts.append(_label_setting(task))
            bar.update()
    bar.close()
    from analyses._categories import with_category

    labels = with_category(pl.DataFrame([row for rows, _ in parts for row in rows]))
    return labels, [r for _, records in parts for r in records]
