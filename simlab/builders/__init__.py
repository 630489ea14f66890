"""Draft-tree builders, one per module behind one protocol (``simlab.builders.base.Builder``).

``get(name, **options)`` builds one by name:

====================  ===================================================  =======================  ===================
name                  builder                                              children (node laws)     lossless verifiers
====================  ===================================================  =======================  ===================
``delayed``           DDTE's delayed tree ``Delayed(K, L1, L2)``           i.i.d. (or w/o repl.)    nss, naive, spectr,
                                                                                                    specinfer, khisti,
                                                                                                    optimal, traversal,
                                                                                                    bv, naive_chain
``iid``               K i.i.d. rollouts of L tokens ``iid(K, L)``          i.i.d.                   as delayed
``chain``             one drafted path ``chain(L)``                        one child from q         every sampled one
``static``            a topology in tuple notation ``Static(spec, ...)``   top-k / w/o replacement  onehot / rrs_wor, ...
``eagle2``            EAGLE-2's dynamic tree (``EAGLE2``)                  deterministic            onehot, nss, greedy
``sequoia``           Sequoia's DP tree (``Sequoia``)                      w/o repl. (or top-k)     rrs_wor, traversal, ...
``greedy_draft``      greedy draft with proxy scores (``GreedyDraftTree``)  mixed / deterministic    greedy_draft, onehot
``treegraft``         TreeGraft: n-gram and mid drafters on one trie       deterministic            onehot, nss, greedy
``specblock``         SpecBlock's rank-guided tree (``RankGuided``)        deterministic            onehot, nss, greedy
``medusa``            Medusa's static tree over a parallel drafter         deterministic            onehot, nss, greedy
``ddtree``            DDTree's best-first tree over a parallel drafter     deterministic            onehot, nss, greedy
``confident_chain``   llama.cpp's draft chain: the argmax while the        deterministic            onehot, nss, greedy
                      draft is confident, dropped if short
                      (``ConfidentChain``)
====================  ===================================================  =======================  ===================

``medusa`` and ``ddtree`` draft from a parallel drafter's per-position distributions and refuse a
pair that is not one (``simlab.pairs.ParallelDraft``; ``simlab.builders.parallel``).

A builder's trees state their node laws; a verifier that is not lossless for them refuses them
(``simlab.tree_verifiers``).  Budgets count draft tokens (distinct non-root nodes).

Every registered builder declares its ``default_laws``, its defaults, an ``example(vocab_size=4)`` and,
for a parallel drafter, ``parallel_draft = True``, once on its class; ``laws(name)``, ``example(name)``,
``parallel_draft(name)`` and ``sampled(name)`` read them (``docs/derivations/builders.md``).
"""

from __future__ import annotations

from simlab.builders.base import MAX_TREES, Builder, enumerate_draws
from simlab.builders.confident_chain import ConfidentChain
from simlab.builders.ddtree import DDTree
from simlab.builders.delayed import Delayed, chain, iid, named_shape
from simlab.builders.eagle import EAGLE2
from simlab.builders.greedy_draft import GreedyDraftTree
from simlab.builders.medusa import Medusa
from simlab.builders.sequoia import Sequoia
from simlab.builders.static import Static
from simlab.drafting import Drafting
from simlab.specblock.builder import RankGuided
from simlab.treegraft.builder import TreeGraft


REGISTRY = {
    "delayed": Delayed,
    "iid": iid,
    "chain": chain,
    "static": Static,
    "eagle2": EAGLE2,
    "sequoia": Sequoia,
    "greedy_draft": GreedyDraftTree,
    "treegraft": TreeGraft,
    "specblock": RankGuided,
    "medusa": Medusa,
    "ddtree": DDTree,
    "confident_chain": ConfidentChain,
}


def names() -> list[str]:
    """Every builder name."""
    return list(REGISTRY)


def _entry(name: str):
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"name: unknown builder {name!r}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name]


def laws(name: str) -> frozenset:
    """The drafting laws (``simlab.drafting.Drafting``) the builder ``name`` declares for its
    trees' nodes at its default options.

    Raises:
        ValueError: ``name: ...`` for an unknown name.
    """
    return frozenset(_entry(name).default_laws)


def sampled(name: str) -> bool:
    """True when the builder ``name`` draws its trees at its default options: its declared
    ``default_laws`` hold a law other than ``Drafting.DETERMINISTIC`` (i.i.d., without replacement,
    mixed, repeated), so a study values it by the mean over drawn trees; False for one tree per root.

    Raises:
        ValueError: ``name: ...`` for an unknown name.
    """
    return bool(laws(name) - {Drafting.DETERMINISTIC})


def parallel_draft(name: str) -> bool:
    """True when the builder ``name`` declares ``parallel_draft`` on its class: it drafts from a
    parallel drafter's per-position rows (``simlab.pairs.ParallelDraft``), one draft forward per tree;
    False for an autoregressive drafter (one forward per level).

    Raises:
        ValueError: ``name: ...`` for an unknown name.
    """
    return bool(getattr(_entry(name), "parallel_draft", False))


def example(name: str, vocab_size: int = 4) -> Builder:
    """The tiny instance the builder ``name`` declares for the generic tests (worlds of
    ``vocab_size`` tokens; only builders with a drafter of their own use it).

    Raises:
        ValueError: ``name: ...`` for an unknown name.
    """
    return _entry(name).example(vocab_size)


def get(name: str, **options) -> Builder:
    """The builder registered as ``name``, built with ``options``.

    Raises:
        ValueError: ``name: ...`` for an unknown name; ``options: ...`` for options the builder
            does not take; the builder's own ``ValueError`` for values out of range.
    """
    entry = _entry(name)
    try:
        return entry(**options)
    except TypeError as exc:
        raise ValueError(f"options: {name} does not accept {sorted(options)} ({exc})") from None


__all__ = [
    "Builder",
    "ConfidentChain",
    "DDTree",
    "Delayed",
    "EAGLE2",
    "GreedyDraftTree",
    "MAX_TREES",
    "Medusa",
    "REGISTRY",
    "RankGuided",
    "Sequoia",
    "Static",
    "TreeGraft",
    "chain",
    "enumerate_draws",
    "example",
    "get",
    "iid",
    "laws",
    "names",
    "named_shape",
    "parallel_draft",
    "sampled",
]
