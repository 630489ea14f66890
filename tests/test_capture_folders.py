"""Capture folders hold one capture (issue 28): settings.json written by every rank before its
first shard, a folder held by one run at a time (the ranks of one run together), every shard
stamped with the hash of its settings and refused by the readers when it differs, RANK,
WORLD_SIZE and settings.json fields validated with one line."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from backends import capture_store as store
from backends.capture import main
from backends.capture_lock import lock_path
from backends.sources.replay import CaptureSource
from conftest import capture_flags, one_error_line, write_prompts


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts"), 2)


def flags(pair_dir, prompts, out, *extra):
    return capture_flags(pair_dir, prompts, out, "--depth", "1", "--width", "2", "--roots-per-forward", "1", *extra)


def grid_flags(pair_dir, prompts, out, *extra):
    return capture_flags(
        pair_dir,
        prompts,
        out,
        "--shape",
        "grid",
        "--width",
        "2",
        "--depth",
        "1",
        "--samples",
        "2",
        "--labels",
        "specinfer",
        "--roots-per-forward",
        "1",
        "--full",
        *extra,
    )


def exit_2(capsys, call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    return err


# -- settings.json written by every rank ---------------------------------------------------------------------------
def test_a_rank_alone_writes_the_settings_so_a_run_with_others_is_refused(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    """Issue 28 (a): RANK=1 WORLD_SIZE=2 alone wrote shards but no settings.json; a run at T = 0.5
    into the folder then succeeded, its settings.json over roots drawn at T = 1."""
    out = tmp_path / "rank1"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    assert store.load_settings(out).temperature == 1.0 and store.completed_roots(out) == [1]
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out, "--temperature", "0.5")))
    assert "other settings (temperature 1.0, not 0.5)" in err
    assert store.completed_roots(out) == [1] and not list(out.glob("lock-*"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(flags(micro_pair_dir, prompts, out)) == 0  # its fellow rank completes it
    assert store.read_capture(out)["root"].unique().to_list() == [0, 1]


def test_a_folder_with_shards_and_no_settings_is_refused(micro_pair_dir, prompts, tmp_path, capsys):
    out = tmp_path / "orphans"
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    (out / "settings.json").unlink()  # as a rank > 0 alone left its folders before the fix
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out)))
    assert "holds capture shards but no settings.json" in err


def test_a_run_whose_folder_got_other_settings_while_it_loaded_is_refused(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    """Issue 28 (b): A checks the settings and loads its models; meanwhile B (a run that did not
    take the folder's lock: an older version, another machine) writes its settings (T = 0.5) and
    a shard; A resumes: refused, with no shard of its own written (before: A exited 0 and wrote
    T = 1 roots under B's settings.json)."""
    import backends.pretrained as pretrained

    out = tmp_path / "raced"
    original = pretrained.HFPair  # what the capture's open_pair builds

    class WhileALoads(original):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            store.save_settings(out, store.load_settings(tmp_path / "b"))
            shutil.copy(store.shard_path(tmp_path / "b", 0), store.shard_path(out, 0))

    assert main(flags(micro_pair_dir, prompts, tmp_path / "b", "--temperature", "0.5")) == 0
    monkeypatch.setattr(pretrained, "HFPair", WhileALoads)
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out)))
    assert "other settings (temperature 0.5, not 1.0)" in err
    assert store.completed_roots(out) == [0] and store.read_capture(out).equals(store.read_nodes(tmp_path / "b", 0))


def test_settings_rewritten_during_a_run_stop_it_before_its_next_shard(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    import backends.capture as capture_module

    out = tmp_path / "rewritten"
    original, calls = capture_module.capture_group, [0]

    def rewrite_after_the_first(*args):
        calls[0] += 1
        if calls[0] == 2:
            store.save_settings(out, dataclasses.replace(store.load_settings(out), seed=7))
        return original(*args)

    monkeypatch.setattr(capture_module, "capture_group", rewrite_after_the_first)
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out)))
    assert "settings.json changed during this run" in err and store.completed_roots(out) == [0]


# -- one run at a time ---------------------------------------------------------------------------------------------
HELD_LOCK = """
import pathlib, sys, time
from backends.capture_lock import CaptureLock
out, rank, world, digest, gate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], pathlib.Path(sys.argv[5])
with CaptureLock(out, rank, world, digest):
    print("holding", flush=True)
    while not gate.exists():
        time.sleep(0.05)
"""


def _run_hash(argv) -> str:
    from backends.capture import parse_args, run_settings
    from backends.roots import read_prompt_records

    settings, _, device, _, engine, _ = parse_args(argv)
    return store.settings_hash(run_settings(settings, read_prompt_records(settings.prompts), device, engine))


def test_a_folder_is_held_by_one_run_and_shared_by_its_ranks(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys):
    """Another process holds the folder as rank 0 of 2 of a capture (its lock only: a light
    process): a run with other settings or another WORLD_SIZE is refused with one line naming it,
    rank 0 again too; its fellow rank 1 (same settings and WORLD_SIZE) captures beside it."""
    out, gate = tmp_path / "held", tmp_path / "gate"
    out.mkdir()
    argv = flags(micro_pair_dir, prompts, out)
    holder = subprocess.Popen(
        [sys.executable, "-c", HELD_LOCK, str(out), "0", "2", _run_hash(argv), str(gate)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        owner = json.loads(lock_path(out, 0).read_text())
        assert owner["pid"] == holder.pid and owner["rank"] == 0 and owner["world_size"] == 2
        err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, out, "--seed", "3")))
        assert f"is being captured into by another run with other settings: process {holder.pid} on" in err
        assert "another WORLD_SIZE" in exit_2(capsys, lambda: main(argv))  # WORLD_SIZE 1
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert f"rank 0 of this capture, already running: process {holder.pid}" in exit_2(capsys, lambda: main(argv))
        monkeypatch.setenv("RANK", "1")
        assert main(argv) == 0  # the fellow rank
        assert store.completed_roots(out) == [1] and not lock_path(out, 1).exists() and lock_path(out, 0).exists()
    finally:
        gate.touch()
        holder.wait(timeout=60)
    assert holder.returncode == 0 and not list(out.glob("lock-*"))


HELD_CAPTURE = """
import pathlib, sys, time
from backends import capture, pretrained
gate, original = pathlib.Path(sys.argv[1]), pretrained.HFPair
class Held(original):  # holds the folder (its lock is taken before the models load) until the gate opens
    def __init__(self, *args, **kwargs):
        print("holding", flush=True)
        while not gate.exists():
            time.sleep(0.05)
        super().__init__(*args, **kwargs)
pretrained.HFPair = Held  # what the capture's open_pair builds
sys.exit(capture.main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_two_capture_processes_the_second_refused_while_the_first_holds(micro_pair_dir, prompts, tmp_path):
    out, gate = tmp_path / "held", tmp_path / "gate"
    argv = flags(micro_pair_dir, prompts, out)
    first = subprocess.Popen(
        [sys.executable, "-c", HELD_CAPTURE, str(gate), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout.readline().strip() == "holding"
        second = subprocess.run(
            [sys.executable, "-m", "backends.capture", *flags(micro_pair_dir, prompts, out, "--seed", "3")],
            capture_output=True,
            text=True,
        )
        assert second.returncode == 2 and one_error_line(second.stderr) and f"process {first.pid} on" in second.stderr, (
            second.stderr
        )
    finally:
        gate.touch()
        first.wait(timeout=120)
    assert first.returncode == 0, first.stderr.read()
    assert store.completed_roots(out) == [0, 1] and not list(out.glob("lock-*"))


def test_a_dead_runs_lock_is_taken_over_with_a_note(micro_pair_dir, prompts, tmp_path, capsys):
    """A lock whose process is gone (here one that ran and exited; SIGKILL: test_capture's rerun)."""
    out = tmp_path / "stale"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    for rank in (0, 3):
        lock_path(out, rank).write_text(
            json.dumps({"pid": int(dead), "host": "elsewhere", "rank": rank, "world_size": 4, "settings_sha256": "0" * 64})
        )
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    err = capsys.readouterr().err
    assert f"taking over the stale lock lock-rank0.json of process {dead} on elsewhere (no longer running)" in err
    assert f"removing the stale lock lock-rank3.json of process {dead} on elsewhere (no longer running)" in err
    assert store.completed_roots(out) == [0, 1] and not list(out.glob("lock-*"))


# -- the settings hash in every shard -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_captures(micro_pair_dir, prompts, tmp_path_factory):
    """Two labelled grid captures (--full) of the same roots, at seeds 0 and 1."""
    a, b = tmp_path_factory.mktemp("seed0"), tmp_path_factory.mktemp("seed1")
    assert main(grid_flags(micro_pair_dir, prompts, a)) == 0
    assert main(grid_flags(micro_pair_dir, prompts, b, "--seed", "1")) == 0
    return a, b


def _readers(folder):
    return {
        "read_capture": lambda: store.read_capture(folder),
        "read_labels": lambda: store.read_labels(folder).collect(),
        "read_grid_drafts": lambda: list(store.read_grid_drafts(folder)),
        "read_logits": lambda: store.read_logits(folder, 0),
        "CapturedPair": lambda: store.CapturedPair(folder),
        "CaptureSource": lambda: list(CaptureSource([str(folder)]).roots(CaptureSource([str(folder)]).fixed_settings()[0])),
        "tree CaptureSource": lambda: CaptureSource([str(folder)], grid=False),
    }


@pytest.mark.parametrize("shard", ["nodes", "drafts", "labels", "logits"])
def test_readers_refuse_a_shard_drawn_under_other_settings(two_captures, tmp_path, shard):
    a, b = two_captures
    mixed = tmp_path / "mixed"
    shutil.copytree(a, mixed)
    name = {"nodes": store.shard_path, "drafts": store.drafts_path, "labels": store.labels_path, "logits": store.logits_path}[
        shard
    ]
    shutil.copy(name(b, 0), name(mixed, 0))  # root 0 of the seed-1 capture in the seed-0 folder
    for reader, read in _readers(mixed).items():
        touches = {
            "nodes": {"read_capture", "CapturedPair", "tree CaptureSource", "CaptureSource"},
            "drafts": {"read_grid_drafts", "CaptureSource"},
            "labels": {"read_labels", "CaptureSource"},
            "logits": {"read_logits", "CapturedPair", "CaptureSource"},
        }[shard]
        if reader in touches:
            with pytest.raises(
                ValueError, match=rf"^capture: '.*{name(mixed, 0).name}' was drawn under other settings than"
            ) as exc:
                read()
            assert "\n" not in str(exc.value), reader
        else:
            read()


@pytest.mark.parametrize("shard", ["nodes", "drafts", "labels", "logits"])
def test_readers_refuse_a_shard_stored_under_another_roots_name(two_captures, tmp_path, shard):
    """A root's shard copied over another root's file (root 1's over root 0's) was read as root 0:
    root 1's data counted twice.  Every reader of it compares the root the shard records (its
    ``root`` column, the logits archive's ``root`` member) with its file name, refusing with one line."""
    name = {"nodes": store.shard_path, "drafts": store.drafts_path, "labels": store.labels_path, "logits": store.logits_path}[
        shard
    ]
    misnamed = tmp_path / "misnamed"
    shutil.copytree(two_captures[0], misnamed)
    shutil.copy(name(misnamed, 1), name(misnamed, 0))
    touches = {
        "nodes": {"read_capture", "CapturedPair", "tree CaptureSource", "CaptureSource"},
        "drafts": {"read_grid_drafts", "CaptureSource"},
        "labels": {"read_labels", "CaptureSource"},
        "logits": {"read_logits", "CapturedPair", "CaptureSource"},
    }[shard]
    for reader, read in _readers(misnamed).items():
        if reader in touches:
            says = rf"^capture: '.*{name(misnamed, 0).name}' is damaged \(it holds root 1, not root 0 as its name says"
            with pytest.raises(ValueError, match=says) as exc:
                read()
            assert "\n" not in str(exc.value), reader
        else:
            read()


def test_shards_without_a_hash_are_read_as_legacy(two_captures, tmp_path):
    """Captures made before the settings hash: their shards carry none and are read unchecked."""
    a, _ = two_captures
    legacy = tmp_path / "legacy"
    shutil.copytree(a, legacy)
    for file in legacy.glob("*-r*.parquet"):
        assert store.HASH_KEY in pl.read_parquet_metadata(file)
        pl.read_parquet(file).write_parquet(file, statistics=False)
    for file in legacy.glob("logits-r*.npz"):
        with np.load(file) as stored:
            assert "settings_sha256" in stored.files
            target, draft = stored["target"], stored["draft"]
        np.savez_compressed(file, target=target, draft=draft)
    for reader, read in _readers(legacy).items():
        read()
    assert store.read_labels(legacy).collect().equals(store.read_labels(a).collect())


def _strip_stamp(file) -> None:
    """Rewrite one shard without its settings hash, as a capture made before the hash wrote it."""
    if file.suffix == ".npz":
        with np.load(file) as stored:
            target, draft = stored["target"], stored["draft"]
        np.savez_compressed(file, target=target, draft=draft)
    else:
        pl.read_parquet(file).write_parquet(file, statistics=False)


def _unstamped_shard_refused(folder, shard: str) -> bool:
    """Whether every reader of ``shard`` in ``folder`` (root 0's, stripped of its hash beside stamped
    shards) refuses it with one line naming it, the others reading on."""
    touches = {
        "nodes": {"read_capture", "CapturedPair", "tree CaptureSource", "CaptureSource"},
        "drafts": {"read_grid_drafts", "CaptureSource"},
        "labels": {"read_labels", "CaptureSource"},
        "logits": {"read_logits", "CapturedPair", "CaptureSource"},
    }[shard]
    for reader, read in _readers(folder).items():
        try:
            read()
        except store.MixedCapture as exc:
            if reader not in touches or "records no settings hash, but other shards" not in str(exc) or "\n" in str(exc):
                raise
            continue
        if reader in touches:
            return False
    return True


@pytest.mark.parametrize("shard", ["nodes", "drafts", "labels", "logits"])
def test_an_unstamped_shard_among_stamped_ones_is_refused(two_captures, tmp_path, shard, monkeypatch):
    """Issue 40 item 4: a shard without a hash in a folder whose other shards have one (a T = 0.5
    shard from a capture made before the hash) was read as a legacy shard; legacy reading is for a
    folder with no stamped shard at all.  The planted fault (every unstamped shard read as legacy,
    the old rule) is caught."""
    name = {"nodes": store.shard_path, "drafts": store.drafts_path, "labels": store.labels_path, "logits": store.logits_path}[
        shard
    ]
    mixed = tmp_path / "mixed"
    shutil.copytree(two_captures[0], mixed)
    _strip_stamp(name(mixed, 0))
    assert _unstamped_shard_refused(mixed, shard)
    monkeypatch.setattr(store, "unstamped_allowed", lambda folder: True)  # the planted fault: the old rule
    assert not _unstamped_shard_refused(mixed, shard)


def test_a_legacy_folder_is_scanned_once_per_change(two_captures, tmp_path, monkeypatch):
    """A folder with no stamped shard is read as legacy; its shards' footers are read once for the
    verdict, not once per shard, and a shard renamed into it (as every writer does) renews the verdict."""
    legacy = tmp_path / "legacy"
    shutil.copytree(two_captures[0], legacy)
    for file in store._shards(legacy):
        _strip_stamp(file)
    calls = []
    original = store._recorded_hash
    monkeypatch.setattr(store, "_recorded_hash", lambda file: calls.append(file) or original(file))
    store.read_capture(legacy)
    store.read_capture(legacy)
    assert len(calls) == len(list(store._shards(legacy)))
    stamped = tmp_path / "stamped.parquet"
    shutil.copy(store.shard_path(two_captures[0], 1), stamped)
    stamped.rename(store.shard_path(legacy, 1))  # a stamped shard renamed over an unstamped one
    with pytest.raises(store.MixedCapture, match="nodes-r000000.parquet' records no settings hash, but other shards"):
        store.read_capture(legacy)


# -- RANK, WORLD_SIZE and settings.json fields ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env, says",
    [
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE: must be >= 1, got 0"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK: 2 is not a rank of WORLD_SIZE 2 (ranks 0 to 1)"),
        ({"RANK": "abc"}, "RANK: must be an integer, got 'abc'"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK: must be >= 0, got -1"),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK: must be an integer"),
    ],
)
def test_ranks_that_cannot_shard_exit_2_with_one_line(micro_pair_dir, prompts, tmp_path, monkeypatch, capsys, env, says):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = exit_2(capsys, lambda: main(flags(micro_pair_dir, prompts, tmp_path / "o")))
    assert says in err and not (tmp_path / "o").exists()


def test_a_rank_with_nothing_to_do_says_so(micro_pair_dir, tmp_path, monkeypatch, capsys):
    one = write_prompts(tmp_path, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(flags(micro_pair_dir, one, tmp_path / "o")) == 0
    assert "rank 1 of 2 has nothing to do: 1 roots make 1 groups" in capsys.readouterr().err
    assert (tmp_path / "o" / "settings.json").is_file() and not store.completed_roots(tmp_path / "o")


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("width", "two", "width: expected an integer, got 'two'"),
        ("temperature", None, "temperature: expected a number, got None"),
        ("full", "yes", "full: expected true or false"),
        ("samples", 0, "samples: must be >= 1, got 0"),
        ("evaluation", "eager", "evaluation: must be one of"),
        ("colour", 1, "colour: not a capture setting"),
    ],
)
def test_a_settings_field_of_the_wrong_type_is_one_line_naming_it(two_captures, tmp_path, capsys, field, value, says):
    """Issue 28: ``width: "two"`` in settings.json was a TypeError in compare_verifiers."""
    from analyses import compare_verifiers

    damaged = tmp_path / "damaged"
    shutil.copytree(two_captures[0], damaged)
    data = json.loads((damaged / "settings.json").read_text())
    (damaged / "settings.json").write_text(json.dumps({**data, field: value}))
    with pytest.raises(ValueError, match=f"settings.json \\({says}"):
        store.load_settings(damaged)
    err = exit_2(
        capsys,
        lambda: compare_verifiers.main(
            ["--capture", str(damaged), "--K-max", "2", "--L-max", "1", "--samples", "2", "--quiet", "--out", str(tmp_path / "o")]
        ),
    )
    assert "--capture" in err and says in err, err


def test_stored_numbers_of_float_settings_hash_as_floats(two_captures, tmp_path):
    """A stored ``"temperature": 1`` (JSON has one number type) is the capture's 1.0: same hash."""
    folder = tmp_path / "ints"
    shutil.copytree(two_captures[0], folder)
    data = json.loads((folder / "settings.json").read_text())
    (folder / "settings.json").write_text(json.dumps({**data, "temperature": 1}))
    assert store.folder_hash(folder) == store.folder_hash(two_captures[0])
    store.read_capture(folder)


def test_a_file_system_without_locks_is_one_line(tmp_path, monkeypatch):
    import fcntl

    from backends.capture_lock import CaptureLock

    def no_locks(fd, operation):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(ValueError, match=r"^out: the capture folder's file system does not lock files \(No locks available\)"):
        CaptureLock(tmp_path, 0, 1, "0" * 64).acquire()
