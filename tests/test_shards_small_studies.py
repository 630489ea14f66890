"""``analyses.block_efficiency_grid``, ``lossy_rules``, ``spectr_gbv`` and ``sequoia_tree`` on the study
runner (``analyses._study``): the grid study sharded over two ranks publishes the one-process
tables byte for byte; the studies that value no roots refuse ``WORLD_SIZE`` > 1 in one line; the
configs hold their lists parsed once (tuples of numbers and names)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyses import block_efficiency_grid, lossy_rules, sequoia_tree, spectr_gbv
from conftest import one_error_line

GRID = ["--vocab", "3", "--trajectories", "2", "--roots-per-trajectory", "2", "--K", "1,2", "--L1-max", "1", "--L2-max", "1"]
GRID += ["--method", "mc", "--samples", "2", "--verifiers", "specinfer,bv", "--quiet"]
TABLES = ("block_efficiency_grid.parquet", "by_position.parquet")


def _grid_run(out: Path, monkeypatch, rank: int | None = None) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(block_efficiency_grid, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
        if rank is not None:
            patch.setenv("RANK", str(rank))
            patch.setenv("WORLD_SIZE", "2")
            patch.setenv("SIMLAB_SHARD_WAIT", "5")
        assert block_efficiency_grid.main([*GRID, "--out", str(out)]) == 0


def test_two_ranks_publish_the_one_process_tables_byte_for_byte(tmp_path, monkeypatch):
    """Rank 1 values roots 1 and 3 into its part, rank 0 roots 0 and 2 and merges: the mc trees
    are seeded by the root's index in the run, so both tables equal a one-process run's bytes."""
    _grid_run(tmp_path / "one", monkeypatch)
    _grid_run(tmp_path / "two", monkeypatch, rank=1)
    assert not (tmp_path / "two" / TABLES[0]).exists()  # rank 1 publishes nothing
    _grid_run(tmp_path / "two", monkeypatch, rank=0)
    part = json.loads((tmp_path / "two" / "parts" / "rank-1-of-2.json").read_text())
    assert part["complete"] and sorted(part["roots"]) == ["1", "3"]
    for name in TABLES:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


@pytest.mark.parametrize(
    "module, flags",
    [
        (lossy_rules, ["--vocab", "2", "--epsilons", "0.1", "--alphas", "1", "--singles", "1", "--accs", "1"]),
        (spectr_gbv, ["--seeds", "1", "--ks", "1", "--gammas", "2"]),
        (sequoia_tree, ["--acceptance", "ACC"]),
    ],
    ids=["lossy_rules", "spectr_gbv", "sequoia_tree"],
)
def test_a_study_without_roots_refuses_to_be_sharded(module, flags, tmp_path, monkeypatch, capsys):
    (tmp_path / "acc.json").write_text(json.dumps([0.55, 0.2, 0.1]))
    flags = [str(tmp_path / "acc.json") if f == "ACC" else f for f in flags]
    if module is not sequoia_tree:
        flags += ["--out", str(tmp_path / "out")]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "1")  # a run that shards anyway fails in a second, not a day
    with pytest.raises(SystemExit) as exc:
        module.main(flags)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    assert "WORLD_SIZE: 2 processes cannot share this run (the study values no roots: " in err, err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_the_configs_hold_their_lists_parsed_once(tmp_path):
    out = ["--out", str(tmp_path / "out")]
    config, _ = lossy_rules.parse_args(["--epsilons", "0.1,1", "--rules", "lenience,cos", "--leniences", "0.5", *out])
    assert config.epsilons == (0.1, 1.0) and config.alphas == (0.3, 1.0, 1e9) and config.rules == ("lenience", "cos")
    assert config.leniences == (0.5,) and config.cos_lambdas == (0.2, 0.4, 0.6, 0.8)
    assert lossy_rules.parse_args(["--alphas", "0.3,1,1e9", "--weights", "0.2,0.4,0.6,0.8", *out])[0] == lossy_rules.Config(
        out=out[1]
    )  # a grid no rule reads may be given at its default text
    config, _ = spectr_gbv.parse_args(["--seeds", "3,1", "--closeness", "0.5", *out])
    assert (config.seeds, config.closeness, config.ks, config.gammas) == ((3, 1), (0.5,), (1, 2, 3, 7), (2, 3, 4, 6))
    config, _ = block_efficiency_grid.parse_args(["--K", "3,1", "--verifiers", "bv,specinfer", *out])
    assert config.K == (3, 1) and config.verifiers == ("bv", "specinfer")
    assert not (tmp_path / "out").exists()
