"""Expected block efficiency over the tree distribution, and the exact law of emitted tokens.

E[tau + 1] = E_T[ E[tau + 1 | T] ] (DDTE Eq. 1-3): the outer expectation over the trees a
builder draws (``simlab.builders``: the shapes, EAGLE-2, Sequoia, greedy draft), the inner one
exact for each tree (``TreeVerifier.expected_block_efficiency``).

* ``method="exact"``: enumerate every tree with its probability (``builder.enumerate``; one tree
  for a deterministic builder, so its value at a root is exact; small vocabularies for sampled
  ones, at most ``simlab.builders.MAX_TREES`` trees);
* ``method="mc"``: average the exact inner expectation over ``samples`` sampled trees (DDTE
  uses 4): unbiased, with the standard error of that mean;
* ``method="auto"``: exact where the enumeration fits, else mc;
* ``simulate_block_efficiency``: the brute-force cross-check that runs ``verify``.

The action grid of delayed trees (its axes, sampled drafts and DDTE's estimator over them) lives
in ``simlab.grid``; a builder's tree valued at a root with its T-hat, in ``simlab.valuation``.

A verifier paired with trees it is not lossless for raises ``ValueError`` unless the call asks
for the biased value (``allow_lossy=True``); the result then has ``lossless=False`` and
``pairing_bias`` gives its exact bias (the TV distance of the emitted n-token law from the
target's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simlab import reach_grid, tree_verifiers
from simlab.builders.base import Builder
from simlab.checks import check_int
from simlab.pairs import ModelPair, eos_of
from simlab.tree_verifiers.base import counted_tokens
from simlab.trees import NodeTable


@dataclass(frozen=True)
class Estimate:
    """A block-efficiency value in tokens per verification step.

    Attributes:
        mean: the estimate of E[tau + 1].
        stderr: its standard error (0.0 for ``exact``; NaN for one Monte Carlo sample).
        method: ``"exact"``, ``"mc"`` or ``"simulation"``.
        samples: trees (mc) or verification steps (simulation) used; trees enumerated (exact).
        lossless: False when the verifier is not lossless for the trees the value was computed
            from (the value was asked for with ``allow_lossy=True``; ``pairing_bias`` gives the
            bias); every entry point computes it with ``lossless_over``.
    """

    mean: float
    stderr: float
    method: str
    samples: int
    lossless: bool


def lossless_over(verifier, trees, depths: Sequence[int] | None = None):
    """The ``lossless`` flag of every ``Estimate``, computed here only: True when ``verifier`` is
    lossless on every tree of ``trees``, the trees the value was computed from
    (``TreeVerifier.lossless_depth``, one pass per tree).  With ``depths``, one flag per cut
    (the trees cut at d tokens, ``DraftTree.truncate``): a list of bools.  ``trees=None``: a value
    computed without building trees (``reach_grid.grid_values``), allowed only for a verifier
    ``reach_grid.serves`` (lossless for every drafting law, so on every grid tree), else ValueError."""
    if trees is None:  # a value computed without trees: only for verifiers lossless on every grid tree
        if not reach_grid.serves(verifier):
            raise ValueError(f"trees: {verifier.name}'s lossless flag needs the trees its value came from")
        return True if depths is None else [True] * len(depths)
    margins = [(verifier.lossless_depth(tree), tree.depth()) for tree in trees]
    if depths is None:
        return all(deepest >= whole for deepest, whole in margins)
    return [all(deepest >= cut for deepest, _ in margins) for cut in depths]


def _check(pair, shape) -> None:
    if not isinstance(pair, ModelPair):
        raise ValueError(f"pair: must implement the ModelPair protocol (vocab_size, distributions), got {type(pair).__name__}")
    if not isinstance(shape, Builder):
        raise ValueError(
            f"shape: must be a tree builder (simlab.builders.get(name): delayed, iid, chain, static, eagle2, "
            f"sequoia, greedy_draft), got {shape!r}"
        )


def expected_block_efficiency(
    pair: ModelPair,
    context: Sequence[int],
    shape,
    verifier,
    *,
    method: str = "exact",
    samples: int = 4,
    seed: int = 0,
    allow_lossy: bool = False,
    table: NodeTable | None = None,
) -> Estimate:
    """E[tau + 1] for drafting with the builder ``shape`` at ``context`` and verifying with ``verifier``.

    Args:
        pair: the model pair giving p and q.
        context: the root context (token ids).
        shape: a tree builder (``simlab.builders``: ``Delayed``, ``iid``, ``chain``, ``Static``,
            ``EAGLE2``, ``Sequoia``, ``GreedyDraftTree``).
        verifier: a tree-verifier name or object (``simlab.tree_verifiers.get``).
        method: ``"exact"``, ``"mc"`` or ``"auto"`` (exact where the enumeration fits).
        samples: number of sampled trees for ``"mc"`` (>= 1).
        seed: seed of the ``numpy.random.Generator`` that draws the trees for ``"mc"``.
        allow_lossy: compute the value of a pairing the verifier is not lossless for (biased;
            the result has ``lossless=False``) instead of raising.
        table: a ``NodeTable`` of this very ``pair`` at this ``context`` whose fetched nodes are
            read again (several builders or verifiers valued at one root fetch each node once);
            default: a new one.

    Returns:
        ``Estimate`` (tokens per step).

    Raises:
        ValueError: unknown method or verifier, samples < 1, a bad context, a lossy pairing
            (naming the verifier and the drafting law) without ``allow_lossy``, too many
            trees to enumerate (with the limit in the message), or a ``table`` of another pair
            or context.
    """
    verifier = tree_verifiers.as_verifier(verifier, allow_lossy)
    _check(pair, shape)
    if table is None:
        table = NodeTable(pair, context)
    elif not isinstance(table, NodeTable) or table.pair is not pair or table.context != NodeTable(pair, context).context:
        raise ValueError("table: must be a NodeTable of this pair at this context")
    if method == "auto":
        try:
            return expected_block_efficiency(pair, context, shape, verifier, method="exact", table=table)
        except ValueError as exc:
            if "exact enumeration would list" not in str(exc) and "above the limit" not in str(exc):
                raise
            method = "mc"
    if method == "exact":
        total, weight, count, lossless = 0.0, 0.0, 0, True
        for tree, prob in shape.enumerate(table):
            total += prob * verifier.expected_block_efficiency(tree)
            weight += prob
            count += 1
            lossless = lossless and lossless_over(verifier, [tree])
        return Estimate(total / weight, 0.0, "exact", count, lossless)
    if method == "mc":
        samples = check_int(samples, "samples", 1)
        rng = np.random.default_rng(seed)
        trees = [shape.sample(table, rng) for _ in range(samples)]
        values = np.array([verifier.expected_block_efficiency(tree) for tree in trees])
        stderr = float(values.std(ddof=1) / math.sqrt(samples)) if samples > 1 else float("nan")
        return Estimate(float(values.mean()), stderr, "mc", samples, lossless_over(verifier, trees))
    raise ValueError(f"method: must be 'exact', 'mc' or 'auto', got {method!r}")


def pairing_bias(pair: ModelPair, context: Sequence[int], shape, verifier, n: int = 3) -> float:
    """The exact bias of a pairing: TV between the law of the first ``n`` emitted tokens (repeated
    steps of ``shape`` verified by ``verifier``, lossy pairings allowed) and the target's n-token
    law; 0 (to rounding) for a lossless pairing.  Small vocabularies (every tree is enumerated).

    Raises:
        ValueError: as ``emitted_sequence_law``.
    """
    law = emitted_sequence_law(pair, context, shape, verifier, check_int(n, "n", 1), allow_lossy=True)
    return sequence_tv(law, target_sequence_law(pair, context, n))


def sequence_tv(a: dict, b: dict) -> float:
    """Total variation 0.5 sum_s |a(s) - b(s)| between two laws over token sequences (dicts
    sequence -> probability, as ``emitted_sequence_law`` and ``target_sequence_law`` return; a
    sequence missing from one law has probability 0 there)."""
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


def simulate_block_efficiency(
    pair: ModelPair, context: Sequence[int], shape, verifier, *, steps: int, seed: int = 0, allow_lossy: bool = False
) -> Estimate:
    """Brute force: draw a tree and run ``verify`` ``steps`` times; mean and standard error of tau + 1
    (with an EOS id, of the tokens kept: ``simlab.tree_verifiers.base.counted_tokens``)."""
    verifier = tree_verifiers.as_verifier(verifier, allow_lossy)
    _check(pair, shape)
    steps = check_int(steps, "steps", 2)
    table = NodeTable(pair, context)
    rng = np.random.default_rng(seed)
    lengths, lossless = np.empty(steps), True
    for i in range(steps):
        tree = shape.sample(table, rng)
        lengths[i] = counted_tokens(verifier.verify(tree, rng)[0], table.eos_id)
        lossless = lossless and lossless_over(verifier, [tree])
    return Estimate(float(lengths.mean()), float(lengths.std(ddof=1) / math.sqrt(steps)), "simulation", steps, lossless)


def emitted_sequence_law(
    pair: ModelPair, context: Sequence[int], shape, verifier, n: int, allow_lossy: bool = False
) -> dict[tuple[int, ...], float]:
    """Exact law of the first ``n`` tokens emitted by repeated speculative steps from ``context``.

    Each step enumerates the trees of ``shape`` at the current context, takes the exact
    outcome law of ``verifier`` (accepted path + correction or bonus token), and recurses on
    the extended context until n tokens are out.  Equal to ``target_sequence_law`` iff the
    scheme is lossless (over these n tokens).  With an EOS id (``simlab.pairs.EndOfSequence``) a
    sequence ends at its first EOS: the law is over sequences of n tokens or shorter ones
    ending in EOS.  ``allow_lossy``: as in ``expected_block_efficiency``.
    """
    verifier = tree_verifiers.as_verifier(verifier, allow_lossy)
    _check(pair, shape)
    eos = eos_of(pair)
    memo: dict[tuple[tuple[int, ...], int], dict[tuple[int, ...], float]] = {}

    def law(ctx: tuple[int, ...], need: int) -> dict[tuple[int, ...], float]:
        key = (ctx, need)
        if key in memo:
            return memo[key]
        out: dict[tuple[int, ...], float] = {}
        table = NodeTable(pair, ctx)
        for tree, prob in shape.enumerate(table):
            for path, vector in verifier.outcome_law(tree).items():
                for t in np.flatnonzero(vector > 0):
                    emitted = path + (int(t),)
                    weight = prob * float(vector[t])
                    if eos is not None and eos in emitted[:need]:
                        head = emitted[: emitted.index(eos) + 1]
                        out[head] = out.get(head, 0.0) + weight
                    elif len(emitted) >= need:
                        head = emitted[:need]
                        out[head] = out.get(head, 0.0) + weight
                    else:
                        for tail, w in law(ctx + emitted, need - len(emitted)).items():
                            out[emitted + tail] = out.get(emitted + tail, 0.0) + weight * w
        memo[key] = out
        return out

    return law(tuple(int(t) for t in context), n)


def target_sequence_law(pair: ModelPair, context: Sequence[int], n: int) -> dict[tuple[int, ...], float]:
    """The target's law of the next ``n`` tokens: prod_i p(x_i | context, x_<i) (with an EOS id,
    a sequence that reaches EOS ends there)."""
    eos = eos_of(pair)
    out = {(): 1.0}
    for _ in range(n):
        nxt = {pre: w for pre, w in out.items() if eos is not None and pre and pre[-1] == eos}
        prefixes = [pre for pre in out if pre not in nxt]
        if not prefixes:
            break
        p_rows, _ = pair.distributions([tuple(context) + pre for pre in prefixes])
        for pre, row in zip(prefixes, p_rows):
            for t in np.flatnonzero(row > 0):
                nxt[pre + (int(t),)] = out[pre] * float(row[t])
        out = nxt
    return out
