"""Reusable checks for tree verifiers (used by the tree tests and the tree planted-fault suite).

The estimator cross-check compares two estimates of E[tau + 1] by |a - b| <= 5 combined
standard errors: two-sided false-alarm probability 5.7e-7 under the normal approximation
(fixed seeds make every run identical), power >= 0.99 against a bias of 7.33 standard errors.
"""

from __future__ import annotations

import math

import numpy as np

from simlab.efficiency import (
    emitted_sequence_law,
    expected_block_efficiency,
    simulate_block_efficiency,
    target_sequence_law,
)

Z = 5.0


def check_tree_lossless(pair, context, shape, verifier, n=2):
    law = emitted_sequence_law(pair, context, shape, verifier, n)
    target = target_sequence_law(pair, context, n)
    tv = 0.5 * sum(abs(law.get(k, 0.0) - target.get(k, 0.0)) for k in set(law) | set(target))
    assert tv <= 1e-10, f"emitted {n}-token law differs from the target by TV {tv:.3g}"


def check_greedy_decoding(pair, context, shape, verifier, n=3, runs=20, seed=0):
    """The greedy rule at any temperature (a lossy pairing at T > 0, allowed here): its exact
    emitted n-token law is the point mass on the target's greedy continuation
    (``simlab.decoding.greedy_decode``, lowest-id ties), and ``runs`` sampled decodes (seeds
    ``seed``..) emit exactly that continuation (deterministic: no statistics)."""
    import dataclasses

    from simlab.decoding import greedy_decode, speculative_decode

    verifier = dataclasses.replace(verifier, allow_lossy=True)
    greedy = tuple(greedy_decode(pair, context, n))
    law = emitted_sequence_law(pair, context, shape, verifier, n, allow_lossy=True)
    assert law.get(greedy, 0.0) >= 1.0 - 1e-12, f"greedy continuation {greedy} has mass {law.get(greedy, 0.0):.6g} (law {law})"
    for s in range(seed, seed + runs):
        tokens, _ = speculative_decode(pair, context, shape, verifier, n, np.random.default_rng(s))
        assert tuple(tokens) == greedy, f"seed {s}: decoded {tokens}, greedy continuation {list(greedy)}"


def check_estimates_agree(a, b):
    se = math.hypot(a.stderr, b.stderr)
    assert abs(a.mean - b.mean) <= Z * se + 1e-12, f"{a.method} {a.mean:.4f} vs {b.method} {b.mean:.4f} (combined SE {se:.4f})"


def check_simulation_matches_exact(pair, context, shape, verifier, steps=2000, seed=0):
    exact = expected_block_efficiency(pair, context, shape, verifier)
    check_estimates_agree(exact, simulate_block_efficiency(pair, context, shape, verifier, steps=steps, seed=seed))


def law_block_efficiency(verifier, tree) -> float:
    """E[tau + 1 | tree] straight from the outcome law (the reference of every fast path): the
    sum over accepted paths of their mass times the tokens they keep."""
    from simlab.tree_verifiers.base import counted_tokens

    eos = tree.table.eos_id
    return float(sum(float(v.sum()) * counted_tokens(path, eos) for path, v in verifier.outcome_law(tree).items()))


def check_fast_efficiency(verifier, pairs=200, vocab=6, seed=0):
    """The verifier's own E[tau + 1 | tree] (its fast path: children masses, Traversal's mass
    recursion) equals the outcome-law reference to 1e-12, on a wide tree at the root of each of
    ``pairs`` random pairs: up to four distinct children in a random order (E given the tree is
    exact whatever drew it), drawn without replacement where the verifier takes that law, else
    i.i.d.  A node's later rejections matter only where its children's weights do not saturate,
    which a few percent of such roots give."""
    from simlab.drafting import Drafting
    from simlab.pairs import MarkovPair
    from simlab.trees import DraftTree, NodeTable

    law = Drafting.WITHOUT_REPLACEMENT if Drafting.WITHOUT_REPLACEMENT in verifier.lossless_for else Drafting.IID
    rng = np.random.default_rng(seed)
    for _ in range(pairs):
        pair = MarkovPair.random(vocab, rng, concentration=float(rng.choice([0.2, 1.0, 5.0])), closeness=float(rng.random()))
        table = NodeTable(pair, (0,))
        support = np.flatnonzero(table.q(()) > 0)
        tree = DraftTree(table, {(): tuple(int(t) for t in rng.permutation(support)[:4])}, drafting=law)
        fast, reference = verifier.expected_block_efficiency(tree), law_block_efficiency(verifier, tree)
        assert abs(fast - reference) <= 1e-12, f"fast E {fast:.15f} vs the outcome law's {reference:.15f}"


def check_outcome_law_is_a_law(tree, verifier):
    law = verifier.outcome_law(tree)
    total = sum(float(v.sum()) for v in law.values())
    assert abs(total - 1.0) <= 1e-12, f"outcome law sums to {total}"
    assert all(np.all(v >= -1e-15) for v in law.values())


def check_lossless_flag(verifier, pair, context, seed=5):
    """The one-pass flag of every result (``TreeVerifier.lossless_on(tree, depth)``, from
    ``lossless_depth``) agrees with the reference, ``mismatch`` on the cut tree, at every cut of a
    few sampled trees (per-path trunks, i.i.d. rollouts, delayed trees; lossy pairings included)."""
    from simlab.builders import Delayed, iid
    from simlab.trees import NodeTable

    rng = np.random.default_rng(seed)
    for shape in (Delayed(2, 1, 1, trunk_children="per_path"), iid(2, 2), Delayed(2, 1, 2)):
        for _ in range(3):
            tree = shape.sample(NodeTable(pair, context), rng)
            for depth in range(tree.depth() + 2):
                flag, reference = verifier.lossless_on(tree, depth), verifier.mismatch(tree.truncate(depth)) is None
                assert flag is reference, f"lossless flag {flag} at cut {depth} of a {shape} tree; mismatch says {reference}"
