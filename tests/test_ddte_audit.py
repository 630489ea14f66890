"""The DDTE audit study as a tool: outputs, the exact convention inflating nothing, the lossy trunk
convention inflating Khisti and SpecTr but not SpecInfer's value nor Traversal, the selector's
policies valued by the convention's labels and by the exact ones (recomputed here from the
label table), one-line errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from analyses import ddte_audit
from simlab.selector.train import split_by_trajectory
from conftest import one_error_line

SMALL = ["--vocab", "8", "--trajectories", "3", "--settings", "1,0.6", "--samples", "1", "--epochs", "3", "--quiet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    assert ddte_audit.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs_and_inflation(run):
    for name in (
        "ddte_audit.parquet",
        "labels.parquet",
        "by_position.parquet",
        "inflation.html",
        "inflation.png",
        "selector.parquet",
        "selector_roots.parquet",
        "selector.html",
        "selector.png",
    ):
        assert (run / name).stat().st_size > 0, name
    summary = pl.read_parquet(run / "ddte_audit.parquet")
    assert set(summary["convention"]) == set(ddte_audit.CONVENTIONS) and set(summary["verifier"]) == set(ddte_audit.VERIFIERS)
    assert set(summary["static"]) == set(ddte_audit.STATIC_POLICIES)
    assert (summary.filter(pl.col("static") == "static_iid")["L1"] == 0).all()
    by = {(r["verifier"], r["convention"]): r for r in summary.iter_rows(named=True)}
    assert all(by[(v, "exact")]["inflation"] == 0 for v in ddte_audit.VERIFIERS)
    assert by[("traversal", "per_path")]["max_inflation"] <= 1e-12 and by[("specinfer", "per_path")]["max_inflation"] <= 1e-12
    assert by[("khisti", "per_path")]["inflation"] > 0.01 and by[("spectr", "per_path")]["inflation"] > 0.01
    assert by[("specinfer", "four_step")]["inflation"] == 0  # four_step touches SpecTr only


def test_engine_metrics_in_the_labels(run):
    """The labels carry E[tau] and P(tau >= j) (by the grid's estimator, ``grid_metrics``): without
    an EOS, E[tau] = E[tau + 1] - 1 = the sum of P(tau >= j); by_position.parquet's rows are the
    means over roots, one per position of each action."""
    labels, positions = pl.read_parquet(run / "labels.parquet"), pl.read_parquet(run / "by_position.parquet")
    assert (labels["accepted"] - (labels["E"] - 1)).abs().max() <= 1e-12
    assert (labels["accepted"] - labels["unconditional"].list.sum()).abs().max() <= 1e-12
    key = ["setting", "verifier", "convention", "K", "L1", "L2"]
    expected = labels.group_by(key).agg((pl.col("L1").first() + pl.col("L2").first()).alias("depth"))
    assert positions.height == expected["depth"].sum()
    one = labels.filter((pl.col("verifier") == "spectr") & (pl.col("convention") == "per_path") & (pl.col("K") == 3))
    one = one.filter((pl.col("L1") == 2) & (pl.col("L2") == 4) & (pl.col("setting") == one["setting"][0]))
    got = positions.join(one.select(key).unique(), on=key).sort("position")
    np.testing.assert_allclose(got["unconditional"], np.mean(one["unconditional"].to_list(), axis=0), rtol=0, atol=1e-12)


def test_the_inflation_chart_shows_the_mean_over_settings(run):
    """One bar per verifier and convention (the mean over the two settings), not one per setting."""
    summary = pl.read_parquet(run / "ddte_audit.parquet")
    assert summary["setting"].n_unique() == 2
    assert (run / "inflation.html").read_text().count('"max_inflation":') == len(ddte_audit.VERIFIERS) * len(
        ddte_audit.CONVENTIONS
    )


def test_selector_policies_are_valued_by_the_labels(run):
    labels, roots = pl.read_parquet(run / "labels.parquet"), pl.read_parquet(run / "selector_roots.parquet")
    table = pl.read_parquet(run / "selector.parquet")
    touched = (
        {("specinfer", c) for c in ("exact", "per_path", "public")}
        | {("spectr", c) for c in ("exact", "per_path", "four_step", "public")}
        | {("khisti", c) for c in ("exact", "per_path", "rank", "public")}
        | {("traversal", "exact")}
    )
    assert set(zip(table["verifier"], table["convention"])) == touched
    key = ["setting", "trajectory", "root", "verifier", "K", "L1", "L2"]
    label_of = {(r["convention"], *(r[k] for k in key)): r["E"] for r in labels.iter_rows(named=True)}
    test_trajectories = {
        t for t, part in zip(labels["trajectory"], split_by_trajectory(labels["trajectory"].to_list(), 0)) if part == "test"
    }
    assert set(roots["trajectory"]) == test_trajectories
    for r in roots.iter_rows(named=True):
        own = r["convention"] if (r["convention"], *(r[k] for k in key)) in label_of else "exact"
        assert (
            r["E_claimed"] == label_of[(own, *(r[k] for k in key))] and r["E_exact"] == label_of[("exact", *(r[k] for k in key))]
        )
    for _, group in roots.filter(pl.col("policy").str.starts_with("static")).group_by(
        "verifier", "convention", "policy", "setting"
    ):
        assert group.select("K", "L1", "L2").unique().height == 1  # one static action per setting
    for (verifier, convention, policy), group in roots.group_by("verifier", "convention", "policy"):
        row = table.filter(
            (pl.col("verifier") == verifier)
            & (pl.col("convention") == convention)
            & (pl.col("policy") == policy)
            & (pl.col("setting") == "all")
        ).row(0, named=True)
        assert row["claimed_TPS"] == pytest.approx(group["E_claimed"].sum() / group["T"].sum(), rel=1e-12)
        assert row["exact_TPS"] == pytest.approx(group["E_exact"].sum() / group["T"].sum(), rel=1e-12)
    exact = table.filter(pl.col("convention") == "exact")
    assert np.array_equal(exact["claimed_TPS"], exact["exact_TPS"])
    # SpecInfer's per-path labels equal its exact ones: the same selector, the same choices
    pick = lambda c: roots.filter((pl.col("verifier") == "specinfer") & (pl.col("convention") == c)).drop("convention")
    assert pick("per_path").equals(pick("exact"))


def test_static_choice_is_the_training_roots_argmax(run):
    """Each static policy is the training roots' argmax of sum E / sum T among its candidates: the
    i.i.d. rollouts (L1 = 0) for static_iid (DDTE's baseline), every action for static_all_actions."""
    labels, roots = pl.read_parquet(run / "labels.parquet"), pl.read_parquet(run / "selector_roots.parquet")
    ids = labels.select("trajectory").unique().sort("trajectory")["trajectory"].to_list()
    part = dict(zip(ids, split_by_trajectory(ids, 0)))
    train = labels.filter(pl.col("trajectory").replace_strict(part) == "train")
    assert set(roots["policy"]) == set(ddte_audit.POLICIES)
    assert (roots.filter(pl.col("policy") == "static_iid")["L1"] == 0).all()
    statics = roots.filter(pl.col("policy").str.starts_with("static"))
    for (verifier, convention, policy, setting), group in statics.group_by("verifier", "convention", "policy", "setting"):
        own = train.filter((pl.col("verifier") == verifier) & (pl.col("setting") == setting))
        own = own.filter(pl.col("convention") == (convention if convention in own["convention"].to_list() else "exact"))
        own = own.filter(pl.col("L1") == 0) if policy == "static_iid" else own
        totals = own.group_by("K", "L1", "L2").agg(pl.col("E").sum() / pl.col("T").sum()).sort("K", "L1", "L2")
        best = totals.filter(pl.col("E") == totals["E"].max()).row(0)[:3]  # ties go to the first action (L2 = 0 makes K moot)
        assert tuple(group.row(0, named=True)[k] for k in ("K", "L1", "L2")) == best


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--samples", "0"], "--samples"),
        (["--capture", "x"], "--capture"),
        (["--settings", "x"], "--settings"),
        (["--trajectories", "2"], "--trajectories"),
        (["--epochs", "0"], "--epochs"),
        (["--no-selector", "--epochs", "5"], "--epochs"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        ddte_audit.main(flags + ["--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and flag in err, err
