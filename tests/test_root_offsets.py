"""The main job's node rows carry each root's offset into the target's reply (issue 39: the root
at the chat template's end told apart from roots inside the reply), only where roots have one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import polars as pl

from analyses import divergence_by_depth
from backends.sources.synthetic import SyntheticSource

FLAGS = ["--vocab", "16", "--trajectories", "2", "--roots-per-trajectory", "2", "--depth", "2", "--width", "2", "--k", "2"]


def _run(out: Path, monkeypatch, offsets: bool) -> dict[int, int]:
    given: dict[int, int] = {}
    monkeypatch.setattr(divergence_by_depth, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
    if offsets:
        plain = SyntheticSource.roots

        def roots(self, settings):
            for root in plain(self, settings):
                given[root.root] = 16 * (root.root % 2)
                yield dataclasses.replace(root, offset=given[root.root])

        monkeypatch.setattr(SyntheticSource, "roots", roots)
    assert divergence_by_depth.main([*FLAGS, "--out", str(out), "--quiet"]) == 0
    return given


def test_nodes_carry_the_roots_offsets(tmp_path, monkeypatch):
    given = _run(tmp_path / "with", monkeypatch, offsets=True)
    nodes = pl.read_parquet(tmp_path / "with" / "nodes.parquet")
    assert set(nodes["offset"].unique()) == {0, 16}
    for root, offset in given.items():
        assert set(nodes.filter(pl.col("root") == root)["offset"].unique()) == {offset}


def test_no_offset_column_without_offsets(tmp_path, monkeypatch):
    _run(tmp_path / "without", monkeypatch, offsets=False)
    assert "offset" not in pl.read_parquet(tmp_path / "without" / "nodes.parquet").columns
