import os
from pathlib import Path

# One thread per test process: the suite runs in two worker processes (pytest-xdist, `-n 2` in
# pyproject.toml), and torch's or BLAS's default threads in each stall a 2-core box; set before
# numpy or torch is imported, inherited by the CLIs the tests start.  A caller's own setting wins.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# A sharded study's rank waits for the other ranks' parts (default a day): in the tests a rank that
# would wait for a part nobody writes fails within two minutes instead of hanging the suite.
os.environ.setdefault("SIMLAB_SHARD_WAIT", "120")

from hypothesis import HealthCheck, settings

# Numeric properties: no deadline; derandomized so every run (and CI) checks the same examples.
settings.register_profile(
    "simlab",
    deadline=None,
    derandomize=True,
    max_examples=int(os.environ.get("SIMLAB_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("simlab")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def micro_pair_dir(tmp_path_factory):
    """The tiny reference pair (``python -m backends.reference_pair --micro``), trained once per session."""
    from backends.reference_pair import PairSpec, build

    out = tmp_path_factory.mktemp("micro_pair")
    build(out, seed=0, spec=PairSpec.micro(), log=lambda message: None)
    return out


@pytest.fixture(scope="session")
def drafters(micro_pair_dir):
    """Micro block drafters (the drafter and both ablations) for the micro pair, trained once per session."""
    from backends.block_drafter.__main__ import main

    assert main(["--pair", str(micro_pair_dir), "--micro", "--variant", "all", "--quiet"]) == 0
    return micro_pair_dir / "block_drafter"


SHIPPED_PROMPTS = Path(__file__).resolve().parent.parent / "backends" / "prompts" / "reference_prompts.txt"


@pytest.fixture(scope="session")
def smollm2_folder():
    """The pretrained pair's converted float32 folder (``backends.pretrained.target_folder``: fetched
    and converted on the first run on this machine); ``SIMLAB_OFFLINE=1`` skips when it is not cached."""
    from backends import pretrained

    try:
        return pretrained.target_folder()
    except ValueError as exc:
        if os.environ.get("SIMLAB_OFFLINE") == "1":
            pytest.skip(f"SIMLAB_OFFLINE=1 and the smollm2 file is not cached: {exc}")
        raise


def write_prompts(folder: Path, count: int) -> str:
    """The first ``count`` shipped prompts as a prompt file in ``folder``; its path."""
    path = Path(folder) / "prompts.txt"
    path.write_text("\n".join(SHIPPED_PROMPTS.read_text().splitlines()[:count]) + "\n")
    return str(path)


def live_pair_flags(pair_dir) -> list[str]:
    """A study's source flags for the micro pair, live: ``--backend hf --target .. --draft ..``."""
    return ["--backend", "hf", "--target", str(Path(pair_dir) / "target"), "--draft", str(Path(pair_dir) / "draft")]


def capture_flags(pair_dir, prompts, out, *extra) -> list[str]:
    """``backends.capture`` flags for the micro pair: one root per prompt, spacing 4, quiet, then ``extra``."""
    return [
        "--target",
        str(Path(pair_dir) / "target"),
        "--draft",
        str(Path(pair_dir) / "draft"),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--roots-per-prompt",
        "1",
        "--spacing",
        "4",
        "--quiet",
        *extra,
    ]


KILLED_CAPTURE = """
import os, signal, sys
from backends import capture, capture_store
saved, original = [0], capture_store.save_nodes
def save_nodes(*args, **kwargs):  # SIGKILL right after the n-th root's last shard: a deterministic kill point
    original(*args, **kwargs)
    saved[0] += 1
    if saved[0] == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
capture_store.save_nodes = save_nodes
sys.exit(capture.main(sys.argv[2:]))
"""


def killed_capture(argv, after: int) -> int:
    """Run ``python -m backends.capture argv`` in a subprocess that SIGKILLs itself right after
    writing its ``after``-th root (mid-group when groups hold more roots); its return code (-9)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", KILLED_CAPTURE, str(after), *argv], capture_output=True).returncode


def make_capture(micro_pair_dir, tmp_path_factory, prompts: int, *flags) -> Path:
    """A ``--full`` capture of the micro pair on the first ``prompts`` shipped prompts (1 root each, spacing 4)."""
    from backends.capture import main as capture_main

    out = tmp_path_factory.mktemp("capture")
    prompt_file = write_prompts(tmp_path_factory.mktemp("prompts"), prompts)
    assert capture_main(capture_flags(micro_pair_dir, prompt_file, out, "--full", *flags)) == 0
    return out


@pytest.fixture(scope="session")
def grid_capture(micro_pair_dir, tmp_path_factory):
    """A grid capture (``--shape grid``): 2 prompts, 1 root each, K <= 2, L1, L2 <= 2, 2 trees per L1."""
    return make_capture(micro_pair_dir, tmp_path_factory, 2, "--shape", "grid", "--width", "2", "--depth", "2", "--samples", "2")


@pytest.fixture(scope="session")
def tree_capture(micro_pair_dir, tmp_path_factory):
    """A capture of i.i.d. trees (width 2, depth 2): 2 prompts, 1 root each."""
    return make_capture(micro_pair_dir, tmp_path_factory, 2, "--depth", "2", "--width", "2")


def load_script(path: Path, name: str | None = None):
    """The module of a script that is not a package module (``scripts/*.py``, a benchmark file),
    loaded from ``path`` (a path relative to the repository root, or absolute) under ``name``
    (default: the file's stem)."""
    import importlib.util

    path = Path(path) if Path(path).is_absolute() else Path(__file__).resolve().parents[1] / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one_error_line(err: str) -> bool:
    """True when a tool's stderr holds exactly one line besides its progress notes (the lines
    ``backends.cli.slow_step`` prints, ending in "...", when a step such as loading the models
    takes over 2 s on a busy machine): the one-line error a CLI exits 2 with."""
    return len([line for line in err.splitlines() if line.strip() and not line.endswith("...")]) == 1


def check_tree_attention_and_greedy(pair, prompt, tokens: int) -> None:
    """A real pair's tree attention equals its sequential forwards (1e-5: float32 models) on a
    ``Delayed(2, 1, 2)`` tree at ``prompt``, and T = 0 speculative decoding with SpecInfer emits
    the greedy sequence for ``tokens`` tokens (the named pairs' slow whole-model checks)."""
    import numpy as np

    from simlab.builders import Delayed, iid
    from simlab.decoding import greedy_decode, speculative_decode
    from simlab.sampling import SamplingSettings
    from simlab.trees import NodeTable

    tree = Delayed(2, 1, 2).sample(NodeTable(pair, prompt), np.random.default_rng(0))
    np.testing.assert_allclose(
        pair.node_distributions(prompt, tree.nodes())[0],
        pair.distributions([prompt + path for path in tree.nodes()])[0],
        atol=1e-5,
    )
    greedy = pair.with_settings(SamplingSettings(temperature=0.0))
    decoded, _ = speculative_decode(greedy, prompt, iid(2, 2), "specinfer", tokens, np.random.default_rng(2))
    assert decoded == greedy_decode(greedy, prompt, tokens)
