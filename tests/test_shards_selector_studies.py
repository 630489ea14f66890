"""The DDTE audit and the selector's training sharded across processes (``analyses._study``): each
rank values its share of the roots into its own part, rank 0 merges, and the published tables are
those of one process, byte for byte; the selector's evaluation values no roots and refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from shard_checks import run_ranks

from analyses import ddte_audit, evaluate_selector, train_selector
from simlab.grid import GridAxes
from tests.conftest import one_error_line

AUDIT = ["--vocab", "6", "--trajectories", "3", "--roots-per-trajectory", "2", "--settings", "1,0.6", "--samples", "1"]
AUDIT += ["--epochs", "2", "--quiet"]
TRAIN = ["--vocab", "6", "--trajectories", "3", "--roots-per-trajectory", "2", "--settings", "1,0.6", "--K-max", "1"]
TRAIN += ["--L-max", "1", "--samples", "2", "--epochs", "2", "--verifiers", "specinfer", "--jobs", "1", "--quiet"]
TABLES = {
    ddte_audit: ("ddte_audit.parquet", "labels.parquet", "by_position.parquet", "selector.parquet", "selector_roots.parquet"),
    train_selector: ("labels.parquet", "roots.parquet", "embeddings.npz", "history.parquet", "latency.json"),
}


@pytest.fixture(autouse=True)
def _small(monkeypatch):
    """Empty chart files (the tables are what the merge must reproduce) and, for the audit, a grid
    of K <= 2, L1 and L2 <= 1 in place of DDTE's (324 actions under every convention are slow)."""
    for module in (ddte_audit, evaluate_selector, train_selector):
        monkeypatch.setattr(module, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
    monkeypatch.setattr(ddte_audit, "DDTE_AXES", GridAxes((1, 2), (0, 1), (0, 1)))


@pytest.mark.slow  # three runs of a study: 2-3 s each on an idle machine, 30 s on a loaded one
@pytest.mark.parametrize("module, argv", [(ddte_audit, AUDIT), (train_selector, TRAIN)])
def test_a_sharded_run_publishes_the_one_process_tables(monkeypatch, tmp_path, module, argv):
    """Two settings of six roots over two ranks (three for the audit): every table, the labels,
    the feature records (roots, embeddings) and what was trained from them are the one-process
    run's, byte for byte."""
    world = 3 if module is ddte_audit else 2
    assert module.main([*argv, "--out", str(tmp_path / "one")]) == 0
    run_ranks(monkeypatch, module, argv, tmp_path / "many", world)
    for name in TABLES[module]:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes(), name
    parts = sorted(p.name for p in (tmp_path / "many" / "parts").iterdir())
    assert parts == [f"rank-{r}-of-{world}.json" for r in range(world)]


def test_the_audits_sharded_labels_are_its_one_process_labels_in_order():
    """``merge`` of every root's payload, read back from JSON as a part is, is ``values`` of one
    process (labels and feature records), so the merged run trains the same selectors."""
    import json

    import numpy as np

    from analyses._selector_data import feature_arrays
    from analyses._study import json_plain, parse, tasks

    small = ["--vocab", "6", "--trajectories", "3", "--settings", "1,0.6", "--samples", "1"]
    config, parser = parse(ddte_audit.STUDY, small)
    opened = ddte_audit.open_roots(config, parser, lambda message: None)
    payloads = [json.loads(json.dumps(ddte_audit.value_root(config, opened, t), default=json_plain)) for t in tasks(opened)]
    labels, records = ddte_audit.merge(config, opened, payloads)
    one_labels, one_records = ddte_audit.values(config, opened, lambda message: None)
    assert labels.equals(one_labels) and len(records) == len(one_records) == 6
    (roots, arrays), (one_roots, one_arrays) = feature_arrays(records), feature_arrays(one_records)
    assert roots.equals(one_roots) and arrays.keys() == one_arrays.keys()
    assert all(np.array_equal(arrays[k], one_arrays[k]) and arrays[k].dtype == one_arrays[k].dtype for k in arrays)


def test_the_selectors_evaluation_refuses_to_be_sharded_with_one_line(monkeypatch, tmp_path, capsys):
    """It values no roots (it reads a train_selector run): WORLD_SIZE > 1 is refused before any part."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "0")  # a run that went on would not wait for rank 1
    with pytest.raises(SystemExit) as exc:
        evaluate_selector.main(["--run", str(run), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and "the study values no roots" in err, err
    assert not (tmp_path / "o" / "parts").exists()


def test_train_selector_refuses_to_shard_a_capture():
    """A capture's features come from its live models, loaded once: a sharded run is refused."""

    from dataclasses import replace

    captured = replace(train_selector.Config(), capture=("CAP",))
    reason = train_selector.shardable(captured, None, None)  # decided before anything is opened
    assert reason and "capture" in reason
