"""DIVERSE's static ensemble verification (arXiv 2604.07622), as Hugging Face transformers ships it: lossy.

The rule of ``transformers.generation.utils._speculative_sampling`` with ``assistant_ensemble_weight``
= w (transformers 5.25.0, ``generation/utils.py``; ``GenerationConfig.assistant_ensemble_weight``),
at one node with target p, draft q and ordered children x_1..x_k of which only the first is tested
(transformers verifies a chain: one drafted token per position): with the ensemble
v = w p + (1 - w) q, accept x_1 iff U < v(x_1) / q(x_1) = 1 - w + w p(x_1) / q(x_1), U ~ Uniform[0, 1);
otherwise emit the correction token, a draw from norm((p - q)_+) (= norm((v - q)_+), computed from
p - q as transformers does), or from p where that residual is zero.  At a leaf the bonus token is a
draw from p.

Exact law: B(x, .) = a(x) delta_{x_1} + (1 - a(x)) norm((p - q)_+), a(x) = min(1, v(x_1) / q(x_1)).
With x_1 ~ q the output law is min(q, v) + w (p - q)_+ = v exactly (where p >= q, v >= q and
min(q, v) = q; where p < q, min(q, v) = v and the residual is 0): the rule emits the ensemble v,
not p, so its bias is TV(v, p) = (1 - w) TV(p, q), zero only at w = 1 (standard speculative
sampling) or p = q.  Acceptance of x_1: sum min(q, v) = 1 - w TV(p, q).  The verifier is declared
lossy (``lossless_for`` empty: every tree refuses it without ``allow_lossy=True``); its exact bias on
a tree is ``simlab.efficiency.pairing_bias``.

Conventions: a child with q(x_1) = 0 (possible only for deterministic children) is accepted iff
p(x_1) > 0 (transformers' ratio is inf there, and NaN from 0 / 0 when p(x_1) = 0 too, which its
strict test rejects).  Transformers falls back to p when its float32 residual mass is at most
``torch.finfo(float32).tiny``; the lab's float64 residual falls back to p when it is exactly 0
(``simlab.distributions.residual``): the two differ only on residual masses in (0, 1.2e-38].  Its
greedy mode (argmax of v, ``do_sample=False``) is not this rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw
from simlab.verifiers.speculative import SingleDraft, accept_probabilities


class _DiversePlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        w = float(verifier.weight)
        self.v = w * p + (1.0 - w) * q
        self.single = SingleDraft(p, q)  # its correction: norm((p - q)_+), p where that is zero

    def _law(self, children):
        x = int(children[0])
        a = float(accept_probabilities(self.v[x], self.q[x]))
        out = (1.0 - a) * self.single.correction
        out[x] += a
        return out

    def _draw(self, children, rng):
        x = int(children[0])
        if accept_draw(rng, self.v[x], self.q[x]):
            return x
        return sample_categorical(self.single.correction, rng)


@dataclass(frozen=True)
class Diverse(NodeVerifier):
    """DIVERSE's static ensemble verification: speculative sampling of the first child against the
    ensemble v = w p + (1 - w) q (transformers' ``assistant_ensemble_weight``).

    Args:
        weight: w in (0, 1]; 1 is standard speculative sampling (bias 0), below 1 the output law is
            v (bias (1 - w) TV(p, q)).  Transformers takes w in the open interval (0, 1) (None for
            its lossless mode); 0.5 is the lab's default, no engine's.

    Raises:
        ValueError: ``weight: ...`` for a weight outside (0, 1] or not a finite number.
    """

    name = "diverse"
    label = "DIVERSE (transformers)"
    drafting = Drafting.IID  # transformers' assistant samples one draft per position
    lossless_for = frozenset()  # declared lossy: its output law is w p + (1 - w) q
    exact_at_greedy_target = False  # it accepts a child with p = 0 w.p. 1 - w
    weight: float = 0.5

    def __post_init__(self):
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or not 0.0 < w <= 1.0:
            raise ValueError(f"weight: must be a number in (0, 1] (1: standard speculative sampling), got {w!r}")

    def _plan(self, p, q, k):
        return _DiversePlan(self, p, q, k)


def ensemble_law(p, q, weight: float) -> np.ndarray:
    """v = w p + (1 - w) q, float64 (V,): the output law of DIVERSE's rule with one child drawn
    from q (the module docstring); p, q validated float64 (V,), weight as ``Diverse``."""
    w = Diverse(weight=weight).weight
    return w * np.asarray(p, dtype=np.float64) + (1.0 - w) * np.asarray(q, dtype=np.float64)
