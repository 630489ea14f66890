"""Grid labels at one root: E[tau + 1] of every delayed-tree action from sampled grid drafts.

The values behind DDTE's selector labels (DDTE Sec. 6): for each verifier and action a = (K, L1,
L2), DDTE's unbiased estimator over the ``samples`` drafts of its L1
(``simlab.grid.grid_block_efficiency``), with the engines' metrics by the same estimator
(``simlab.grid.grid_metrics``: E[tau] and P(tau >= j)).  The drafts are split in two halves by sample
index, so a study can choose an action on one half (``E_select``) and report it on the other
(``E_holdout``) without the winner's curse; ``E`` is the mean of both and ``E_se`` its standard
error.  Computed by the studies (``analyses._labels``) and at capture time
(``backends.capture --labels``) with this one function, so both give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from simlab import tree_verifiers
from simlab.batched import supports
from simlab.grid import DDTE_AXES, GridDraft, grid_metrics
from simlab.trees import NodeTable

LABEL_COLUMNS = ("verifier", "K", "L1", "L2", "E", "E_se", "E_select", "E_holdout")
"""The columns of a label row (``grid_labels``) that every label capture holds."""

METRIC_COLUMNS = ("accepted", "unconditional")
"""The engines' metrics a label row adds (``grid_labels``; captures made before them lack them):
``accepted`` = E[tau] (vLLM's accepted tokens per draft) and ``unconditional`` = [P(tau >= j)
for j = 1..L1 + L2] (vLLM's per-position counters per draft), a list of floats."""


def verifier_Ks(name: str, K_values: Sequence[int]) -> tuple[int, ...]:
    """The K values a verifier is labelled at: (1,) for a single-path verifier (``single_path``:
    wider trees cost more, gain nothing), else ``K_values``."""
    return (1,) if tree_verifiers.get(name).single_path else tuple(K_values)


def halves(drafts: Sequence[GridDraft]) -> tuple[list[GridDraft], list[GridDraft]]:
    """Split drafts by their sample index within each L1: (even indices, odd indices); with one
    draft per L1 the second half is the first.

    Raises:
        ValueError: ``drafts: ...`` when the L1 values have different numbers of drafts.
    """
    seen: dict[int, int] = {}
    first, second = [], []
    for d in drafts:
        n = seen.get(d.L1, 0)
        seen[d.L1] = n + 1
        (first if n % 2 == 0 else second).append(d)
    if len(set(seen.values())) > 1:
        raise ValueError(f"drafts: every L1 needs the same number of drafts, got {dict(sorted(seen.items()))}")
    return first, second or first


def grid_labels(
    table: NodeTable,
    drafts: Sequence[GridDraft],
    verifiers: Sequence[str],
    *,
    K_values=DDTE_AXES.K_values,
    L2_values=DDTE_AXES.L2_values,
    engine: str = "numpy",
    device=None,
    stream: bool = False,
) -> Iterator[dict]:
    """One row per (verifier, action): verifier, K, L1, L2, E, E_se, E_select, E_holdout (tokens per
    step), and the engines' metrics (``METRIC_COLUMNS``) over all the drafts, by the same estimator
    (``simlab.grid.grid_metrics``): accepted (E[tau]) and unconditional ([P(tau >= j)]).

    Args:
        table: p and q at the drafts' nodes (the root's ``NodeTable``).
        drafts: the root's grid drafts (``simlab.grid.draw_grid``), ``samples`` per L1.
        verifiers: tree-verifier names; single-path ones get K = 1 only (``verifier_Ks``).
        K_values: the grid's K axis (branches; its L1 axis is the drafts' L1 values).
        L2_values: the grid's L2 axis (branch tokens).
        engine: ``"numpy"`` or ``"torch"``, as ``grid_block_efficiency``; with ``"torch"`` the
            verifiers the batched engine implements use it (``simlab.batched.SUPPORTED``), the
            others the numpy path.
        device: the torch device of the ``"torch"`` engine, as ``grid_block_efficiency``.
        stream: as ``grid_block_efficiency`` (node by node, no plan kept: bounded memory).

    Raises:
        ValueError: as ``grid_block_efficiency``.
    """
    if engine not in ("numpy", "torch"):
        raise ValueError(f"engine: must be 'numpy' or 'torch', got {engine!r}")
    first, second = halves(drafts)
    for name in verifiers:
        verifier, Ks = tree_verifiers.get(name), verifier_Ks(name, K_values)
        served = isinstance(verifier, tree_verifiers.TopDown) and supports(verifier.node)
        options = dict(K_values=Ks, L2_values=L2_values, engine=engine if served else "numpy", device=device, stream=stream)
        a = grid_metrics(table, first, verifier, **options)
        b = grid_metrics(table, second, verifier, **options) if second is not first else a
        for (K, L1, L2), ma in a.items():
            mb = b[(K, L1, L2)]
            est, other = ma.E, mb.E
            se = math.sqrt(est.stderr**2 + other.stderr**2) / 2 if second is not first else est.stderr
            yield {
                "verifier": name,
                "K": K,
                "L1": L1,
                "L2": L2,
                "E": (est.mean + other.mean) / 2,
                "E_se": se,
                "E_select": est.mean,
                "E_holdout": other.mean,
                "accepted": (ma.accepted + mb.accepted) / 2,  # the halves hold equal numbers of drafts
                "unconditional": ((ma.unconditional + mb.unconditional) / 2).tolist(),
            }
