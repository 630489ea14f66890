"""Draft-tree builders, one per module behind one protocol (``simlab.builders.base.Builder``).

``get(name, **options)`` builds one by name:

================  ===================================================  =======================  ===================
name              builder                                              children (node laws)     lossless verifiers
================  ===================================================  =======================  ===================
``delayed``       DDTE's delayed tree ``Delayed(K, L1, L2)``           i.i.d. (or w/o repl.)    nss, naive, spectr,
                                                                                                specinfer, khisti,
                                                                                                optimal, traversal,
                                                                                                bv, naive_chain
``iid``           K i.i.d. rollouts of L tokens ``iid(K, L)``          i.i.d.                   as delayed
``chain``         one drafted path ``chain(L)``                        one child from q         every sampled one
``static``        a topology in tuple notation ``Static(spec, ...)``   top-k / w/o replacement  onehot / rrs_wor, ...
``eagle2``        EAGLE-2's dynamic tree (``EAGLE2``)                  deterministic            onehot, nss, greedy
``sequoia``       Sequoia's DP tree (``Sequoia``)                      w/o repl. (or top-k)     rrs_wor, traversal, ...
``greedy_draft``  greedy draft with proxy scores (``GreedyDraftTree``)  mixed / deterministic    greedy_draft, onehot
``treegraft``     TreeGraft: n-gram and mid drafters on one trie       deterministic            onehot, nss, greedy
================  ===================================================  =======================  ===================

A builder's trees state their node laws; a verifier that is not lossless for them refuses them
(``simlab.tree_verifiers``).  Budgets count draft tokens (distinct non-root nodes).
"""

from __future__ import annotations

from simlab.builders.base import MAX_TREES, Builder, enumerate_draws
from simlab.builders.delayed import Delayed, chain, iid, named_shape
from simlab.builders.eagle import EAGLE2
from simlab.builders.greedy_draft import GreedyDraftTree
from simlab.builders.sequoia import Sequoia
from simlab.builders.static import Static

REGISTRY = {"delayed": Delayed, "iid": iid, "chain": chain, "static": Static, "eagle2": EAGLE2, "sequoia": Sequoia,
            "greedy_draft": GreedyDraftTree}


def _treegraft(**options):
    from simlab.treegraft import TreeGraft

    return TreeGraft(**options)


REGISTRY["treegraft"] = _treegraft


def names() -> list[str]:
    """Every builder name."""
    return list(REGISTRY)


def get(name: str, **options) -> Builder:
    """The builder registered as ``name``, built with ``options``.

    Raises:
        ValueError: ``name: ...`` for an unknown name; ``options: ...`` for options the builder
            does not take; the builder's own ``ValueError`` for values out of range.
    """
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"name: unknown builder {name!r}; choose one of {', '.join(REGISTRY)}")
    try:
        return REGISTRY[name](**options)
    except TypeError as exc:
        raise ValueError(f"options: {name} does not accept {sorted(options)} ({exc})") from None


__all__ = ["Builder", "Delayed", "EAGLE2", "GreedyDraftTree", "MAX_TREES", "REGISTRY", "Sequoia", "Static", "chain",
           "enumerate_draws", "get", "iid", "names", "named_shape"]
