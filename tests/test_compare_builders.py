"""The matched-budget comparison of every builder (issue 15) as a tool: outputs, matched budgets,
ratios, reasons for what cannot run, and its exact values against the core called directly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from conftest import live_pair_flags, one_error_line

from analyses import compare_builders

SMALL = [
    "--vocab",
    "12",
    "--trajectories",
    "2",
    "--roots-per-trajectory",
    "1",
    "--spacing",
    "6",
    "--settings",
    "0,1",
    "--budgets",
    "4,8",
    "--samples",
    "2",
    "--grid-samples",
    "1",
    "--epochs",
    "3",
    "--quiet",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cb")
    assert compare_builders.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_outputs_and_reasons(run):
    for name in (
        "compare_builders.parquet",
        "per_root.parquet",
        "by_depth.parquet",
        "node_gaps.parquet",
        "not_run.parquet",
        "throughput.html",
        "throughput.png",
        "acceptance_by_depth.html",
        "acceptance_by_depth.png",
    ):
        assert (run / name).stat().st_size > 0, name
    per_root = pl.read_parquet(run / "per_root.parquet")
    for name in ("per_root", "by_depth", "node_gaps"):  # null on synthetic roots, one type in every frame
        assert pl.read_parquet(run / f"{name}.parquet").schema["offset"] == pl.Int64, name
    not_run = pl.read_parquet(run / "not_run.parquet")
    ran = set(per_root["builder"])
    assert ran | set(not_run["builder"]) == set(compare_builders.roster_module.NAMES)  # never silently dropped
    assert "nde" in set(not_run["builder"]) and (not_run["reason"].str.len_chars() > 0).all()
    assert {"eagle2", "specblock", "treegraft_best", "delayed", "sequoia"} <= ran


def test_budgets_are_matched_and_pairings_lossless(run):
    from simlab import tree_verifiers
    from simlab.drafting import Drafting

    per_root = pl.read_parquet(run / "per_root.parquet")
    assert (per_root["tokens"] <= per_root["budget"]).all()
    for builder, verifier in per_root.select("builder", "verifier").unique().iter_rows():
        assert compare_builders.roster_module.LAWS[builder] <= set(tree_verifiers.get(verifier).lossless_for), (builder, verifier)
    assert Drafting.DETERMINISTIC in compare_builders.roster_module.LAWS["eagle2"]
    best = per_root.filter(pl.col("builder") == "treegraft_best").join(
        per_root.filter(pl.col("builder") == "treegraft_learned"), on=["setting", "root", "budget", "verifier"], suffix="_l"
    )
    assert (best["E"] / best["T"] >= best["E_l"] / best["T_l"] - 1e-12).all()  # the exact best schedule dominates


def test_exact_values_equal_the_core(run):
    from backends.synthetic import make_world
    from simlab.builders import EAGLE2
    from simlab.efficiency import expected_block_efficiency
    from simlab.pairs import rooted
    from simlab.sampling import SamplingSettings

    per_root = pl.read_parquet(run / "per_root.parquet").filter((pl.col("builder") == "eagle2") & (pl.col("setting") == "T=1"))
    world = make_world("depth_profile", vocab=12, seed=0, settings=SamplingSettings(1.0))
    assert per_root.height
    for row in per_root.iter_rows(named=True):
        direct = expected_block_efficiency(
            rooted(world, len(row["context"])), row["context"], EAGLE2(budget=row["budget"], depth=7, top_k=10), row["verifier"]
        )
        assert abs(direct.mean - row["E"]) <= 1e-12


def test_with_one_builder_the_ratios_are_one(tmp_path):
    assert compare_builders.main(SMALL + ["--builders", "eagle2", "--baseline", "eagle2", "--out", str(tmp_path)]) == 0
    summary = pl.read_parquet(tmp_path / "compare_builders.parquet")
    primary = summary.filter(
        pl.col("verifier") == pl.when(pl.col("setting") == "T=0").then(pl.lit("greedy")).otherwise(pl.lit("onehot"))
    )
    assert primary.height and (primary["vs_baseline"] - 1).abs().max() <= 1e-12 and primary["paired_dE"].abs().max() <= 1e-12


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--budgets", "0"], "--budgets"),
        (["--builders", "medusa"], "--builders"),
        (["--verifiers", "x"], "--verifiers"),
        (["--samples", "1"], "--samples"),
        (["--capture", "x"], "--capture"),
        (["--selector", "nowhere"], "--selector"),
        (["--trajectories", "1"], "--trajectories"),
        (["--drafters", "x"], "--drafters"),
        (["--builders", "iid"], "--baseline"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        compare_builders.main(flags + ["--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and flag in err, err


def test_on_the_micro_pair_with_the_trained_block_drafter(micro_pair_dir, drafters, tmp_path):
    flags = [
        *live_pair_flags(micro_pair_dir),
        "--trajectories",
        "2",
        "--roots-per-trajectory",
        "1",
        "--settings",
        "1",
        "--budgets",
        "6",
        "--builders",
        "eagle2,specblock,iid",
        "--verifiers",
        "onehot,specinfer",
        "--samples",
        "2",
        "--grid-samples",
        "1",
        "--out",
        str(tmp_path),
        "--quiet",
    ]
    assert compare_builders.main(flags) == 0
    per_root = pl.read_parquet(tmp_path / "per_root.parquet")
    assert set(per_root["builder"]) == {"eagle2", "specblock", "iid"} and (per_root["tokens"] <= 6).all()
    assert per_root["offset"].to_list() == [0] * per_root.height  # one root per prompt: at the template's end


def test_a_builder_without_a_lossless_verifier_is_listed_and_a_missing_baseline_is_said(tmp_path, capsys):
    """Issue 28: with --verifiers traversal EAGLE-2 (deterministic trees: no lossless pairing with
    traversal) got neither rows nor a not-run reason, and vs_baseline was null with no note."""
    assert (
        compare_builders.main(
            SMALL
            + [
                "--settings",
                "1",
                "--budgets",
                "4",
                "--builders",
                "sequoia,eagle2",
                "--verifiers",
                "traversal",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    not_run = pl.read_parquet(tmp_path / "not_run.parquet").filter(pl.col("builder") == "eagle2")
    assert not_run["setting"].to_list() == ["T=1"] and not_run["reason"].str.contains("--verifiers").all()
    summary = pl.read_parquet(tmp_path / "compare_builders.parquet")
    assert set(summary["builder"]) == {"sequoia"} and summary["vs_baseline"].is_null().all()
    assert (
        summary["baseline_note"].str.contains("onehot is not among --verifiers").sum()
        == summary.filter(pl.col("setting") == "T=1").height
    )
    assert "note: vs_baseline and paired_dE are empty at T=1" in err


def test_the_baseline_note_is_null_where_the_ratio_is_given(run):
    summary = pl.read_parquet(run / "compare_builders.parquet")
    assert summary["vs_baseline"].is_not_null().all() and summary["baseline_note"].is_null().all()


def test_standard_errors_are_over_roots_clustered_by_prompt():
    """``summarise``: ``E_se`` and ``paired_dE_se`` are CR1 over the roots clustered by prompt (two
    roots of prompt 0, one of prompt 1), ``E_mc_se`` the trees' Monte Carlo error given the roots."""
    import math

    from analyses.compare_builders import summarise

    rows = []
    for root, (trajectory, e_iid, e_eagle) in enumerate([(0, 3.0, 2.0), (0, 5.0, 2.5), (1, 4.0, 3.0)]):
        for builder, verifier, E, se in (("iid", "spectr", e_iid, 0.3), ("eagle2", "onehot", e_eagle, 0.0)):
            rows.append(
                {
                    "setting": "T=1",
                    "budget": 8,
                    "trajectory": trajectory,
                    "root": root,
                    "builder": builder,
                    "verifier": verifier,
                    "E": E,
                    "accepted": E - 1,
                    "se": se,
                    "T": 0.01,
                    "tokens": 8,
                    "sampled": builder == "iid",
                }  # fmt: skip
            )
    table = summarise(pl.DataFrame(rows), "eagle2", {"T=1": "onehot"})
    iid = table.filter(pl.col("builder") == "iid").row(0, named=True)
    # E: mean 4, influences (-1, 1, 0) / 3, prompt sums (0, 0): clustered se 0 (independent roots: 0.577)
    assert iid["E"] == 4.0 and iid["E_se"] == 0.0
    assert math.isclose(iid["E_mc_se"], math.sqrt(3 * 0.09) / 3, rel_tol=1e-12)
    # paired d = (1, 2.5, 1), mean 1.5, influences (-0.5, 1, -0.5) / 3, prompt sums (0.5 / 3, -0.5 / 3)
    assert math.isclose(iid["paired_dE"], 1.5, rel_tol=1e-12)
    assert math.isclose(iid["paired_dE_se"], math.sqrt(2 * 2 * (0.5 / 3) ** 2), rel_tol=1e-12)
    # per-root throughput E / T with T = 0.01 s: the differences are 100 d tokens/s
    assert math.isclose(iid["paired_dTPS"], 150.0, rel_tol=1e-12)
    assert math.isclose(iid["paired_dTPS_se"], 100 * iid["paired_dE_se"], rel_tol=1e-12)
    # by place along the reply: each offset's block is the summary of its roots alone
    from analyses.compare_builders import by_offset

    noted = lambda frame: summarise(frame, "eagle2", {"T=1": "onehot"})
    placed = pl.DataFrame(rows).with_columns((pl.col("root") % 2 * 16).alias("offset"))
    blocks = by_offset(placed, noted)
    assert blocks["offset"].unique().sort().to_list() == [0, 16]
    for o in (0, 16):
        want = noted(placed.filter(pl.col("offset") == o))
        assert blocks.filter(pl.col("offset") == o).drop("offset").equals(want)
    assert by_offset(pl.DataFrame(rows), noted) is None  # no offsets (synthetic roots)
    assert by_offset(placed.with_columns(pl.lit(0).alias("offset")), noted) is None  # one place only
    assert by_offset(placed.with_columns(pl.lit(None, dtype=pl.Int64).alias("offset")), noted) is None


def test_the_fit_builds_one_table_per_training_root_and_matches_the_plain_fits(monkeypatch, tmp_path):
    """The run's fit stage (``sharded``'s, the compare stage left out) takes each training root's
    share of every fit (the static grid's sums, Sequoia's vector, TreeGraft's margins) from one
    table of that root, through its part; its choices equal the plain fits written here from the
    core alone on each setting's training roots (2 settings, 4 training roots each): DDTE's grid
    summed over the roots (E over T-hat), Sequoia's vector from each root's own forward,
    TreeGraft's margins on a fresh table per budget."""
    import numpy as np

    from backends.sources.base import Root
    from simlab import builders, tree_verifiers
    from simlab.builders.sequoia import measure_acceptance
    from simlab.grid import GridAxes, action_grid_block_efficiency
    from simlab.treegraft.schedules import evaluate_schedules, margins, train
    from simlab.trees import drafting_table

    config, parser = compare_builders.parse_args(
        SMALL[:-1]
        + ["--trajectories", "4", "--roots-per-trajectory", "2", "--budgets", "4"]
        + ["--builders", "iid,delayed,sequoia,eagle2,treegraft_learned"]
    )
    opened = replace(compare_builders.open_source(config, parser, lambda message: None), out=tmp_path)
    every = {s: list(opened.source.roots(s)) for s in opened.settings}
    test = compare_builders.split([r.trajectory for rs in every.values() for r in rs], config.test_share, config.seed)
    roots = {s: [r for r in rs if r.trajectory not in test] for s, rs in every.items()}
    calls = []
    table = Root.table
    monkeypatch.setattr(Root, "table", lambda self: calls.append((self.setting, self.root)) or table(self))
    monkeypatch.setattr(compare_builders, "_compare_root", lambda *args, test: None)  # the fit stage only
    monkeypatch.setattr(compare_builders, "_compare_merge", lambda *args, test: None)
    assert compare_builders.sharded(config, opened, 0, 1, lambda message: None) is None
    roster = opened.roster
    trained = [(s.name, r.root) for s, rs in roots.items() for r in rs]
    assert sorted(calls) == sorted(trained) and len(calls) == len(set(calls))  # one table per training root
    assert all(len(rs) == 4 for rs in roots.values()) and len(roots) == 2
    monkeypatch.setattr(Root, "table", table)
    latency, static, checked = roster.latency, {}, 0
    for setting, rs in roots.items():
        laws = compare_builders.roster_module.LAWS["delayed"]
        for v in [v for v in tree_verifiers.lossless_names(laws, setting) if v in config.verifiers]:
            sums = {}
            for root in rs:
                grid = action_grid_block_efficiency(
                    root.pair, root.context, v, samples=config.grid_samples, seed=config.seed + root.root, table=root.table()
                )
                for action, estimate in grid.items():
                    E, T = sums.get(action, (0.0, 0.0))
                    sums[action] = (E + estimate.mean, T + latency.delayed_time(*action, len(root.context)))
            for budget in config.budgets:
                for kind in ("iid", "delayed"):
                    candidates = [a for a in GridAxes().actions(budget, rollouts=kind == "iid") if a in sums]
                    if candidates:
                        static[(setting.name, v, budget, kind)] = max(
                            candidates, key=lambda a: (sums[a][0] / sums[a][1], -sum(a))
                        )
        vector = np.mean(
            [
                measure_acceptance(
                    root.pair, [root.context], 8, method="mc", samples=512, rng=np.random.default_rng([config.seed, root.root])
                )
                for root in rs
            ],
            axis=0,
        )
        rule = tree_verifiers.deterministic_rule(setting)
        for budget in config.budgets:
            fitted = roster.sequoia[(setting.name, budget)]
            np.testing.assert_allclose(fitted.acceptance, vector, rtol=0, atol=1e-12)
            assert (
                fitted.spec
                == builders.get("sequoia", acceptance=tuple(vector.tolist()), budget=budget, depth=min(budget, 8)).spec
            )
            X, y = [], []
            for root in rs:
                base = builders.get("treegraft", budget=budget, cached=root.prompt_length)
                fresh = root.table()
                values = evaluate_schedules(base, drafting_table(fresh, config.draft_law), rule, latency, verify_table=fresh)
                prompt = root.prompt_length if root.prompt_length is not None else len(root.context)
                for z, margin, _ in margins(base, drafting_table(fresh, config.draft_law), values, latency, prompt):
                    X.append(z)
                    y.append(margin)
            want, _ = train(np.array(X), np.array(y), epochs=config.epochs, seed=config.seed)
            got = roster.treegraft.scheduler[(setting.name, budget)]
            assert all((a == b).all() for a, b in zip(got.network.parameters(), want.network.parameters()))
            checked += 1
    assert roster.static == static and static and checked == len(roots) * len(config.budgets)


def test_the_best_treegraft_trees_of_a_root_are_let_go_at_the_next_root():
    """``TreeGraftEntry`` keeps the best schedule's trees (which hold the root's whole node table)
    for one root only: a study over many held-out roots does not keep every root's table alive."""
    import gc
    import weakref

    config, parser = compare_builders.parse_args(SMALL[:-1] + ["--trajectories", "2", "--builders", "eagle2,treegraft_best"])
    opened = compare_builders.open_source(config, parser, lambda message: None)
    roster = compare_builders.roster_for(config, opened, parser)
    setting = opened.settings[1]
    tables = []
    for root in opened.source.roots(setting):
        table = root.table()
        for budget in config.budgets:
            for _ in range(2):  # a second verifier: the same tree, no second search
                tree = roster.treegraft("treegraft_best", root, setting, budget, "onehot", table).tree
            assert roster.treegraft.best[budget] is tree
        tables.append(weakref.ref(table))
        del table, tree
    gc.collect()
    assert len(tables) >= 2 and all(t() is None for t in tables[:-1]) and tables[-1]() is not None
    assert set(roster.treegraft.best) == set(config.budgets)


def _tables(out) -> dict:
    return {name: (out / name).read_bytes() for name in ("compare_builders.parquet", "per_root.parquet", "by_depth.parquet")}


def test_two_ranks_run_one_after_the_other_equal_one_process(monkeypatch, tmp_path, capsys):
    """Sharded (``WORLD_SIZE`` 2), each rank run in turn with no wait: rank 1 writes its fit part and
    stops, naming rank 0's missing fit part; rank 0 fits (both fit parts) and values its held-out
    share, then stops waiting for rank 1's compare part; rank 1 rerun values its share; rank 0 rerun
    merges: the tables equal one process's byte for byte."""
    monkeypatch.setattr(compare_builders, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
    argv = SMALL[:-1] + [
        "--trajectories",
        "4",
        "--settings",
        "1",
        "--builders",
        "iid,eagle2,sequoia,treegraft_learned",
        "--quiet",
    ]
    assert compare_builders.main([*argv, "--out", str(tmp_path / "one")]) == 0
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("SIMLAB_SHARD_WAIT", "0")
    many = [*argv, "--out", str(tmp_path / "many")]
    for rank, code, said in (
        (1, 2, "ranks 0 of 2 left no complete fit part"),
        (0, 2, "ranks 1 of 2 left no complete compare part"),
    ):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(SystemExit) as exit_:
            compare_builders.main(many)
        err = capsys.readouterr().err
        assert exit_.value.code == code and said in err and one_error_line(err), err
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert compare_builders.main(many) == 0
    assert _tables(tmp_path / "many") == _tables(tmp_path / "one")


def test_a_killed_run_resumes_from_its_parts_unless_an_input_or_the_fit_changed(monkeypatch, tmp_path):
    """Killed in the compare stage after its first held-out root (parts written per root here) and
    rerun: (i) with a fit part whose shares changed (edited by hand) it keeps the fit part but
    values every held-out root again (the compare stage's key holds the fit's digest); (ii) with a
    latency profile file whose content changed under the same path it values both stages again;
    (iii) unchanged, it values no training root and only the held-out root not in its compare
    part, and its tables equal a fresh run's; a finished run removes its parts."""
    from analyses import _study
    from simlab.latency import LatencyModel

    monkeypatch.setattr(compare_builders, "chart_writer", lambda chart, fmt: lambda tmp: Path(tmp).write_bytes(b""))
    monkeypatch.setattr(_study, "SHARD_BATCH", 1)
    profile = tmp_path / "latency.json"
    LatencyModel.from_cost_ratio(0.1).save(profile)
    argv = SMALL[:-1] + ["--trajectories", "4", "--settings", "1", "--builders", "iid,eagle2", "--latency", str(profile)]
    plain_fit, plain_measure, calls = compare_builders.fit_share, compare_builders.measure_root, {"fit": 0, "measure": 0}

    def dying(*args):
        if calls["measure"] == 1:
            raise KeyboardInterrupt
        calls["measure"] += 1
        return plain_measure(*args)

    def killed(out):
        calls.update(fit=0, measure=0)
        monkeypatch.setattr(compare_builders, "measure_root", dying)
        assert compare_builders.main([*argv, "--quiet", "--out", str(out)]) == 130
        monkeypatch.setattr(compare_builders, "fit_share", lambda *a: calls.update(fit=calls["fit"] + 1) or plain_fit(*a))
        monkeypatch.setattr(
            compare_builders, "measure_root", lambda *a: calls.update(measure=calls["measure"] + 1) or plain_measure(*a)
        )
        calls.update(fit=0, measure=0)

    out = tmp_path / "run"
    killed(out)
    fit_part = out / "parts" / "fit-rank-0-of-1.json"
    part = json.loads(fit_part.read_text())
    share = next(v for v in part["roots"].values() if v is not None)
    share["static"][0][2] += 0.5  # another E for one action of one training root
    fit_part.write_text(json.dumps(part))
    assert compare_builders.main([*argv, "--quiet", "--out", str(out)]) == 0
    assert calls == {"fit": 0, "measure": 2}  # the fit part reused, both held-out roots valued again
    monkeypatch.setattr(compare_builders, "fit_share", plain_fit)
    killed(out)
    LatencyModel.from_cost_ratio(0.4).save(profile)
    assert compare_builders.main([*argv, "--quiet", "--out", str(out)]) == 0
    assert calls == {"fit": 2, "measure": 2}
    monkeypatch.setattr(compare_builders, "fit_share", plain_fit)
    killed(out)
    assert compare_builders.main([*argv, "--quiet", "--out", str(out)]) == 0
    assert calls == {"fit": 0, "measure": 1} and not (out / "parts").exists()
    assert compare_builders.main([*argv, "--quiet", "--out", str(tmp_path / "fresh")]) == 0
    assert _tables(out) == _tables(tmp_path / "fresh")
