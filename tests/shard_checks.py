"""What the sharded-study tests share: run every rank of a study in this process and compare the
published tables with a one-process run's, byte for byte."""

from __future__ import annotations

from pathlib import Path


def no_charts(monkeypatch, modules) -> None:
    """Each module's charts written as empty files: the tables are what a merge must reproduce (and
    PNGs are slow)."""
    for module in modules:
        monkeypatch.setattr(module, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))


def run_ranks(monkeypatch, module, argv, out: Path, world: int) -> None:
    """Ranks world-1 .. 1 write their parts, then rank 0 values its own share and merges."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "0")
    for rank in reversed(range(world)):
        monkeypatch.setenv("RANK", str(rank))
        assert module.main([*argv, "--out", str(out)]) == 0
    for name in ("RANK", "WORLD_SIZE", "SIMLAB_SHARD_WAIT"):
        monkeypatch.delenv(name)


def assert_sharded_equals_one_process(monkeypatch, tmp_path, module, argv, tables, world: int = 2) -> None:
    """A one-process run into ``tmp_path/one`` and a ``world``-rank run into ``tmp_path/many`` publish
    the same bytes for every file of ``tables``, and the ranks left one part each."""
    assert module.main([*argv, "--out", str(tmp_path / "one")]) == 0
    run_ranks(monkeypatch, module, argv, tmp_path / "many", world)
    for name in tables:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes(), name
    parts = sorted(p.name for p in (tmp_path / "many" / "parts").iterdir())
    assert parts == [f"rank-{r}-of-{world}.json" for r in range(world)]
