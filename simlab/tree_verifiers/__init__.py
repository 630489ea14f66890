"""Tree verifiers: ``get(name, **options)``.

* ``nss``, ``naive``, ``spectr``, ``specinfer``, ``rrs_wor``, ``khisti``, ``optimal``: the
  top-down lifting of the node verifier of that name (``TopDown``), options passed to it;
* ``naive_chain``: standard speculative sampling on the first path;
* ``bv``: Block Verification on the first path;
* ``traversal``: Traversal Verification (siblings drafted without replacement);
* ``greedy``: temperature-0 verification against the target argmax.
"""

from __future__ import annotations

from simlab import verifiers as node_verifiers
from simlab.tree_verifiers.base import TreeVerifier
from simlab.tree_verifiers.block import BlockVerification
from simlab.tree_verifiers.greedy import Greedy
from simlab.tree_verifiers.topdown import TopDown
from simlab.tree_verifiers.traversal import Traversal

WHOLE_TREE = {"naive_chain": None, "bv": BlockVerification, "traversal": Traversal, "greedy": Greedy}


def names() -> list[str]:
    """Every tree-verifier name."""
    return node_verifiers.names() + list(WHOLE_TREE)


def get(name: str, **options) -> TreeVerifier:
    """The tree verifier called ``name``; ``options`` go to the node verifier of a top-down one.

    Raises:
        ValueError: unknown name or bad options.
    """
    if name == "naive_chain":
        return TopDown(node_verifiers.get("naive"), first_path_only=True)
    if name in WHOLE_TREE:
        if options:
            raise ValueError(f"options: {name} takes no options, got {sorted(options)}")
        return WHOLE_TREE[name]()
    if name in node_verifiers.REGISTRY:
        return TopDown(node_verifiers.get(name, **options))
    raise ValueError(f"name: unknown tree verifier {name!r}; choose one of {', '.join(names())}")


__all__ = ["BlockVerification", "Greedy", "TopDown", "Traversal", "TreeVerifier", "get", "names"]
