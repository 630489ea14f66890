"""The recorded source (``backends.sources.recorded``): a live pair captured into
``<out>/capture-<hash>`` and replayed, as ``analyses._flags.make_source(..., record=...)`` gives it
for ``--backend hf`` (the main job's live runs).

The folder names are pinned to the ones the main job's own capture step named before the recording
became a source option (commit b48a611, ``divergence_by_depth.capture_live``), so an existing
folder resumes; a rerun resumes every capture (no root captured twice, no shard rewritten).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from analyses import divergence_by_depth
from analyses._flags import make_source
from backends.capture_store import CaptureSettings
from backends.sources import SyntheticSource, recorded
from backends.sources.recorded import RecordedSource, RecordedTrees, capture_folder, record, recording_settings
from conftest import live_pair_flags, one_error_line, write_prompts
from simlab.sampling import SamplingSettings

PROG = divergence_by_depth.PROG
LIVE = ["--backend", "hf", "--target", "models/target", "--draft", "models/draft", "--prompts", "p.txt", "--quiet"]
PINNED = [  # (flags, folder the capture went to), from divergence_by_depth.capture_live at commit b48a611
    (
        [
            *LIVE,
            *("--depth", "3", "--width", "2", "--shape", "delayed", "--trunk", "1", "--settings", "0.8:0.9:20"),
            *("--roots-per-trajectory", "3", "--spacing", "5", "--seed", "7", "--dtype", "bfloat16", "--out", "o1"),
        ],
        "o1/capture-254f66299d",
    ),
    (LIVE, "out/divergence_by_depth/hf-target-draft/capture-879da2e9b1"),
    (["--pair", "smollm2", "--prompts", "p.txt", "--quiet"], "out/divergence_by_depth/hf-smollm2-default/capture-211a2e3253"),
    (
        ["--pair", "smollm2", "--draft", "early-exit:2", "--settings", "0", "--prompts", "p.txt", "--depth", "2", "--quiet"],
        "out/divergence_by_depth/hf-smollm2-early-exit:2/capture-1fe5c92c51",
    ),
]


class _Stop(Exception):
    """Raised by the stand-in capture: the test needs the folder, not the models."""


def _never(*args, **kwargs):
    raise AssertionError("a capture started")


@pytest.fixture()
def in_folder(tmp_path, monkeypatch):
    """``tmp_path`` as the working folder, holding two folders that pass as models and a prompt file."""
    for name in ("target", "draft"):
        (tmp_path / "models" / name).mkdir(parents=True)
        (tmp_path / "models" / name / "config.json").write_text("{}")
    (tmp_path / "p.txt").write_text("Hello there\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "folder"), PINNED, ids=["delayed", "models", "pair", "pair-draft"])
def test_the_main_job_records_into_the_folder_it_named_before(argv, folder, in_folder, monkeypatch):
    calls = []

    def capture(settings, out, **kwargs):
        calls.append((Path(out), kwargs))
        raise _Stop

    monkeypatch.setattr(recorded, "run", capture)
    with pytest.raises(_Stop):
        divergence_by_depth.main(argv)
    assert calls == [(Path(folder), {"device": "auto", "quiet": True})]
    assert (in_folder / folder).is_dir()


def test_a_recording_is_replayed_and_a_rerun_resumes_it(micro_pair_dir, tmp_path, monkeypatch):
    out, prompts = tmp_path / "out", write_prompts(tmp_path, 1)
    argv = [*live_pair_flags(micro_pair_dir), "--prompts", prompts, "--roots-per-trajectory", "2", "--spacing", "4"]
    config, parser = divergence_by_depth.parse_args([*argv, "--out", str(out), "--quiet"])
    config = replace(config, settings="1,0.5")  # two settings: one capture each
    captured, real = [], recorded.run
    monkeypatch.setattr(recorded, "run", lambda *args, **kwargs: captured.append(real(*args, **kwargs)) or captured[-1])
    trees = RecordedTrees("iid", 2, 2, 0)

    def opened():
        return make_source(PROG, parser, config, grid=False, depth=2, quiet=True, record=trees)

    source, settings = opened()
    assert isinstance(source, RecordedSource) and source.out == out and source.slug() == "hf-target-draft"
    folders = [
        capture_folder(
            recording_settings(
                trees, s, target=config.target, draft=config.draft, prompts=prompts, spacing=4, roots_per_prompt=2
            ),
            out,
        )
        for s in settings
    ]
    assert source.folders == tuple(map(str, folders)) and source.fixed_settings() == settings
    assert captured == [2, 2] and all(source.count(s) == 2 for s in settings)
    assert all(root.tree is not None for root in source.roots(settings[1]))
    shards = {path: path.stat().st_mtime_ns for path in out.rglob("*") if path.is_file()}
    again, _ = opened()
    assert captured[2:] == [0, 0] and again.folders == source.folders
    assert {path: path.stat().st_mtime_ns for path in out.rglob("*") if path.is_file()} == shards


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--settings", "1,0.5"], "--settings: this study takes 1 sampling setting at a time, got 2"),
        (["--settings", "1:2"], "--settings: top-p must lie in (0, 1], got 2.0"),
        (["--trajectories", "2"], "--trajectories: the hf source cannot honour it (a live run captures every prompt"),
    ],
    ids=["two-settings", "bad-setting", "study-refusal"],
)
def test_refusals_come_before_any_folder_or_capture(flags, error, in_folder, monkeypatch, capsys):
    monkeypatch.setattr(recorded, "run", _never)
    with pytest.raises(SystemExit) as exit_info:
        divergence_by_depth.main([*LIVE, *flags, "--out", "o"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and one_error_line(err), err
    assert error in err and not (in_folder / "o").exists(), err


def test_other_sources_ignore_record(monkeypatch):
    monkeypatch.setattr(recorded, "run", _never)
    config, parser = divergence_by_depth.parse_args(["--quiet"])
    source, _ = make_source(PROG, parser, config, stream="shared", grid=False, record=RecordedTrees())
    assert isinstance(source, SyntheticSource)


@pytest.mark.parametrize(
    ("fields", "argument"),
    [(("grid2",), "shape"), (("iid", 0), "width"), (("iid", 2, True), "depth"), (("iid", 2, 2, -1), "trunk")],
)
def test_bad_trees_name_their_argument(fields, argument):
    with pytest.raises(ValueError, match=f"^{argument}: "):
        RecordedTrees(*fields)


def test_record_needs_full_capture_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(recorded, "run", _never)
    with pytest.raises(ValueError, match="^trees: "):
        recording_settings("iid", SamplingSettings(1.0), target="t", draft="d")
    with pytest.raises(ValueError, match="^setting: "):
        recording_settings(RecordedTrees(), 1.0, target="t", draft="d")
    for settings in (CaptureSettings("t", "d", "p"), [], ["not settings"]):
        with pytest.raises(ValueError, match="^settings: "):
            record(settings, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_studies_evaluation_reaches_the_recording():
    """``--evaluation plain`` records with the capture's ``forward`` evaluation (another folder);
    the default keeps the cached one (the folder the main job named before)."""
    from backends.sources import recorded
    from simlab.sampling import SamplingSettings

    trees = recorded.RecordedTrees("iid", 2, 2, 1)
    cached = recorded.recording_settings(trees, SamplingSettings(), target="t", draft="d")
    plain = recorded.recording_settings(trees, SamplingSettings(), target="t", draft="d", evaluation="plain")
    assert (cached.evaluation, plain.evaluation) == ("cached", "forward")
    assert recorded.capture_folder(cached, "o") != recorded.capture_folder(plain, "o")
    with pytest.raises(ValueError, match="^evaluation: must be one of"):
        recorded.recording_settings(trees, SamplingSettings(), target="t", draft="d", evaluation="forward")


def test_the_studies_trajectory_reaches_the_recording():
    """``--trajectory forward`` records with the capture's ``forward`` continuations (another folder);
    the default is the capture's own ``cached``; an unknown method is refused."""
    trees = RecordedTrees("iid", 2, 2, 1)
    cached = recording_settings(trees, SamplingSettings(), target="t", draft="d")
    forward = recording_settings(trees, SamplingSettings(), target="t", draft="d", trajectory="forward")
    assert (cached.trajectory, forward.trajectory) == ("cached", "forward")
    assert cached.trajectory == CaptureSettings("t", "d", "p").trajectory
    assert capture_folder(cached, "o") != capture_folder(forward, "o")
    with pytest.raises(ValueError, match="^trajectory: must be one of"):
        recording_settings(trees, SamplingSettings(), target="t", draft="d", trajectory="kv")
