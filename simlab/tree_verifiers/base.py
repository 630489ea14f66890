"""The tree-verifier protocol.

Vocabulary: verifying a draft tree emits the **accepted path** (the accepted draft tokens, a
node of the tree; tau = its length) and then one more token: the **correction** token when
verification stopped at an internal node, or the **bonus** token drawn at a leaf.  The
**block efficiency** of one step is tau + 1 tokens.

Every tree verifier gives
* ``outcome_law(tree)``: the exact joint law of (accepted path, next token), as a dict
  node path -> float64 (V,) vector whose entry t is P(accepted path = path, next token = t);
  all entries sum to 1;
* ``accepted_length_distribution(tree)``: P(tau = j | tree), float64 (depth + 1,);
* ``expected_block_efficiency(tree)``: E[tau + 1 | tree] in tokens (DDTE Eq. 1-3, inner sum);
  when the pair names an end-of-sequence id (``simlab.pairs.EndOfSequence``), the tokens an
  engine keeps: none after an accepted or emitted EOS (``counted_tokens``);
* ``verify(tree, rng)``: one run of the algorithm, returning (accepted path, next token).
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from simlab.trees import DraftTree, Path


class TreeVerifier(abc.ABC):
    """Base class of tree verifiers (see the module docstring for the vocabulary)."""

    name: ClassVar[str]

    @abc.abstractmethod
    def outcome_law(self, tree: DraftTree) -> dict[Path, np.ndarray]:
        """Exact P(accepted path, next token | tree): node path -> float64 (V,)."""

    @abc.abstractmethod
    def verify(self, tree: DraftTree, rng: np.random.Generator) -> tuple[Path, int]:
        """Run the algorithm once: (accepted path, correction or bonus token)."""

    def accepted_length_distribution(self, tree: DraftTree) -> np.ndarray:
        """P(tau = j | tree) for j = 0..depth, float64 (depth + 1,)."""
        law = self.outcome_law(tree)
        out = np.zeros(tree.depth() + 1)
        for path, vector in law.items():
            out[len(path)] += vector.sum()
        return out

    def block_efficiency_by_depth(self, tree: DraftTree, depths) -> np.ndarray:
        """E[tau + 1 | tree cut at depth d] for each d in ``depths``, float64 (len(depths),).

        The cut of a tree drawn with longer branches has the law of a tree drawn with shorter
        ones, so one sampled tree serves every cut-off (DDTE's label grid).
        """
        return np.array([self.expected_block_efficiency(tree.truncate(d)) for d in depths])

    def expected_block_efficiency(self, tree: DraftTree) -> float:
        """E[tau + 1 | tree] in tokens (accepted drafts plus the correction or bonus token); with
        an EOS id, E[tokens kept], none counted after the first EOS (``counted_tokens``)."""
        eos = tree.table.eos_id
        if eos is None:
            dist = self.accepted_length_distribution(tree)
            return float(np.dot(np.arange(1, dist.size + 1), dist))
        return float(sum(float(vector.sum()) * counted_tokens(path, eos) for path, vector in self.outcome_law(tree).items()))


def counted_tokens(path: Path, eos: int | None) -> int:
    """Tokens one step keeps for an accepted ``path``: up to and including its first EOS, else the
    path plus the correction or bonus token (an engine stops at EOS; an emitted EOS counts once)."""
    if eos is not None and eos in path:
        return path.index(eos) + 1
    return len(path) + 1


def drafted_q(tree: DraftTree, path: Path, token: int) -> float:
    """q(token) at node ``path``, which must be positive for a drafted child.

    Raises:
        ValueError: ``tree: ...`` when q(token) = 0 (an impossible draw, not a verifier input).
    """
    value = float(tree.table.q(path)[token])
    if value <= 0.0:
        raise ValueError(f"tree: child {token} of node {path} has q = 0 and cannot have been drafted")
    return value
