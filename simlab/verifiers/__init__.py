"""Node-level verifiers (OTLP solvers), one per module, behind the ``NodeVerifier`` protocol.

Use ``get(name, **options)``:

=============  ========================================================  ====================
name           algorithm                                                 drafting law assumed
=============  ========================================================  ====================
``nss``        sample from p, accept if it is a child                    any (i.i.d. for alpha)
``naive``      NaiveTree: speculative sampling on the first child        i.i.d.
``spectr``     SpecTr K-SEQ with rho* by bisection                       i.i.d.
``specinfer``  recursive rejection sampling with replacement             i.i.d.
``rrs_wor``    recursive rejection sampling without replacement          without replacement
``khisti``     importance-weighted selection + speculative sampling      i.i.d.
``optimal``    the OT-LP coupling (small vocabularies)                   i.i.d. or w/o repl.
=============  ========================================================  ====================
"""

from __future__ import annotations

from simlab.verifiers.base import NodePlan, NodeVerifier, accept_draw
from simlab.verifiers.khisti import Khisti
from simlab.verifiers.naive import Naive
from simlab.verifiers.nss import NSS
from simlab.verifiers.optimal import Optimal
from simlab.verifiers.rrs_wor import RRSWithoutReplacement
from simlab.verifiers.specinfer import SpecInfer
from simlab.verifiers.spectr import SpecTr

REGISTRY: dict[str, type[NodeVerifier]] = {
    cls.name: cls for cls in (NSS, Naive, SpecTr, SpecInfer, RRSWithoutReplacement, Khisti, Optimal)
}


def names() -> list[str]:
    """The registered verifier names, in the order of the table above."""
    return list(REGISTRY)


def get(name: str, **options) -> NodeVerifier:
    """The verifier registered as ``name``, built with ``options`` (for example ``order="fixed"``).

    Raises:
        ValueError: unknown name, or an option the verifier does not take or rejects.
    """
    try:
        cls = REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"name: unknown verifier {name!r}; choose one of {', '.join(REGISTRY)}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"options: {name} does not accept {sorted(options)} ({exc})") from None


__all__ = ["NodePlan", "NodeVerifier", "REGISTRY", "accept_draw", "get", "names"] + [c.__name__ for c in REGISTRY.values()]
