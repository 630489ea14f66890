"""The one-hot rule: EAGLE's verifier for temperature > 0 on deterministic child sets.

Visit the distinct children x in their order with a working target p' = p: accept x with
probability p'(x) (the draft probability is taken as 1: the children are not a sample from q);
on rejection set p'(x) = 0 and renormalise; when every child is rejected, the correction token
is drawn from the final p'.  Accepting the i-th child has probability
p(x_i) / (1 - p(x_1..x_{i-1})) times the probability of reaching it, so the telescoping product
gives B(x, t) = p(t) for every t: the output is a sample from p, exactly as NSS, whatever the
children, and the rule is lossless for every drafting law.  Accepted with probability
p(set(x)) (DDTE's alpha for NSS given the children); at a deterministic node the children are
the k most probable tokens of q (``Drafting.DETERMINISTIC``).
Source: SafeAILab/EAGLE@cb7e084 ``eagle/model/utils.py::evaluate_posterior`` (issues #93, #110).
"""

from __future__ import annotations

from dataclasses import dataclass


from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.verifiers.base import ALL_LAWS, NodePlan, NodeVerifier, accept_draw


class _OneHotPlan(NodePlan):
    def _law(self, children):
        return self.p.copy()

    def _draw(self, children, rng):
        target, left = self.p.copy(), 1.0  # left = mass of p' before renormalisation
        last = None  # the last child of positive mass visited
        for x in dict.fromkeys(children.tolist()):
            if accept_draw(rng, target[x], left):
                return int(x)
            if target[x] > 0.0:
                last = x
            left -= target[x]
            target[x] = 0.0
        if last is not None and not target.any():
            # The children cover p's support: in exact arithmetic ``left`` equals p(last) when
            # ``last`` is tested, so it is accepted surely; only a rounded ``left`` rejected it.
            return int(last)
        return sample_categorical(target, rng)

    def acceptance_formula(self) -> float:
        from simlab.drafting import top_tokens

        return float(self.p[top_tokens(self.q, self.k)].sum())


@dataclass(frozen=True)
class OneHot(NodeVerifier):
    """Accept each distinct child with its residual target probability (q = 1); lossless for any children."""

    name = "onehot"
    drafting = Drafting.DETERMINISTIC
    lossless_for = ALL_LAWS

    def _plan(self, p, q, k):
        return _OneHotPlan(self, p, q, k)
