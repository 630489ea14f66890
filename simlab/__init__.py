"""simlab: an exact analytic lab for multi-path speculative decoding.

Modules:
    simlab.distributions   validation, sampling transforms, divergences
    simlab.drafting        drafting laws of a node's children (i.i.d., without replacement)
    simlab.verifiers       node-level verifiers (OTLP solvers); ``simlab.verifiers.get(name)``
    simlab.otlp            the optimal-transport LP and its closed-form optimum
    simlab.pairs           the model-pair protocol (where p and q come from) and two minimal pairs
    simlab.trees           draft trees (nodes keyed by token path, child lists with multiplicity)
    simlab.shapes          tree shapes: Delayed(K, L1, L2), iid, chain, Static (tuple notation)
    simlab.tree_verifiers  tree verifiers: top-down lifting, naive_chain, bv, traversal, greedy
    simlab.efficiency      expected block efficiency (exact, mc, simulation), emitted-token laws

Three lines for E[tau + 1]::

    pair = simlab.MarkovPair.random(4, np.random.default_rng(0))
    simlab.expected_block_efficiency(pair, [0], simlab.Delayed(2, 1, 2), "specinfer").mean
"""

from simlab import distributions, drafting, otlp, pairs, shapes, tree_verifiers, trees, verifiers  # shapes: deprecated alias
from simlab.drafting import Drafting
from simlab.efficiency import Estimate, expected_block_efficiency, simulate_block_efficiency
from simlab.pairs import ContextFreePair, MarkovPair, ModelPair
from simlab.builders import Delayed, Static, chain, iid

__all__ = [
    "ContextFreePair", "Delayed", "Drafting", "Estimate", "MarkovPair", "ModelPair", "Static", "chain",
    "distributions", "drafting", "expected_block_efficiency", "iid", "otlp", "pairs", "shapes",
    "simulate_block_efficiency", "tree_verifiers", "trees", "verifiers",
]
