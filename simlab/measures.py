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
  when k exceeds the support.

Every registered node verifier (``simlab.verifiers.names()``, those added by ``register`` included)
is measurable through its ``acceptance_rate``; ``measurable()`` lists them, ``optimal`` computed by
the closed form, then ``optimal_wor``.  The default set is DDTE's (``DDTE_METHODS``).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from simlab import verifiers
from simlab.distributions import check_pair, entropy, kl_divergence, l1_distance
from simlab.drafting import Drafting, check_k
from simlab.otlp import optimal_acceptance

DDTE_METHODS = ("nss", "naive", "spectr", "specinfer", "rrs_wor", "khisti", "optimal")
"""DDTE's node verifiers, the default of ``node_acceptance``: NSS, NaiveTree, SpecTr, SpecInfer,
recursive rejection sampling without replacement, Khisti et al.'s importance-weighted selection, and
the OT optimum alpha* (the node-level OTLP solvers DDTE compares, its Sec. 5 and App. C)."""
ACCEPTANCE_METHODS = DDTE_METHODS
"""The methods ``node_acceptance`` reports by default: ``DDTE_METHODS``."""
EXTRA_METHODS = ("optimal_wor",)
"""Methods that are no registered verifier: alpha* for children drafted without replacement."""


def measurable() -> tuple[str, ...]:
    """Every method ``node_acceptance`` knows: each registered node verifier (``simlab.verifiers.names``,
    in registry order; read at the call, so a verifier added by ``simlab.verifiers.register`` is
    measurable), then ``EXTRA_METHODS``."""
    return (*verifiers.names(), *EXTRA_METHODS)


MEASURABLE = measurable()
"""``measurable()`` at import: the lab's own verifiers and ``optimal_wor`` (a verifier registered
later is measurable too; ``measurable()`` lists it)."""


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
    p, q, k_values: Iterable[int], rng: np.random.Generator, samples: int = 32, methods: Iterable[str] = DDTE_METHODS
) -> dict[str, float]:
    """``alpha_<method>_k<k>`` for each method and k; floats in [0, 1] (NaN where undefined).

    Args:
        p: the target distribution, float64 of shape (V,).
        q: the draft distribution, float64 of shape (V,) (the same V).
        k_values: numbers of children.
        rng: randomness for the sampled children of ``khisti`` and ``rrs_wor`` at large V.
        samples: child tuples per estimate.
        methods: which of ``measurable()`` (default ``DDTE_METHODS``).

    Raises:
        ValueError: invalid p or q, a k that is not an integer >= 1, or a method outside
            ``measurable()``.
    """
    p, q = check_pair(p, q)
    k_values = [check_k(k) for k in k_values]
    methods = tuple(methods)
    known = measurable()
    unknown = sorted(set(methods) - set(known))
    if unknown:
        raise ValueError(f"methods: unknown {', '.join(unknown)}; known: {', '.join(known)}")
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
