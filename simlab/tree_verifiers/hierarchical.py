"""Hierarchical Speculative Decoding (HSD; Zhou et al., ICLR 2026, arXiv 2601.05724) on the first
path of a tree, as its official code runs it (ZhouYuxuanYX/Hierarchical-Speculative-Decoding@b8575e2,
``transformers/generation/utils.py::_speculative_sampling`` with ``backward=True, clever=True``,
one draft; ``algorithm.py::_speculative_sampling`` is the same rule with a loop for the cap).

For the draft block X_1..X_g with target p_k and draft q_k at the node after k tokens, the joint
prefix masses P_k = prod_{j<k} p_j(X_{j+1}), Q_k likewise, their ratio r_k = P_k / Q_k (r_0 = 1)
and its running cap m_k = max(1, r_0, .., r_k).  At each depth k < g the branch difference is
D_k = (P_k / m_k) p_k - Q_k q_k over the next token; with S+ and S- the masses of its positive
and negative parts, the branch **does not step back** with probability a_k = S+ / max(S+, S-),
and its resampling law is norm(D_k+).  The whole block is accepted with probability
min(1, A), where the official code takes A = r_g, the raw joint ratio; otherwise verification stops
at the deepest k whose branch does not step back (k = 0 when all do) and emits X_1..X_k and a
token drawn from norm(D_k+).  So P(tau = g, Y = y) = min(1, A) p_g(y) and, for k < g,
P(tau = k, Y = y) = (1 - min(1, A)) a_k prod_{k<j<g} (1 - a_j) norm(D_k+)(y) (a_0 read as 1).

**The official acceptance is lossy.**  Dividing D_k by Q_k gives w_k p_k - q_k with
w_k = r_k / m_k = min(1, w_{k-1} p_{k-1}(X_k) / q_{k-1}(X_k)), Block Verification's weight, and
a_k = s_k / (s_k + 1 - w_k), its h_k: the branches are BV's.  BV accepts the whole block with
w_g = r_g / m_{g-1} <= r_g; the raw ratio accepts more and the emitted law is off the target's
(exact TV in ``docs/results.md`` section 9; equal to it only where p is one-hot at every node).
So, by the lab's rule for official conventions that change the emitted law
(``docs/departures.md``): ``hsd`` accepts with the capped ratio A = r_g / m_{g-1} (lossless; its
law is BV's, tested equal to 1e-12, an independent derivation of the same rule), and
``hsd_official`` is the official rule, declared lossless only for a greedy target (refused at
T > 0 unless ``allow_lossy=True``, then its exact bias is reported).

Where D_k is zero (P_k / m_k p_k = Q_k q_k, which needs p_k = q_k) the official code divides
0 by 0; the lab reads a_k = 0 there (no residual to resample from).  A stop at a branch with no
residual mass and positive probability would be an undefined law: ``ValueError``, never a
patched residual (the exact tests show it does not arise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.distributions import positive_part, sample_categorical
from simlab.drafting import SAMPLED, Drafting
from simlab.tree_verifiers.base import TreeVerifier, drafted_q


@dataclass(frozen=True)
class HierarchicalSD(TreeVerifier):
    """HSD of the first drafted path, its whole-block acceptance capped (the lossless rule)."""

    name = "hsd"
    label = "HSD"
    single_path = True
    lossless_for = SAMPLED | {Drafting.REPEATED}  # only the first child of a node is read: a draw from q
    raw_acceptance: ClassVar[bool] = False  # the official whole-block acceptance min(1, r_g)
    capped_branches: ClassVar[bool] = True  # P_k / m_k in D_k (a seam for the planted-fault tests)

    def _block(self, tree):
        """(path, P(accept the whole block), a (g,) not-step-back probabilities, the branches'
        resampling laws [g vectors, None where D_k+ has no mass]).  Ratios in log space, as the
        official code (a product of ratios p / q can overflow where one of its factors is large)."""
        path = tree.first_path()
        g = len(path)
        log_ratio, log_cap = 0.0, 0.0  # log r_k and log m_k, k = 0
        a, laws = np.zeros(g), []
        for k in range(g):
            p_k, q_k = tree.table.p(path[:k]), tree.table.q(path[:k])
            scale = math.exp(log_ratio - log_cap) if self.capped_branches else math.exp(log_ratio)
            diff = scale * p_k - q_k  # D_k / Q_k: a_k and norm(D_k+) do not depend on the scale Q_k
            plus = positive_part(diff)
            mass_plus, mass_minus = float(plus.sum()), float(positive_part(-diff).sum())
            a[k] = mass_plus / max(mass_plus, mass_minus) if mass_plus > 0.0 else 0.0
            laws.append(plus / mass_plus if mass_plus > 0.0 else None)
            log_ratio += _log(p_k[path[k]]) - math.log(drafted_q(tree, path[:k], path[k]))
            if k + 1 < g:
                log_cap = max(log_cap, log_ratio)
        accept = math.exp(min(0.0, log_ratio if self.raw_acceptance else log_ratio - log_cap))  # min(1, A)
        return path, accept, a, laws

    @staticmethod
    def stop_distribution(a) -> np.ndarray:
        """P(stop at k | the block is not accepted) for k = 0..g-1, float64 (g,): the deepest
        branch that does not step back, k = 0 when every deeper one does (a_0 is read as 1)."""
        a = np.asarray(a, dtype=np.float64).copy()
        if a.size:
            a[0] = 1.0
        deeper_step_back = np.concatenate((np.cumprod((1.0 - a)[::-1])[::-1][1:], [1.0]))
        return a * deeper_step_back

    def _outcome_law(self, tree):
        path, accept, a, laws = self._block(tree)
        g = len(path)
        out = {path: accept * tree.table.p(path)} if accept > 0.0 else {}
        for k, stop in enumerate(self.stop_distribution(a)):
            mass = (1.0 - accept) * stop
            if mass <= 0.0:
                continue
            if laws[k] is None:
                raise ValueError(f"tree: {self.name} stops at depth {k} of {g} with probability {mass:.3g} and no residual there")
            out[path[:k]] = mass * laws[k]
        return out

    def _verify(self, tree, rng):
        path, accept, a, laws = self._block(tree)
        if rng.random() < accept:
            return path, sample_categorical(tree.table.p(path), rng)
        k = len(path) - 1
        while k > 0 and not rng.random() < a[k]:  # step back from the deepest branch
            k -= 1
        if laws[k] is None:
            raise ValueError(f"tree: {self.name} stops at depth {k} of {len(path)} with no residual there")
        return path[:k], sample_categorical(laws[k], rng)


@dataclass(frozen=True)
class HierarchicalSDOfficial(HierarchicalSD):
    """HSD as the official code accepts the whole block, min(1, P(X) / Q(X)): lossless only for
    a greedy target (the lab's option ``hsd_official``; ``docs/departures.md``)."""

    name = "hsd_official"
    label = "HSD (official acceptance)"
    needs_greedy_target = True
    raw_acceptance = True


def _log(x: float) -> float:
    """log x, -inf at 0 (a drafted token the target gives no mass: the ratio becomes 0)."""
    return math.log(x) if x > 0.0 else -math.inf
