"""From label rows and feature records to the selector's tensors, and the static choices the
selector is compared with (shared by ``train_selector``, ``evaluate_selector`` and ``ddte_audit``).

Two static baselines (``STATIC_BASELINES``), both chosen per sampling setting on the training roots:

* ``static_iid``: DDTE's static baseline (DDTE Sec. 4.2): plain i.i.d. rollouts, K in 1..4 and
  L in 0..8, that is the grid's actions with L1 = 0 (K rollouts of L2 tokens).  The default
  wherever a study says "DDTE's static baseline", and the baseline of the selector's loss.
* ``static_all_actions``: the lab's option: the best of all the grid's delayed actions
  (K, L1, L2), 324 of them on DDTE's grid (``docs/departures.md``).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from simlab.selector.features import SCALARS

KEYS = ("setting", "trajectory", "root")

DEFAULT_RUN = "out/train_selector/synthetic-distilled-V32"
"""``train_selector``'s run folder for its default source (its ``default_out``), which
``evaluate_selector --run`` reads by default (here so that one study need not import the other)."""


VALUES = ("E", "E_select", "E_holdout", "T")


def value_matrices(labels: pl.DataFrame, verifier: str, roots: pl.DataFrame, actions, columns=VALUES) -> dict[str, np.ndarray]:
    """The label ``columns`` (default E, E_select, E_holdout in tokens per step, T in seconds) as
    float64 (N roots, |A|), roots in the order of ``roots`` and actions in the order of ``actions``.

    Raises:
        ValueError: a root or an action without a label for this verifier.
    """
    part = labels.filter(pl.col("verifier") == verifier)
    index = {a: i for i, a in enumerate(actions)}
    keyed = roots.select(*KEYS).with_row_index("row")
    part = part.join(keyed, on=list(KEYS), how="inner")
    if part.height != roots.height * len(actions):
        raise ValueError(f"labels: {verifier} has {part.height} labels for {roots.height} roots x {len(actions)} actions")
    rows = part["row"].to_numpy()
    cols = np.array([index[a] for a in zip(part["K"].to_list(), part["L1"].to_list(), part["L2"].to_list())])
    out = {}
    for name in columns:
        m = np.full((roots.height, len(actions)), np.nan)
        m[rows, cols] = part[name].to_numpy()
        out[name] = m
    return out


STATIC_BASELINES = ("static_iid", "static_all_actions")
"""The static baselines (module docstring): DDTE's i.i.d. rollouts first (the default)."""


def static_candidates(actions, baseline: str = "static_iid") -> np.ndarray:
    """Indices (int64) of the ``actions`` ((K, L1, L2) tuples) a static ``baseline`` chooses among:
    those with L1 = 0 for ``static_iid``, all of them for ``static_all_actions``.

    Raises:
        ValueError: an unknown ``baseline``, or no candidate action.
    """
    if baseline not in STATIC_BASELINES:
        raise ValueError(f"baseline: must be one of {', '.join(STATIC_BASELINES)}, got {baseline!r}")
    out = np.array([i for i, a in enumerate(actions) if baseline == "static_all_actions" or a[1] == 0], dtype=np.int64)
    if out.size == 0:
        raise ValueError(f"actions: none is a candidate of {baseline} (i.i.d. rollouts need actions with L1 = 0)")
    return out


def static_choice(
    values: dict[str, np.ndarray], settings: np.ndarray, mask: np.ndarray, actions, baseline: str = "static_iid"
) -> dict[str, int]:
    """Per setting, the action index (into ``actions``, the columns of ``values``) maximising
    sum E / sum T over the roots in ``mask`` among the ``baseline``'s candidates
    (``static_candidates``; default DDTE's i.i.d. rollouts); ties to the first candidate.

    Raises:
        ValueError: as ``static_candidates``.
    """
    candidates = static_candidates(actions, baseline)
    out = {}
    for s in np.unique(settings):
        rows = mask & (settings == s)
        if rows.any():
            ratio = values["E"][rows][:, candidates].sum(0) / values["T"][rows][:, candidates].sum(0)
            out[str(s)] = int(candidates[np.argmax(ratio)])
    return out


def feature_arrays(records: list[dict]) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    """(roots table with keys and scalars, {"h_p_prev", "h_q_prev", "h_q_root"}: float32 (N, d))."""
    roots = pl.DataFrame([{k: r[k] for k in (*KEYS, *SCALARS)} for r in records])
    arrays = {name: np.stack([r[name] for r in records]).astype(np.float32) for name in ("h_p_prev", "h_q_prev", "h_q_root")}
    return roots, arrays


def tensors(roots: pl.DataFrame, arrays: dict[str, np.ndarray], values: dict[str, np.ndarray], base: dict[str, int]):
    """``SelectorData`` for all roots (base_tps from each root's setting's static action)."""
    import torch

    from simlab.selector.train import SelectorData

    settings = roots["setting"].to_numpy()
    cols = np.array([base[str(s)] for s in settings])
    rows = np.arange(roots.height)
    base_tps = values["E"][rows, cols] / values["T"][rows, cols]
    return SelectorData(
        tuple(torch.from_numpy(arrays[n]) for n in ("h_p_prev", "h_q_prev", "h_q_root")),
        torch.from_numpy(roots.select(*SCALARS).to_numpy().astype(np.float32)),
        torch.from_numpy(values["E"]),
        torch.from_numpy(values["T"]),
        torch.from_numpy(base_tps),
    )


def fit_selector(
    roots: pl.DataFrame,
    arrays: dict[str, np.ndarray],
    values: dict[str, np.ndarray],
    split: np.ndarray,
    config,
    actions,
    baseline: str = "static_iid",
):
    """Train one selector on the labels ``values`` (``value_matrices``: E and T, columns in the
    order of ``actions``) of the roots whose ``split`` is ``"train"``, validated on
    ``"validation"``; the baseline of DDTE's loss is each setting's static choice on the training
    roots (``static_choice`` with ``baseline``: DDTE's i.i.d. rollouts by default).

    Returns:
        (model in eval mode on the CPU, history, static choice {setting: action index}).

    Raises:
        ValueError: no training or validation roots, or training diverged (``simlab.selector.train``);
            a bad ``baseline`` (``static_candidates``).
    """
    from simlab.selector.train import train

    base = static_choice(values, roots["setting"].to_numpy(), split == "train", actions, baseline)
    data = tensors(roots, arrays, values, base)
    model, history = train(
        data.subset(np.flatnonzero(split == "train")), data.subset(np.flatnonzero(split == "validation")), config
    )
    return model, history, base


def choose(model, roots: pl.DataFrame, arrays: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The selector's argmax action index (int64) for each root in ``rows`` (eval mode, CPU)."""
    import torch

    h = [torch.from_numpy(arrays[n][rows]) for n in ("h_p_prev", "h_q_prev", "h_q_root")]
    scalars = torch.from_numpy(roots.select(*SCALARS).to_numpy().astype(np.float32)[rows])
    return model.choose(*h, scalars).numpy()
