"""Medusa's typical acceptance, over the whole tree: lossy (declared so).

The rule of Medusa's default generation (FasterDecoding/Medusa@e2a5d20
``medusa/model/utils.py::evaluate_posterior`` with ``sampling="typical"``, ``fast=True``, the
defaults ``medusa_generate`` passes, and ``generate_candidates`` for the next token), on a
draft tree whose nodes carry the target p:

* at node u the **threshold** is tau_u = min(epsilon, alpha * exp(-H_u)), with
  H_u = -sum_t p_u(t) log(p_u(t) + 1e-5) (the official entropy, with its 1e-5) and
  epsilon = ``posterior_threshold``, alpha = ``posterior_alpha`` (Medusa paper Sec. 3.3.1: the
  typical-acceptance criterion p(x) > min(epsilon, delta exp(-H)));
* a child x of u **passes** when p_u(x) > tau_u (strict); the candidates are the root-to-leaf
  paths, and a candidate's accepted length is the number of leading tokens that pass;
* the **accepted path** is the longest accepted prefix over all candidates; among equally long
  ones, the one of largest likelihood sum log p_u(x) along it, and on an exact tie the first
  candidate (``torch.argmax``) in Medusa's candidate order: ``generate_medusa_buffers`` sorts the
  choices by ``(len(x), x)`` (x the children's ranks) and builds ``retrieve_indices`` walking that
  list from its end (``sorted_medusa_choices[-i-1]``), so the candidates are the leaves in
  decreasing (length, ranks) and a tie goes to the path through the deepest, highest-ranked leaf.
  A function of the tree and the target: no randomness (the lab sums the likelihood in float64
  where Medusa sums float32 logs);
* the **next token** (correction or bonus, emitted after the accepted path) is the target's
  argmax at the accepted node (``generate_candidates`` with ``fast=True``: ties to the lowest id),
  ``next_token="argmax"``, the default.  ``next_token="target"`` draws it from p instead: the
  token vLLM v0's ``TypicalAcceptanceSampler`` (vllm-project/vllm@0244fee, one chain, the same
  acceptance test) takes from the target's own sampler.

Temperature enters through p (the lab's target is p at the sampling setting; Medusa divides the
logits by T before the softmax).  At T = 0 Medusa runs its greedy branch, the lab's ``greedy``
rule; the typical rule on a one-hot target is that same rule (a child passes iff it is the argmax
when tau < 1), so its bias is 0 there, and with ``next_token="target"`` and tau_u >= max p_u at
every node (epsilon = 1, alpha large) nothing is accepted and the next token is a draw from p:
plain sampling, bias 0.  Elsewhere the rule is lossy: a deterministic accept and an argmax next
token.  Declared lossy (``lossless_for`` empty, every tree refused without ``allow_lossy=True``);
its exact bias is ``simlab.efficiency.pairing_bias``.

Official behaviours not modelled (the non-fast and nucleus modes, the padding of short candidates):
``docs/derivations/typical.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from simlab.distributions import sample_categorical
from simlab.drafting import Drafting
from simlab.tree_verifiers.base import TreeVerifier
from simlab.verifiers.greedy import greedy_token

ENTROPY_OFFSET = 1e-5
"""The official entropy's offset: H = -sum p log(p + 1e-5) (Medusa and vLLM alike)."""

NEXT_TOKENS = ("argmax", "target")


def typical_threshold(p: np.ndarray, posterior_threshold: float, posterior_alpha: float) -> float:
    """tau = min(epsilon, alpha * exp(-H)), H = -sum_t p(t) log(p(t) + 1e-5), for float64 (V,) ``p``."""
    entropy = -float(np.sum(p * np.log(p + ENTROPY_OFFSET)))
    return min(posterior_threshold, posterior_alpha * math.exp(-entropy))


def _first_candidates(tree, first=max) -> dict:
    """Node path -> the sort key (length, ranks) of the first candidate through it in Medusa's
    candidate order, the root-to-leaf paths in decreasing (length, ranks) (module docstring), a
    rank being a child's place among its node's distinct children: the largest key below it (``first``: the seam of a planted fault)."""
    ranks = {(): ()}
    for path in tree.nodes():  # parents first
        for rank, t in enumerate(dict.fromkeys(tree.child_list(path))):
            ranks[path + (t,)] = ranks[path] + (rank,)
    out = {}
    for path in reversed(tree.nodes()):  # children first
        kids = list(dict.fromkeys(tree.child_list(path)))
        out[path] = first(out[path + (t,)] for t in kids) if kids else (len(path), ranks[path])
    return out


def _check_nonnegative(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class TypicalAcceptance(TreeVerifier):
    """Medusa's typical acceptance: the longest path of children above the entropy-adaptive
    threshold, then the target's argmax (or a draw from p: ``next_token="target"``).

    Args:
        posterior_threshold: epsilon >= 0 (Medusa's and vLLM's default 0.09).
        posterior_alpha: alpha >= 0 (default 0.3, "recommended to be sqrt(posterior_threshold)").
        next_token: ``"argmax"`` (Medusa, the default) or ``"target"`` (vLLM v0's chain sampler).
        allow_lossy: see ``TreeVerifier``; required for any result (the rule is declared lossy).

    Raises:
        ValueError: a negative or non-finite threshold, an unknown ``next_token``.
    """

    name: ClassVar[str] = "typical"
    label: ClassVar[str] = "typical acceptance (Medusa)"
    lossless_for: ClassVar[frozenset[Drafting]] = frozenset()
    options: ClassVar[tuple[str, ...]] = ("posterior_threshold", "posterior_alpha", "next_token")
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    next_token: str = "argmax"
    first_candidate: ClassVar = max  # Medusa's first candidate has the largest key (a seam for the planted faults)

    def __post_init__(self):
        _check_nonnegative(self.posterior_threshold, "posterior_threshold")
        _check_nonnegative(self.posterior_alpha, "posterior_alpha")
        if self.next_token not in NEXT_TOKENS:
            raise ValueError(f"next_token: must be one of {', '.join(NEXT_TOKENS)}, got {self.next_token!r}")

    # -- declared lossy: every tree, the root alone included (its next token is not a draw from p) --
    def mismatch(self, tree) -> str | None:
        return (
            f"verifier: {self.name} is not lossless on any tree: it is declared lossy (typical acceptance accepts "
            "children above a threshold and emits the target's argmax or a draw from p, not the target law)"
        )

    def lossless_depth(self, tree) -> float:
        """-1: no cut of any tree is declared lossless (the root's next token is already the rule's)."""
        return -1

    # -- the rule -------------------------------------------------------------------------------
    def threshold(self, p: np.ndarray) -> float:
        """tau at a node with target ``p`` (float64 (V,)): ``typical_threshold`` with this rule's
        epsilon and alpha."""
        return typical_threshold(p, self.posterior_threshold, self.posterior_alpha)

    def accepted_path(self, tree) -> tuple[int, ...]:
        """The path the rule accepts on ``tree`` (deterministic): the deepest node reached through
        passing children, then the largest likelihood, then the first in Medusa's candidate order.

        Raises:
            ValueError: a pairing it refuses (``check``).
        """
        self.check(tree)
        return self._accepted_path(tree)

    def _accepted_path(self, tree):
        reached = []  # (path, likelihood) of every node reached through passing children
        stack = [((), 0.0)]
        while stack:
            path, likelihood = stack.pop()
            reached.append((path, likelihood))
            p = tree.table.p(path)
            key = ("typical threshold", type(self), self.posterior_threshold, self.posterior_alpha, path)
            tau = tree.table.memo(key, lambda: self.threshold(p))  # once per node of a table
            for t in dict.fromkeys(tree.child_list(path)):
                if p[t] > tau:
                    stack.append((path + (t,), likelihood + math.log(p[t])))
        depth = max(len(path) for path, _ in reached)
        deepest = [(path, likelihood) for path, likelihood in reached if len(path) == depth]
        top = max(likelihood for _, likelihood in deepest)
        pick = type(self).first_candidate
        first = _first_candidates(tree, pick)
        return pick((first[path], path) for path, likelihood in deepest if likelihood == top)[1]

    def _next_law(self, p):
        if self.next_token == "argmax":
            out = np.zeros_like(p)
            out[greedy_token(p)] = 1.0
            return out
        return p.copy()

    def _outcome_law(self, tree):
        path = self._accepted_path(tree)
        return {path: self._next_law(tree.table.p(path))}

    def _verify(self, tree, rng):
        path = self._accepted_path(tree)
        p = tree.table.p(path)
        return path, greedy_token(p) if self.next_token == "argmax" else sample_categorical(p, rng)
