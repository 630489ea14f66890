"""The TreeGraft study as a tool: outputs, the exact oracle's dominance, one-line errors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import polars as pl
import pytest

from analyses import treegraft
from analyses._flags import with_drafter_time
from backends.tree_cache import node_table
from simlab import tree_verifiers
from simlab.drafting import Drafting
from simlab.trees import drafting_table
from conftest import load_script, one_error_line

SMALL = [
    "--vocab",
    "16",
    "--trajectories",
    "3",
    "--roots-per-trajectory",
    "1",
    "--spacing",
    "10",
    "--budget",
    "12",
    "--top-k",
    "3",
    "--depth",
    "3",
    "--fixed",
    "1,0,1",
    "--epochs",
    "5",
    "--quiet",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tg")
    assert treegraft.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs(run):
    for name in (
        "treegraft.parquet",
        "treegraft_every_root.parquet",
        "per_root.parquet",
        "schedules.parquet",
        "throughput.html",
        "throughput.png",
        "schedules.html",
        "schedules.png",
    ):
        assert (run / name).stat().st_size > 0, name
    summary = pl.read_parquet(run / "treegraft.parquet")
    assert set(summary["policy"]) == set(treegraft.POLICIES) and set(summary["setting"]) == {"T=0", "T=1"}
    assert set(summary.filter(pl.col("setting") == "T=0")["verifier"]) == {
        "greedy",
        "onehot",
        "nss",
        "exact_match",
        "greedy_draft",
    }
    per_root = pl.read_parquet(run / "per_root.parquet")  # every lossless verifier of a deterministic tree: the same exact E
    spread = per_root.group_by("setting", "policy", "trajectory", "root").agg(
        (pl.col("E").max() - pl.col("E").min()).alias("spread")
    )
    assert spread["spread"].max() <= 1e-12
    stopped = per_root.filter(pl.col("early_stop"))
    assert (stopped["layers_run"] < 3).all() and set(stopped["stop"]) <= {"empty frontier", "fallback", "node cap"}
    assert summary["early_stop_share"].is_between(0, 1).all()


def test_lab_rules_flag(tmp_path):
    """--rules lab builds the lab's earlier trees: none stops early."""
    assert treegraft.main(SMALL + ["--rules", "lab", "--out", str(tmp_path)]) == 0
    per_root = pl.read_parquet(tmp_path / "per_root.parquet")
    assert not per_root["early_stop"].any() and (per_root.filter(pl.col("policy") != "sequence_level")["layers_run"] == 3).all()


def test_the_best_schedule_dominates_every_schedule_and_budgets_hold(run):
    per_root = pl.read_parquet(run / "per_root.parquet")
    schedules = pl.read_parquet(run / "schedules.parquet")
    assert (per_root["tokens"] <= 12).all() and (schedules["tokens"] <= 12).all()
    top = schedules.group_by("setting", "verifier", "root").agg(pl.col("TPS").max().alias("top"))
    best = per_root.filter(pl.col("policy") == "best").join(top, on=["setting", "verifier", "root"])
    assert (best["TPS"] == best["top"]).all()
    fixed = per_root.filter(pl.col("policy").is_in(["all_small", "all_mid", "fixed", "learned"])).join(
        top, on=["setting", "verifier", "root"]
    )
    assert (fixed["TPS"] <= fixed["top"] + 1e-12).all()
    for verifiers in per_root.group_by("setting", "root", "policy").agg(pl.col("E").n_unique()).iter_rows():
        assert verifiers[-1] == 1  # every lossless verifier of deterministic trees gives the same exact value


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--fixed", "1,0"], "--fixed"),
        (["--depth", "6"], "--depth"),
        (["--trajectories", "1"], "--trajectories"),
        (["--budget", "0"], "--budget"),
        (["--capture", "x"], "--capture"),
        (["--small-ratio", "0"], "--small-ratio"),
        (["--depth", "0"], "--depth"),
        (["--fixed", "1,0,2,0,1"], "--fixed"),
        (["--depth", "3"], "--depth: 3 layers need a --fixed schedule of 3 entries"),  # --fixed not given
        (["--depth", "3", "--fixed", "1,0"], "--fixed: needs 3 entries"),
        (["--ngram", "0"], "--ngram"),
        (["--rules", "official,nonsense"], "--rules"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        treegraft.main(flags + ["--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and flag in err, err


def test_report_script_agrees_with_the_study_summary(run):
    """scripts/treegraft_report.py's learned row (the test roots) has the study's own ratios."""
    report = load_script("scripts/treegraft_report.py")
    rows = [line.split(" | ") for line in report.report(str(run), "onehot").splitlines() if "learned g_psi" in line]
    summary = pl.read_parquet(run / "treegraft.parquet").filter(
        (pl.col("verifier") == "onehot") & (pl.col("policy") == "learned")
    )
    assert len(rows) == summary.height == 2
    for row in rows:
        mine = summary.filter(pl.col("setting") == row[0].strip("| "))
        assert row[6] == f"{mine['vs_all_small'][0]:.3f}" and row[7] == f"{mine['vs_all_mid'][0]:.3f}"


def test_the_learned_policy_read_from_stored_features_equals_building_each_held_out_root_again():
    """``learn`` (g_psi's schedule from the features ``measure`` stored at every prefix, valued by
    that schedule's row) against the plain path: each held-out root's table built again, the
    schedule chosen layer by layer (``Scheduler.schedule``) and its tree valued."""
    from simlab.treegraft.schedules import train

    config, parser = treegraft.parse_args(SMALL + ["--trajectories", "4"])
    opened = treegraft.open_source(config, parser, lambda message: None)
    opened = replace(opened, latency=with_drafter_time(opened.latency, "small", config.small_ratio, "small_ratio", parser))
    rows, schedule_rows, training = treegraft.values(config, opened, None)
    test = treegraft.split([r["trajectory"] for r in rows], config.test_share, config.seed)
    learned, _ = treegraft.learn(config, opened.settings, training, schedule_rows, test)
    got = {(r["setting"], r["trajectory"], r["root"], r["verifier"]): r for r in learned}
    checked = 0
    for setting in opened.settings:
        fit = [e for e in training[setting.name] if e["trajectory"] not in test]
        scheduler, _ = train(
            np.array([e["z"] for e in fit]), np.array([e["y"] for e in fit]), epochs=config.epochs, seed=config.seed
        )
        for root in opened.source.roots(setting):
            if root.trajectory not in test:
                continue
            base, _ = treegraft.builders_for(config, root.prompt_length)
            table = node_table(root.pair, root.context, config.evaluation)
            drafting = drafting_table(table, config.draft_law)
            schedule = scheduler.schedule(base, drafting, opened.latency, len(root.context))
            for v in tree_verifiers.lossless_names({Drafting.DETERMINISTIC}, setting):
                want = treegraft._value(replace(base, schedule=schedule), drafting, table, v, opened.latency)
                row = got[(setting.name, root.trajectory, root.root, v)]
                assert row["schedule"] == "".join(map(str, schedule)) and row["policy"] == "learned"
                assert row["E"] == pytest.approx(want["E"], abs=1e-12) and row["T"] == pytest.approx(want["T"], rel=1e-12)
                assert row["tokens"] == want["tokens"] and row["graft_positions"] == want["state"].graft_positions
                checked += 1
    assert checked == len(learned) > 0
    assert all(set(r) == set(rows[0]) for r in learned)  # the policy rows' columns, no schedule-row extras


def test_the_every_root_summary_covers_training_and_test_roots_and_agrees_with_per_root(run):
    per_root = pl.read_parquet(run / "per_root.parquet")
    assert per_root.schema["offset"] == pl.Int64 and "best" not in per_root.columns
    every = pl.read_parquet(run / "treegraft_every_root.parquet")
    test = pl.read_parquet(run / "treegraft.parquet")
    assert "learned" not in set(every["policy"]) and set(every["policy"]) == set(test["policy"]) - {"learned"}
    assert per_root["test"].any() and not per_root["test"].all()
    for (setting, verifier, policy), part in per_root.filter(pl.col("policy") != "learned").group_by(
        "setting", "verifier", "policy"
    ):
        row = every.filter((pl.col("setting") == setting) & (pl.col("verifier") == verifier) & (pl.col("policy") == policy))
        assert (
            row["roots"].item()
            == part.height
            > test.filter((pl.col("setting") == setting) & (pl.col("verifier") == verifier) & (pl.col("policy") == policy))[
                "roots"
            ].item()
        )
        assert row["TPS"].item() == pytest.approx(part["E"].sum() / part["T"].sum(), rel=1e-12)
