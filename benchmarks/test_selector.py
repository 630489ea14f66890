"""Selector inference time and label-generation rate (issue 7), and the compare_verifiers
default run (issue 6).  Recorded in RESULTS.md, never asserted.

    python -m pytest benchmarks/test_selector.py --benchmark-columns=min,median,mean,rounds

The reference-pair label rate replays a grid capture; set SIMLAB_GRID_CAPTURE to its folder
(default: out/results/refgrid/T1.0, made by the commands in docs/results.md).
"""

import os
from pathlib import Path

import pytest
import torch

from analyses.labels import Grid, label_root
from analyses.sources import SyntheticSource
from backends.synthetic import SamplingSettings
from simlab.latency import LatencyModel
from simlab.selector.model import Selector, SelectorConfig

CAPTURE = Path(os.environ.get("SIMLAB_GRID_CAPTURE", "out/results/refgrid/T1.0"))


@pytest.mark.parametrize("dims", [(32, 32, 32), (256, 64, 64), (4096, 2048, 2048)], ids=["synthetic-V32", "reference-pair", "7B-sized"])
def test_selector_inference_one_context(benchmark, dims):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Selector(SelectorConfig(dims, 11, 324)).eval()
    x = [torch.randn(1, n) for n in dims] + [torch.randn(1, 11)]
    benchmark(model.choose, *x)


def test_label_rate_synthetic_default(benchmark):
    """One root of the default world, the default grid (324 actions, s = 4), SpecInfer + Traversal."""
    root = next(SyntheticSource().roots(SamplingSettings()))
    latency = LatencyModel.from_cost_ratio(0.1, per_token=0.01)
    benchmark.pedantic(label_root, args=(root, ["specinfer", "traversal"], Grid(), latency), rounds=3, iterations=1)


@pytest.mark.skipif(not (CAPTURE / "settings.json").is_file(), reason="no reference-pair grid capture (see docs/results.md)")
def test_label_rate_reference_capture(benchmark):
    from analyses.sources import CaptureSource

    source = CaptureSource((str(CAPTURE),))
    root = next(source.roots(source.settings()[0]))
    latency = LatencyModel.from_cost_ratio(0.1)
    benchmark.pedantic(label_root, args=(root, ["specinfer", "traversal"], Grid(samples=2), latency), rounds=3, iterations=1)


def test_compare_verifiers_default_run(benchmark, tmp_path):
    """The study's default run (8 settings x 8 roots x 7 verifiers), target <= 2 minutes on 2 cores."""
    from analyses import compare_verifiers

    benchmark.pedantic(compare_verifiers.main, args=(["--out", str(tmp_path), "--quiet"],), rounds=1, iterations=1)
