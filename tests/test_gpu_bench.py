"""scripts/gpu_bench.py runs end to end in its CPU dry run and refuses a missing CUDA device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_bench.py"


def load():
    return load_script(SCRIPT)


def test_dry_run_writes_every_level(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert load().main(["--dry-run", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["environment"]["torch"] == torch.__version__
    levels = {(r["level"], r["verifier"]) for r in data["rows"]}
    assert {("node", v) for v in ("nss", "naive", "specinfer", "spectr")} <= levels
    assert {("tree", "specinfer"), ("grid", "specinfer"), ("grid", "spectr"), ("capture", "specinfer")} <= levels
    assert {("alpha*", "optimal"), ("ot_exact", "ot_exact")} <= levels
    assert all(r["cpu_per_s"] > 0 and r["device_per_s"] > 0 for r in data["rows"])
    assert "device /s" in capsys.readouterr().out


@pytest.mark.parametrize("fault", ["alpha", "node"])
def test_a_device_result_off_the_cpu_reference_stops_the_script(tmp_path, capsys, monkeypatch, fault):
    """Planted faults: the device's alpha* or node masses off by 1e-6: exit 1 naming the level, nothing written."""
    from simlab import batched

    name = {"alpha": "optimal_acceptance", "node": "children_mass"}[fault]
    real = getattr(batched, name)
    monkeypatch.setattr(batched, name, lambda *a, **kw: real(*a, **kw) + 1e-6)
    out = tmp_path / "bench.json"
    assert load().main(["--dry-run", "--out", str(out)]) == 1
    assert ("alpha*" if fault == "alpha" else "node nss") in capsys.readouterr().err
    assert not out.exists()


def test_cuda_missing_exits_2(tmp_path):
    if torch.cuda.is_available():
        return
    assert load().main(["--device", "cuda", "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_capture_memory_script_runs_at_a_tiny_size(capsys):
    module = load_script(SCRIPT.parent / "capture_memory.py")
    assert module.main(["--vocab", "300", "--depth", "1", "--samples", "1"]) == 0
    assert "peak RSS" in capsys.readouterr().out
    for argv, flag in [
        (["--vocab", "1"], "--vocab"),
        (["--pair", "smollm2", "--vocab", "300"], "--vocab"),
        (["--pair", "smollm2", "--models", "x"], "--models"),
        (["--pair", "nosuch"], "--pair"),
        (["--vocab", "300", "--labels", "nosuch"], "--labels"),
    ]:
        with pytest.raises(SystemExit) as exc:
            module.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"error: {flag}" in err, (argv, err)
