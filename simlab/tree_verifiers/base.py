"""The tree-verifier protocol, and the check that a verifier is paired with trees it is lossless for.

Vocabulary: verifying a draft tree emits the **accepted path** (the accepted draft tokens, a
node of the tree; tau = its length) and then one more token: the **correction** token when
verification stopped at an internal node, or the **bonus** token drawn at a leaf.  The
**block efficiency** of one step is tau + 1 tokens.

Every tree verifier gives
* ``outcome_law(tree)``: the exact joint law of (accepted path, next token), as a dict
  node path -> float64 (V,) vector whose entry t is P(accepted path = path, next token = t);
  all entries sum to 1;
* ``accept_masses(tree)``: P(accepted path = v | tree) per path (floats), the law's mass per path
  (overridable where it is cheaper than the law: ``Traversal``);
* ``accepted_length_distribution(tree)``: P(tau = j | tree), float64 (depth + 1,);
* ``expected_block_efficiency(tree)``: E[tau + 1 | tree] in tokens (DDTE Eq. 1-3, inner sum);
  when the pair names an end-of-sequence id (``simlab.pairs.EndOfSequence``), the tokens an
  engine keeps: none after an accepted or emitted EOS (``counted_tokens``);
* ``verify(tree, rng)``: one run of the algorithm, returning (accepted path, next token).

**Lossless pairings are enforced.**  A tree states, node by node, how its children were drawn
(``DraftTree.law``); a verifier states the laws it is lossless for (``node_lossless``).  Every
entry point above raises ``ValueError`` naming the verifier and the law when a node of the tree
is outside them, unless the verifier was built with ``allow_lossy=True``
(``simlab.tree_verifiers.get(name, allow_lossy=True)``); ``lossless_on(tree)`` says which case a
result is, and ``simlab.efficiency.pairing_bias`` gives the exact bias of a lossy pairing.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from simlab.drafting import SAMPLED, Drafting, lossless_pairing
from simlab.trees import DraftTree, Path


@dataclass(frozen=True)
class TreeVerifier(abc.ABC):
    """Base class of tree verifiers (see the module docstring for the vocabulary).

    Attributes:
        allow_lossy: compute results for pairings outside the verifier's lossless laws (they
            are biased; ``lossless_on`` reports it) instead of raising ``ValueError``.

    Class attributes (declared by each verifier): ``name`` (registry name), ``label`` (the
    papers' name, None: ``name``), ``single_path`` (verifies the first path only, so only K = 1
    trees are worth valuing), ``lossless_for`` and ``needs_greedy_target`` (as the node verifiers'),
    ``options`` (the fields ``simlab.tree_verifiers.get`` passes on: none by default).
    """

    name: ClassVar[str]
    label: ClassVar[str | None] = None
    single_path: ClassVar[bool] = False
    lossless_for: ClassVar[frozenset[Drafting]] = SAMPLED
    needs_greedy_target: ClassVar[bool] = False
    options: ClassVar[tuple[str, ...]] = ()
    allow_lossy: bool = field(default=False, kw_only=True)

    # -- what the verifier is lossless for -------------------------------------------------
    def node_lossless(self, tree: DraftTree, path: Path) -> bool:
        """True when the children of ``path`` were drawn by a law this verifier is lossless for."""
        return lossless_pairing(self.lossless_for, tree.law(path), len(tree.child_list(path)))

    def _greedy_target(self, tree: DraftTree) -> Path | None:
        """The first node whose target is not one-hot, for verifiers that need a greedy target."""
        for path in tree.nodes():
            if not _one_hot_target(tree, path):
                return path
        return None

    no_lossless_law = "it is declared lossy (lossless for no drafting law)"
    """How ``mismatch`` says that the verifier is lossless for no drafting law (a subclass whose laws
    are certified rather than declared says it its way: ``TopDown``)."""

    def mismatch(self, tree: DraftTree) -> str | None:
        """Why this verifier is not lossless on ``tree`` (None when it is)."""
        for path, kids in tree.children.items():
            if kids and not self.node_lossless(tree, path):
                laws = ", ".join(sorted(law.value for law in self.lossless_for))
                return (
                    f"verifier: {self.name} is not lossless for children drafted {tree.law(path).description} "
                    f"(node {path}, {len(kids)} children); " + (f"it is lossless for {laws}" if laws else self.no_lossless_law)
                )
        if self.needs_greedy_target:
            where = self._greedy_target(tree)
            if where is not None:
                return (
                    f"verifier: {self.name} is lossless only for a greedy (one-hot) target, and p at node {where} "
                    "is not one-hot (temperature > 0)"
                )
        return None

    def lossless_on(self, tree: DraftTree, depth: int | None = None) -> bool:
        """True when verifying ``tree`` (cut at ``depth`` tokens, ``DraftTree.truncate``; default:
        whole) with this verifier emits the target law: ``lossless_depth(tree) >= depth``."""
        return self.lossless_depth(tree) >= (tree.depth() if depth is None else depth)

    def lossless_depth(self, tree: DraftTree) -> float:
        """The deepest cut of ``tree`` this verifier is lossless on (``math.inf``: every cut): a cut
        at d keeps the children of nodes above depth d, each checked by ``node_lossless``, and
        reads p at nodes down to depth d (``needs_greedy_target``).  One pass, for every cut; the
        same nodes ``mismatch`` checks (tests/test_lossless_flag.py asserts they agree)."""
        deepest = math.inf
        for path, kids in tree.children.items():
            if kids and len(path) < deepest and not self.node_lossless(tree, path):
                deepest = len(path)  # its children are kept by every cut deeper than len(path)
        if self.needs_greedy_target:
            for path in tree.nodes():
                if len(path) <= deepest and not _one_hot_target(tree, path):
                    deepest = len(path) - 1  # p at this node is read by every cut at or below it
        return deepest

    def check(self, tree: DraftTree) -> None:
        """Raise ``ValueError`` for a lossy pairing, unless ``allow_lossy``."""
        if not self.allow_lossy:
            reason = self.mismatch(tree)
            if reason is not None:
                raise ValueError(
                    f"{reason}; pass allow_lossy=True for its biased result (simlab.efficiency.pairing_bias gives the exact bias)"
                )

    # -- to implement --------------------------------------------------------------------------
    @abc.abstractmethod
    def _outcome_law(self, tree: DraftTree) -> dict[Path, np.ndarray]:
        """Exact P(accepted path, next token | tree) on a checked pairing."""

    @abc.abstractmethod
    def _verify(self, tree: DraftTree, rng: np.random.Generator) -> tuple[Path, int]:
        """One run on a checked pairing."""

    # -- entry points ----------------------------------------------------------------------------
    def outcome_law(self, tree: DraftTree) -> dict[Path, np.ndarray]:
        """Exact P(accepted path, next token | tree): node path -> float64 (V,)."""
        self.check(tree)
        return self._outcome_law(tree)

    def verify(self, tree: DraftTree, rng: np.random.Generator) -> tuple[Path, int]:
        """Run the algorithm once: (accepted path, correction or bonus token)."""
        self.check(tree)
        return self._verify(tree, rng)

    def accept_masses(self, tree: DraftTree) -> dict[Path, float]:
        """P(accepted path = v | tree) for each path v the verifier can accept (floats summing to 1):
        the outcome law's mass per path.  A verifier that can compute it without the law's
        V-vectors overrides it (``Traversal``); ``outcome_law`` stays its reference (tests).

        Raises:
            ValueError: a pairing the verifier refuses (``check``).
        """
        return {path: float(vector.sum()) for path, vector in self.outcome_law(tree).items()}

    def accepted_length_distribution(self, tree: DraftTree) -> np.ndarray:
        """P(tau = j | tree) for j = 0..depth, float64 (depth + 1,), from ``accept_masses``."""
        return accepted_lengths(self.accept_masses(tree), tree.depth())

    def block_efficiency_by_depth(self, tree: DraftTree, depths) -> np.ndarray:
        """E[tau + 1 | tree cut at depth d] for each d in ``depths``, float64 (len(depths),).

        The cut of a tree drawn with longer branches has the law of a tree drawn with shorter
        ones, so one sampled tree serves every cut-off (DDTE's label grid).
        """
        return np.array([self.expected_block_efficiency(tree.truncate(d)) for d in depths])

    def positions_by_depth(self, tree: DraftTree, depths) -> tuple[np.ndarray, np.ndarray]:
        """``block_efficiency_by_depth`` and, for each cut, P(tau >= j | tree cut at d) for
        j = 1..max(depths) (0 for j > d; with an EOS id, position j counts only when no EOS sits
        among the first j - 1 accepted tokens, as ``simlab.engine_metrics.path_metrics``): float64
        (len(depths),) and (len(depths), max(depths)), from one ``accept_masses`` per cut."""
        depths = list(depths)
        eos = tree.table.eos_id
        values = np.empty(len(depths))
        reached = np.zeros((len(depths), max(depths, default=0)))
        for i, d in enumerate(depths):
            cut = tree.truncate(d)
            masses = self.accept_masses(cut)
            values[i] = _efficiency(masses, cut.depth(), eos)
            counted = [min(len(v), v.index(eos) + 1) if eos is not None and eos in v else len(v) for v in masses]
            reached[i, :d] = reach_probabilities(np.bincount(counted, weights=list(masses.values()), minlength=d + 1))[:d]
        return values, reached

    def expected_block_efficiency(self, tree: DraftTree) -> float:
        """E[tau + 1 | tree] in tokens (accepted drafts plus the correction or bonus token); with
        an EOS id, E[tokens kept], none counted after the first EOS (``counted_tokens``)."""
        return _efficiency(self.accept_masses(tree), tree.depth(), tree.table.eos_id)


def _efficiency(masses: dict, depth: int, eos: int | None) -> float:
    """E[tau + 1] (E[tokens kept] with an EOS id) from ``accept_masses``."""
    if eos is None:
        dist = accepted_lengths(masses, depth)
        return float(np.dot(np.arange(1, dist.size + 1), dist))
    return float(sum(mass * counted_tokens(path, eos) for path, mass in masses.items()))


def cut_positions(reached: np.ndarray, depths) -> np.ndarray:
    """P(tau >= j | tree cut at d) for each d of ``depths`` and j = 1..max(depths), float64
    (len(depths), max(depths)), from the whole tree's P(tau >= j) (float64 (depth,)) of a
    verifier whose reach above a cut does not depend on the nodes below it (top-down)."""
    depths = list(depths)
    width = max(depths, default=0)
    padded = np.zeros(width)
    padded[: min(width, reached.size)] = reached[:width]
    return np.where(np.arange(width)[None, :] < np.array(depths)[:, None], padded[None, :], 0.0)


def _one_hot_target(tree: DraftTree, path: Path) -> bool:
    """True when p at ``path`` is one-hot; read once per node of a table (``NodeTable.memo``: the
    check and the flag of every result ask it of the same nodes)."""
    return tree.table.memo(("one-hot target", path), lambda: bool(tree.table.p(path).max() >= 1.0))


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


def accepted_lengths(law: dict, depth: int) -> np.ndarray:
    """P(tau = j) for j = 0..depth, float64 (depth + 1,), from an outcome law (path -> float64 (V,),
    ``TreeVerifier.outcome_law``) or from path masses (path -> float, ``accept_masses``)."""
    out = np.zeros(depth + 1)
    for path, value in law.items():
        out[len(path)] += np.sum(value)
    return out


def reach_probabilities(lengths) -> np.ndarray:
    """P(tau >= d) for d = 1..depth from P(tau = j), j = 0..depth (``accepted_lengths``): the
    acceptance by depth; float64 (depth,)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return np.cumsum(lengths[::-1])[::-1][1:]
