"""TreeGraft's schedules: when to call the mid drafter, exactly best per root, or learned.

* ``evaluate_schedules``: every one of the 2^D schedules at a root (D = 5: 32 trees), each tree's
  exact E[tau + 1] (a deterministic tree: one exact value) and T-hat from its drafting cost, so
  the **best schedule** per root is exact (``best``), not estimated.
* ``features``: the 17 inputs of TreeGraft's scheduler g_psi at a decision (``FEATURES``): context
  (4): log1p(prompt length), T_tgt and T_mid in ms, log(T_tgt / T_mid); prefix (7): l / D,
  calls / D, the called-layer mask (5 bits); tree (6): mean frontier depth, frontier leaf ratio,
  collapse debt (max(0, -(mean depth of the would-be graft positions - mean frontier depth))),
  the share of the would-be positions from depths outside the frontier's, their overlap with the
  frontier, their mean score (the would-be positions: the pool's best under the current scores,
  no mid forward).
* ``margins``: the training targets: at every decision (layer k after every prefix of calls),
  y_k = the best throughput over completions that call the mid drafter at layer k minus the best
  over those that do not (TreeGraft's distilled target, with exact values in place of its value
  model f_theta).
* ``Scheduler``: the MLP 17 -> 64 -> 32 -> 1 (ReLU; 3,265 parameters), z-scored inputs and a
  de-standardised output; it calls the mid drafter iff its margin is > 0 (and fewer than ``B0``
  calls were made; TreeGraft's preset B0 = D never binds).  ``train`` fits it deterministically
  on the CPU (fixed seed and thread count: bit-for-bit repeatable).
Source: TreeGraft (arXiv 2608.26112); fjm9933/TreeGraft@f53e3a8 ``graft/combine_tree/scheduler*.py``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from simlab.checks import check_int

FEATURES = (
    "log1p_prompt",
    "t_target_ms",
    "t_mid_ms",
    "log_t_ratio",
    "layer_share",
    "calls_share",
    "called_1",
    "called_2",
    "called_3",
    "called_4",
    "called_5",
    "frontier_depth",
    "frontier_leaf_ratio",
    "collapse_debt",
    "reselect_outside_share",
    "reselect_overlap",
    "reselect_score",
)
MASK_BITS = 5


def all_schedules(depth: int) -> list[tuple[int, ...]]:
    """Every schedule of ``depth`` layers, all-skip first, in binary order."""
    return [tuple(s) for s in itertools.product((0, 1), repeat=check_int(depth, "depth", 1, 16))]


def evaluate_schedules(builder, table, verifier, latency, verify_table=None) -> dict[tuple[int, ...], dict]:
    """Every schedule's tree at one root: {schedule: {"E", "T", "TPS", "tokens", "tree"}}.

    The states are shared along common prefixes (one ``GraftState`` copy per prefix).
    ``verify_table``: the table the trees are valued on when they are built on another one of
    the same root (``NodeTable.untempered``: ranked by the drafters' untempered law).
    """
    from simlab import tree_verifiers
    from simlab.valuation import value_tree

    verifier = tree_verifiers.as_verifier(verifier)
    root = builder.prepare(table)
    out = {}
    stack = [(builder.start(root), ())]
    while stack:
        state, prefix = stack.pop()
        if len(prefix) == builder.depth:
            tree = state.finish()
            if verify_table is not None:
                tree = tree.on(verify_table)
            out[prefix] = {**value_tree(tree, verifier, latency), "tree": tree, "state": state}
            continue
        for call in (1, 0):
            child = state.copy()
            child.step(bool(call))
            stack.append((child, prefix + (call,)))
    return dict(sorted(out.items()))


def best(values: dict) -> tuple[int, ...]:
    """The schedule of highest throughput (ties: fewer calls, then the binary order)."""
    return max(values, key=lambda s: (values[s]["TPS"], -sum(s), tuple(-c for c in s)))


def features(state, latency, prompt_length: int) -> np.ndarray:
    """The 17 scheduler inputs (``FEATURES``) before the next layer of ``state``; float64 (17,)."""
    b = state.builder
    context = len(state.root.table.context)
    t_target = latency.target(context, 1 + b.budget) * 1e3
    t_mid = latency.draft(context, 1) * 1e3
    called = [0.0] * MASK_BITS
    for i, c in enumerate(state.calls[:MASK_BITS]):
        called[i] = float(c)
    nodes = state.nodes
    frontier = state.frontier
    depths = [nodes[f].depth for f in frontier] or [0]
    leaves = [not nodes[f].children for f in frontier] or [True]
    would = state.positions()
    would_depths = [nodes[g].depth for g in would] or [0]
    frontier_depths = state.frontier_depths
    scores = [nodes[g].score for g in would if math.isfinite(nodes[g].score)]
    return np.array(
        [
            math.log1p(prompt_length),
            t_target,
            t_mid,
            math.log(t_target / t_mid),
            (state.layer + 1) / b.depth,
            sum(state.calls) / b.depth,
            *called,
            float(np.mean(depths)),
            float(np.mean(leaves)),
            max(0.0, -(float(np.mean(would_depths)) - float(np.mean(depths)))),
            float(np.mean([d not in frontier_depths for d in would_depths])) if would else 0.0,
            len(set(would) & set(frontier)) / max(1, len(would)),
            float(np.mean(scores)) if scores else 0.0,
        ]
    )


def margins(builder, table, values: dict, latency, prompt_length: int) -> list[tuple[np.ndarray, float, tuple[int, ...]]]:
    """(features, y_k, prefix) at every decision of one root, from the exact schedule values."""
    root = builder.prepare(table)
    out = []
    stack = [(builder.start(root), ())]
    while stack:
        state, prefix = stack.pop()
        if len(prefix) == builder.depth:
            continue
        k = len(prefix)
        call = max(v["TPS"] for s, v in values.items() if s[:k] == prefix and s[k] == 1)
        skip = max(v["TPS"] for s, v in values.items() if s[:k] == prefix and s[k] == 0)
        out.append((features(state, latency, prompt_length), call - skip, prefix))
        for c in (0, 1):
            child = state.copy()
            child.step(bool(c))
            stack.append((child, prefix + (c,)))
    return out


@dataclass
class Scheduler:
    """g_psi: a trained MLP and its standardisation (module docstring)."""

    network: object
    mean: np.ndarray
    std: np.ndarray
    y_mean: float
    y_std: float
    calls_cap: int = 5

    def margin(self, z: np.ndarray) -> float:
        import torch

        x = torch.from_numpy(((np.asarray(z, dtype=np.float64) - self.mean) / self.std).astype(np.float32))[None]
        with torch.no_grad():
            return float(self.network(x)[0, 0]) * self.y_std + self.y_mean

    def schedule(self, builder, table, latency, prompt_length: int) -> tuple[int, ...]:
        """The schedule g_psi chooses at a root, layer by layer."""
        state = builder.start(builder.prepare(table))
        for _ in range(builder.depth):
            call = self.margin(features(state, latency, prompt_length)) > 0 and sum(state.calls) < self.calls_cap
            state.step(call)
        return tuple(state.calls)

    def schedule_from(self, features_at: dict, depth: int) -> tuple[int, ...]:
        """The schedule ``schedule`` chooses, read from features already computed at every prefix
        (``margins``' (z, prefix) pairs as ``{prefix: z}``, prefix a tuple of 0/1 ints, z float64
        (17,) ``FEATURES``): no tree is built, so a root already valued needs no second table.
        Equal to ``schedule`` on the same root (tested).  Returns the 0/1 calls, one per layer.

        Raises:
            ValueError: a prefix on the chosen path missing from ``features_at``.
        """
        calls: tuple[int, ...] = ()
        for _ in range(check_int(depth, "depth", 1, 16)):
            if calls not in features_at:
                raise ValueError(f"features_at: no features after the prefix {calls}")
            calls += (int(self.margin(features_at[calls]) > 0 and sum(calls) < self.calls_cap),)
        return calls


def network(seed: int):
    """The MLP 17 -> 64 -> 32 -> 1 with ReLU (3,265 parameters), initialised from ``seed``."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(len(FEATURES), 64), torch.nn.ReLU(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )


def train(
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 300,
    lr: float = 3e-3,
    batch: int = 64,
    seed: int = 0,
    calls_cap: int = 5,
    threads: int = 1,
) -> tuple[Scheduler, list[float]]:
    """Fit g_psi on (features, margins) by mean squared error (Adam), deterministically.

    Args:
        X: float (n, 17) features; y: float (n,) margins (tokens per second).
        threads: torch's thread count during training (restored after): the same seed and
            thread count give the same weights bit for bit.

    Returns:
        (scheduler, training losses by epoch).

    Raises:
        ValueError: shapes that do not match, fewer than 2 examples, or bad options.
    """
    import torch

    X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURES) or y.shape != (X.shape[0],) or X.shape[0] < 2:
        raise ValueError(f"X, y: need (n, {len(FEATURES)}) features and (n,) margins with n >= 2, got {X.shape}, {y.shape}")
    epochs, batch, seed = check_int(epochs, "epochs", 1), check_int(batch, "batch", 1), check_int(seed, "seed", 0)
    mean, std = X.mean(0), X.std(0)
    std[std == 0] = 1.0
    y_mean, y_std = float(y.mean()), float(y.std()) or 1.0
    previous = torch.get_num_threads()
    torch.set_num_threads(check_int(threads, "threads", 1))
    try:
        net = network(seed)
        optimizer = torch.optim.Adam(net.parameters(), lr=lr)
        xs = torch.from_numpy(((X - mean) / std).astype(np.float32))
        ys = torch.from_numpy(((y - y_mean) / y_std).astype(np.float32))[:, None]
        generator = torch.Generator().manual_seed(seed)
        losses = []
        for _ in range(epochs):
            order = torch.randperm(xs.shape[0], generator=generator)
            total = 0.0
            for start in range(0, xs.shape[0], batch):
                rows = order[start : start + batch]
                loss = torch.nn.functional.mse_loss(net(xs[rows]), ys[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * rows.numel()
            losses.append(total / xs.shape[0])
    finally:
        torch.set_num_threads(previous)
    net.eval()
    return Scheduler(net, mean, std, y_mean, y_std, calls_cap), losses
