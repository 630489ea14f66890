"""Selector inference time and label-generation rate (issue 7), and the compare_verifiers
default run (issue 6).  Recorded in RESULTS.md, never asserted.

    python -m pytest benchmarks/test_selector.py --benchmark-columns=min,median,mean,rounds

The reference-pair label rate replays a grid capture: SIMLAB_GRID_CAPTURE (default
out/results/refgrid/T1.0, made by the commands in docs/results.md) when it exists, otherwise a
one-root grid capture (s = 2) made here from the reference pair, which is trained first if the
cache lacks it (``python -m backends.reference_pair``, 3-9 minutes).
"""

import os
from pathlib import Path

import pytest
import torch

from analyses._labels import Grid, label_root
from backends.sources import SyntheticSource
from simlab.sampling import SamplingSettings
from simlab.latency import LatencyModel
from simlab.selector.model import Selector, SelectorConfig

CAPTURE = Path(os.environ.get("SIMLAB_GRID_CAPTURE", "out/results/refgrid/T1.0"))


@pytest.mark.parametrize(
    "dims", [(32, 32, 32), (256, 64, 64), (4096, 2048, 2048)], ids=["synthetic-V32", "reference-pair", "7B-sized"]
)
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


@pytest.fixture(scope="module")
def reference_capture(tmp_path_factory) -> Path:
    """The recorded grid capture, or a one-root one of the reference pair made now."""
    if (CAPTURE / "settings.json").is_file():
        return CAPTURE
    from backends import capture, reference_pair

    pair = reference_pair.DEFAULT_CACHE / "seed0"
    if not (pair / "target").is_dir():
        reference_pair.build(pair, seed=0)
    prompts = tmp_path_factory.mktemp("prompts") / "p.txt"
    prompts.write_text("The for statement is used to iterate over the elements of a sequence\n")
    out = tmp_path_factory.mktemp("grid")
    assert (
        capture.main(
            [
                "--target",
                str(pair / "target"),
                "--draft",
                str(pair / "draft"),
                "--prompts",
                str(prompts),
                "--out",
                str(out),
                "--shape",
                "grid",
                "--width",
                "4",
                "--depth",
                "8",
                "--samples",
                "2",
                "--roots-per-prompt",
                "1",
                "--full",
                "--device",
                "cpu",
                "--quiet",
            ]
        )
        == 0
    )
    return out


def test_label_rate_reference_capture(benchmark, reference_capture):
    from backends.sources import CaptureSource

    source = CaptureSource((str(reference_capture),))
    root = next(source.roots(source.fixed_settings()[0]))
    latency = LatencyModel.from_cost_ratio(0.1)
    benchmark.pedantic(label_root, args=(root, ["specinfer", "traversal"], Grid(samples=2), latency), rounds=3, iterations=1)


def test_compare_verifiers_default_run(benchmark, tmp_path):
    """The study's default run (8 settings x 8 roots x 7 verifiers), target <= 2 minutes on 2 cores."""
    from analyses import compare_verifiers

    benchmark.pedantic(compare_verifiers.main, args=(["--out", str(tmp_path), "--quiet"],), rounds=1, iterations=1)
