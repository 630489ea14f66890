"""Capture throughput vs a plain batched target forward (issue 5; recorded, not asserted).

Run (after ``python -m backends.reference_pair``):
    SIMLAB_PAIR=~/.cache/simlab/reference_pair/seed0 python -m pytest benchmarks/test_capture.py --benchmark-columns=min,median,rounds
or on a named pretrained pair (``backends.pretrained``, its default draft; issue 23):
    SIMLAB_PAIR=smollm2 python -m pytest benchmarks/test_capture.py --benchmark-columns=min,median,rounds

Nodes per second of the tree evaluation (both models, prefix included) against tokens per
second of a plain batched forward of both models over the same number of tokens: one tree
forward per root (``node_logits``, prefix cache then tree tokens), and the eight roots' trees in
one masked forward per model (``forest_logits``, what ``backends.capture --roots-per-forward 8``
runs).  Eight roots on four prompts, Delayed(4, 2, 4) trees (about 150 nodes).
"""

import os
from pathlib import Path

import numpy as np
import pytest

from backends.pretrained import DEFAULT_DRAFT, PAIRS

NAME = os.environ.get("SIMLAB_PAIR", "~/.cache/simlab/reference_pair/seed0")
NAMED = NAME in PAIRS
PAIR = Path(os.path.expanduser(NAME))
pytestmark = pytest.mark.skipif(
    not NAMED and not (PAIR / "target").is_dir(), reason="run python -m backends.reference_pair first"
)


def capture_settings(**options):
    """The ``CaptureSettings`` of the benchmarked pair (the named pair with its default draft, or the
    reference pair's folders), grid shape, width 4, depth 4, 2 trees per L1, 8 roots per forward."""
    from backends import capture_store

    where = (
        {"target": "", "draft": DEFAULT_DRAFT, "pair": NAME}
        if NAMED
        else {"target": str(PAIR / "target"), "draft": str(PAIR / "draft")}
    )
    grid = {"shape": "grid", "width": 4, "depth": 4, "samples": 2, "roots_per_forward": 8}
    return capture_store.CaptureSettings(prompts="", **where, **grid, **options)


@pytest.fixture(scope="module")
def setup():
    from backends.hf import HFPair
    from backends.pretrained import named_pair
    from simlab.builders import Delayed
    from simlab.trees import NodeTable

    pair = named_pair(NAME, device="cpu") if NAMED else HFPair(str(PAIR / "target"), str(PAIR / "draft"), device="cpu")
    texts = [
        "The for statement is used to iterate over the elements of a sequence",
        "A class definition defines a class object",
        "Exceptions are raised by the raise statement",
        "The import statement finds a module",
    ]
    rng = np.random.default_rng(0)
    trees = []
    for i in range(8):
        prompt = pair.encode(texts[i % 4])
        trees.append((prompt, Delayed(4, 2, 4).sample(NodeTable(pair, prompt), rng).nodes()))
    return pair, trees[0][0], trees


def test_tree_evaluation(benchmark, setup):
    pair, _, trees = setup
    benchmark(lambda: [pair.node_logits(root, nodes) for root, nodes in trees])
    benchmark.extra_info["nodes"] = sum(len(n) for _, n in trees)


def test_forest_evaluation(benchmark, setup):
    pair, _, trees = setup
    benchmark(lambda: pair.forest_logits(trees))
    benchmark.extra_info["nodes"] = sum(len(n) for _, n in trees)


def test_plain_batched_forward(benchmark, setup):
    import torch

    pair, prompt, trees = setup
    n_tokens = sum(len(n) for _, n in trees)
    width = len(prompt) + 18
    tokens = torch.randint(0, pair.vocab_size, (max(1, n_tokens // width), width))

    def forward():
        with torch.no_grad():
            pair.target(tokens)
            pair.draft(tokens)

    benchmark(forward)
    benchmark.extra_info["tokens"] = int(tokens.numel())


@pytest.fixture(scope="module")
def group(setup):
    pair, _, _ = setup
    texts = [
        "The for statement is used to iterate over the elements of a sequence",
        "A class definition defines a class object",
        "Exceptions are raised by the raise statement",
        "The import statement finds a module",
    ]
    return [(i, i % 4, pair.encode(texts[i % 4])) for i in range(8)]


@pytest.mark.parametrize("evaluation", ["cached", "forward"])
@pytest.mark.parametrize("labels", ["", "specinfer"])
def test_grid_capture_group(benchmark, setup, group, evaluation, labels):
    """A whole grid-capture group (``backends.capture.capture_group``): 8 roots, width 4, depth 4,
    2 trees per L1 (about 1,400 nodes), drafting and leaves (and with ``labels`` the SpecInfer
    labels and the node summaries); ``cached`` evaluates every node once on kept KV caches, all 8
    roots in one forward per model and level, ``forward`` re-runs the ancestors at every level."""
    from backends.capture import capture_group

    pair, _, _ = setup
    roots = group
    settings = capture_settings(labels=labels, evaluation=evaluation)
    results = benchmark.pedantic(lambda: capture_group(pair, settings, roots, pair.max_batch, pair.forest_tokens), rounds=3)
    benchmark.extra_info["nodes"] = sum(len(rows) for rows, *_ in results)


@pytest.mark.parametrize("evaluation", ["cached", "forward"])
def test_grid_drafting_and_leaves(benchmark, setup, group, evaluation):
    """The model work of the same group alone (drafting every level, then the leaves; no summaries,
    no labels): nodes per second against the plain batched forward's tokens per second."""
    from backends.capture import draft_cached, draft_forward

    pair, _, _ = setup
    roots = group
    settings = capture_settings(evaluation=evaluation)
    run = (
        (lambda: draft_cached(pair, settings, roots))
        if evaluation == "cached"
        else (lambda: draft_forward(pair, settings, roots, pair.forest_tokens))
    )
    drafted = benchmark.pedantic(run, rounds=3)
    benchmark.extra_info["nodes"] = sum(len(tree.nodes()) for tree, _, _ in drafted)
