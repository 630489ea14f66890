"""The matched-settings comparison: grid search, held-out reporting, the study as a tool, capture replay."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest

from analyses import compare_verifiers as cv
from analyses._labels import Grid, label_root
from backends.sources import SyntheticSource
from simlab.sampling import parse_settings
from simlab.sampling import SamplingSettings
from simlab.efficiency import expected_block_efficiency
from simlab.grid import draw_grid, grid_block_efficiency
from simlab.latency import LatencyModel
from simlab.builders import Delayed
from simlab.trees import NodeTable
from conftest import one_error_line

SMALL = [
    "--vocab",
    "6",
    "--trajectories",
    "2",
    "--roots-per-trajectory",
    "1",
    "--settings",
    "1,0.5",
    "--K-max",
    "2",
    "--L-max",
    "2",
    "--samples",
    "2",
    "--verifiers",
    "specinfer,bv,traversal",
    "--jobs",
    "1",
    "--quiet",
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("cv")
    assert cv.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs(small):
    for name in (
        "compare_verifiers.parquet",
        "grid.parquet",
        "by_position.parquet",
        "labels.parquet",
        "latency.json",
        "throughput.html",
        "throughput.png",
        "block_efficiency.html",
        "block_efficiency.png",
    ):
        assert (small / name).stat().st_size > 0, name
    chosen = pl.read_parquet(small / "compare_verifiers.parquet")
    assert chosen.height == 2 * 3 * 4  # settings x verifiers x choices
    assert chosen.filter(pl.col("verifier") == "bv")["K"].to_list() == [1] * 8  # a one-path verifier: K = 1 only


def test_the_choice_is_the_true_maximum_of_the_grid(small):
    """Brute force over the aggregated grid: each chosen action maximises its criterion (to the
    documented tie tolerance, ties going to the smallest action)."""
    grid = pl.read_parquet(small / "grid.parquet")
    chosen = pl.read_parquet(small / "compare_verifiers.parquet")
    for (setting, verifier, choice), group in chosen.group_by("setting", "verifier", "choice"):
        iid_only, criterion = cv.CHOICES[choice]
        rows = grid.filter((pl.col("setting") == setting) & (pl.col("verifier") == verifier)).to_dicts()
        rows = [r for r in rows if r["L1"] == 0 or not iid_only]
        best = max(r[criterion] for r in rows)
        row = group.row(0, named=True)
        assert row["static"] == ("static_iid" if iid_only else "static_all_actions")
        pick = next(r for r in rows if (r["K"], r["L1"], r["L2"]) == (row["K"], row["L1"], row["L2"]))
        assert pick[criterion] >= best - cv.TIE * abs(best)
        tied = [(r["K"], r["L1"], r["L2"]) for r in rows if r[criterion] >= best - cv.TIE * abs(best)]
        assert (row["K"], row["L1"], row["L2"]) == min(tied)
        assert row["E"] == pick["E_holdout"] and row["TPS"] == pytest.approx(pick["E_holdout"] / pick["T"], rel=1e-12)


def test_throughput_is_mean_E_over_mean_T(small):
    labels = pl.read_parquet(small / "labels.parquet")
    grid = pl.read_parquet(small / "grid.parquet")
    one = labels.filter(
        (pl.col("verifier") == "specinfer")
        & (pl.col("K") == 2)
        & (pl.col("L1") == 1)
        & (pl.col("L2") == 2)
        & (pl.col("setting") == "T=1")
    )
    row = grid.filter(
        (pl.col("verifier") == "specinfer")
        & (pl.col("K") == 2)
        & (pl.col("L1") == 1)
        & (pl.col("L2") == 2)
        & (pl.col("setting") == "T=1")
    ).row(0, named=True)
    assert row["TPS"] == pytest.approx(one["E"].mean() / one["T"].mean(), rel=1e-12)
    assert row["T"] == pytest.approx(
        LatencyModel.from_cost_ratio(0.1, per_token=0.01).delayed_time(2, 1, 2, one["context_length"][0])
    )


def test_same_seed_same_labels(small, tmp_path):
    assert cv.main(SMALL + ["--out", str(tmp_path), "--jobs", "2"]) == 0  # parallel workers give the same rows
    assert pl.read_parquet(tmp_path / "labels.parquet").equals(pl.read_parquet(small / "labels.parquet"))


def test_the_torch_engine_gives_the_same_labels(small, tmp_path):
    """--engine torch (simlab.batched for SpecInfer; BV and Traversal stay on numpy): same labels."""
    assert cv.main(SMALL + ["--out", str(tmp_path), "--engine", "torch"]) == 0
    fast, plain = pl.read_parquet(tmp_path / "labels.parquet"), pl.read_parquet(small / "labels.parquet")
    values = ("E", "E_se", "E_select", "E_holdout", "accepted", "unconditional")
    assert fast.drop(values).equals(plain.drop(values))
    for column in ("E", "E_select", "E_holdout", "accepted"):
        assert (fast[column] - plain[column]).abs().max() <= 1e-12
    assert (fast["unconditional"].explode() - plain["unconditional"].explode()).abs().max() <= 1e-12


def test_engine_metrics_columns_follow_the_labels(small):
    """grid.parquet's ``accepted`` is the mean of the roots' E[tau]; by_position.parquet's
    ``unconditional`` is the mean of the roots' P(tau >= j) and ``conditional`` the ratio of those
    means (``engine_metrics.conditional_rates``); without an EOS, E[tau] = E[tau + 1] - 1 and the
    sum of P(tau >= j)."""
    from simlab.engine_metrics import chain_acceptance_length, conditional_rates

    labels = pl.read_parquet(small / "labels.parquet")
    grid = pl.read_parquet(small / "grid.parquet")
    positions = pl.read_parquet(small / "by_position.parquet")
    assert (labels["accepted"] - (labels["E"] - 1)).abs().max() <= 1e-12
    assert (labels["accepted"] - labels["unconditional"].list.sum()).abs().max() <= 1e-12
    key = ["setting", "verifier", "K", "L1", "L2"]
    for row in grid.iter_rows(named=True):
        rows = labels.filter(*(pl.col(k) == row[k] for k in key))
        assert row["accepted"] == pytest.approx(rows["accepted"].mean(), abs=1e-12)
        mean = np.mean(rows["unconditional"].to_list(), axis=0) if row["L1"] + row["L2"] else np.zeros(0)
        got = positions.filter(*(pl.col(k) == row[k] for k in key)).sort("position")
        assert got["position"].to_list() == list(range(1, row["L1"] + row["L2"] + 1))
        np.testing.assert_allclose(got["unconditional"].to_numpy(), mean, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got["conditional"].to_numpy(), conditional_rates(mean), rtol=0, atol=1e-12)
        if row["L1"] + row["L2"]:  # SpecForge's chain from the roots' rates averaged where reached
            rates = np.array([conditional_rates(u) for u in rows["unconditional"].to_list()])
            chain = chain_acceptance_length(np.nanmean(np.where(np.isnan(rates).all(0), 0.0, rates), axis=0))
            assert got["chain"].unique().to_list() == [pytest.approx(chain, abs=1e-12)]


def test_grid_estimates_agree_with_exact_expectations():
    """Each (K, L1, L2) estimate from shared K-prefix drafts is unbiased: within 5 standard errors."""
    source = SyntheticSource(vocab=3, trajectories=1, roots_per_trajectory=1)
    root = next(source.roots(SamplingSettings()))
    table = NodeTable(root.pair, root.context)
    drafts = draw_grid(table, K_max=2, L1_values=(0, 1), L2_max=2, samples=400, rng=np.random.default_rng(5))
    grid = grid_block_efficiency(table, drafts, "specinfer", K_values=(1, 2), L2_values=(0, 1, 2))
    for (K, L1, L2), est in grid.items():
        exact = expected_block_efficiency(root.pair, root.context, Delayed(K, L1, L2), "specinfer").mean
        assert abs(est.mean - exact) <= 5 * max(est.stderr, 1e-12), (K, L1, L2, est, exact)


def test_holdout_half_is_independent_of_the_choice_half():
    root = next(SyntheticSource(vocab=8, trajectories=1, roots_per_trajectory=1).roots(SamplingSettings()))
    rows = label_root(root, ["specinfer"], Grid((1, 2), (0, 2), (0, 3), samples=4), LatencyModel.from_cost_ratio(0.1))
    drafted = [r for r in rows if r["L2"] > 0]
    assert any(r["E_select"] != r["E_holdout"] for r in drafted)
    for r in rows:
        assert r["E"] == pytest.approx((r["E_select"] + r["E_holdout"]) / 2)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--samples", "1"], "--samples"),
        (["--verifiers", "specinfer,nope"], "--verifiers: unknown nope"),
        (["--baseline", "nss", "--verifiers", "specinfer"], "--baseline"),
        (["--settings", "hot"], "--settings"),
        (["--settings", "1:1.5"], "--settings: top-p"),
        (["--L-max", "17"], "--L-max"),
        (["--cost-ratio", "0"], "--cost-ratio"),
        (["--backend", "hf"], "--backend hf"),
        (["--capture", "/nonexistent"], "--capture"),
        (["--latency", "/nonexistent.json"], "latency: no such profile"),
        (["--engine", "torch", "--method", "exact"], "--engine"),
        (["--engine-device", "cuda"], "--engine-device: only with --engine torch"),
        (["--engine", "torch", "--engine-device", "nonsense"], "--engine-device"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cv.main(flags + ["--out", str(tmp_path), "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and one_error_line(err)


def test_ddte_settings():
    settings = parse_settings("ddte")
    assert len(settings) == 8 and settings[-1] == SamplingSettings(1.0, top_p=0.99)
    assert parse_settings("0.6, 1:0.9") == (SamplingSettings(0.6), SamplingSettings(1.0, top_p=0.9))


def test_table_printed(tmp_path, capsys):
    assert cv.main([f for f in SMALL if f != "--quiet"] + ["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cf. DDTE Table 3" in out and "SpecInfer" in out and "Traversal" in out and "delayed / iid" in out


def test_capture_replay_equals_live_models_on_the_same_drafts(grid_capture, micro_pair_dir):
    from backends.sources import CaptureSource
    from backends.hf import HFPair

    source = CaptureSource((str(grid_capture),))
    live = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    latency, grid = LatencyModel.from_cost_ratio(0.1), Grid((1, 2), (0, 1, 2), (0, 1, 2), samples=2)
    roots = list(source.roots(source.fixed_settings()[0]))
    assert len(roots) == 2 and all(len(r.drafts) == 3 * 2 for r in roots)
    for root in roots:
        replayed = label_root(root, ["specinfer", "traversal"], grid, latency)
        again = label_root(root.__class__(**{**root.__dict__, "pair": live}), ["specinfer", "traversal"], grid, latency)
        assert [r["E"] for r in replayed] == pytest.approx([r["E"] for r in again], abs=1e-5)


def test_study_on_a_grid_capture(grid_capture, tmp_path):
    assert (
        cv.main(
            [
                "--capture",
                str(grid_capture),
                "--K-max",
                "2",
                "--L-max",
                "2",
                "--samples",
                "2",
                "--verifiers",
                "specinfer,traversal",
                "--out",
                str(tmp_path),
                "--quiet",
            ]
        )
        == 0
    )
    labels = pl.read_parquet(tmp_path / "labels.parquet")
    assert labels["root"].n_unique() == 2 and set(labels["setting"]) == {"T=1"}


def test_non_grid_capture_is_refused(micro_pair_dir, tmp_path, capsys):
    from tests.test_capture import SHIPPED, flags
    from backends.capture import main as capture_main

    prompts = tmp_path / "p.txt"
    prompts.write_text(SHIPPED.read_text().splitlines()[0] + "\n")
    assert capture_main(flags(micro_pair_dir, str(prompts), tmp_path / "c", "--full")) == 0
    with pytest.raises(SystemExit):
        cv.main(["--capture", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--quiet"])
    assert "--shape grid" in capsys.readouterr().err


def test_every_action_is_labelled_once():
    root = next(SyntheticSource(vocab=5, trajectories=1, roots_per_trajectory=1).roots(SamplingSettings()))
    grid = Grid((1, 2), (0, 1), (0, 2), samples=2)
    rows = label_root(root, ["spectr"], grid, LatencyModel.from_cost_ratio(0.1))
    assert sorted((r["K"], r["L1"], r["L2"]) for r in rows) == sorted(itertools.product((1, 2), (0, 1), (0, 2)))


def test_exact_method_enumerates_every_tree(tmp_path):
    assert (
        cv.main(
            [
                "--method",
                "exact",
                "--vocab",
                "2",
                "--K-max",
                "2",
                "--L-max",
                "2",
                "--settings",
                "1",
                "--verifiers",
                "specinfer,traversal",
                "--trajectories",
                "1",
                "--roots-per-trajectory",
                "1",
                "--jobs",
                "1",
                "--out",
                str(tmp_path),
                "--quiet",
            ]
        )
        == 0
    )
    labels = pl.read_parquet(tmp_path / "labels.parquet")
    assert (labels["E_se"] == 0).all() and labels.height == 2 * 2 * 3 * 3
    row = labels.filter((pl.col("verifier") == "specinfer") & (pl.col("K") == 2) & (pl.col("L1") == 1) & (pl.col("L2") == 1)).row(
        0, named=True
    )
    root = next(SyntheticSource(vocab=2, trajectories=1, roots_per_trajectory=1).roots(SamplingSettings()))
    assert row["E"] == expected_block_efficiency(root.pair, root.context, Delayed(2, 1, 1), "specinfer").mean


def test_exact_method_is_refused_for_real_models(capsys, tmp_path):
    with pytest.raises(SystemExit):
        cv.main(["--method", "exact", "--capture", str(tmp_path), "--out", str(tmp_path / "o"), "--quiet"])
    assert "--method exact" in capsys.readouterr().err


def test_one_root_per_setting_runs(tmp_path, capsys):
    """A single root has no standard error across roots: NaN, never a crash."""
    assert (
        cv.main(
            [
                "--settings",
                "1",
                "--trajectories",
                "1",
                "--roots-per-trajectory",
                "1",
                "--K-max",
                "2",
                "--L-max",
                "1",
                "--samples",
                "2",
                "--verifiers",
                "specinfer,traversal",
                "--vocab",
                "5",
                "--jobs",
                "1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert "nan" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--settings", "1,1"], "names a setting twice"),
        (["--settings", "inf"], "--settings: temperature"),
        (["--verifiers", "rrs_wor,traversal"], "rrs_wor"),
        (["--verifiers", "traversal,typical,sglang_threshold"], "--verifiers: typical, sglang_threshold declared lossy"),
    ],
)
def test_more_bad_arguments(flags, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cv.main(flags + ["--out", str(tmp_path), "--quiet"])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_damaged_and_one_sample_captures_are_refused(grid_capture, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(grid_capture, broken)
    next(broken.glob("logits-r*.npz")).write_bytes(b"not a zip")
    with pytest.raises(SystemExit):
        cv.main(["--capture", str(broken), "--K-max", "2", "--L-max", "2", "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert "damaged" in err and one_error_line(err)
    with pytest.raises(SystemExit):
        cv.main(["--capture", str(grid_capture), "--out", str(tmp_path / "o"), "--quiet"])  # grid larger than the capture
    assert "--K-max 2 --L-max 2" in capsys.readouterr().err


def test_labels_stored_before_the_engine_metrics_replay_without_them():
    """A capture's labels made before the metric columns: E as stored, accepted NaN and
    unconditional None (never recomputed from other trees), left out of by_position."""
    from dataclasses import replace

    from analyses._labels import by_position

    root = next(SyntheticSource(vocab=3, trajectories=1, roots_per_trajectory=1).roots(SamplingSettings()))
    grid, latency = Grid((1, 2), (0, 1), (0, 1), samples=2), LatencyModel.from_cost_ratio(0.1)
    fresh = label_root(root, ["specinfer"], grid, latency)
    stored = {(r["verifier"], r["K"], r["L1"], r["L2"]): (r["E"], r["E_se"], r["E_select"], r["E_holdout"]) for r in fresh}
    old = label_root(replace(root, labels=stored), ["specinfer"], grid, latency)
    assert [r["E"] for r in old] == [r["E"] for r in fresh]
    assert all(np.isnan(r["accepted"]) and r["unconditional"] is None for r in old)
    assert by_position(pl.DataFrame(old), ["verifier", "K", "L1", "L2"]).height == 0
    assert by_position(pl.DataFrame(fresh), ["verifier", "K", "L1", "L2"]).height == 2 * (0 + 1 + 1 + 2)


# ---- standard errors clustered by prompt (trajectory) ------------------------------------------


def _hand_labels(E_traversal, E_specinfer, trajectories, T=2.0):
    """A labels frame of one setting, one action (K=1, L1=0, L2=1), two verifiers, one row per root."""
    rows = []
    for verifier, values in (("traversal", E_traversal), ("specinfer", E_specinfer)):
        for root, (e, traj) in enumerate(zip(values, trajectories)):
            rows.append(
                {"setting": "s", "verifier": verifier, "K": 1, "L1": 0, "L2": 1, "tokens": 1, "E": e, "E_select": e}
                | {"E_holdout": e, "T": T, "accepted": e - 1, "trajectory": traj, "root": root}
            )
    return pl.DataFrame(rows)


def _root_se(x):
    """The per-root standard error the study reported before clustering: sd / sqrt(roots)."""
    return float(np.std(x, ddof=1) / np.sqrt(len(x)))


def test_two_roots_per_prompt_are_clustered_by_hand():
    """E_holdout (1, 2, 3, 6) over prompts (0, 0, 1, 1): mean 3, influence (-2, -1, 0, 3) / 4, prompt
    sums -0.75 and 0.75, se^2 = 2 / 1 * 1.125 = 2.25; the per-root se is sqrt(14/3 / 4)."""
    labels = _hand_labels([1.0, 2.0, 3.0, 6.0], [1.0, 1.0, 1.0, 1.0], [0, 0, 1, 1])
    grid = cv.aggregate(labels)
    row = grid.filter(pl.col("verifier") == "traversal").row(0, named=True)
    assert row["E_holdout_se"] == pytest.approx(1.5, rel=1e-12) and row["E_se"] == pytest.approx(1.5, rel=1e-12)
    assert row["TPS_holdout_se"] == pytest.approx(0.75, rel=1e-12)
    assert row["E_holdout_se_root"] == pytest.approx(math.sqrt(7 / 6), rel=1e-12)
    assert row["roots"] == 4 and row["trajectories"] == 2
    chosen = cv.choose(grid, "traversal")
    pick = chosen.filter((pl.col("verifier") == "traversal") & (pl.col("choice") == "iid_TPS")).row(0, named=True)
    assert pick["E_se"] == pytest.approx(1.5, rel=1e-12) and pick["TPS_se"] == pytest.approx(0.75, rel=1e-12)
    assert pick["TPS_se_root"] == pytest.approx(math.sqrt(7 / 6) / 2, rel=1e-12)
    # Traversal minus SpecInfer: d = (E_t - E_s) / T = (0, 0.5, 1, 2.5): mean 1, influence (-1, -0.5, 0, 1.5) / 4
    diff = cv.paired_difference(labels, chosen, ("traversal", "iid_TPS"), ("specinfer", "iid_TPS")).row(0, named=True)
    assert diff["diff"] == pytest.approx(1.0, rel=1e-12)
    assert diff["se"] == pytest.approx(math.sqrt(2 * (0.375**2 + 0.375**2)), rel=1e-12)
    assert diff["se_root"] == pytest.approx(_root_se([0.0, 0.5, 1.0, 2.5]), rel=1e-12)
    assert diff["se"] != pytest.approx(diff["se_root"])
    table = cv.difference_table(labels, chosen, [("T - S", ("traversal", "iid_TPS"), ("specinfer", "iid_TPS"))], ["s"])
    assert table["s"][0] == "+1.000 ± 0.750"


def test_one_root_per_prompt_gives_the_per_root_standard_errors(small):
    """With one root per trajectory the clustered standard errors are the old per-root ones."""
    labels = pl.read_parquet(small / "labels.parquet")
    assert labels.group_by("setting", "trajectory").agg(pl.col("root").n_unique())["root"].max() == 1
    grid = pl.read_parquet(small / "grid.parquet")
    key = ["setting", "verifier", "K", "L1", "L2"]
    for row in grid.iter_rows(named=True):
        rows = labels.filter(*(pl.col(k) == row[k] for k in key))
        assert row["E_se"] == pytest.approx(_root_se(rows["E"].to_numpy()), rel=1e-12)
        assert row["E_holdout_se"] == pytest.approx(_root_se(rows["E_holdout"].to_numpy()), rel=1e-12)
        assert row["E_holdout_se"] == pytest.approx(row["E_holdout_se_root"], rel=1e-12)
    chosen = pl.read_parquet(small / "compare_verifiers.parquet")
    assert (chosen["E_se"] - chosen["E_se_root"]).abs().max() <= 1e-12 * chosen["E_se_root"].abs().max()
    assert (chosen["TPS_se"] - chosen["TPS_se_root"]).abs().max() <= 1e-12 * chosen["TPS_se_root"].abs().max()
    diff = cv.paired_difference(labels, chosen, ("traversal", "iid_TPS"), ("specinfer", "iid_TPS"))
    assert diff["se"].to_list() == pytest.approx(diff["se_root"].to_list(), rel=1e-12)


def test_several_roots_per_prompt_cluster_the_printed_tables(tmp_path, capsys):
    """Two roots per trajectory: the chosen trees' standard errors are the CR1 ones by prompt
    (recomputed here from the labels), and the printed tables say so."""
    flags = [f for f in SMALL if f != "--quiet"]
    flags[flags.index("--roots-per-trajectory") + 1] = "2"
    flags[flags.index("--trajectories") + 1] = "3"
    assert cv.main(flags + ["--out", str(tmp_path), "--spacing", "2"]) == 0
    out = capsys.readouterr().out
    assert "standard error clustered by prompt" in out and "over 3 prompts" in out
    labels = pl.read_parquet(tmp_path / "labels.parquet")
    chosen = pl.read_parquet(tmp_path / "compare_verifiers.parquet")
    assert set(chosen["trajectories"]) == {3} and set(chosen["roots"]) == {6}
    differ = 0
    for row in chosen.iter_rows(named=True):
        rows = labels.filter(*(pl.col(k) == row[k] for k in ("setting", "verifier", "K", "L1", "L2")))
        x, g = rows["E_holdout"].to_numpy(), rows["trajectory"].to_numpy()
        sums = [((x[g == t] - x.mean()) / len(x)).sum() for t in np.unique(g)]
        se = math.sqrt(3 / 2 * sum(s * s for s in sums))
        assert row["E_se"] == pytest.approx(se, rel=1e-10, abs=1e-15)
        assert row["E_se_root"] == pytest.approx(_root_se(x), rel=1e-10, abs=1e-15)
        differ += abs(row["E_se"] - row["E_se_root"]) > 1e-9
    assert differ > 0


def test_the_average_over_settings_is_clustered_by_prompt_across_settings():
    """Two settings on the same prompts: each prompt's difference is the same in both, so the
    average over settings is no better known than either setting (its standard error is the
    settings' own, not theirs over sqrt(2) as for independent settings)."""
    x = [1.0, 2.0, 3.0, 6.0]
    one = _hand_labels(x, [1.0] * 4, [0, 1, 2, 3])
    labels = pl.concat([one, one.with_columns(pl.lit("t").alias("setting"))])
    chosen = cv.choose(cv.aggregate(labels), "traversal")
    pair = ("traversal", "iid_TPS"), ("specinfer", "iid_TPS")
    by = cv.paired_difference(labels, chosen, *pair)
    se = _root_se([(e - 1.0) / 2.0 for e in x])
    assert by["se"].to_list() == pytest.approx([se, se], rel=1e-12)
    assert cv.average_difference_se(labels, chosen, *pair) == pytest.approx(se, rel=1e-12)
    table = cv.difference_table(labels, chosen, [("T - S", *pair)], ["s", "t"])
    assert table["average"][0] == f"{1.0:+.3f} ± {se:.3f}" == table["s"][0] == table["t"][0]
    # one prompt: no standard error
    single = _hand_labels([1.0, 2.0], [1.0, 1.0], [0, 0])
    single_chosen = cv.choose(cv.aggregate(single), "traversal")
    assert math.isnan(cv.average_difference_se(single, single_chosen, *pair))
