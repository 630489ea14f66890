"""TreeGraft and SpecBlock sharded across processes (``analyses._study``): each rank values its
share of the roots into its part, rank 0 merges, and the published tables are one process's, byte
for byte."""

from __future__ import annotations


import pytest

from shard_checks import assert_sharded_equals_one_process, no_charts

from analyses import specblock, treegraft

TREEGRAFT = ["--vocab", "12", "--trajectories", "3", "--roots-per-trajectory", "1", "--spacing", "6", "--budget", "6"]
TREEGRAFT += ["--top-k", "2", "--depth", "2", "--fixed", "1,0", "--epochs", "2", "--quiet"]
SPECBLOCK = ["--vocab", "12", "--trajectories", "2", "--roots-per-trajectory", "2", "--spacing", "6", "--budgets", "4,6"]
SPECBLOCK += ["--K", "2", "--beam-width", "2", "--eagle-depth", "2", "--eagle-top-k", "2", "--quiet"]
TABLES = {
    treegraft: ("treegraft.parquet", "per_root.parquet", "schedules.parquet"),
    specblock: ("specblock.parquet", "per_root.parquet", "by_depth.parquet", "by_slot.parquet", "not_run.parquet"),
}


@pytest.fixture(autouse=True)
def _no_charts(monkeypatch):
    no_charts(monkeypatch, TABLES)


@pytest.mark.parametrize("module, argv", [(treegraft, TREEGRAFT), (specblock, SPECBLOCK)], ids=["treegraft", "specblock"])
def test_a_sharded_run_equals_one_process(monkeypatch, tmp_path, module, argv):
    assert_sharded_equals_one_process(monkeypatch, tmp_path, module, argv, TABLES[module])
