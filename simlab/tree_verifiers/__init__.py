"""Tree verifiers: ``get(name, allow_lossy=False, **options)``.

* ``nss``, ``naive``, ``spectr``, ``specinfer``, ``rrs_wor``, ``khisti``, ``optimal``, ``onehot``,
  ``greedy``, ``greedy_draft``: the top-down lifting of the node verifier of that name
  (``TopDown``), options passed to it (``greedy``: temperature-0 verification against the
  target argmax; ``onehot``: EAGLE's rule for deterministic trees; ``greedy_draft``: the
  verifier of greedy-draft trees);
* ``naive_chain``: standard speculative sampling on the first path;
* ``bv``: Block Verification on the first path;
* ``traversal``: Traversal Verification (siblings drafted without replacement);
* ``hsd``: Hierarchical Speculative Decoding on the first path, its whole-block acceptance capped
  (lossless; its law is BV's); ``hsd_official``: the official whole-block acceptance (lossless
  only for a greedy target; ``simlab.tree_verifiers.hierarchical``);
* ``typical``: Medusa's typical acceptance (options ``posterior_threshold``, ``posterior_alpha``,
  ``next_token``), declared lossy;
* ``exact_match`` (strict exact-match, the engines' name for NSS's rule) and ``sglang_threshold``
  (SGLang's threshold relaxation, declared lossy) are top-down node rules like the first list.

Every verifier refuses trees it is not lossless for (``TreeVerifier.check``) unless built with
``allow_lossy=True``.  ``as_verifier(name_or_verifier)`` is the one coercion of a name or a
``TreeVerifier`` every valuation takes.  ``lossless_names(laws, settings)`` answers which verifiers may be paired
with a tree of those drafting laws at a setting, from what each verifier declares
(``lossless_for``, ``needs_greedy_target``; for a node class not of the lab's own, the declared laws
``simlab.conformance`` confirms: ``TopDown``); ``deterministic_rule(settings)`` is the baseline of
deterministic trees; ``paper_name`` the label a verifier declares; ``single_path`` (declared by
the whole-tree classes, ``first_path_only`` for ``TopDown``) marks the verifiers of one path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from simlab import verifiers as node_verifiers
from simlab.checks import check_bool, check_choice
from simlab.drafting import Drafting, lossless_pairing
from simlab.tree_verifiers.base import TreeVerifier
from simlab.tree_verifiers.block import BlockVerification
from simlab.tree_verifiers.hierarchical import HierarchicalSD, HierarchicalSDOfficial
from simlab.tree_verifiers.topdown import NaiveChain, TopDown
from simlab.tree_verifiers.traversal import Traversal
from simlab.tree_verifiers.typical import TypicalAcceptance

REGISTRY: dict[str, type[TreeVerifier]] = {
    cls.name: cls for cls in (NaiveChain, BlockVerification, Traversal, HierarchicalSD, HierarchicalSDOfficial, TypicalAcceptance)
}
"""The whole-tree verifiers (their own classes; options are their own fields), by their declared
``name``; every registered node verifier is a tree verifier too (``TopDown``)."""


def deterministic_rule(settings) -> str:
    """The verifier EAGLE's code pairs with deterministic trees: ``"greedy"`` at a greedy target
    (``settings.greedy``: T = 0 or top-k = 1), else ``"onehot"`` (EAGLE-2 ``evaluate_posterior``; the studies' baseline)."""
    return "greedy" if settings.greedy else "onehot"


def deterministic_rules(settings) -> dict[str, str]:
    """``{s.name: deterministic_rule(s)}`` for a sequence of settings (a table's baseline verifier
    by its ``setting`` column)."""
    return {s.name: deterministic_rule(s) for s in settings}


def lossless_names(laws: Iterable[Drafting], settings, k: int | None = None) -> list[str]:
    """Every tree verifier that may be paired with a tree whose nodes' children are drawn by
    ``laws`` at ``settings`` (in ``names()`` order): lossless for each law
    (``simlab.drafting.lossless_pairing``; with ``k = 1``, a single child drawn from q also
    serves a verifier lossless for any one-draw law), and a verifier that needs a greedy target
    only when ``settings.greedy`` (T = 0 or top-k = 1).

    Args:
        laws: the drafting laws of the tree's nodes (``Drafting`` values; at least one).
        settings: the sampling settings (anything with a boolean ``greedy``).
        k: the most children of any node; None: any number (the law must be declared).

    Raises:
        ValueError: ``laws`` empty or not ``Drafting`` values, ``k`` not None or a positive int.
    """
    laws = frozenset(laws)
    if not laws or not all(isinstance(law, Drafting) for law in laws):
        raise ValueError(f"laws: must be a non-empty set of simlab.drafting.Drafting values, got {sorted(map(str, laws))}")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        raise ValueError(f"k: must be None or a positive integer, got {k!r}")
    out = []
    for name in names():
        verifier = get(name)
        if verifier.needs_greedy_target and not settings.greedy:
            continue
        if all(law in verifier.lossless_for if k is None else lossless_pairing(verifier.lossless_for, law, k) for law in laws):
            out.append(name)
    return out


def paper_name(name: str) -> str:
    """The label a verifier declares (``label``: the papers' name, for example "SpecTr"), or its
    registry name when it declares none.

    Raises:
        ValueError: ``name: ...`` for a name that is not a tree verifier's (a non-string included).
    """
    name = check_choice(name, "name", names(), "tree verifier")
    if name in REGISTRY:
        return REGISTRY[name].label or name
    return node_verifiers.REGISTRY[name].display_name()


def paper_names() -> dict[str, str]:
    """``{name: paper_name(name)}`` for every tree verifier (a table's display names)."""
    return {name: paper_name(name) for name in names()}


def names() -> list[str]:
    """Every tree-verifier name: the node verifiers' (top-down), then the whole-tree ones."""
    return node_verifiers.names() + list(REGISTRY)


def get(name: str, allow_lossy: bool = False, **options) -> TreeVerifier:
    """The tree verifier called ``name``; ``options`` go to the node verifier of a top-down one.

    Args:
        allow_lossy: compute results on trees the verifier is not lossless for (biased;
            ``TreeVerifier.lossless_on`` says so) instead of raising ``ValueError``.

    Raises:
        ValueError: ``name: ...`` for a name that is not a tree verifier's (a non-string included;
            ``simlab.checks.check_choice``, as ``simlab.verifiers.get``), or bad options.
    """
    name = check_choice(name, "name", names(), "tree verifier")
    allow_lossy = check_bool(allow_lossy, "allow_lossy")
    if name in REGISTRY:
        cls = REGISTRY[name]
        fields = set(cls.options)
        if set(options) - fields:
            takes = f"takes only {', '.join(sorted(fields))}" if fields else "takes no options"
            raise ValueError(f"options: {name} {takes}, got {sorted(options)}")
        return cls(allow_lossy=allow_lossy, **options)
    return TopDown(node_verifiers.get(name, **options), allow_lossy=allow_lossy)


def as_verifier(verifier, allow_lossy: bool = False) -> TreeVerifier:
    """The tree verifier ``verifier`` names or is: the one public coercion every valuation uses.

    Args:
        verifier: a tree-verifier name (``get(name, allow_lossy=allow_lossy)``) or a ``TreeVerifier``
            (returned as it is, or a copy with ``allow_lossy=True`` when that is asked and it lacks it).
        allow_lossy: as ``get``.

    Raises:
        ValueError: ``verifier: ...`` for an object that is neither a name nor a ``TreeVerifier``;
            ``name: ...`` (``get``) for an unknown name.
    """
    if isinstance(verifier, str):
        return get(verifier, allow_lossy=allow_lossy)
    if not isinstance(verifier, TreeVerifier):
        raise ValueError(f"verifier: must be a tree-verifier name or object, got {verifier!r}")
    if allow_lossy and not verifier.allow_lossy:
        return dataclasses.replace(verifier, allow_lossy=True)
    return verifier


__all__ = [
    "REGISTRY",
    "BlockVerification",
    "HierarchicalSD",
    "HierarchicalSDOfficial",
    "NaiveChain",
    "TopDown",
    "Traversal",
    "TreeVerifier",
    "TypicalAcceptance",
    "as_verifier",
    "deterministic_rule",
    "deterministic_rules",
    "get",
    "lossless_names",
    "names",
    "paper_name",
    "paper_names",
]
