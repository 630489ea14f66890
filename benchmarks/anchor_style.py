"""A plain label loop in the style of the DDTE authors' public code: the in-run stand-in for it.

The lab cannot vendor the authors' code, so the label benchmark (``test_labels_anchor.py``) times
this independent transcription beside the lab on the same inputs.  It computes what their label
loop computes (DDTE Eq. 1-3 with the branch probabilities of App. C-D) the way their code does it:

* one tree object per (draft, K), its K paths listed whole, so a trunk node lists its child once
  per path (K copies: the per-path convention, ``trunk_children="per_path"`` in the lab);
* per node of every tree, a dict of branch probabilities over its distinct children, from torch
  float64 tensors; full-vocabulary work (the residual vectors) is cached per node and shared by
  every tree, as their class-level caches are; no input validation;
* SpecTr's rho from four halvings of [1, k] (their label path), SpecInfer's branch law by a DP over
  the subsets of child copies, NaiveTree's as a full residual vector with the accepted mass added;
* E[depth] at the cut-offs L1..L1 + L2_max by a pass from the deepest node up, once per cut-off.

Written from the formulas (DDTE App. C-D; SpecTr, Sun et al. 2023; SpecInfer, Miao et al. 2024),
not copied; checked against the lab's per-path grid to 1e-9 in the benchmark.
"""

from __future__ import annotations

import torch


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm((p - q)_+) as a full vector (p itself, renormalised, when the excess is empty)."""
    res = torch.relu(p - q)
    total = float(res.sum())
    return res / total if total > 0.0 else p / float(p.sum())


def _naive(p, q, kids, cache, node):
    x = kids[0]
    qx, px = float(q[x]), float(p[x])
    a = 1.0 if qx <= 0.0 else min(1.0, px / qx)
    if (node, "naive") not in cache:
        cache[(node, "naive")] = _residual(p, q)
    out = (1.0 - a) * cache[(node, "naive")]
    out[x] += a
    return {t: float(out[t]) for t in kids}


def _nss(p, q, kids, cache, node):
    return {t: float(p[t]) for t in kids}


def _spectr(p, q, kids, cache, node):
    k = len(kids)
    if k == 1:
        return _naive(p, q, kids, cache, node)
    key = (node, "spectr", k)
    if key not in cache:
        lo, hi = 1.0, float(k)
        for _ in range(4):
            rho = 0.5 * (lo + hi)
            beta = float(torch.minimum(p / rho, q).sum())
            lo, hi = (rho, hi) if 1 - (1 - beta) ** k >= rho * beta else (lo, rho)
        rho = hi
        beta = float(torch.minimum(p / rho, q).sum())
        p_acc = 1 - (1 - beta) ** k
        cache[key] = (rho, _residual(p, torch.minimum(p / rho, q) * (p_acc / beta if beta > 0 else rho)))
    rho, res = cache[key]
    out, reject = {}, 1.0
    for t in kids:
        qt = float(q[t])
        a = 1.0 if qt <= 0.0 else min(1.0, float(p[t]) / (rho * qt))
        out[t] = out.get(t, 0.0) + reject * a
        reject *= 1.0 - a
    for t in set(kids):
        out[t] += reject * float(res[t])
    return out


def _specinfer(p, q, kids, cache, node):
    k = len(kids)
    if k == 1:
        return _naive(p, q, kids, cache, node)
    key = (node, "specinfer", tuple(sorted(kids)))
    if key in cache:
        return cache[key]
    tokens = sorted(set(kids))
    target, accept = p.clone(), []
    for _ in range(k):  # the target after each rejection, read at the distinct children
        accept.append({t: (1.0 if float(q[t]) <= 0.0 else min(1.0, float(target[t]) / float(q[t]))) for t in tokens})
        target = _residual(target, q)
    final = {t: float(target[t]) for t in tokens}
    law = {0: final}  # law[mask of copies left] = P(output = t | those copies left), by token
    for mask in range(1, 1 << k):
        left = [j for j in range(k) if mask >> j & 1]
        step = k - len(left)
        out = dict.fromkeys(tokens, 0.0)
        for j in left:
            a = accept[step][kids[j]]
            out[kids[j]] += a / len(left)
            if a < 1.0:
                for t, v in law[mask ^ (1 << j)].items():
                    out[t] += (1.0 - a) / len(left) * v
        law[mask] = out
    cache[key] = law[(1 << k) - 1]
    return cache[key]


BRANCH = {"nss": _nss, "naive": _naive, "spectr": _spectr, "specinfer": _specinfer}


def expected_depths(paths, rows, method: str, L1: int, cache: dict) -> list[float]:
    """E[tau + 1] of the tree made of ``paths`` (K token paths from the root, all of one length
    L) cut at L1, ..., L: ``rows[node] = (p, q)`` torch tensors, ``cache`` shared across trees."""
    L = len(paths[0])
    children: dict[tuple, list] = {}
    for path in paths:
        for d in range(L):
            children.setdefault(path[:d], []).append(path[d])
    branch = {node: BRANCH[method](*rows[node], kids, cache, node) for node, kids in children.items()}
    deepest_first = sorted(children, key=len, reverse=True)
    out = []
    for cut in range(L1, L + 1):
        depth: dict[tuple, float] = {}
        for node in deepest_first:
            if len(node) >= cut:
                depth[node] = float(cut)
                continue
            moved = branch[node]
            stay = max(0.0, 1.0 - sum(moved.values()))
            depth[node] = stay * len(node) + sum(
                v * depth.get(node + (t,), float(min(len(node) + 1, cut))) for t, v in moved.items()
            )
        out.append(1.0 + depth[()])
    return out


def label_loop(trees, rows, method: str) -> list[list[float]]:
    """Every tree's E[tau + 1] at its cut-offs: ``trees`` = [(L1, K, paths)], one cache for all
    (emptied per call, as a fresh run of their code starts)."""
    cache: dict = {}
    return [expected_depths(paths, rows, method, L1, cache) for L1, _, paths in trees]


def _spectr_rho(p: torch.Tensor, q: torch.Tensor, k: int, tol: float) -> float:
    """The upper end of a bisection of [1, k] on 1 - (1 - beta)^k >= rho beta, to ``tol``."""
    lo, hi = 1.0, float(k)
    while hi - lo > tol:
        rho = 0.5 * (lo + hi)
        beta = float(torch.minimum(p / rho, q).sum())
        lo, hi = (rho, hi) if 1 - (1 - beta) ** k >= rho * beta else (lo, rho)
    return hi


def accept_nss(p, q, k: int) -> float:
    """sum_t p(t) (1 - (1 - q(t))^k) (DDTE App. C)."""
    return float((p * (1 - (1 - q) ** k)).sum())


def accept_naive(p, q, k: int) -> float:
    """sum min(p, q) + sum (p - q)_+ (1 - (1 - q)^(k - 1)) (DDTE App. C)."""
    out = torch.minimum(p, q).sum()
    if k > 1:
        out = out + (torch.relu(p - q) * (1 - (1 - q) ** (k - 1))).sum()
    return float(out)


def accept_spectr(p, q, k: int, tol: float = 1e-4) -> float:
    """p_acc + (1 - p_acc) sum res (1 - (1 - r)^k), r = (q - p / rho)_+ / (1 - beta) (DDTE App. C),
    rho bisected to ``tol`` as the authors' acceptance path does."""
    rho = _spectr_rho(p, q, k, tol)
    beta = float(torch.minimum(p / rho, q).sum())
    if beta >= 1.0:
        return 1.0
    p_acc = 1 - (1 - beta) ** k
    res = _residual(p, torch.minimum(p / rho, q) * (p_acc / beta if beta > 0 else rho))
    r = torch.relu(q - p / rho) / max(1 - beta, 1e-6)
    return float(p_acc + (1 - p_acc) * (res * (1 - (1 - r) ** k)).sum())


ACCEPT = {"nss": accept_nss, "naive": accept_naive, "spectr": accept_spectr}


def node_branch(p, q, kids, method: str) -> dict:
    """One node's branch probabilities as their label loop computes them at a node's first visit
    (an empty cache)."""
    return BRANCH[method](p, q, list(kids), {}, ())
