"""Capture throughput vs a plain batched target forward (issue 5; recorded, not asserted).

Run (after ``python -m backends.reference_pair``):
    SIMLAB_PAIR=~/.cache/simlab/reference_pair/seed0 python -m pytest benchmarks/test_capture.py --benchmark-columns=min,median,rounds
or on a named pretrained pair (``backends.pretrained``, its default draft: ``default_draft``; issue 23):
    SIMLAB_PAIR=smollm2 python -m pytest benchmarks/test_capture.py --benchmark-columns=min,median,rounds
or, one round of each (a grid-capture group takes minutes on one thread), on ``qwen2.5-coder``
(Qwen2.5-Coder-1.5B-Instruct drafted by ``qwen2.5-coder-0.5b``):
    OMP_NUM_THREADS=1 SIMLAB_PAIR=qwen2.5-coder python -m pytest benchmarks/test_capture.py \
        --benchmark-min-rounds=1 --benchmark-warmup=off --benchmark-columns=min,rounds

Nodes per second of the tree evaluation (both models, prefix included) against tokens per
second of a plain batched forward of both models over the same number of tokens: one tree
forward per root (``node_logits``, prefix cache then tree tokens), and the eight roots' trees in
one masked forward per model (``forest_logits``, what ``backends.capture --roots-per-forward 8``
runs).  Eight roots on four prompts, Delayed(4, 2, 4) trees (about 150 nodes): the first four
prompts of the pair's own prompt set where a named pair declares one (``PROMPTS``), else four
sentences of the Python documentation (``TEXTS``).

Rounds (``timed``): on a named pair every benchmark runs ``--benchmark-min-rounds`` pedantic
rounds of one call each (the two grid-capture benchmarks at most 3) and no other call, so
``--benchmark-min-rounds=1`` calls each timed function once; on the reference pair the three
evaluation benchmarks calibrate as pytest-benchmark does (a calibration call, at least
``--benchmark-min-rounds`` rounds, a final call).
"""

import os
from pathlib import Path

import numpy as np
import pytest

from backends.pretrained import PAIRS, default_draft, pair_study_defaults

NAME = os.environ.get("SIMLAB_PAIR", "~/.cache/simlab/reference_pair/seed0")
NAMED = NAME in PAIRS
PROMPTS = (pair_study_defaults(NAME).get("prompts") or "") if NAMED else ""
"""The prompt set (``backends.prompt_sets``) a named pair declares for its studies
(``backends.pretrained.pair_study_defaults``), "" where none (then ``TEXTS``)."""
TEXTS = [
    "The for statement is used to iterate over the elements of a sequence",
    "A class definition defines a class object",
    "Exceptions are raised by the raise statement",
    "The import statement finds a module",
]
PAIR = Path(os.path.expanduser(NAME))
pytestmark = pytest.mark.skipif(
    not NAMED and not (PAIR / "target").is_dir(), reason="run python -m backends.reference_pair first"
)


def capture_settings(**options):
    """The ``CaptureSettings`` of the benchmarked pair (the named pair with its default draft,
    ``backends.pretrained.default_draft``, and ``PROMPTS``; or the reference pair's folders), grid
    shape, width 4, depth 4, 2 trees per L1, 8 roots per forward; ``options`` override fields."""
    from backends import capture_store

    where = (
        {"target": "", "draft": default_draft(NAME), "pair": NAME}
        if NAMED
        else {"target": str(PAIR / "target"), "draft": str(PAIR / "draft")}
    )
    grid = {"shape": "grid", "width": 4, "depth": 4, "samples": 2, "roots_per_forward": 8}
    return capture_store.CaptureSettings(prompts=PROMPTS, **where, **grid, **options)


def root_texts(pair) -> list[str]:
    """The four texts the roots are encoded from: the first four prompts of ``PROMPTS`` as the pair
    encodes them (``backends.roots.prompt_texts``, chat template included), else ``TEXTS``."""
    if not PROMPTS:
        return list(TEXTS)
    from backends.roots import prompt_texts, read_prompt_records

    return prompt_texts(pair, read_prompt_records(PROMPTS)[:4])


def timed(benchmark, config, function, most: int | None = None):
    """``function``'s result, timed by ``benchmark``: on a named pair ``--benchmark-min-rounds``
    pedantic rounds (at most ``most``) of one call each and no other call; on the reference pair
    ``benchmark(function)`` (``most`` given: pedantic, ``min(most, --benchmark-min-rounds)`` rounds)."""
    rounds = config.getoption("benchmark_min_rounds")
    if most is None and not NAMED:
        return benchmark(function)
    return benchmark.pedantic(function, rounds=rounds if most is None else min(most, rounds), iterations=1)


@pytest.fixture(scope="module")
def setup():
    from backends.hf import HFPair
    from backends.pretrained import named_pair
    from simlab.builders import Delayed
    from simlab.trees import NodeTable

    pair = named_pair(NAME, device="cpu") if NAMED else HFPair(str(PAIR / "target"), str(PAIR / "draft"), device="cpu")
    texts = root_texts(pair)
    rng = np.random.default_rng(0)
    trees = []
    for i in range(8):
        prompt = pair.encode(texts[i % 4])
        trees.append((prompt, Delayed(4, 2, 4).sample(NodeTable(pair, prompt), rng).nodes()))
    return pair, trees[0][0], trees


def test_tree_evaluation(benchmark, pytestconfig, setup):
    pair, _, trees = setup
    timed(benchmark, pytestconfig, lambda: [pair.node_logits(root, nodes) for root, nodes in trees])
    benchmark.extra_info["nodes"] = sum(len(n) for _, n in trees)


def test_forest_evaluation(benchmark, pytestconfig, setup):
    pair, _, trees = setup
    timed(benchmark, pytestconfig, lambda: pair.forest_logits(trees))
    benchmark.extra_info["nodes"] = sum(len(n) for _, n in trees)


def test_plain_batched_forward(benchmark, pytestconfig, setup):
    import torch

    pair, prompt, trees = setup
    n_tokens = sum(len(n) for _, n in trees)
    width = len(prompt) + 18
    tokens = torch.randint(0, pair.vocab_size, (max(1, n_tokens // width), width))

    def forward():
        with torch.no_grad():
            pair.target(tokens)
            pair.draft(tokens)

    timed(benchmark, pytestconfig, forward)
    benchmark.extra_info["tokens"] = int(tokens.numel())


@pytest.fixture(scope="module")
def group(setup):
    pair, _, _ = setup
    texts = root_texts(pair)
    return [(i, i % 4, pair.encode(texts[i % 4])) for i in range(8)]


@pytest.mark.parametrize("evaluation", ["cached", "forward"])
@pytest.mark.parametrize("labels", ["", "specinfer"])
def test_grid_capture_group(benchmark, pytestconfig, setup, group, evaluation, labels):
    """A whole grid-capture group (``backends.capture.capture_group``): 8 roots, width 4, depth 4,
    2 trees per L1 (about 1,400 nodes), drafting and leaves (and with ``labels`` the SpecInfer
    labels and the node summaries); ``cached`` evaluates every node once on kept KV caches, all 8
    roots in one forward per model and level, ``forward`` re-runs the ancestors at every level."""
    from backends.capture import capture_group

    pair, _, _ = setup
    roots = group
    settings = capture_settings(labels=labels, evaluation=evaluation)
    results = timed(benchmark, pytestconfig, lambda: capture_group(pair, settings, roots, pair.max_batch, pair.forest_tokens), 3)
    benchmark.extra_info["nodes"] = sum(len(rows) for rows, *_ in results)


@pytest.mark.parametrize("evaluation", ["cached", "forward"])
def test_grid_drafting_and_leaves(benchmark, pytestconfig, setup, group, evaluation):
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
    drafted = timed(benchmark, pytestconfig, run, 3)
    benchmark.extra_info["nodes"] = sum(len(tree.nodes()) for tree, _, _ in drafted)
