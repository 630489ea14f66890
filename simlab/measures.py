"""Per-node measurements used by the studies and by captured data: divergences and acceptance.

``node_divergences(p, q)`` gives L1, TV, KL(p||q), KL(q||p) (nats; inf where supports
mismatch), H(p), H(q).  ``node_acceptance(p, q, k_values)`` gives, for k i.i.d. children drawn
from q, each verifier's acceptance rate and the optimum alpha*:

* a verifier whose plan has a closed form (``nss``, ``naive``, ``spectr``, ``specinfer``: DDTE
  App. C) uses it; one without (``khisti``, ``rrs_wor``) is exact by enumerating the children
  when at most its ``exact_tuples`` tuples exist, otherwise the unbiased estimate that averages
  the exact P(output in set(x) | x) over ``samples`` child tuples drawn with ``rng``
  (``NodeVerifier.acceptance_rate(method="auto", rng=...)``); a verifier drafting without
  replacement is NaN when k exceeds the support;
* ``optimal``: alpha* from ``simlab.otlp.optimal_acceptance`` (i.i.d. children);
* ``optimal_wor``: alpha* for children drafted without replacement (the bound of ``rrs_wor``;
  exponential clocks, ``simlab.containment``: about 0.25 s per node and k at V = 49,152), NaN
  when k exceeds the support.  Not in the default ``ACCEPTANCE_METHODS``; ``MEASURABLE`` lists
  every method.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from simlab import verifiers
from simlab.distributions import check_pair, entropy, kl_divergence, l1_distance
from simlab.drafting import Drafting, check_k
from simlab.otlp import optimal_acceptance

ACCEPTANCE_METHODS = ("nss", "naive", "spectr", "specinfer", "rrs_wor", "khisti", "optimal")
"""The methods ``node_acceptance`` reports by default."""
MEASURABLE = (*ACCEPTANCE_METHODS, "optimal_wor")
"""Every method ``node_acceptance`` knows."""


def node_divergences(p, q) -> dict[str, float]:
    """L1, TV, KL both ways and both entropies of one node (floats; nats for KL and H).

    Raises:
        ValueError: invalid p or q (see ``simlab.distributions.check_distribution``).
    """
    p, q = check_pair(p, q)  # once, not in every measure
    l1 = l1_distance(p, q, checked=True)
    return {
        "l1": l1,
        "tv": 0.5 * l1,
        "kl_pq": kl_divergence(p, q, checked=True),
        "kl_qp": kl_divergence(q, p, checked=True),
        "h_p": entropy(p, checked=True),
        "h_q": entropy(q, checked=True),
    }


def node_acceptance(
    p, q, k_values: Iterable[int], rng: np.random.Generator, samples: int = 32, methods: Iterable[str] = ACCEPTANCE_METHODS
) -> dict[str, float]:
    """``alpha_<method>_k<k>`` for each method and k; floats in [0, 1] (NaN where undefined).

    Args:
        p, q: target and draft distributions (V,).
        k_values: numbers of children.
        rng: randomness for the sampled children of ``khisti`` and ``rrs_wor`` at large V.
        samples: child tuples per estimate.
        methods: which of ``MEASURABLE`` (default ``ACCEPTANCE_METHODS``).

    Raises:
        ValueError: invalid p or q, a k that is not an integer >= 1, or a method outside
            ``MEASURABLE``.
    """
    p, q = check_pair(p, q)
    k_values = [check_k(k) for k in k_values]
    methods = tuple(methods)
    unknown = sorted(set(methods) - set(MEASURABLE))
    if unknown:
        raise ValueError(f"methods: unknown {', '.join(unknown)}; known: {', '.join(MEASURABLE)}")
    support = int(np.count_nonzero(q))
    out = {}
    for method in methods:
        for k in k_values:
            if method == "optimal":
                value = optimal_acceptance(p, q, k)
            elif method == "optimal_wor":
                value = optimal_acceptance(p, q, k, replacement=False) if k <= support else float("nan")
            else:
                verifier = verifiers.get(method)
                if verifier.drafting is Drafting.WITHOUT_REPLACEMENT and k > support:
                    value = float("nan")
                else:
                    value = verifier.acceptance_rate(p, q, k, rng=rng, samples=samples)
            out[f"alpha_{method}_k{k}"] = value
    return out
