"""Studies sharded across processes (``analyses._study``): each rank values its share of the roots
into its own part, rank 0 merges, and the published tables are those of one process, byte for
byte; a killed rank resumes from its part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyses import _study
from analyses import compare_verifiers as cv
from analyses import divergence_by_depth as dbd
from tests.conftest import one_error_line

ROOT = Path(__file__).resolve().parent.parent
DBD = ["--roots-per-trajectory", "5", "--depth", "2", "--trajectories", "2", "--draws", "root", "--k", "2", "--quiet"]
DBD += ["--width", "2", "--methods", "spectr,khisti,rrs_wor,optimal", "--child-samples", "4"]  # khisti, rrs_wor: sampled
CV = ["--K-max", "2", "--L-max", "2", "--samples", "2", "--verifiers", "specinfer,traversal", "--quiet"]
TABLES = {
    dbd: ("divergence_by_depth.parquet", "nodes.parquet"),
    cv: ("compare_verifiers.parquet", "grid.parquet", "by_position.parquet", "labels.parquet", "latency.json"),
}


@pytest.fixture(autouse=True)
def _no_charts(monkeypatch):
    """Empty chart files: the tables are what the merge must reproduce (and PNGs are slow)."""
    for module in (dbd, cv):
        monkeypatch.setattr(module, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))


def _rank(monkeypatch, module, argv, rank: int, world: int) -> int:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "0")
    try:
        return module.main(argv)
    finally:
        for name in ("RANK", "WORLD_SIZE", "SIMLAB_SHARD_WAIT"):
            monkeypatch.delenv(name)


def _sharded(monkeypatch, module, argv, out: Path, world: int) -> None:
    """Ranks world-1 .. 1 write their parts, then rank 0 values its own share and merges."""
    for rank in reversed(range(world)):
        assert _rank(monkeypatch, module, [*argv, "--out", str(out)], rank, world) == 0


def _same_tables(module, one: Path, many: Path) -> None:
    for name in TABLES[module]:
        assert (one / name).read_bytes() == (many / name).read_bytes(), name


def test_sharded_divergence_by_depth_equals_one_process(monkeypatch, tmp_path, world=3):
    assert dbd.main([*DBD, "--engine-metrics", "specinfer", "--out", str(tmp_path / "one")]) == 0
    _sharded(monkeypatch, dbd, [*DBD, "--engine-metrics", "specinfer"], tmp_path / "many", world)
    _same_tables(dbd, tmp_path / "one", tmp_path / "many")
    assert (tmp_path / "one" / "engine_metrics.parquet").read_bytes() == (
        tmp_path / "many" / "engine_metrics.parquet"
    ).read_bytes()
    parts = sorted(p.name for p in (tmp_path / "many" / "parts").iterdir())
    assert parts == [f"rank-{r}-of-{world}.json" for r in range(world)]
    held = {r: sorted(map(int, json.loads((tmp_path / "many" / "parts" / parts[r]).read_text())["roots"])) for r in range(world)}
    assert held == {r: list(range(r, 10, world)) for r in range(world)}  # round-robin by root index


def test_sharded_compare_verifiers_over_a_capture_equals_one_process(monkeypatch, tmp_path, grid_capture):
    argv = [*CV, "--capture", str(grid_capture)]
    assert cv.main([*argv, "--out", str(tmp_path / "one")]) == 0
    _sharded(monkeypatch, cv, argv, tmp_path / "many", 2)
    _same_tables(cv, tmp_path / "one", tmp_path / "many")


def test_sharded_compare_verifiers_over_settings_and_trajectories(monkeypatch, tmp_path):
    argv = [*CV, "--settings", "1,0.6", "--trajectories", "2", "--roots-per-trajectory", "2", "--jobs", "1"]
    assert cv.main([*argv, "--out", str(tmp_path / "one")]) == 0
    _sharded(monkeypatch, cv, argv, tmp_path / "many", 3)
    _same_tables(cv, tmp_path / "one", tmp_path / "many")


@pytest.mark.parametrize("batch, seconds", [(1, 30.0), (100, 0.0)], ids=["every-root", "every-root-by-time"])
def test_a_killed_rank_resumes_from_its_part(monkeypatch, tmp_path, batch, seconds):
    """Rank 1 dies after its 3rd root (its part, written per root here: by count, or by the time
    since its last rewrite, holds 3 roots); its rerun values only the other 2, a further rerun
    none, and rank 0's merge equals one process."""
    monkeypatch.setattr(_study, "SHARD_BATCH", batch)
    monkeypatch.setattr(_study, "SHARD_SECONDS", seconds)
    argv = [*DBD, "--out", str(tmp_path / "many")]
    calls = []
    plain = dbd.value_root

    def dying(config, opened, task):
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process dies here: its part holds what it wrote before
        calls.append(task.index)
        return plain(config, opened, task)

    study = dbd.STUDY.__class__(**{**dbd.STUDY.__dict__, "value_root": dying})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _study.run_study(study, argv) == 130
    part = json.loads((tmp_path / "many" / "parts" / "rank-1-of-2.json").read_text())
    assert not part["complete"] and sorted(map(int, part["roots"])) == [1, 3, 5]
    calls.clear()
    counted = dbd.STUDY.__class__(**{**dbd.STUDY.__dict__, "value_root": lambda *a: calls.append(a[2].index) or plain(*a)})
    assert _study.run_study(counted, argv) == 0
    assert calls == [7, 9]
    assert _study.run_study(counted, argv) == 0
    assert calls == [7, 9]  # a complete part is not recomputed
    monkeypatch.setenv("RANK", "0")
    assert _study.run_study(dbd.STUDY, argv) == 0
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert dbd.main([*DBD, "--out", str(tmp_path / "one")]) == 0
    _same_tables(dbd, tmp_path / "one", tmp_path / "many")


def test_a_part_is_used_only_for_the_roots_it_valued(monkeypatch, tmp_path):
    """A part's root whose identity (setting, root id, context) is not the run's root of that index,
    as after a capture is recaptured under the same flags, is valued again; rank 0 does not merge a
    part that lacks a root of its share or holds another root (exit 2, one line)."""
    argv = [*DBD, "--out", str(tmp_path / "many")]
    path = tmp_path / "many" / "parts" / "rank-1-of-2.json"
    calls = []
    plain = dbd.value_root
    counted = dbd.STUDY.__class__(**{**dbd.STUDY.__dict__, "value_root": lambda *a: calls.append(a[2].index) or plain(*a)})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "0")
    assert _study.run_study(counted, argv) == 0 and calls == [1, 3, 5, 7, 9]
    part = json.loads(path.read_text())
    part["ids"]["3"] = "0" * 16  # root 3 of the part is another root than the run's root 3
    path.write_text(json.dumps(part))
    calls.clear()
    assert _study.run_study(counted, argv) == 0 and calls == [3]
    assert json.loads(path.read_text())["ids"]["3"] != "0" * 16
    for tamper in ("ids", "roots"):
        part = json.loads(path.read_text())
        good = json.loads(path.read_text())
        if tamper == "ids":
            part["ids"]["5"] = "0" * 16
        else:
            del part["roots"]["5"], part["ids"]["5"]
        path.write_text(json.dumps(part))
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(SystemExit) as exit_:
            _study.run_study(dbd.STUDY, argv)
        assert exit_.value.code == 2
        assert not (tmp_path / "many" / "divergence_by_depth.parquet").exists()
        path.write_text(json.dumps(good))
        monkeypatch.setenv("RANK", "1")


def test_a_part_of_another_run_is_not_reused(monkeypatch, tmp_path):
    out = tmp_path / "many"
    assert _rank(monkeypatch, dbd, [*DBD, "--seed", "1", "--out", str(out)], 1, 2) == 0
    _sharded(monkeypatch, dbd, DBD, out, 2)
    assert dbd.main([*DBD, "--out", str(tmp_path / "one")]) == 0
    _same_tables(dbd, tmp_path / "one", out)


@pytest.mark.parametrize(
    "env, argv, message",
    [
        ({"RANK": "2", "WORLD_SIZE": "2"}, [*DBD, "--out", "{out}"], "RANK: 2 is not a rank of WORLD_SIZE 2"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, DBD, "--out: a sharded run"),
        ({"WORLD_SIZE": "2"}, [*DBD, "--out", "{out}"], "RANK: not set, but WORLD_SIZE is 2"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, ["--depth", "2", "--out", "{out}"], "--draws shared continues one generator"),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "SIMLAB_SHARD_WAIT": "0"},
            [*DBD, "--out", "{out}"],
            "ranks 1 of 2 left no complete part",
        ),
        ({"RANK": "0", "WORLD_SIZE": "2", "SIMLAB_SHARD_WAIT": "abc"}, [*DBD, "--out", "{out}"], "SIMLAB_SHARD_WAIT: must be"),
    ],
)
def test_sharding_refusals_are_one_line(monkeypatch, tmp_path, capsys, env, argv, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        dbd.main([a.replace("{out}", str(tmp_path / "o")) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and one_error_line(err)


@pytest.mark.parametrize(
    "module, argv",
    [
        ("lossy_rules", ["--quiet"]),
        ("spectr_gbv", ["--quiet"]),
        ("divergence_by_depth", ["--backend", "hf", "--target", "{out}-t", "--draft", "{out}-d", "--quiet"]),
        ("compare_builders", ["--backend", "hf", "--target", "{out}-t", "--draft", "{out}-d", "--latency", "probe", "--quiet"]),
    ],
)
def test_a_refused_sharded_run_writes_nothing(monkeypatch, tmp_path, capsys, module, argv):
    """Reasons the flags alone decide are given before the study opens anything: no --out folder,
    no capture of live models, one line."""
    import importlib

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    out = tmp_path / "o"
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(f"analyses.{module}").main([a.replace("{out}", str(out)) for a in [*argv, "--out", "{out}"]])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "WORLD_SIZE: 2 processes cannot share this run" in err and one_error_line(err)
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_torchrun_two_processes_over_a_capture(tmp_path, grid_capture):
    """``torchrun --nproc_per_node 2`` on CPU gives the one-process tables byte for byte."""
    torchrun = Path(sys.executable).parent / "torchrun"
    argv = ["-m", "analyses.compare_verifiers", *CV, "--capture", str(grid_capture)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, *argv, "--out", str(tmp_path / "one")], cwd=ROOT, env=env, capture_output=True)
    assert one.returncode == 0, one.stderr
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", "--no-python", sys.executable, *argv]
    many = subprocess.run([*command, "--out", str(tmp_path / "many")], cwd=ROOT, env=env, capture_output=True)
    assert many.returncode == 0, many.stderr
    _same_tables(cv, tmp_path / "one", tmp_path / "many")


@pytest.mark.parametrize(
    "world, device, cuda, expected",
    [
        (2, "auto", True, "cuda:1"),  # the rank's own GPU (LOCAL_RANK 1), as the capture picks it
        (2, "auto", False, "cpu"),
        (2, "cpu", True, "cpu"),  # an explicit --device is honoured as given
        (2, "cuda:0", True, "cuda:0"),
        (2, "cuda", True, "cuda:1"),  # bare cuda is the rank's own GPU too, not GPU 0 for every rank
        (2, "cuda", False, "cuda"),  # refused where the models open
        (1, "cuda", True, "cuda"),
        (1, "auto", True, "auto"),  # one process: resolved where the models open
    ],
)
def test_shard_device_is_the_local_rank_gpu_for_auto(monkeypatch, world, device, cuda, expected):
    import torch

    from backends.cli import shard_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    assert shard_device(device, world, 1) == expected


def test_shard_device_wraps_the_local_rank_over_the_gpus_the_process_sees(monkeypatch):
    """A launcher that shows each rank only its own GPU (``CUDA_VISIBLE_DEVICES``) gives every
    rank ``cuda:0``, not ``cuda:LOCAL_RANK`` (which would not exist in that process)."""
    import torch

    from backends.cli import shard_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert [shard_device("auto", 4, local) for local in range(4)] == ["cuda:0"] * 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [shard_device("cuda", 4, local) for local in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]


class _Opened(Exception):
    """Raised by the stand-in for ``HFSource``: the device it was asked for is all the test needs."""


@pytest.mark.parametrize(
    "flags, expected",
    [([], "cuda:1"), (["--device", "auto"], "cuda:1"), (["--device", "cuda"], "cuda:1"), (["--device", "cpu"], "cpu")],
)
def test_a_sharded_study_opens_live_models_on_the_local_rank_gpu(monkeypatch, tmp_path, flags, expected):
    """Under ``torchrun --nproc_per_node 2`` rank 1 opens its live models on ``cuda:1`` with ``--device
    auto`` (no GPU here: CUDA is made to look usable and ``HFSource`` only records its device)."""
    import torch

    from analyses import _flags

    seen = []

    def opened(*args, device, **kwargs):
        seen.append(device)
        raise _Opened

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(_flags, "HFSource", opened)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    argv = ["--backend", "hf", "--target", "org/target", "--draft", "org/draft", "--cost-ratio", "0.1", *flags]
    with pytest.raises(_Opened):
        cv.main([*argv, "--quiet", "--out", str(tmp_path / "o")])
    assert seen == [expected]


def test_a_rank_shows_its_progress_counting_the_roots_its_part_holds(monkeypatch, tmp_path, capsys):
    """A rank's bar on stderr ("rank R roots") starts at the roots its part already holds."""
    monkeypatch.setattr(_study, "SHARD_BATCH", 1)
    argv = [a for a in DBD if a != "--quiet"] + ["--out", str(tmp_path / "many")]
    plain, calls = dbd.value_root, []

    def dying(config, opened, task):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(task.index)
        return plain(config, opened, task)

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _study.run_study(dbd.STUDY.__class__(**{**dbd.STUDY.__dict__, "value_root": dying}), argv) == 130
    first = capsys.readouterr().err
    assert "rank 1 roots:" in first and "3/5" in first and "5/5" not in first
    assert _study.run_study(dbd.STUDY, argv) == 0
    resumed = capsys.readouterr().err
    assert "resuming" in resumed and "rank 1 roots:  60%" in resumed and "5/5" in resumed and "0/5" not in resumed


def test_rank_0_says_why_a_part_is_not_this_runs(monkeypatch, tmp_path, capsys):
    """Rank 0 names each missing rank's state: no part yet, or a part of another run (rank 1 was
    given other flags), while it waits and in its error line when the wait ends."""
    out = tmp_path / "many"
    argv = [a for a in DBD if a != "--quiet"] + ["--out", str(out)]
    for state in ("rank 1: no part yet", "rank 1: its part is of another run"):
        if "another" in state:  # rank 1 started with another seed
            assert _rank(monkeypatch, dbd, [*DBD, "--seed", "1", "--out", str(out)], 1, 2) == 0
        capsys.readouterr()
        for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("SIMLAB_SHARD_WAIT", "1.5")):
            monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as exit_:
            dbd.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"waiting for the parts of ranks 1 of 2 ({state}" in err, err
        assert err.strip().splitlines()[-1].count(state) == 1 and "rerun them with the same flags" in err
    assert not (out / "divergence_by_depth.parquet").exists()


def test_part_state_names_each_kind_from_one_read(tmp_path):
    """``part_state`` classifies the part as read once: none (naming parts of another WORLD_SIZE),
    unreadable (truncated or not an object), another run's, in progress (counting only the share's
    own roots) and stale; ``_load_part`` tells a missing file from a damaged one."""
    state, key, expected = _study.part_state, "k", {"0": "a", "1": "b", "2": "c", "3": "d"}
    assert state(_study._MISSING, key, 1, 2, expected, tmp_path) == ("none", "no part yet")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "rank-1-of-3.json").write_text('{"key": "k"')  # truncated, and of W = 3
    assert _study._load_part(tmp_path / "parts" / "rank-1-of-3.json") == _study._UNREADABLE
    assert _study._load_part(tmp_path / "parts" / "rank-1-of-2.json") == _study._MISSING
    none = state(_study._MISSING, key, 1, 2, expected, tmp_path)
    assert none == ("none", "no part yet (rank-1-of-3.json there: started with another WORLD_SIZE)")
    for raw in (_study._UNREADABLE, None, [1]):
        assert state(raw, key, 1, 2, expected, tmp_path)[0] == "unreadable"
    assert state({"key": "other"}, key, 1, 2, expected, tmp_path)[0] == "other"
    stale_ids = {"key": key, "complete": False, "roots": {"1": 0, "3": 0, "5": 0}, "ids": {"1": "b", "3": "x", "5": "z"}}
    assert state(stale_ids, key, 1, 2, expected, tmp_path) == ("progress", "in progress, 1 of 2 roots")
    assert state({**stale_ids, "complete": True}, key, 1, 2, expected, tmp_path)[0] == "stale"


def test_the_run_key_follows_the_code_of_every_lab_package(monkeypatch):
    """``run_key`` digests every module of ``simlab``, ``backends`` and ``analyses`` (a part written
    by other code is never reused): changing one module's bytes, in any of the three, changes it."""
    import simlab.otlp
    import backends.capture_store
    import analyses._builder_roster

    config, _ = dbd.parse_args(DBD)
    key = _study.run_key(dbd.STUDY, config, 2)
    assert key == _study.run_key(dbd.STUDY, config, 2) and key != _study.run_key(dbd.STUDY, config, 2, stage="fit")
    read = Path.read_bytes
    for module in (simlab.otlp, backends.capture_store, analyses._builder_roster):
        edited = Path(module.__file__).resolve()
        monkeypatch.setattr(Path, "read_bytes", lambda self, e=edited: read(self) + (b"#" if self.resolve() == e else b""))
        assert _study.run_key(dbd.STUDY, config, 2) != key, module.__name__
        monkeypatch.setattr(Path, "read_bytes", read)
