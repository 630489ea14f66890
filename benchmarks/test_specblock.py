"""SpecBlock timings at the reference pair's scale (issue 14), the target model's calls excluded.

Run:  OMP_NUM_THREADS=1 python -m pytest benchmarks/test_specblock.py --benchmark-columns=min,median,mean,rounds
(and once more without OMP_NUM_THREADS, the default environment).
Targets (recorded in benchmarks/RESULTS.md, not asserted): building one rank-guided tree (V = 4096,
K = 4, two blocks, beam 10, budget 90) <= 10 ms beyond the drafter's forwards (blocks precomputed);
one block-drafter forward for 10 seeds (W = 128, V = 4096) below the plain draft model's 8 levels.
"""

import numpy as np
import pytest
import torch

from backends.block_drafter.model import BlockDrafterModel, DrafterSpec
from simlab.pairs import ContextFreePair
from simlab.specblock import Block, RankGuided
from simlab.trees import NodeTable

V = 4096


class PrecomputedDrafter:
    """Blocks drawn once per seed path and kept (the drafter's cost is not timed)."""

    K, vocab_size = 4, V

    def __init__(self):
        self.blocks = {}

    def _block(self, path):
        if path not in self.blocks:
            rng = np.random.default_rng([len(path), *path])
            z = rng.normal(size=(4, V)) * 3
            self.blocks[path] = Block(z - np.log(np.exp(z).sum(1, keepdims=True)), rng.integers(0, 4, 4), (path,) * 4)
        return self.blocks[path]

    def first_block(self, table):
        return self._block(())

    def next_blocks(self, table, seeds):
        return [self._block(path) for path, _ in seeds]


@pytest.fixture(scope="module")
def builder():
    b = RankGuided(PrecomputedDrafter(), budget=90)
    b.sample(NodeTable(ContextFreePair(np.full(V, 1 / V), np.full(V, 1 / V)), ()))
    return b


def test_build_rank_guided_tree(benchmark, builder):
    table = NodeTable(ContextFreePair(np.full(V, 1 / V), np.full(V, 1 / V)), ())
    tree = benchmark(lambda: builder.sample(table))
    assert tree.cost.verified == 90 >= tree.tokens()


def test_block_drafter_forward_10_seeds(benchmark):
    torch.manual_seed(0)
    model = BlockDrafterModel(DrafterSpec(), 768, V).eval()
    token, inherited = torch.zeros(10, dtype=torch.long), torch.zeros(10, 128)

    def run():
        with torch.no_grad():
            return model(token, inherited=inherited)[1]

    assert benchmark(run).shape == (10, 4, V)
