"""Every study reports by workload category (issue 23): the roots' categories reach every per-root
row, ``by_category.parquet`` holds each category's summary, equal to the study's own summary of
that category's roots alone, and the overall block equals the main summary; without categories
the outputs are what they were (no file, the same summary bytes, a null ``category`` column).

The synthetic source's roots get categories by trajectory (``maths``, ``qa``, none) through a
patched ``SyntheticSource.roots``; the charts are stubbed (their rendering is tested elsewhere)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from analyses import _categories
from analyses import (
    block_efficiency_grid,
    compare_builders,
    compare_verifiers,
    ddte_audit,
    divergence_by_depth,
    parallel_drafters,
    specblock,
    sweep,
    treegraft,
)
from backends import cli
from backends.sources import SyntheticSource
from simlab.sampling import parse_settings
from simlab import tree_verifiers

CATEGORIES = ("maths", "qa", None)  # by trajectory % 3: the third trajectory's prompt has none


def _rules(settings: str) -> dict[str, str]:
    return tree_verifiers.deterministic_rules(parse_settings(settings))


def _sweep_summary(rows: pl.DataFrame) -> pl.DataFrame:
    """The sweep's scalar summary columns from its per-root rows (``analyses._engine_valuation.summarise``: E and T
    means over roots, E_se = sqrt(sum E_se^2) / roots, TPS = sum E / sum T)."""
    return (
        rows.group_by("setting", "config", "mode", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("roots"),
            pl.col("E").mean(),
            (pl.col("E_se").pow(2).sum().sqrt() / pl.len()).alias("E_se"),
            pl.col("T").mean(),
            (pl.col("E").sum() / pl.col("T").sum()).alias("TPS"),
        )
        .sort(["setting", "TPS"], descending=[False, True])
    )


SWEEP_CONFIG = '[{"engine": "sequoia", "budget": 4}, {"engine": "eagle", "total_tokens": 5, "depth": 2, "top_k": 2}]'

# study, flags, main summary file, per-root file, the study's summary of per-root rows (None: the study's own)
STUDIES = {
    "compare_builders": (
        compare_builders,
        ["--vocab", "12", "--trajectories", "3", "--roots-per-trajectory", "1", "--spacing", "6", "--settings", "0,1"]
        + ["--budgets", "4", "--builders", "eagle2,iid,delayed", "--samples", "2", "--grid-samples", "1", "--epochs", "2"]
        + ["--test-share", "0.9"],
        "compare_builders.parquet",
        "per_root.parquet",
        lambda rows: compare_builders.baseline_notes(
            compare_builders.summarise(rows, "eagle2", _rules("0,1")), "eagle2", tree_verifiers.names(), _rules("0,1")
        ),
    ),
    "compare_verifiers": (
        compare_verifiers,
        ["--vocab", "6", "--trajectories", "3", "--roots-per-trajectory", "1", "--settings", "1", "--K-max", "2"]
        + ["--L-max", "2", "--samples", "2", "--verifiers", "specinfer,traversal", "--jobs", "1"],
        "compare_verifiers.parquet",
        "labels.parquet",
        lambda rows: compare_verifiers.choose(compare_verifiers.aggregate(rows), "traversal"),
    ),
    "sweep": (
        sweep,
        ["--latency", "sequoia-demo", "--trajectories", "3", "--roots-per-trajectory", "1", "--settings", "1", "--vocab", "8"],
        "sweep.parquet",
        "per_root.parquet",
        _sweep_summary,
    ),
    "parallel_drafters": (
        parallel_drafters,
        [
            "--vocab",
            "8",
            "--trajectories",
            "3",
            "--roots-per-trajectory",
            "1",
            "--spacing",
            "3",
            "--budgets",
            "4",
            "--depth",
            "3",
        ],
        "parallel_drafters.parquet",
        "per_root.parquet",
        parallel_drafters.summarise,
    ),
    "treegraft": (
        treegraft,
        ["--vocab", "16", "--trajectories", "6", "--roots-per-trajectory", "1", "--spacing", "10", "--budget", "12"]
        + ["--top-k", "3", "--depth", "3", "--fixed", "1,0,1", "--epochs", "2", "--test-share", "0.5"],
        "treegraft.parquet",
        "per_root.parquet",
        treegraft.summarise,
    ),
    "specblock": (
        specblock,
        ["--vocab", "24", "--trajectories", "3", "--roots-per-trajectory", "1", "--spacing", "6", "--budgets", "6"]
        + ["--K", "3", "--beam-width", "3"],
        "specblock.parquet",
        "per_root.parquet",
        specblock.summarise,
    ),
    "ddte_audit": (
        ddte_audit,
        [
            "--vocab",
            "8",
            "--trajectories",
            "3",
            "--roots-per-trajectory",
            "1",
            "--settings",
            "1",
            "--samples",
            "1",
            "--no-selector",
        ],
        "ddte_audit.parquet",
        "labels.parquet",
        ddte_audit.summarise,
    ),
    "divergence_by_depth": (
        divergence_by_depth,
        ["--vocab", "24", "--trajectories", "3", "--roots-per-trajectory", "2", "--depth", "3", "--width", "2", "--k", "2"],
        "divergence_by_depth.parquet",
        "nodes.parquet",
        lambda rows: divergence_by_depth.aggregate(rows, 2),
    ),
}


def _run(study, flags, out: Path, patch: pytest.MonkeyPatch, categorised: bool) -> dict[int, str | None]:
    """Run ``study`` into ``out`` (charts stubbed); with ``categorised``, its roots carry categories.
    Returns root id -> the category given (empty without)."""
    given: dict[int, str | None] = {}
    patch.setattr(study, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
    if categorised:
        plain = SyntheticSource.roots

        def roots(self, settings):
            for root in plain(self, settings):
                given[root.root] = CATEGORIES[root.trajectory % 3]
                yield dataclasses.replace(root, category=given[root.root])

        patch.setattr(SyntheticSource, "roots", roots)
    assert study.main([*flags, "--out", str(out), "--quiet"]) == 0
    return given


SLOW = {"ddte_audit"}  # about 20 s: DDTE's whole grid under every convention


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(STUDIES)])
def test_by_category_rows_are_the_summary_of_each_categorys_roots(name, tmp_path):
    study, flags, main_file, root_file, summarise = STUDIES[name]
    with pytest.MonkeyPatch.context() as patch:
        _run(study, flags, tmp_path / "plain", patch, categorised=False)
    with pytest.MonkeyPatch.context() as patch:
        given = _run(study, flags, tmp_path / "cat", patch, categorised=True)
    plain, cat = tmp_path / "plain", tmp_path / "cat"
    # without categories: no by-category file; the summary is the same with them
    assert not (plain / "by_category.parquet").exists()
    assert (plain / main_file).read_bytes() == (cat / main_file).read_bytes()
    rows = pl.read_parquet(cat / root_file)
    plain_rows = pl.read_parquet(plain / root_file)
    if name == "divergence_by_depth":  # the main job's files gain the column only with categories
        assert "category" not in plain_rows.columns
    else:
        assert plain_rows.schema["category"] == pl.String and plain_rows["category"].null_count() == plain_rows.height
    assert rows.drop("category").equals(plain_rows.drop("category", strict=False))
    assert rows["category"].to_list() == [given[r] for r in rows["root"]]
    table = pl.read_parquet(cat / "by_category.parquet")
    assert table["category"].unique(maintain_order=True).to_list()[-1] == _categories.OVERALL
    expected_blocks = {_categories.OVERALL: rows}
    for category in ("maths", "qa", None):
        keep = [r for r, c in given.items() if c == category]
        expected_blocks[category or _categories.UNCATEGORISED] = rows.filter(pl.col("root").is_in(keep))
    if name == "treegraft":  # its summary is over the test roots
        expected_blocks = {k: v.filter(pl.col("test")) for k, v in expected_blocks.items()}
    expected_blocks = {k: v for k, v in expected_blocks.items() if v.height}
    assert len(expected_blocks) >= 3, expected_blocks.keys()  # two categories at least, and the overall block
    assert set(table["category"]) == set(expected_blocks)
    for category, part in expected_blocks.items():
        got = table.filter(pl.col("category") == category).drop("category")
        expected = summarise(part)
        got = got.select(expected.columns)  # the summary's own columns (the sweep's scalar ones)
        if name == "ddte_audit":  # its summary's row order is not fixed (an unordered group_by)
            got, expected = got.sort(pl.all()), expected.sort(pl.all())
        if name == "sweep":  # re-derived from the rows in polars: the same sums in another order
            assert_frame_equal(got, expected, check_exact=False, rel_tol=1e-12, abs_tol=0.0)
        else:
            assert got.equals(expected), (name, category)
    overall = table.filter(pl.col("category") == _categories.OVERALL).drop("category")
    main = pl.read_parquet(cat / main_file)
    if name == "ddte_audit":
        overall, main = overall.sort(pl.all()), main.sort(pl.all())
    assert overall.select(main.columns).equals(main)


def test_the_by_category_table_is_printed(tmp_path, capsys):
    study, flags, *_ = STUDIES["parallel_drafters"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(study, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
        plain = SyntheticSource.roots
        patch.setattr(
            SyntheticSource,
            "roots",
            lambda self, s: (dataclasses.replace(r, category=CATEGORIES[r.trajectory % 3]) for r in plain(self, s)),
        )
        assert study.main([*flags, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "by category" in out and "maths" in out and "(none)" in out and "(all)" in out


def test_by_category_is_none_without_categories_and_refuses_nothing_else():
    frame = pl.DataFrame({"category": [None, None], "E": [1.0, 2.0]})
    assert _categories.by_category(_categories.with_category(frame), lambda rows: rows.select(pl.col("E").mean())) is None
    assert _categories.by_category(pl.DataFrame({"E": [1.0]}), lambda rows: rows) is None
    assert _categories.by_category([{"category": None}], lambda rows: pl.DataFrame({"n": [len(rows)]})) is None
    table = _categories.by_category(
        [{"category": "a"}, {"category": None}, {"category": "a"}], lambda rows: pl.DataFrame({"n": [len(rows)]})
    )
    assert table.rows() == [("a", 2), ("(none)", 1), ("(all)", 3)]
    with pytest.raises(ValueError, match="category"):
        _categories.by_category([{"category": "(all)"}], lambda rows: pl.DataFrame({"n": [len(rows)]}))


def test_a_categorised_prompt_file_on_the_micro_pair_reports_by_category(micro_pair_dir, tmp_path):
    """End to end: the live source gives each root its prompt's category (no patching)."""
    prompts = tmp_path / "prompts.jsonl"
    lines = [("maths", "def add(a, b):\n    return a + b"), ("qa", "import os\nimport sys"), (None, "class Point:\n    x = 0")]
    prompts.write_text("".join(json.dumps({"prompt": t} | ({"category": c} if c else {})) + "\n" for c, t in lines))
    flags = ["--backend", "hf", "--target", str(micro_pair_dir / "target"), "--draft", str(micro_pair_dir / "draft")]
    flags += ["--prompts", str(prompts), "--trajectories", "3", "--roots-per-trajectory", "1", "--spacing", "4"]
    flags += ["--settings", "1", "--device", "cpu", "--budgets", "4", "--depth", "3"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel_drafters, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
        assert parallel_drafters.main([*flags, "--out", str(tmp_path / "out"), "--quiet"]) == 0
    rows = pl.read_parquet(tmp_path / "out" / "per_root.parquet")
    assert rows.select("trajectory", "category").unique().sort("trajectory").rows() == [(0, "maths"), (1, "qa"), (2, None)]
    table = pl.read_parquet(tmp_path / "out" / "by_category.parquet")
    for category, part in (("maths", rows.filter(pl.col("trajectory") == 0)), ("(none)", rows.filter(pl.col("trajectory") == 2))):
        assert table.filter(pl.col("category") == category).drop("category").equals(parallel_drafters.summarise(part))


def test_the_grid_studys_category_rows_equal_a_run_on_that_categorys_roots_alone(tmp_path):
    """block_efficiency_grid keeps no per-root file: its exact values depend on the root alone,
    so a run on one category's roots (the others dropped from the source) is that category's row."""
    flags = ["--vocab", "3", "--trajectories", "3", "--roots-per-trajectory", "2", "--K", "1,2", "--L1-max", "1"]
    flags += ["--L2-max", "2", "--method", "exact", "--verifiers", "specinfer,bv", "--quiet"]

    def run(out, keep):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(block_efficiency_grid, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
            plain = SyntheticSource.roots
            roots = lambda self, s: (  # noqa: E731
                dataclasses.replace(r, category=CATEGORIES[r.trajectory % 3])
                for r in plain(self, s)
                if keep(CATEGORIES[r.trajectory % 3])
            )
            patch.setattr(SyntheticSource, "roots", roots)
            assert block_efficiency_grid.main([*flags, "--out", str(out)]) == 0
        return pl.read_parquet(out / "block_efficiency_grid.parquet")

    overall = run(tmp_path / "all", lambda c: True)
    table = pl.read_parquet(tmp_path / "all" / "by_category.parquet")
    assert_frame_equal(table.filter(pl.col("category") == _categories.OVERALL).drop("category"), overall)
    for category in CATEGORIES:
        alone = run(tmp_path / str(category), lambda c: c == category)
        got = table.filter(pl.col("category") == (category or _categories.UNCATEGORISED)).drop("category")
        assert got["roots"].to_list() == [2] * got.height
        assert_frame_equal(got, alone, check_exact=False, rel_tol=1e-12, abs_tol=0.0)


def test_the_selectors_evaluation_by_category(tmp_path):
    """train_selector's labels carry the roots' categories; evaluate_selector's category rows are its
    summary of that category's per-root rows (the policies fixed by the whole run)."""
    from analyses import evaluate_selector, train_selector

    flags = ["--trajectories", "6", "--roots-per-trajectory", "1", "--settings", "1", "--K-max", "1", "--L-max", "1"]
    flags += ["--samples", "2", "--vocab", "6", "--epochs", "2", "--verifiers", "specinfer", "--jobs", "1", "--quiet"]
    with pytest.MonkeyPatch.context() as patch:
        given = _run(train_selector, flags, tmp_path / "run", patch, categorised=True)
    labels = pl.read_parquet(tmp_path / "run" / "labels.parquet")
    assert labels["category"].to_list() == [given[r] for r in labels["root"]]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate_selector, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
        args = ["--run", str(tmp_path / "run"), "--split", "train", "--quiet", "--out", str(tmp_path / "eval")]
        assert evaluate_selector.main(args) == 0
    rows = pl.read_parquet(tmp_path / "eval" / "per_root.parquet")
    assert rows["category"].to_list() == [given[r] for r in rows["root"]]
    table = pl.read_parquet(tmp_path / "eval" / "by_category.parquet")
    main = pl.read_parquet(tmp_path / "eval" / "evaluation.parquet")
    assert table.filter(pl.col("category") == _categories.OVERALL).drop("category").equals(main)
    baseline = dict(main.select("verifier", "loss_baseline").unique().iter_rows())
    for category in set(rows["category"].to_list()):
        keep = [r for r, c in given.items() if c == category]
        got = table.filter(pl.col("category") == (category or _categories.UNCATEGORISED)).drop("category")
        assert got.equals(evaluate_selector.summarise(rows.filter(pl.col("root").is_in(keep)), baseline))


def _second_run_leaves_by_category(tmp_path, legacy: bool = False) -> bool:
    """parallel_drafters run twice into one folder holding a user's file, first with categories,
    then without: True when the first run's ``by_category.parquet`` outlives the second (the
    user's file must survive).  ``legacy``: the first run's list of published files is deleted,
    as a folder written before the list existed."""
    study, flags, *_ = STUDIES["parallel_drafters"]
    out = tmp_path / "shared"
    out.mkdir(parents=True)
    (out / "notes.txt").write_text("the user's")
    with pytest.MonkeyPatch.context() as patch:
        _run(study, flags, out, patch, categorised=True)
    assert (out / "by_category.parquet").exists()
    if legacy:
        (out / cli.PUBLISHED).unlink()
    with pytest.MonkeyPatch.context() as patch:
        _run(study, flags, out, patch, categorised=False)
    assert (out / "notes.txt").read_text() == "the user's"
    rows = pl.read_parquet(out / "per_root.parquet")
    assert rows["category"].null_count() == rows.height  # the second run's rows
    return (out / "by_category.parquet").exists()


def test_a_run_without_categories_removes_the_last_runs_by_category_file(tmp_path, monkeypatch):
    """Issue 40, item 5 (the README's two SmolLM2 commands share a folder): the output folder holds
    only what this run wrote; the planted fault (the publish and ``stage_by_category`` before the
    issue: nothing removed) leaves the first run's by-category table beside the second run's rows."""
    assert not _second_run_leaves_by_category(tmp_path / "new")
    # a folder written before the list: its file may be the user's, so it stays until a publish lists it
    assert _second_run_leaves_by_category(tmp_path / "legacy", legacy=True)

    def old_publish(self):
        for name, tmp in self.staged:
            os.replace(tmp, self.folder / name)
        self.staged = []

    monkeypatch.setattr(cli.OutputSet, "publish", old_publish)
    assert _second_run_leaves_by_category(tmp_path / "mutant")
