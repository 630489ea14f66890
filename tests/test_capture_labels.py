"""Labelled grid captures (``backends.capture --labels``): labels equal those replayed from the
same capture's full logits, resume after SIGKILL to identical bytes, shard over ranks."""

from __future__ import annotations

import signal
import subprocess
import sys

import polars as pl
import pytest

from backends.capture import main
from backends.capture_store import read_capture, read_labels
from backends.sources.replay import CaptureSource
from conftest import capture_flags, killed_capture, one_error_line, write_prompts
from simlab.labels import grid_labels
from simlab.trees import NodeTable

VERIFIERS = "specinfer,spectr,traversal,naive_chain"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts"), 4)


def flags(pair_dir, prompts, out, *extra):
    return capture_flags(
        pair_dir,
        prompts,
        out,
        "--shape",
        "grid",
        "--width",
        "2",
        "--depth",
        "2",
        "--samples",
        "2",
        "--labels",
        VERIFIERS,
        "--roots-per-forward",
        "2",
        *extra,
    )


@pytest.fixture(scope="module")
def labelled(micro_pair_dir, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("labelled")
    assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    return out


def test_labels_equal_the_labels_of_the_replayed_logits(labelled):
    stored = read_labels(labelled).collect().sort("root", "verifier", "K", "L1", "L2")
    source = CaptureSource([str(labelled)])
    (setting,) = source.fixed_settings()
    rows = []
    for root in source.roots(setting):
        table = NodeTable(root.pair, root.context)
        rows += [
            {"root": root.root, **r}
            for r in grid_labels(table, root.drafts, VERIFIERS.split(","), K_values=(1, 2), L2_values=(0, 1, 2))
        ]
    replayed = pl.DataFrame(rows).sort("root", "verifier", "K", "L1", "L2")
    assert stored.height == replayed.height == 4 * (2 * 3 * 3 * 3 + 3 * 3)  # 4 roots; naive_chain has K = 1 only
    assert stored.drop("prompt").equals(replayed)


def test_without_full_the_capture_keeps_labels_and_summaries_only(micro_pair_dir, prompts, labelled, tmp_path):
    out = tmp_path / "light"
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    assert not list(out.glob("logits-r*"))
    assert read_labels(out).collect().equals(read_labels(labelled).collect())
    assert read_capture(str(out)).equals(read_capture(str(labelled)))


def test_sigkill_then_rerun_gives_identical_label_bytes(micro_pair_dir, prompts, labelled, tmp_path):
    argv = flags(micro_pair_dir, prompts, tmp_path / "killed", "--full")
    assert killed_capture(argv, after=1) == -signal.SIGKILL  # mid-group: roots 0 and 1 share a group
    assert len(list((tmp_path / "killed").glob("nodes-r*.parquet"))) == 1
    command = [sys.executable, "-m", "backends.capture", *argv]
    assert subprocess.run(command, capture_output=True).returncode == 0
    for file in sorted(labelled.glob("labels-r*.parquet")):
        assert (tmp_path / "killed" / file.name).read_bytes() == file.read_bytes(), file.name


def test_two_ranks_merge_to_the_unsharded_capture(micro_pair_dir, prompts, labelled, tmp_path, monkeypatch):
    out = tmp_path / "sharded"
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main(flags(micro_pair_dir, prompts, out, "--full")) == 0
    assert read_labels(out).collect().equals(read_labels(labelled).collect())


def test_the_torch_label_engine_gives_the_same_labels(micro_pair_dir, prompts, labelled, tmp_path):
    """--labels-engine torch (the batched engine; what auto picks on CUDA) against the numpy labels: 1e-12."""
    out = tmp_path / "torch"
    assert main(flags(micro_pair_dir, prompts, out, "--labels-engine", "torch")) == 0
    a = read_labels(out).collect().sort("root", "verifier", "K", "L1", "L2")
    b = read_labels(labelled).collect().sort("root", "verifier", "K", "L1", "L2")
    assert a.select("root", "verifier", "K", "L1", "L2").equals(b.select("root", "verifier", "K", "L1", "L2"))
    for column in ("E", "E_select", "E_holdout"):
        assert (a[column] - b[column]).abs().max() <= 1e-12, column
    # The logits stayed on the models' device (here the CPU, as tensors): the node summaries were
    # computed there (simlab.device_rows), equal to the host's to rounding, top tokens exactly.
    nodes, reference = read_capture(str(out)), read_capture(str(labelled))
    exact = [c for c in reference.columns if c not in ("l1", "tv", "kl_pq", "kl_qp", "h_p", "h_q", "p_top_probs", "q_top_probs")]
    assert nodes.select(exact).equals(reference.select(exact))
    for column in ("l1", "tv", "kl_pq", "kl_qp", "h_p", "h_q"):
        assert (nodes[column] - reference[column]).abs().max() <= 1e-12, column
    for column in ("p_top_probs", "q_top_probs"):
        assert (nodes[column].explode() - reference[column].explode()).abs().max() <= 1e-15, column


def test_bad_labels_flags_exit_2(micro_pair_dir, prompts, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, tmp_path / "a", "--labels", "nope"))  # the later --labels wins
    assert exc.value.code == 2 and "--labels" in capsys.readouterr().err
    iid = flags(micro_pair_dir, prompts, tmp_path / "b")
    iid[iid.index("grid")] = "iid"
    del iid[iid.index("--samples") : iid.index("--samples") + 2]
    with pytest.raises(SystemExit) as exc:
        main(iid)
    assert exc.value.code == 2 and "--labels" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    no_labels = [f for f in flags(micro_pair_dir, prompts, tmp_path / "c") if f not in ("--labels", VERIFIERS)]
    with pytest.raises(SystemExit) as exc:
        main(no_labels + ["--labels-engine", "torch"])
    assert exc.value.code == 2 and "--labels-engine" in capsys.readouterr().err
    for labels, says in (
        ("", "at least one verifier"),
        ("specinfer,greedy", "greedy target"),
        ("rrs_wor", "not lossless for the grid"),
    ):
        with pytest.raises(SystemExit) as exc:  # refused before any model is loaded: no folder is left behind
            main(flags(micro_pair_dir, prompts, tmp_path / "d", "--labels", labels))
        err = capsys.readouterr().err
        assert exc.value.code == 2 and says in err and one_error_line(err), err
        assert not (tmp_path / "d").exists()
    assert main(flags(micro_pair_dir, prompts, tmp_path / "e", "--labels", "greedy", "--temperature", "0")) == 0


def test_the_label_engine_is_part_of_the_settings(micro_pair_dir, prompts, labelled, tmp_path, capsys):
    """A resume with another engine would mix labels equal only to 1e-12 in one folder: refused;
    a capture from before the field (engine unrecorded) resumes with either."""
    import json

    assert json.loads((labelled / "settings.json").read_text())["labels_engine"] == "numpy"  # auto on a CPU
    out = tmp_path / "mixed"
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, prompts, out, "--labels-engine", "torch"))
    assert exc.value.code == 2 and "labels_engine 'numpy', not 'torch'" in capsys.readouterr().err
    data = json.loads((out / "settings.json").read_text())
    del data["format"], data["labels_engine"]  # format 0: a settings.json from before the field
    (out / "settings.json").write_text(json.dumps(data))
    for shard in out.glob("*-r*.*"):  # drawn under the edited settings' hash: a capture from before the field has none yet
        shard.unlink()
    assert main(flags(micro_pair_dir, prompts, out, "--labels-engine", "torch")) == 0
    assert read_capture(out)["root"].n_unique() == 4


def test_the_studies_use_stored_labels_with_unchanged_results(labelled):
    """analyses._labels reads a labelled capture's labels instead of recomputing them: same rows."""
    import dataclasses

    from analyses._labels import Grid, label_root
    from simlab.latency import LatencyModel

    source = CaptureSource([str(labelled)])
    (setting,) = source.fixed_settings()
    grid = Grid((1, 2), (0, 1, 2), (0, 1, 2), samples=2)
    latency = LatencyModel.from_cost_ratio(0.1)
    for root in source.roots(setting):
        assert root.labels is not None
        stored = label_root(root, ["specinfer", "traversal"], grid, latency)
        computed = label_root(dataclasses.replace(root, labels=None), ["specinfer", "traversal"], grid, latency)
        assert pl.DataFrame(stored).equals(pl.DataFrame(computed))  # NaN standard errors (one draft per half) compare equal


@pytest.fixture(scope="module")
def light(micro_pair_dir, prompts, tmp_path_factory):
    """The same labelled capture without --full: labels and per-node summaries, no logits."""
    out = tmp_path_factory.mktemp("light")
    assert main(flags(micro_pair_dir, prompts, out)) == 0
    return out


def test_a_label_only_capture_replays_its_labels_in_the_grid_studies(light, labelled, tmp_path):
    from analyses import compare_verifiers

    study = ["--K-max", "2", "--L-max", "2", "--samples", "2", "--verifiers", "specinfer,traversal", "--quiet"]
    assert compare_verifiers.main(["--capture", str(light), "--out", str(tmp_path / "a"), *study]) == 0
    assert compare_verifiers.main(["--capture", str(labelled), "--out", str(tmp_path / "b"), *study]) == 0
    a, b = (pl.read_parquet(tmp_path / d / "labels.parquet").sort("root", "verifier", "K", "L1", "L2") for d in "ab")
    assert a.height == b.height > 0 and a.equals(b)


def test_a_label_only_capture_refuses_what_it_cannot_replay(light, tmp_path, capsys):
    from analyses import compare_verifiers

    with pytest.raises(SystemExit) as exc:  # a verifier it was not labelled for
        compare_verifiers.main(
            [
                "--capture",
                str(light),
                "--K-max",
                "2",
                "--L-max",
                "2",
                "--samples",
                "2",
                "--verifiers",
                "nss,traversal",
                "--out",
                str(tmp_path / "c"),
                "--quiet",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and "--full" in err, err
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").iterdir())  # nothing written
    with pytest.raises(ValueError, match="without --full"):
        CaptureSource([str(light)], grid=False)


def test_the_selector_trains_on_a_label_only_capture(light, tmp_path):
    """train_selector reads the stored labels and takes the features from the live models the
    capture names (hidden states are never stored)."""
    from analyses import train_selector

    assert (
        train_selector.main(
            [
                "--capture",
                str(light),
                "--K-max",
                "2",
                "--L-max",
                "2",
                "--samples",
                "2",
                "--verifiers",
                "specinfer",
                "--epochs",
                "2",
                "--out",
                str(tmp_path / "run"),
                "--quiet",
            ]
        )
        == 0
    )
    labels = pl.read_parquet(tmp_path / "run" / "labels.parquet")
    assert set(labels["verifier"]) == {"specinfer", "traversal"} and labels["root"].n_unique() == 4


def test_under_top_k_every_drafted_child_keeps_its_q_in_the_stored_rows(micro_pair_dir, prompts, tmp_path):
    """The stored q of a node is the q its children were drawn from (the drafting table's logits),
    so a child at the top-k boundary never turns up with q = 0 in the labels' rows."""
    from backends.capture_store import CapturedPair

    out = tmp_path / "topk"
    assert main(flags(micro_pair_dir, prompts, out, "--full", "--top-k", "3")) == 0
    pair = CapturedPair(str(out))
    for root in CaptureSource([str(out)]).roots(CaptureSource([str(out)]).fixed_settings()[0]):
        for draft in root.drafts:
            for branch in draft.branches or ((),):
                path = draft.trunk + branch
                for d in range(len(path)):
                    q = pair.distributions([root.context + path[:d]])[1][0]
                    assert q[path[d]] > 0.0


def test_a_capture_resumed_across_the_metric_columns_replays(light, tmp_path):
    """Shards written before the engines' metric columns (``simlab.labels.METRIC_COLUMNS``) beside
    newer ones in one capture: the labels read, with nulls where a shard lacks the metrics."""
    import shutil

    from backends.capture_store import _stamped, labels_path, load_settings, settings_hash
    from backends.cli import write_parquet

    folder = tmp_path / "mixed"
    shutil.copytree(light, folder)
    roots = sorted(read_labels(folder).select("root").unique().collect()["root"])
    assert len(roots) >= 2
    old = labels_path(folder, roots[-1])
    frame = pl.read_parquet(old).drop("accepted", "unconditional")
    write_parquet(frame, old, metadata=_stamped(settings_hash(load_settings(folder))))
    labels = read_labels(folder).collect()
    assert labels.filter(pl.col("root") == roots[-1])["accepted"].is_null().all()
    assert labels.filter(pl.col("root") == roots[0])["accepted"].is_not_null().all()
    source = CaptureSource([str(folder)])
    (setting,) = source.fixed_settings()
    assert all(r.labels is not None for r in source.roots(setting))
