"""simlab: an exact analytic lab for multi-path speculative decoding (knows no backend and no CLI).

Modules:
    simlab.distributions    probability vectors: validation, residuals, divergences, inverse-CDF draws
    simlab.sampling         sampling settings, the one logits-to-p transform, ``seeded_rng`` streams
    simlab.checks           argument checks shared by the lab (integers, seeds, ranges, devices)
    simlab.drafting         drafting laws of a node's children (i.i.d., without replacement, ...)
    simlab.verifiers        node-level verifiers (OTLP solvers); ``simlab.verifiers.get(name)``
    simlab.otlp             the optimal-transport LP and its closed-form optimum
    simlab.conformance      the public losslessness check (exact for a verifier class, a G-test for any sampler)
    simlab.pairs            the model-pair protocol (where p and q come from) and two minimal pairs
    simlab.trees            draft trees (nodes keyed by token path, child lists with multiplicity)
    simlab.builders         draft-tree builders (delayed, static, EAGLE-2, Sequoia, greedy draft, ...)
                            and their drafting cost (``simlab.builders.cost``)
    simlab.tree_verifiers   tree verifiers: top-down lifting, naive_chain, bv, traversal, greedy, hsd
    simlab.efficiency       expected block efficiency (exact, mc, simulation), emitted-token laws
    simlab.measures         per-node measurements: divergences and acceptance
    simlab.labels           grid labels at one root: E[tau + 1] of every delayed-tree action
    simlab.reach_grid       grid labels from path products for verifiers whose branch law is p
    simlab.batched          the batched torch engine (branch masses of many nodes at once)
    simlab.device_rows      p and q where the model produced them (torch), node summaries
    simlab.decoding         speculative decoding loops over any pair (draft, verify, emit, repeat)
    simlab.latency          the latency model: forward times and T-hat of one step
    simlab.latency_profiles published latency profiles of the seed papers' hardware
    simlab.files            atomic file writes
    simlab.stats            cluster-robust standard errors of means over roots grouped by prompt
    simlab.selector         DDTE's neural dynamic selector (NDE)
    simlab.specblock        SpecBlock: rank classes, rank-guided block trees, the bandit
    simlab.treegraft        TreeGraft: n-gram and mid drafters grafting onto one tree
    simlab.spectr_gbv       SpecTr-GBV's released multi-draft block rule, valued exactly
    simlab.acceptance_profiles  acceptance profiles engines replay (converters, exports) and both aggregations
    simlab.widening         rank statistics along the draft's chain, tree-widening gains, RS vs argmax matching

Three lines for E[tau + 1]::

    pair = simlab.MarkovPair.random(4, np.random.default_rng(0))
    simlab.expected_block_efficiency(pair, [0], simlab.Delayed(2, 1, 2), "specinfer").mean
"""

from simlab import distributions, drafting, otlp, pairs, tree_verifiers, trees, verifiers
from simlab.drafting import Drafting
from simlab.efficiency import Estimate, expected_block_efficiency, simulate_block_efficiency
from simlab.pairs import ContextFreePair, MarkovPair, ModelPair
from simlab.builders import Delayed, Static, chain, iid

__all__ = [
    "ContextFreePair",
    "Delayed",
    "Drafting",
    "Estimate",
    "MarkovPair",
    "ModelPair",
    "Static",
    "chain",
    "distributions",
    "drafting",
    "expected_block_efficiency",
    "iid",
    "otlp",
    "pairs",
    "shapes",
    "simulate_block_efficiency",
    "tree_verifiers",
    "trees",
    "verifiers",
]
