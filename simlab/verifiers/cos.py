"""Fast-HSD's CoS rule (Collaborative Decoding via Speculation, weighted-ensemble form): lossy.

The rule Fast-HSD runs for ``fast-hsd-eval --method cos --param lambda`` (``cos_lambda`` passed to
the patched ``_speculative_sampling``): ZhouYuxuanYX/Fast-HSD@66ef1dc
``transformers/generation/utils.py::_speculative_sampling``, branch ``cos_lambda is not None``;
knob grid ``configs/methods/cos.json`` (Fast-HSD@2d79e7a: 0.2, 0.4, 0.6, 0.8); CoS is Fu et al.
2025.  At one node with drafted child x ~ q (the first child with k > 1, NaiveTree's convention):
speculative sampling (``simlab.verifiers.speculative.SingleDraft``) of the mixture

    r = lambda q + (1 - lambda) p

against the proposal q: accept x with probability min(1, r(x) / q(x)), else emit
Y ~ norm((r - q)_+) = norm((p - q)_+) (lambda < 1).  Exact law
B(x, .) = a(x) delta_x + (1 - a(x)) norm((r - q)_+), and over x ~ q the output law is r itself:
TV(r, p) = lambda TV(p, q), acceptance sum min(q, r) = 1 - (1 - lambda) TV(p, q).

As shipped, ``cos_lambda`` weighs the draft q: lambda = 1 emits q (the CLI's default parameter,
``fast_hsd/cli.py`` METHODS), lambda = 0 is speculative sampling.  Fast-HSD's own description
(``configs/methods/cos.json`` and ``fast_hsd/core/collaborative_verification.py``: "lam p +
(1 - lam) q", "lam = 1 recovers lossless SD") has the weights the other way round; the lab follows
the code.  The law is DIVERSE's static ensemble
(arXiv 2604.07622, v = w p + (1 - w) q) at w = 1 - lambda.  Declared lossy (``lossless_for``
empty; exact only at lambda = 0).  Conventions: the lab's coin test is strict (``accept_draw``),
the official ``u_j <= ratio`` is not (the null event U = ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.checks import check_in_range
from simlab.verifiers.base import NodePlan, NodeVerifier
from simlab.verifiers.speculative import SingleDraft


class _CoSPlan(NodePlan):
    def __init__(self, verifier, p, q, k):
        super().__init__(verifier, p, q, k)
        weight = verifier.cos_lambda
        self.single = SingleDraft(weight * q + (1.0 - weight) * p, q)  # target r, proposal q

    def _law(self, children):
        return self.single.law(int(children[0]))

    def _draw(self, children, rng):
        return self.single.draw(int(children[0]), rng)


@dataclass(frozen=True)
class CoS(NodeVerifier):
    """Fast-HSD's CoS rule: speculative sampling of r = lambda q + (1 - lambda) p on the drafted child.

    Args:
        cos_lambda: lambda in [0, 1], the draft's weight in r; 1 is Fast-HSD's CLI default (emits q).

    Raises:
        ValueError: ``cos_lambda: ...`` outside [0, 1] or not a number.
    """

    name = "cos"
    exact_at_greedy_target = False  # cos_lambda > 0 accepts a child the target never emits, at a one-hot target too
    label = "CoS (Fast-HSD)"
    lossless_for = frozenset()  # declared lossy: exact only at cos_lambda = 0 (speculative sampling)
    cos_lambda: float = 1.0

    def __post_init__(self):
        check_in_range(self.cos_lambda, "cos_lambda")

    def _plan(self, p, q, k):
        return _CoSPlan(self, p, q, k)
