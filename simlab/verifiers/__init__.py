"""Node-level verifiers (OTLP solvers), one per module, behind the ``NodeVerifier`` protocol.

Use ``get(name, **options)``:

================  =====================================================  ==========================
name              algorithm                                              lossless for
================  =====================================================  ==========================
``nss``           sample from p, accept if it is a child                 every law (i.i.d. for alpha)
``naive``         NaiveTree: speculative sampling on the first child     i.i.d., w/o replacement
``spectr``        SpecTr K-SEQ with rho* by bisection                    i.i.d.
``specinfer``     recursive rejection sampling with replacement          i.i.d.
``rrs_wor``       recursive rejection sampling without replacement       without replacement
``khisti``        importance-weighted selection + speculative sampling   i.i.d.
``optimal``       the OT-LP coupling (small vocabularies)                i.i.d. or w/o repl.
``ot_walk``       coin walk down p/q + SD of its selection law           i.i.d.
``ot_exact``      highest score by the left curtain + SD of its law      i.i.d.
``ot_wor``        mixture of priority orders + SD of its selection law   without replacement
``onehot``        EAGLE's T > 0 rule: accept a child w.p. p'(x), q = 1   every law (deterministic)
``greedy``        the target's argmax, accepted iff a child              every law, one-hot p only
``greedy_draft``  SD against q~ on the tail of a greedy draft            mixed, w/o repl. (det.: one-hot)
``exact_match``   strict exact-match (vLLM): NSS's rule, engines' name   every law
``sglang_thresh`` SGLang's threshold_single / threshold_acc relaxation   none (declared lossy)
``diverse``       DIVERSE (transformers): SD against w p + (1 - w) q       none (declared lossy)
``lenience``      Fast-HSD: accept min(1, p / (l q)), else (p - q)+      none (declared lossy)
``cos``           Fast-HSD CoS: SD against lambda q + (1 - lambda) p     none (declared lossy)
``speccascade``   Fast-HSD: accept iff p(x) >= c max p, else draw p      none (declared lossy)
``eta_accept``    Fast-HSD eta_spd: accept iff p(x) >= tau(p), else p    none (declared lossy)
``eagle_len``     Fast-HSD EAGLE-3: one-hot rule, accept min(1, p'/l)    none (declared lossy)
``eagle_min_p``   Fast-HSD EAGLE-3: accept iff p'(x) >= c max p'         none (declared lossy)
``eagle_eta``     Fast-HSD EAGLE-3: accept min(1, p'(x) / tau(p'))       none (declared lossy)
================  =====================================================  ==========================

(``sglang_thresh`` stands for ``sglang_threshold``, ``eta_accept`` for ``eta_acceptance``,
``eagle_len`` for ``eagle_lenience``.)  A declared-lossy verifier (``lossless_for`` empty) is
refused by every tree unless ``allow_lossy=True``; its exact bias is ``simlab.efficiency.pairing_bias``.
A tree verifier refuses a pairing outside ``lossless_for`` (``simlab.tree_verifiers``).  The OT rules
reach alpha* wherever certified (``ot_walk``), at every node (``ot_exact``), up to a reported gap
(``ot_wor``), at any vocabulary size; ``simlab.verifiers.selection.SelectionPlan`` is the
select-then-test step (Khisti et al.'s canonical decomposition) that ``ot_exact`` and ``ot_wor`` share.
What a verifier declares on its class, and how to add one: ``docs/derivations/verifiers.md``.
"""

from __future__ import annotations

from simlab.checks import check_choice
from simlab.verifiers.base import ALL_LAWS, NodePlan, NodeVerifier, accept_draw
from simlab.verifiers.cos import CoS
from simlab.verifiers.diverse import Diverse
from simlab.verifiers.eagle_eta import EagleEta
from simlab.verifiers.eagle_lenience import EagleLenience
from simlab.verifiers.eagle_min_p import EagleMinP
from simlab.verifiers.eta_acceptance import EtaAcceptance
from simlab.verifiers.exact_match import ExactMatch
from simlab.verifiers.greedy import Greedy
from simlab.verifiers.greedy_draft import GreedyDraft
from simlab.verifiers.khisti import Khisti
from simlab.verifiers.lenience import Lenience
from simlab.verifiers.naive import Naive
from simlab.verifiers.nss import NSS
from simlab.verifiers.onehot import OneHot
from simlab.verifiers.optimal import Optimal
from simlab.verifiers.ot_exact import OTExact
from simlab.verifiers.ot_walk import OTWalk
from simlab.verifiers.ot_wor import OTWithoutReplacement
from simlab.verifiers.rrs_wor import RRSWithoutReplacement
from simlab.verifiers.sglang_threshold import SGLangThreshold
from simlab.verifiers.speccascade import SpecCascade
from simlab.verifiers.specinfer import SpecInfer
from simlab.verifiers.spectr import SpecTr

REGISTRY: dict[str, type[NodeVerifier]] = {
    cls.name: cls
    for cls in (
        NSS,
        Naive,
        SpecTr,
        SpecInfer,
        RRSWithoutReplacement,
        Khisti,
        Optimal,
        OTWalk,
        OTExact,
        OTWithoutReplacement,
        OneHot,
        Greedy,
        GreedyDraft,
        ExactMatch,
        SGLangThreshold,
        Diverse,
        Lenience,
        CoS,
        SpecCascade,
        EtaAcceptance,
        EagleLenience,
        EagleMinP,
        EagleEta,
    )
}

LAB_VERIFIERS: frozenset[type[NodeVerifier]] = frozenset(REGISTRY.values())
"""The lab's own node verifier classes (proved by its test suite).  Any other class, registered by
``register`` or built by hand, is lossless for the studies only where ``simlab.conformance`` confirms
what it declares (``simlab.conformance.certified_lossless_for``; ``simlab.tree_verifiers.TopDown``)."""


def is_lab_verifier(verifier) -> bool:
    """True when ``verifier`` is an instance of one of the lab's own classes (exactly: a subclass is
    not).  The capabilities a fast path trusts without checking (``speculative_at_one``,
    ``branch_is_target``, a batched implementation found by ``name``) are honoured only for these;
    any other class takes the plain path, whose values follow its own ``prepare``."""
    return type(verifier) in LAB_VERIFIERS


def register(cls: type[NodeVerifier]) -> type[NodeVerifier]:
    """Add a node verifier class under its ``name`` (usable as a class decorator); every query over
    the registry (``names``, ``simlab.tree_verifiers.lossless_names``, the generic tests) then
    includes it.  ``unregister(name)`` removes it.

    Raises:
        ValueError: ``cls`` is not a ``NodeVerifier`` subclass with a ``name``, or the name is taken.
    """
    if not (isinstance(cls, type) and issubclass(cls, NodeVerifier) and isinstance(getattr(cls, "name", None), str)):
        raise ValueError(f"cls: must be a NodeVerifier subclass with a name, got {cls!r}")
    if cls.name in REGISTRY:
        raise ValueError(f"cls: the name {cls.name!r} is already registered")
    REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove the verifier registered as ``name`` (ValueError when there is none)."""
    if REGISTRY.pop(name, None) is None:
        raise ValueError(f"name: no verifier registered as {name!r}")


def names() -> list[str]:
    """The registered verifier names, in the order of the table above."""
    return list(REGISTRY)


def ot_based() -> list[str]:
    """The registered verifiers that declare ``ot_based`` (DDTE's OT-based verifiers), in registry order."""
    return [name for name, cls in REGISTRY.items() if cls.ot_based]


def get(name: str, **options) -> NodeVerifier:
    """The verifier registered as ``name``, built with ``options`` (for example ``order="fixed"``).

    Raises:
        ValueError: ``name: ...`` for a name that is not a registered one (a non-string
            included; ``simlab.checks.check_choice``), or an option the verifier does not take or
            rejects.
    """
    cls = REGISTRY[check_choice(name, "name", REGISTRY, "verifier")]
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"options: {name} does not accept {sorted(options)} ({exc})") from None


__all__ = [
    "ALL_LAWS",
    "NodePlan",
    "NodeVerifier",
    "LAB_VERIFIERS",
    "is_lab_verifier",
    "REGISTRY",
    "accept_draw",
    "get",
    "names",
    "ot_based",
    "register",
    "unregister",
] + [c.__name__ for c in REGISTRY.values()]
