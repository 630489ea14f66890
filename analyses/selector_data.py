"""From label rows and feature records to the selector's tensors, and the static choices the
selector is compared with (shared by ``train_selector`` and ``evaluate_selector``)."""

from __future__ import annotations

import numpy as np
import polars as pl

from simlab.selector.features import SCALARS

KEYS = ("setting", "trajectory", "root")


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


def static_choice(values: dict[str, np.ndarray], settings: np.ndarray, mask: np.ndarray) -> dict[str, int]:
    """Per setting, the action maximising sum E / sum T over the roots in ``mask`` (DDTE's static
    baseline, chosen on training roots); ties to the first action."""
    out = {}
    for s in np.unique(settings):
        rows = mask & (settings == s)
        if rows.any():
            out[str(s)] = int(np.argmax(values["E"][rows].sum(0) / values["T"][rows].sum(0)))
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
    return SelectorData(tuple(torch.from_numpy(arrays[n]) for n in ("h_p_prev", "h_q_prev", "h_q_root")),
                        torch.from_numpy(roots.select(*SCALARS).to_numpy().astype(np.float32)),
                        torch.from_numpy(values["E"]), torch.from_numpy(values["T"]), torch.from_numpy(base_tps))


def fit_selector(roots: pl.DataFrame, arrays: dict[str, np.ndarray], values: dict[str, np.ndarray], split: np.ndarray, config):
    """Train one selector on the labels ``values`` (``value_matrices``: E and T) of the roots whose
    ``split`` is ``"train"``, validated on ``"validation"``; the baseline of DDTE's loss is each
    setting's static choice on the training roots.

    Returns:
        (model in eval mode on the CPU, history, static choice {setting: action index}).

    Raises:
        ValueError: no training or validation roots, or training diverged (``simlab.selector.train``).
    """
    from simlab.selector.train import train

    base = static_choice(values, roots["setting"].to_numpy(), split == "train")
    data = tensors(roots, arrays, values, base)
    model, history = train(data.subset(np.flatnonzero(split == "train")), data.subset(np.flatnonzero(split == "validation")), config)
    return model, history, base


def choose(model, roots: pl.DataFrame, arrays: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The selector's argmax action index (int64) for each root in ``rows`` (eval mode, CPU)."""
    import torch

    h = [torch.from_numpy(arrays[n][rows]) for n in ("h_p_prev", "h_q_prev", "h_q_root")]
    scalars = torch.from_numpy(roots.select(*SCALARS).to_numpy().astype(np.float32)[rows])
    return model.choose(*h, scalars).numpy()
