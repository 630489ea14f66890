"""The parallel-drafter comparison and the sweep sharded across processes (``analyses._study``):
each rank values its share of the roots into its part, rank 0 merges, and the published tables are
one process's, byte for byte; the runs whose roots cannot be valued apart are refused with one line
(compare_builders, fitted then compared, is sharded in two stages: tests/test_compare_builders.py)."""

from __future__ import annotations


import pytest
from conftest import one_error_line
from shard_checks import assert_sharded_equals_one_process, no_charts

from analyses import _study, compare_builders, parallel_drafters, sweep

PARALLEL = ["--vocab", "8", "--trajectories", "1", "--roots-per-trajectory", "3", "--spacing", "3", "--budgets", "4"]
PARALLEL += ["--depth", "3", "--settings", "1", "--quiet"]
SWEEP = ["--latency", "sequoia-demo", "--trajectories", "2", "--roots-per-trajectory", "2", "--settings", "0,1"]
SWEEP += ["--vocab", "12", "--sequoia-budgets=", "--eagle-total-tokens", "6", "--eagle-depths", "2", "--eagle-top-ks", "1,2"]
SWEEP += ["--chain-lengths", "1,3", "--treegraft-budgets", "4", "--specblock-budgets", "4", "--quiet"]
TABLES = {
    parallel_drafters: ("parallel_drafters.parquet", "per_root.parquet"),
    sweep: ("sweep.parquet", "per_root.parquet", "by_position.parquet", "not_run.parquet"),
}


@pytest.fixture(autouse=True)
def _no_charts(monkeypatch):
    no_charts(monkeypatch, TABLES)


@pytest.mark.parametrize("module, argv", [(parallel_drafters, PARALLEL), (sweep, SWEEP)], ids=["parallel_drafters", "sweep"])
def test_a_sharded_run_equals_one_process(monkeypatch, tmp_path, module, argv):
    assert_sharded_equals_one_process(monkeypatch, tmp_path, module, argv, TABLES[module])


@pytest.mark.parametrize(
    "module, argv, reason",
    [
        (sweep, [a for a in SWEEP if a != "--sequoia-budgets="] + ["--sequoia-budgets", "4"], "Sequoia's acceptance vector"),
    ],
    ids=["sweep-sequoia"],
)
def test_a_run_whose_roots_share_a_fit_is_refused(monkeypatch, tmp_path, capsys, module, argv, reason):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as info:
        module.main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and one_error_line(err) and "WORLD_SIZE: 2 processes cannot share" in err and reason in err, err
    assert not (tmp_path / "o" / "parts").exists()


def test_declared_reads_a_study_module_by_its_conventional_names():
    namespace = {name: object() for name in _study.STUDY_NAMES.values()}
    study = _study.declared(namespace, error_flags={"k": "--x"})
    assert all(getattr(study, field) is namespace[name] for field, name in _study.STUDY_NAMES.items())
    assert study.error_flags == {"k": "--x"}
    bare = _study.declared({k: namespace[k] for k in ("PROG", "__doc__", "Config", "flags", "config_of", "open_source", "run")})
    assert bare.value_root is None and bare.merge is None and bare.values is None and bare.shardable is _study._never
    assert bare.sharded is None
    assert compare_builders.STUDY.hf_defaults is compare_builders.HF_DEFAULTS and compare_builders.STUDY.value_root is None
    assert compare_builders.STUDY.sharded is compare_builders.sharded  # fitted, then compared: two stages
    assert sweep.STUDY.value_root is sweep.value_root and sweep.STUDY.shardable is sweep.shardable
