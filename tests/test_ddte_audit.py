"""The DDTE audit study as a tool: outputs, the exact convention inflating nothing, the lossy trunk
convention inflating Khisti and SpecTr but not SpecInfer's value nor Traversal, one-line errors."""

from __future__ import annotations

import polars as pl
import pytest

from analyses import ddte_audit

SMALL = ["--vocab", "8", "--trajectories", "2", "--settings", "1", "--samples", "1", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    assert ddte_audit.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs_and_inflation(run):
    for name in ("ddte_audit.parquet", "labels.parquet", "inflation.html", "inflation.png"):
        assert (run / name).stat().st_size > 0, name
    summary = pl.read_parquet(run / "ddte_audit.parquet")
    assert set(summary["convention"]) == set(ddte_audit.CONVENTIONS) and set(summary["verifier"]) == set(ddte_audit.VERIFIERS)
    by = {(r["verifier"], r["convention"]): r for r in summary.iter_rows(named=True)}
    assert all(by[(v, "exact")]["inflation"] == 0 for v in ddte_audit.VERIFIERS)
    assert by[("traversal", "per_path")]["max_inflation"] <= 1e-12 and by[("specinfer", "per_path")]["max_inflation"] <= 1e-12
    assert by[("khisti", "per_path")]["inflation"] > 0.01 and by[("spectr", "per_path")]["inflation"] > 0.01
    assert by[("specinfer", "four_step")]["inflation"] == 0  # four_step touches SpecTr only


@pytest.mark.parametrize("flags, flag", [(["--samples", "0"], "--samples"), (["--capture", "x"], "--capture"),
                                         (["--settings", "x"], "--settings")])
def test_bad_arguments_exit_2_with_one_line(flags, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        ddte_audit.main(flags + ["--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and flag in err, err
