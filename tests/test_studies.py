"""The studies behave like tools: outputs, identities, reproducibility, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from analyses import block_efficiency_grid, divergence_by_depth
from backends import cli as _tool
from conftest import one_error_line

SMALL = ["--vocab", "24", "--roots-per-trajectory", "3", "--depth", "3", "--width", "2", "--k", "3", "--quiet"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dbd")
    assert divergence_by_depth.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs_exist(small_run):
    for name in (
        "divergence_by_depth.parquet",
        "nodes.parquet",
        "divergence_by_depth.html",
        "divergence_by_depth.png",
        "acceptance_by_depth.html",
        "acceptance_by_depth.png",
    ):
        assert (small_run / name).stat().st_size > 0, name
    assert [p.name for p in small_run.iterdir() if p.name.startswith(".")] == [_tool.PUBLISHED]  # no temporary files left


def test_k1_acceptance_is_one_minus_tv(small_run):
    table = pl.read_parquet(small_run / "divergence_by_depth.parquet")
    for method in ("naive", "spectr", "specinfer", "rrs_wor", "khisti", "optimal"):
        diff = (table[f"alpha_{method}_k1_mean"] - (1 - table["tv_mean"])).abs().max()
        assert diff <= 1e-12, method


def test_same_seed_same_parquet_bytes(small_run, tmp_path):
    assert divergence_by_depth.main(SMALL + ["--out", str(tmp_path)]) == 0
    for name in ("divergence_by_depth.parquet", "nodes.parquet"):
        assert (tmp_path / name).read_bytes() == (small_run / name).read_bytes()


def test_table_printed(tmp_path, capsys):
    divergence_by_depth.main([a for a in SMALL if a != "--quiet"] + ["--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "Divergence by depth" in out and "Acceptance by depth" in out and "tv_mean" in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--world", "nope"], "--world"),
        (["--depth", "0"], "--depth"),
        (["--vocab", "1"], "--vocab"),
        (["--settings", "1:0"], "--settings: top-p"),
        (["--settings", "1:1.5"], "--settings: top-p"),
        (["--settings", "-1"], "--settings: temperature"),
        (["--depth", "x"], "--depth"),
        (["--shape", "star"], "--shape"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        divergence_by_depth.main(flags + ["--out", "/tmp/unused-simlab"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert one_error_line(err) and message in err


def test_unwritable_out(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as exc:
        divergence_by_depth.main(SMALL + ["--out", str(blocker / "sub")])
    assert exc.value.code == 2 and "--out" in capsys.readouterr().err


def test_command_line_entry_point(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "analyses.divergence_by_depth", "--depth", "0"], capture_output=True, text=True
    )
    assert result.returncode == 2 and one_error_line(result.stderr) and "--depth" in result.stderr


def test_interrupted_write_leaves_nothing(tmp_path):
    target = tmp_path / "x.parquet"

    def explode(tmp):
        Path(tmp).write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _tool.atomic_write(target, explode)
    assert list(tmp_path.iterdir()) == []


def test_output_set_discards_everything_on_interrupt(tmp_path):
    (tmp_path / "old.parquet").write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with _tool.OutputSet(tmp_path) as outputs:
            outputs.stage("old.parquet", lambda tmp: Path(tmp).write_bytes(b"new"))
            outputs.stage("other.png", lambda tmp: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.parquet"]
    assert (tmp_path / "old.parquet").read_bytes() == b"old"


def _publish(folder: Path, files: dict[str, bytes]) -> None:
    with _tool.OutputSet(folder) as outputs:
        for name, data in files.items():
            outputs.stage(name, lambda tmp, data=data: Path(tmp).write_bytes(data))
        outputs.publish()


def _old_publish(self) -> None:
    """The planted fault: ``OutputSet.publish`` before issue 40 (renames only; nothing removed)."""
    for name, tmp in self.staged:
        os.replace(tmp, self.folder / name)
    self.staged = []


def _stale_left(folder: Path) -> bool:
    """Two publishes into ``folder`` holding a user's file, the second without ``b.parquet``:
    True when a file of the first publish outlives the second (the user's file must survive)."""
    folder.mkdir()
    (folder / "mine.txt").write_text("the user's")
    _publish(folder, {"a.parquet": b"a1", "b.parquet": b"b1"})
    _publish(folder, {"a.parquet": b"a2"})
    assert (folder / "mine.txt").read_text() == "the user's" and (folder / "a.parquet").read_bytes() == b"a2"
    return (folder / "b.parquet").exists()


def test_a_publish_removes_the_files_of_the_last_publish_it_does_not_write(tmp_path, monkeypatch):
    """Issue 40, item 5: the folder holds only what the run wrote, beside files the lab did not
    write; the planted fault (the old publish) leaves the first run's file behind."""
    assert not _stale_left(tmp_path / "new")
    assert _tool.published(tmp_path / "new") == ["a.parquet"]
    monkeypatch.setattr(_tool.OutputSet, "publish", _old_publish)
    assert _stale_left(tmp_path / "old")


def test_a_publish_killed_between_its_renames_and_removals_is_finished_by_the_next(tmp_path, monkeypatch):
    """The list of published files is written before the renames with the files to be removed in
    it, so a run killed in between leaves every file of the lab listed: the next publish that does
    not write one removes it."""
    _publish(tmp_path, {"a.parquet": b"a1", "b.parquet": b"b1"})
    replace = os.replace

    def killed_after_renames(src, dst):
        replace(src, dst)
        if Path(dst).name == "c.parquet":
            raise KeyboardInterrupt

    monkeypatch.setattr(_tool.os, "replace", killed_after_renames)
    with pytest.raises(KeyboardInterrupt):
        _publish(tmp_path, {"a.parquet": b"a2", "c.parquet": b"c2"})
    monkeypatch.setattr(_tool.os, "replace", replace)
    assert (tmp_path / "c.parquet").exists() and (tmp_path / "b.parquet").exists()
    _publish(tmp_path, {"a.parquet": b"a3"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [_tool.PUBLISHED, "a.parquet"]


def test_only_listed_files_are_removed(tmp_path):
    """A publish removes only what the previous publish listed: a user's file named as a study's
    (``by_category.parquet`` in a folder with no list) stays; a name the list holds that is no plain
    file of the folder (a path, a folder, a hidden file) stays; an unreadable list removes nothing."""
    for name in ("by_category.parquet", "mine.txt", ".hidden"):
        (tmp_path / name).write_text("old")
    _publish(tmp_path, {"a.parquet": b"a"})
    assert (tmp_path / "by_category.parquet").read_text() == "old"
    (tmp_path / "sub").mkdir()
    (tmp_path / _tool.PUBLISHED).write_text(json.dumps({"files": ["../x", "sub", ".hidden", "/etc/passwd", 3]}))
    (tmp_path.parent / "x").write_text("outside")
    _publish(tmp_path, {"a.parquet": b"a"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".hidden",
        _tool.PUBLISHED,
        "a.parquet",
        "by_category.parquet",
        "mine.txt",
        "sub",
    ]
    assert (tmp_path.parent / "x").exists()
    (tmp_path / _tool.PUBLISHED).write_text("not json")  # an unreadable list removes nothing
    _publish(tmp_path, {"b.parquet": b"b"})
    assert (tmp_path / "a.parquet").exists() and _tool.published(tmp_path) == ["b.parquet"]


def test_outputs_are_readable_by_others(small_run):
    assert (small_run / "divergence_by_depth.parquet").stat().st_mode & 0o044 == 0o044


@pytest.mark.parametrize(
    "flags, message",
    [(["--seed", "-1"], "--seed"), (["--out", ""], "--out"), (["--depth", "1000"], "--depth"), (["--k", "20"], "--k")],
)
def test_more_bad_arguments(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        divergence_by_depth.main((["--out", "/tmp/unused-simlab"] if "--out" not in flags else []) + flags)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_grid_study_small(tmp_path, capsys):
    args = [
        "--vocab",
        "3",
        "--roots-per-trajectory",
        "2",
        "--K",
        "1,2",
        "--L1-max",
        "1",
        "--L2-max",
        "2",
        "--method",
        "auto",
        "--verifiers",
        "specinfer,bv",
        "--out",
        str(tmp_path),
    ]
    assert block_efficiency_grid.main(args) == 0
    table = pl.read_parquet(tmp_path / "block_efficiency_grid.parquet")
    assert table.height == 2 * 2 * 2 * 3 and set(table["method"]) == {"exact"}
    assert table.filter((pl.col("L1") == 0) & (pl.col("L2") == 0))["block_efficiency"].to_list() == [1.0] * 4
    assert "Best static delayed tree" in capsys.readouterr().out
    # the engines' metrics, exact here: E[tau] = E[tau + 1] - 1 (no EOS) = the sum of P(tau >= j)
    assert (table["accepted"] - (table["block_efficiency"] - 1)).abs().max() <= 1e-12
    positions = pl.read_parquet(tmp_path / "by_position.parquet")
    assert positions.height == 2 * 2 * sum(L1 + L2 for L1 in range(2) for L2 in range(3))
    summed = (
        positions.group_by("verifier", "K", "L1", "L2")
        .agg(pl.col("unconditional").sum())
        .join(table, on=["verifier", "K", "L1", "L2"])
    )
    assert (summed["unconditional"] - summed["accepted"]).abs().max() <= 1e-12
    assert (tmp_path / "block_efficiency_grid.png").stat().st_size > 0


def test_grid_study_bad_verifier(capsys):
    with pytest.raises(SystemExit) as exc:
        block_efficiency_grid.main(["--verifiers", "bogus"])
    assert exc.value.code == 2 and "--verifiers" in capsys.readouterr().err


LOSSY_SMALL = ["--vocab", "2", "--tokens", "2", "--epsilons", "0.09", "--alphas", "0.3", "--singles", "1", "--accs", "0.5,1"]


def test_lossy_rules_study_small(tmp_path, capsys):
    """The lossy-rules study (issue 26): outputs, the baseline's gain 1 and TV 0, SGLang's default
    thresholds exact on the top-k tree, a lossy knob's TV positive; the table on stdout."""
    from analyses import lossy_rules

    assert lossy_rules.main(LOSSY_SMALL + ["--out", str(tmp_path)]) == 0
    for name in ("lossy_rules.parquet", "gain_vs_tv.html", "gain_vs_tv.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = pl.read_parquet(tmp_path / "lossy_rules.parquet")
    base = table.filter(pl.col("knobs") == "-")
    assert base["gain"].to_list() == [1.0, 1.0] and max(base["TV"]) <= 1e-12
    default = table.filter((pl.col("knobs") == "single=1 acc=1") & pl.col("tree").str.starts_with("top-k"))
    assert default["TV"].item() <= 1e-12 and abs(default["gain"].item() - 1.0) <= 1e-12
    assert table.filter(pl.col("knobs") == "single=1 acc=0.5")["TV"].min() > 1e-4
    assert "Lossy rules against strict exact-match" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--vocab", "9"], "--vocab"),
        (["--accs", "1.5"], "--accs"),
        (["--epsilons", "x"], "--epsilons"),
        (["--tokens", "0"], "--tokens"),
        (["--closeness", "2"], "--closeness: must be in [0, 1]"),
        (["--concentration", "0"], "--concentration: must be a finite number > 0"),
        # issue 40, item 13: every numeric flag refused under its own name
        (["--seed", "-1"], "--seed: must be an integer in [0, 9223372036854775807], got -1"),
        (["--seed", str(2**63)], "--seed: must be an integer in [0, 9223372036854775807]"),
        (["--concentration", "inf"], "--concentration: must be a finite number > 0, got inf"),
        (["--concentration", "nan"], "--concentration: must be a finite number > 0, got nan"),
        (["--concentration", "1.7e308"], "--concentration: 1.7e+308 draws rows that are not laws"),
        (["--concentration", "1e-300"], "--concentration: the world of --seed 0 at concentration 1e-300 has a draft row"),
        (["--closeness", "inf"], "--closeness: must be in [0, 1]"),
        (["--closeness", "nan"], "--closeness: must be in [0, 1]"),
        (["--vocab", "1"], "--vocab: must be in 2..6"),
        (["--tokens", "5"], "--tokens: must be in 1..4"),
        (["--alphas", "inf"], "--alphas: every value must be in [0, 1e+09]"),
        (["--epsilons", "nan"], "--epsilons: every value must be in [0, 1]"),
        (["--singles", "-0.1"], "--singles: every value must be in [0, 1]"),
        (["--accs", ""], "--accs: expected comma-separated numbers, got an empty list"),
    ],
)
def test_lossy_rules_bad_arguments_exit_2_with_one_line(flags, message, capsys, tmp_path):
    from analyses import lossy_rules

    with pytest.raises(SystemExit) as exc:
        lossy_rules.main(flags + ["--out", str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert one_error_line(err) and message in err
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_main_job_engine_metrics_flag(small_run, tmp_path, capsys, monkeypatch):
    """--engine-metrics: one row per verifier, the engines' counters over the roots' drawn trees
    (``aggregate`` of ``tree_metrics`` of exactly those trees, whose E[tau + 1] the verifier's own
    ``expected_block_efficiency`` gives); the default output has no such file; a bad name exits 2."""
    from simlab import engine_metrics

    seen = []
    tree_metrics = engine_metrics.tree_metrics

    def recording(tree, verifier, **kwargs):
        seen.append((tree, verifier, tree_metrics(tree, verifier, **kwargs)))
        return seen[-1][2]

    monkeypatch.setattr(engine_metrics, "tree_metrics", recording)
    flags = ["--vocab", "12", "--roots-per-trajectory", "3", "--depth", "3", "--width", "2", "--k", "1", "--quiet"]
    assert divergence_by_depth.main(flags + ["--engine-metrics", "nss,specinfer", "--out", str(tmp_path / "a")]) == 0
    table = pl.read_parquet(tmp_path / "a" / "engine_metrics.parquet")
    assert table["verifier"].to_list() == ["nss", "specinfer"] and table["roots"].to_list() == [3, 3]
    for row in table.iter_rows(named=True):
        mine = [(t, v, m) for t, v, m in seen if v.name == row["verifier"]]
        assert len(mine) == 3
        for tree, verifier, m in mine:
            assert m.accept_length == pytest.approx(verifier.expected_block_efficiency(tree), abs=1e-12)
        total = engine_metrics.aggregate([m for *_, m in mine])
        assert row == pytest.approx({"verifier": row["verifier"], **total.row(), "roots": 3}, abs=1e-12, nan_ok=True)
    assert not (small_run / "engine_metrics.parquet").exists()  # off by default
    with pytest.raises(SystemExit) as exc:
        divergence_by_depth.main(flags + ["--engine-metrics", "bogus", "--out", str(tmp_path / "c")])
    assert exc.value.code == 2 and "--engine-metrics" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a declared-lossy verifier: refused, under the flag's name
        divergence_by_depth.main(flags + ["--engine-metrics", "typical", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: --engine-metrics: typical is not lossless" in err and len(err.splitlines()) == 1
    assert not any((tmp_path / "d").glob("*"))  # nothing written (the folder is made before the roots run)


def test_main_job_methods_flag(small_run, tmp_path, capsys):
    """--methods picks the acceptance columns: optimal_wor (alpha* drafting without replacement)
    is at least rrs_wor's acceptance and optimal's at every node (to rounding);
    the default columns are the seven of ACCEPTANCE_METHODS; a bad name exits 2 with one line."""
    from simlab.measures import ACCEPTANCE_METHODS

    default = pl.read_parquet(small_run / "nodes.parquet")
    assert {c.rsplit("_k", 1)[0][6:] for c in default.columns if c.startswith("alpha_")} == set(ACCEPTANCE_METHODS)
    flags = ["--vocab", "12", "--roots-per-trajectory", "2", "--depth", "2", "--width", "2", "--k", "3", "--quiet"]
    assert divergence_by_depth.main(flags + ["--methods", "rrs_wor,optimal,optimal_wor", "--out", str(tmp_path / "a")]) == 0
    nodes = pl.read_parquet(tmp_path / "a" / "nodes.parquet")
    assert sorted(c for c in nodes.columns if c.startswith("alpha_")) == sorted(
        f"alpha_{m}_k{k}" for m in ("rrs_wor", "optimal", "optimal_wor") for k in (1, 2, 3)
    )
    for k in (2, 3):
        wor, iid, rrs = (nodes[f"alpha_{m}_k{k}"].to_numpy() for m in ("optimal_wor", "optimal", "rrs_wor"))
        assert (wor >= iid - 1e-12).all() and (wor >= rrs - 1e-12).all()
    table = pl.read_parquet(tmp_path / "a" / "divergence_by_depth.parquet")
    assert "alpha_optimal_wor_k3_mean" in table.columns and "gain_optimal_wor" in table.columns
    with pytest.raises(SystemExit) as exc:
        divergence_by_depth.main(flags + ["--methods", "optimal,lp", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err.strip()) and "--methods: unknown lp" in err
    assert not (tmp_path / "b").exists()


def test_a_listed_file_the_user_changed_is_kept(tmp_path):
    """The list records each file's SHA-256: a file the lab wrote and the user has since overwritten
    is the user's, and a publish that no longer writes that name keeps it."""
    _publish(tmp_path, {"a.parquet": b"a1", "b.parquet": b"b1"})
    (tmp_path / "b.parquet").write_bytes(b"USER DATA")
    _publish(tmp_path, {"a.parquet": b"a2"})
    assert (tmp_path / "b.parquet").read_bytes() == b"USER DATA" and _tool.published(tmp_path) == ["a.parquet"]


def test_a_folder_where_a_file_goes_stops_the_publish_before_anything_is_replaced(tmp_path, capsys):
    """A published file replaced by a folder made the next publish fail half-way (some files new,
    some old, a raw IsADirectoryError): refused up front, one line, exit 2, nothing replaced."""
    _publish(tmp_path, {"a.parquet": b"a1", "b.parquet": b"b1"})
    (tmp_path / "b.parquet").unlink()
    (tmp_path / "b.parquet").mkdir()

    def body():
        _publish(tmp_path, {"a.parquet": b"a2", "b.parquet": b"b2"})
        return 0

    assert _tool.run_tool("prog", body) == 2
    err = capsys.readouterr().err
    assert err.startswith("prog: error: --out: ") and "is a folder" in err and err.count("\n") == 1
    assert (tmp_path / "a.parquet").read_bytes() == b"a1" and not list(tmp_path.glob(".simlab-staging-*"))
