"""Tree verifiers: ``get(name, allow_lossy=False, **options)``.

* ``nss``, ``naive``, ``spectr``, ``specinfer``, ``rrs_wor``, ``khisti``, ``optimal``, ``onehot``,
  ``greedy``, ``greedy_draft``: the top-down lifting of the node verifier of that name
  (``TopDown``), options passed to it (``greedy``: temperature-0 verification against the
  target argmax; ``onehot``: EAGLE's rule for deterministic trees; ``greedy_draft``: the
  verifier of greedy-draft trees);
* ``naive_chain``: standard speculative sampling on the first path;
* ``bv``: Block Verification on the first path;
* ``traversal``: Traversal Verification (siblings drafted without replacement).

Every verifier refuses trees it is not lossless for (``TreeVerifier.check``) unless built with
``allow_lossy=True``.
"""

from __future__ import annotations

from simlab import verifiers as node_verifiers
from simlab.tree_verifiers.base import TreeVerifier
from simlab.tree_verifiers.block import BlockVerification
from simlab.tree_verifiers.topdown import TopDown
from simlab.tree_verifiers.traversal import Traversal

WHOLE_TREE = {"naive_chain": None, "bv": BlockVerification, "traversal": Traversal}


def deterministic_rule(settings) -> str:
    """The verifier EAGLE's code pairs with deterministic trees: ``"greedy"`` at T = 0
    (``settings.greedy``), else ``"onehot"`` (EAGLE-2 ``evaluate_posterior``; the studies' baseline)."""
    return "greedy" if settings.greedy else "onehot"


def deterministic_verifiers(settings) -> list[str]:
    """Every lab verifier lossless for deterministic children at ``settings``: greedy (T = 0 only),
    one-hot, NSS."""
    return (["greedy"] if settings.greedy else []) + ["onehot", "nss"]


def names() -> list[str]:
    """Every tree-verifier name."""
    return node_verifiers.names() + list(WHOLE_TREE)


def get(name: str, allow_lossy: bool = False, **options) -> TreeVerifier:
    """The tree verifier called ``name``; ``options`` go to the node verifier of a top-down one.

    Args:
        allow_lossy: compute results on trees the verifier is not lossless for (biased;
            ``TreeVerifier.lossless_on`` says so) instead of raising ``ValueError``.

    Raises:
        ValueError: unknown name or bad options.
    """
    if not isinstance(allow_lossy, bool):
        raise ValueError(f"allow_lossy: must be True or False, got {allow_lossy!r}")
    if name == "naive_chain":
        if options:
            raise ValueError(f"options: {name} takes no options, got {sorted(options)}")
        return TopDown(node_verifiers.get("naive"), first_path_only=True, allow_lossy=allow_lossy)
    if name in WHOLE_TREE:
        if options:
            raise ValueError(f"options: {name} takes no options, got {sorted(options)}")
        return WHOLE_TREE[name](allow_lossy=allow_lossy)
    if name in node_verifiers.REGISTRY:
        return TopDown(node_verifiers.get(name, **options), allow_lossy=allow_lossy)
    raise ValueError(f"name: unknown tree verifier {name!r}; choose one of {', '.join(names())}")


__all__ = ["BlockVerification", "TopDown", "Traversal", "TreeVerifier", "deterministic_rule", "deterministic_verifiers", "get", "names"]
