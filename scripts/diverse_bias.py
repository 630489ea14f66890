"""DIVERSE's exact bias and E[tau + 1] as functions of its weight w (docs/results.md section 13).

OMP_NUM_THREADS=1 python scripts/diverse_bias.py
"""

import numpy as np
from simlab import tree_verifiers
from simlab.builders import chain
from simlab.efficiency import expected_block_efficiency, pairing_bias
from simlab.pairs import MarkovPair

P = np.array([0.05, 0.30, 0.15, 0.0, 0.25, 0.25])
Q = np.array([0.30, 0.10, 0.15, 0.20, 0.05, 0.20])
PAIR = MarkovPair.random(3, np.random.default_rng(7), concentration=0.7, closeness=0.3)  # tests/test_lossy_rules.py's world
print("| w | node bias on (P, Q) = (1 - w) TV | 3-token bias, chain(3), Markov V=3 | E[tau + 1], chain(3) |")
print("|---|---|---|---|")
for w in (0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
    v = tree_verifiers.get("diverse", allow_lossy=True, weight=w)
    node = (1 - w) * 0.5 * np.abs(P - Q).sum()
    bias = pairing_bias(PAIR, (1,), chain(3), v, n=3)
    e = expected_block_efficiency(PAIR, (1,), chain(3), v, allow_lossy=True).mean
    print(f"| {w} | {node:.4f} | {bias:.4f} | {e:.4f} |")
naive = expected_block_efficiency(PAIR, (1,), chain(3), "naive").mean
print(f"standard speculative sampling (naive), chain(3): E[tau + 1] = {naive:.4f}, bias 0")
