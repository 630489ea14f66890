"""SpecInfer's multi-step speculative sampling = recursive rejection sampling *with* replacement.

Children X_1..X_k ~ i.i.d. q.  Keep a working target p_0 = p.  Pick a remaining child x
(uniformly at random, as in SpecInfer Alg. 2, or in the drafted order with
``order="fixed"``); accept it with probability min(1, p_i(x) / q(x)); on rejection set
p_{i+1} = norm((p_i - q)_+) and remove that one copy of x.  When no child is left, output
Y ~ p_k.  Since p_{i+1} depends only on i, the random-order law is a DP over the at most 2^k
subsets of remaining children (DDTE App. D), touching the full vocabulary only k times.
alpha = 1 - prod_{i<k} TV(p_i, q) (a rejected token has p_{i+1} = 0, so the final sample
never lands on a child); p_i is kept in closed form as norm((p - c_i q)_+).  Sources: Miao et al. 2024, Alg. 2 and Thm. 4.2; DDTE App. C-D.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from simlab.distributions import positive_part, sample_categorical, scratch
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw, summed_over_copies


def _excess(p: np.ndarray, q: np.ndarray, c: float, buffer: np.ndarray) -> float:
    """sum_t (p(t) - c q(t))_+, computed in ``buffer`` (V,) without allocating."""
    np.multiply(q, c, out=buffer)
    np.subtract(p, buffer, out=buffer)
    positive_part(buffer, out=buffer)
    return float(buffer.sum())


class _SpecInferPlan(NodePlan):
    """The residual chain in closed form: p_i = norm((p - c_i q)_+), c_0 = 0, c_{i+1} = c_i + Z_i.

    With Z_i = sum (p - c_i q)_+ (Z_0 = 1), induction gives norm((p_i - q)_+) =
    norm((p - (c_i + Z_i) q)_+) and TV(p_i, q) = Z_{i+1} / Z_i, so P(all k rejected) = Z_k.
    ``prepare`` makes k reductions over the vocabulary; the final vector is built only for a
    full law or a draw (``children_mass`` reads p_k at the children in closed form).
    """

    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        buffer = scratch(p.size)
        self.scale = [0.0]  # c_i
        self.mass = [1.0]  # Z_i
        self.reject_all = 1.0  # P(all k children rejected) = Z_k, or 0 after a stall
        for _ in range(k):
            c = self.scale[-1] + self.mass[-1]
            z = _excess(p, q, c, buffer)
            if z == 0.0:
                # p_i = q: the next trial accepts surely, so P(all rejected) = 0 and any
                # later target is unreachable; keep the current one.
                c, z, self.reject_all = self.scale[-1], self.mass[-1], 0.0
            self.scale.append(c)
            self.mass.append(z)
        if self.reject_all:
            self.reject_all = self.mass[-1]

    @cached_property
    def final(self) -> np.ndarray:
        """p_k = norm((p - c_k q)_+), float64 (V,): the law of the output when every child is
        rejected; built on first use (``children_mass`` reads it at the children only)."""
        buffer = np.empty_like(self.p)
        _excess(self.p, self.q, self.scale[-1], buffer)
        buffer /= self.mass[-1]
        return buffer

    def target_at(self, trial: int, tokens) -> np.ndarray:
        """p_trial(tokens) without materialising p_trial."""
        values = np.maximum(self.p[tokens] - self.scale[trial] * self.q[tokens], 0.0)
        return values / self.mass[trial]

    def _accept_matrix(self, children):
        """A[i, j] = min(1, p_i(x_j) / q(x_j)): accepting child j as the (i+1)-th trial."""
        qx = self.q[children]  # > 0 at every child: check_drafted refuses q = 0 (divides_by_q)
        return np.minimum(1.0, np.stack([self.target_at(i, children) for i in range(self.k)]) / qx)

    def _trials(self, children):
        """(mass, reach): mass[j] = P(child j is the one accepted), float64 (k,) (a repeated token
        shares its mass among its copies), and reach = P(every child rejected)."""
        accept = self._accept_matrix(children)
        k = self.k
        mass = np.zeros(k)
        if self.verifier.order == "fixed":
            reach = 1.0
            for i in range(k):
                mass[i] = reach * accept[i, i]
                reach *= 1.0 - accept[i, i]
            return mass, reach
        # reach[mask] = P(the children in `mask` remain, all others rejected).
        reach_by_mask = np.zeros(1 << k)
        reach_by_mask[(1 << k) - 1] = 1.0
        for mask in sorted(range(1, 1 << k), key=lambda m: -m.bit_count()):
            weight = reach_by_mask[mask]
            if weight == 0.0:
                continue
            remaining = mask.bit_count()
            trial = k - remaining
            for j in range(k):
                if mask >> j & 1:
                    a = accept[trial, j]
                    mass[j] += weight * a / remaining
                    reach_by_mask[mask ^ (1 << j)] += weight * (1.0 - a) / remaining
        return mass, reach_by_mask[0]

    def _children_masses(self, rows):
        """``_children_mass`` of every row of (M, k) children: the same trials and 2^k DP, each
        step one operation over the M rows."""
        count, k = rows.shape
        qx = self.q[rows]
        if np.any(qx == 0):
            raise ValueError(f"children: token {rows[qx == 0][0]} has q = 0; SpecInfer's test p_i / q is undefined there")
        accept = np.minimum(1.0, np.stack([self.target_at(i, rows) for i in range(k)], axis=1) / qx[:, None, :])
        mass = np.zeros((count, k))
        if self.verifier.order == "fixed":
            reach = np.ones(count)
            for i in range(k):
                mass[:, i] = reach * accept[:, i, i]
                reach *= 1.0 - accept[:, i, i]
        else:
            reach_by_mask = np.zeros((1 << k, count))
            reach_by_mask[(1 << k) - 1] = 1.0
            for mask in sorted(range(1, 1 << k), key=lambda m: -m.bit_count()):
                weight = reach_by_mask[mask]  # a zero weight adds exact zeros (the row-wise DP skips it)
                remaining = mask.bit_count()
                trial = k - remaining
                for j in range(k):
                    if mask >> j & 1:
                        a = accept[:, trial, j]
                        mass[:, j] += weight * a / remaining
                        reach_by_mask[mask ^ (1 << j)] += weight * (1.0 - a) / remaining
            reach = reach_by_mask[0]
        out = summed_over_copies(rows, mass)
        rejected = reach > 0.0
        if np.any(rejected):
            out[rejected] += reach[rejected, None] * self.target_at(k, rows[rejected])
        return out

    def _law(self, children):
        mass, reach = self._trials(children)
        out = np.zeros_like(self.p)
        np.add.at(out, children, mass)
        if reach > 0.0:
            out += reach * self.final
        return out

    def _children_mass(self, children):
        mass, reach = self._trials(children)
        out = summed_over_copies(children, mass)
        if reach > 0.0:
            out += reach * self.target_at(self.k, children)
        return out

    def _draw(self, children, rng):
        order = np.arange(self.k) if self.verifier.order == "fixed" else rng.permutation(self.k)
        for trial, j in enumerate(order):
            x = children[j]
            if accept_draw(rng, self.target_at(trial, x), self.q[x]):
                return int(x)
        return sample_categorical(self.final, rng)

    def acceptance_formula(self) -> float:
        return 1.0 - self.reject_all


@dataclass(frozen=True)
class SpecInfer(NodeVerifier):
    """Recursive rejection sampling with replacement (SpecInfer MSS).

    Args:
        order: ``"random"`` (default, SpecInfer's uniform choice among remaining children)
            or ``"fixed"`` (children tried in drafted order).
    """

    name = "specinfer"
    label = "SpecInfer"
    ot_based = True
    speculative_at_one = True
    divides_by_q = True  # the acceptance test divides by q at every child
    order: Literal["random", "fixed"] = "random"

    def __post_init__(self):
        if self.order not in ("random", "fixed"):
            raise ValueError(f"order: must be 'random' or 'fixed', got {self.order!r}")

    def _plan(self, p, q, k):
        return _SpecInferPlan(self, p, q, k)
