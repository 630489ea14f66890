"""NSS: naive speculative sampling (SpecInfer's "naive sampling", DDTE's NSS).

Sample the output Y ~ p directly, ignoring q and the children; Y is accepted iff it is one of
the children.  B(x, t) = p(t) for every x, so NSS is lossless for any drafting law, and its
acceptance is alpha = sum_t p(t) pi(t), pi(t) the probability that t is a child under the
children's drafting law (``simlab.drafting.inclusion_probability``): with i.i.d. children
alpha = sum_t p(t) (1 - (1 - q(t))^k), with deterministic ones the target mass of the k most
probable tokens of q.  Sources: Miao et al. 2024 (SpecInfer,
Sec. 4); DDTE Sec. 3 and App. C.
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.distributions import inner, sample_categorical
from simlab.drafting import inclusion_probability
from simlab.verifiers.base import ALL_LAWS
from simlab.verifiers.base import NodePlan, NodeVerifier


class _NSSPlan(NodePlan):
    def _law(self, children):
        return self.p.copy()

    def _children_mass(self, children):
        return self.p[children]

    def _children_masses(self, rows):
        return self.p[rows]

    def _draw(self, children, rng):
        return sample_categorical(self.p, rng)

    def acceptance_formula(self) -> float:
        return inner(self.p, inclusion_probability(self.q, self.k, self.law))


@dataclass(frozen=True)
class NSS(NodeVerifier):
    """Naive speculative sampling: output ~ p, accepted iff it is a drafted child."""

    name = "nss"
    label = "NSS"
    ot_based = True
    lossless_for = ALL_LAWS
    branch_is_target = True

    def _plan(self, p, q, k):
        return _NSSPlan(self, p, q, k)
