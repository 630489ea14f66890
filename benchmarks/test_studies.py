"""Each study's default run, one round: a study that slows down shows here.

Run:  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python -m pytest benchmarks/test_studies.py
      --benchmark-columns=min,rounds
(``-k NAME`` for one study).  Each runs ``python -m analyses.NAME`` with its defaults (``ddte_audit``
on one setting, T = 1: its default run, DDTE's eight settings, took 241 s CPU, over 3 minutes; both
in RESULTS.md), its output in a temporary folder, ``--quiet``; the times are recorded in
benchmarks/RESULTS.md, never asserted.
``compare_builders`` has its own file (test_compare_builders.py).  Not here, their measured times in
RESULTS.md instead: ``train_selector`` and ``evaluate_selector`` (a few minutes, the second on the
first's run); a pretrained pair's runs need its weights.
"""

import importlib
import json

import pytest

OUT = ["--out", "{tmp}/out", "--quiet"]
STUDIES = {
    "block_efficiency_grid": OUT,
    "compare_verifiers": OUT,
    "ddte_audit": ["--settings", "1", *OUT],  # one of DDTE's eight settings: its default run took 4 min CPU
    "divergence_by_depth": OUT,
    "lossy_rules": OUT,
    "parallel_drafters": OUT,
    "sequoia_tree": ["--acceptance", "{tmp}/acceptance.json"],  # no default vector; prints its tree, writes nothing
    "serve_estimate": ["--engine", "vllm", *OUT],  # --engine has no default: vLLM's default grid
    "specblock": OUT,
    "spectr_gbv": OUT,
    "sweep": OUT,
    "treegraft": OUT,
}
"""Study module -> the flags of its default run ({tmp}: a temporary folder)."""
ACCEPTANCE = [0.8, 0.1, 0.04, 0.02, 0.01, 0.01, 0.005, 0.005]
"""The acceptance vector ``sequoia_tree`` reads."""


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_study_default_run(benchmark, tmp_path, name):
    """``python -m analyses.<name>`` with its defaults, one round; it must exit 0."""
    (tmp_path / "acceptance.json").write_text(json.dumps(ACCEPTANCE))
    argv = [flag.format(tmp=tmp_path) for flag in STUDIES[name]]
    main = importlib.import_module(f"analyses.{name}").main
    code = benchmark.pedantic(main, args=(argv,), rounds=1, iterations=1)
    assert code in (0, None)
