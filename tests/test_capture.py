"""Capture: per-node rows, exact replay, bad input, and resumption after SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from backends.capture import main
from backends.capture_store import CapturedPair, read_capture
from backends.roots import read_prompts
from conftest import SHIPPED_PROMPTS, capture_flags, killed_capture, write_prompts

SHIPPED = SHIPPED_PROMPTS  # other tests import it from here
N_PROMPTS = 8


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """The first 8 shipped prompts (keeps the capture tests short)."""
    return write_prompts(tmp_path_factory.mktemp("prompts"), N_PROMPTS)


def flags(pair_dir, prompts, out, *extra):
    return capture_flags(pair_dir, prompts, out, "--depth", "2", "--width", "2", *extra)


@pytest.fixture(scope="module")
def capture(micro_pair_dir, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("capture")
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    return out


def test_rows_and_columns(capture):
    table = read_capture(str(capture))
    assert table["root"].n_unique() == N_PROMPTS
    for column in (
        "root",
        "prompt",
        "position",
        "path",
        "depth",
        "token",
        "multiplicity",
        "children",
        "tv",
        "kl_pq",
        "kl_qp",
        "h_p",
        "h_q",
        "p_top_ids",
        "p_top_probs",
        "q_top_ids",
        "q_top_probs",
    ):
        assert column in table.columns
    assert table.filter(pl.col("depth") == 0)["multiplicity"].to_list() == [1] * N_PROMPTS
    assert (table.group_by("root", "path").len()["len"] == 1).all()  # no duplicate node


def test_replay_matches_the_stored_statistics(capture):
    pair = CapturedPair(str(capture))
    table = read_capture(str(capture))
    from simlab.measures import node_divergences

    for row in table.head(15).iter_rows(named=True):
        p, q = pair.distributions([tuple(row["root_context"]) + tuple(row["path"])])
        assert node_divergences(p[0], q[0])["tv"] == row["tv"]


def test_rerun_with_other_settings_is_refused(micro_pair_dir, capture, capsys, prompts):
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, capture, "--full", "--seed", "9"))
    assert exc.value.code == 2 and "other settings" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [("", "holds no prompt"), ('{"x": 1}\n', "line 1")])
def test_bad_prompt_files(tmp_path, content, message):
    path = tmp_path / ("p.jsonl" if content.startswith("{") else "p.txt")
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_prompts(str(path))


def test_missing_model_and_long_prompt(micro_pair_dir, tmp_path, capsys, prompts):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "--target",
                str(tmp_path / "none"),
                "--draft",
                str(tmp_path / "none"),
                "--prompts",
                prompts,
                "--out",
                str(tmp_path / "o"),
            ]
        )
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
    long_prompt = tmp_path / "long.txt"
    long_prompt.write_text("word " * 400 + "\n")
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, tmp_path / "o2") + ["--prompts", str(long_prompt)])
    assert exc.value.code == 2 and "context" in capsys.readouterr().err


def test_sigkill_then_rerun_gives_every_row_once(micro_pair_dir, tmp_path, prompts):
    """SIGKILL the capture right after its third root (the middle of its second group of two),
    rerun the same command: the result equals an uninterrupted capture (no duplicate, no missing
    row).  The kill point is fixed (``killed_capture``), not a race with a polling loop."""
    argv = flags(micro_pair_dir, prompts, tmp_path / "killed", "--roots-per-forward", "2")
    assert killed_capture(argv, after=3) == -signal.SIGKILL
    assert len(list((tmp_path / "killed").glob("nodes-r*.parquet"))) == 3
    command = [sys.executable, "-m", "backends.capture", *argv]
    rerun = subprocess.run(command, capture_output=True, text=True)
    assert rerun.returncode == 0 and "taking over the stale lock lock-rank0.json of process" in rerun.stderr  # the killed run's
    assert main(flags(micro_pair_dir, prompts, tmp_path / "clean", "--roots-per-forward", "2")) == 0
    resumed, clean = read_capture(str(tmp_path / "killed")), read_capture(str(tmp_path / "clean"))
    assert resumed.height == clean.height
    assert resumed.equals(clean)
    assert not [p for p in (tmp_path / "killed").iterdir() if p.name.startswith(".")]


def test_torchrun_style_shards_are_disjoint_and_complete(micro_pair_dir, capture, tmp_path, monkeypatch, prompts):
    """Two processes (RANK 0 and 1 of WORLD_SIZE 2) capture disjoint roots; together they equal one run."""
    out = tmp_path / "sharded"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    assert read_capture(str(out)).equals(read_capture(str(capture)))


def test_out_of_memory_retries_with_a_smaller_batch(micro_pair_dir, tmp_path, monkeypatch, capsys, prompts):
    import torch

    import backends.capture as capture_module

    original, calls = capture_module.capture_group, {"n": 0}

    def flaky(pair, *args):
        calls["n"] += 1
        if calls["n"] == 2:
            raise torch.cuda.OutOfMemoryError("simulated")
        return original(pair, *args)

    monkeypatch.setattr(capture_module, "capture_group", flaky)
    loud = [f for f in flags(micro_pair_dir, prompts, tmp_path / "oom", "--roots-per-forward", "2") if f != "--quiet"]
    assert main(loud) == 0
    assert (
        "out of GPU memory at root 2; retrying with 32 tree tokens per forward (4096 per multi-root forward)"
        in capsys.readouterr().err
    )
    assert read_capture(str(tmp_path / "oom"))["root"].n_unique() == N_PROMPTS


def test_a_failed_run_leaves_no_settings_behind(micro_pair_dir, tmp_path, prompts, capsys):
    out = tmp_path / "failed"
    with pytest.raises(SystemExit):
        main(flags(micro_pair_dir, prompts, out) + ["--target", str(tmp_path / "typo")])
    assert not (out / "settings.json").exists()
    assert main(flags(micro_pair_dir, prompts, out)) == 0  # the corrected command then works


def test_same_prompts_by_another_path_resume(micro_pair_dir, capture, prompts, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(prompts).parent)
    relative = Path(prompts).name
    assert main(flags(micro_pair_dir, relative, capture, "--full")) == 0


def _bad_devices():
    import torch

    cases = [("foo", "unknown device")]
    if not torch.cuda.is_available():  # asking for CUDA is only an error where there is none
        cases.append(("cuda:0", "CUDA"))
    return cases


@pytest.mark.parametrize("device, message", _bad_devices())
def test_bad_device(micro_pair_dir, prompts, tmp_path, device, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, tmp_path / "d") + ["--device", device])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_folder_that_is_not_a_model(micro_pair_dir, prompts, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, tmp_path / "o") + ["--draft", str(tmp_path)])
    assert exc.value.code == 2 and "is not a model folder" in capsys.readouterr().err


def test_roots_per_forward_changes_no_tree_and_no_distribution(micro_pair_dir, capture, prompts, tmp_path):
    """One tree forward per root (the captures made before --roots-per-forward) and the default
    multi-root forwards give the same trees and the same per-node statistics (float32 1e-5)."""
    assert main(flags(micro_pair_dir, prompts, tmp_path / "one", "--full", "--roots-per-forward", "1")) == 0
    one, many = read_capture(str(tmp_path / "one")), read_capture(str(capture))
    assert one.select("root", "path").equals(many.select("root", "path"))
    for column in ("tv", "kl_pq", "h_p", "h_q"):
        assert (one[column] - many[column]).abs().max() < 1e-5, column


def test_settings_without_roots_per_forward_resume_as_one_root_per_forward(micro_pair_dir, prompts, tmp_path, capsys):
    import json

    from backends.capture_store import load_settings

    out = tmp_path / "old"
    assert main(flags(micro_pair_dir, prompts, out, "--roots-per-forward", "1")) == 0
    data = json.loads((out / "settings.json").read_text())
    del data["format"], data["roots_per_forward"]  # format 0: a settings.json from before the field
    (out / "settings.json").write_text(json.dumps(data))
    assert load_settings(out).roots_per_forward == 1
    assert main(flags(micro_pair_dir, prompts, out, "--roots-per-forward", "1")) == 0
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, out))  # the default, 8, is another capture
    assert exc.value.code == 2 and "roots_per_forward" in capsys.readouterr().err
