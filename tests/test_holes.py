"""Regression tests for the holes a skeptical user found (issue 11), one or more per hole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from analyses import block_efficiency_grid, compare_verifiers, divergence_by_depth
from backends.cli import PUBLISHED
from backends.synthetic import DepthProfileWorld, DistilledWorld
from simlab import tree_verifiers
from simlab.checks import check_bool, check_int
from simlab.decoding import greedy_decode, speculative_decode
from simlab.efficiency import emitted_sequence_law, expected_block_efficiency, simulate_block_efficiency, target_sequence_law
from simlab.files import STAGING_PREFIX
from simlab.pairs import ContextFreePair, MarkovPair
from simlab.builders import Delayed, chain, iid
from simlab.trees import DraftTree, NodeTable
from conftest import one_error_line

SMALL_DBD = ["--vocab", "12", "--roots-per-trajectory", "2", "--depth", "2", "--width", "2", "--k", "2", "--quiet"]


def one_line_exit_2(capsys, call) -> str:
    with pytest.raises(SystemExit) as exc:
        call()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err), err
    return err


# -- a temperature such as 1e-310 -------------------------------------------------------------------
def test_tiny_temperature_runs_the_synthetic_study(tmp_path):
    assert divergence_by_depth.main(SMALL_DBD + ["--settings", "1e-310", "--out", str(tmp_path)]) == 0
    nodes = pl.read_parquet(tmp_path / "nodes.parquet")
    assert nodes["h_p"].is_finite().all() and (nodes["h_p"] < 1.0).all()  # (nearly) one-hot laws, no NaN


def test_tiny_temperature_world_rows_are_laws():
    world = DepthProfileWorld(vocab=64, seed=0).with_settings(
        __import__("simlab.sampling", fromlist=["x"]).SamplingSettings(1e-310)
    )
    p, q = world.distributions([(3, 4)])
    assert np.isfinite(p).all() and p.sum() == 1.0 and q.sum() == 1.0


# -- ids -1 and >= V ----------------------------------------------------------------------------------
PAIR = MarkovPair.random(4, np.random.default_rng(0))


@pytest.mark.parametrize("bad", [-1, 4, 2.0, True])
@pytest.mark.parametrize("verifier", tree_verifiers.names())
def test_every_tree_verifier_refuses_bad_child_ids(verifier, bad):
    table = NodeTable(PAIR, (1,))
    with pytest.raises(ValueError, match=r"^tree: node \(\) has child"):
        tree_verifiers.get(verifier).outcome_law(DraftTree(table, {(): (0, bad)}))


@pytest.mark.parametrize("verifier", ["bv", "traversal"])
def test_whole_tree_verifiers_refuse_a_child_with_q_zero(verifier):
    pair = ContextFreePair([0.5, 0.25, 0.25], [0.5, 0.5, 0.0])
    tree = DraftTree(NodeTable(pair, ()), {(): (2,)})
    with pytest.raises(ValueError, match=r"^tree: child 2 of node \(\) has q = 0"):
        tree_verifiers.get(verifier).outcome_law(tree)


@pytest.mark.parametrize(
    "make",
    [
        lambda: PAIR,
        lambda: ContextFreePair([0.5, 0.5], [0.5, 0.5]),
        lambda: DepthProfileWorld(vocab=4, seed=0),
        lambda: DistilledWorld(vocab=4, seed=0, train_tokens=200),
    ],
)
@pytest.mark.parametrize("context", [(1, -1), (4,), (1.0,)])
def test_every_pair_refuses_bad_contexts(make, context):
    pair = make()
    context = tuple(min(t, pair.vocab_size) if isinstance(t, int) and t > 0 else t for t in context)
    with pytest.raises(ValueError, match=r"^context: "):
        pair.distributions([context])


# -- damaged captures, huge seeds, empty lists -------------------------------------------------------------
def test_divergence_study_replays_a_capture(tree_capture, tmp_path):
    assert divergence_by_depth.main(["--capture", str(tree_capture), "--k", "2", "--quiet", "--out", str(tmp_path)]) == 0
    from backends.capture_store import read_capture

    assert pl.read_parquet(tmp_path / "nodes.parquet").height == read_capture(tree_capture).height


@pytest.mark.parametrize("damage", ["garbage shard", "wrong schema", "truncated logits", "missing logits", "garbage settings"])
def test_damaged_capture_exits_2_with_one_line(tree_capture, tmp_path, capsys, damage):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tree_capture, broken)
    shard, logits = sorted(broken.glob("nodes-r*.parquet"))[0], sorted(broken.glob("logits-r*.npz"))[0]
    if damage == "garbage shard":
        shard.write_bytes(b"PAR1 not really")
    elif damage == "wrong schema":
        pl.DataFrame({"x": [1, 2]}).write_parquet(shard)
    elif damage == "truncated logits":
        logits.write_bytes(logits.read_bytes()[:40])
    elif damage == "missing logits":
        logits.unlink()
    else:
        (broken / "settings.json").write_text("{not json")
    err = one_line_exit_2(
        capsys, lambda: divergence_by_depth.main(["--capture", str(broken), "--quiet", "--out", str(tmp_path / "o")])
    )
    assert "--capture" in err and ("damaged" in err or "settings.json" in err), err


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--settings", "0.5"], "--settings"),
        (["--shape", "chain"], "--shape"),
        (["--depth", "3"], "--depth"),
        (["--width", "3"], "--width"),
        (["--vocab", "8"], "--vocab"),
        (["--trajectories", "2"], "--trajectories"),
        (["--backend", "synthetic"], "--backend"),
        (["--device", "cpu"], "--device"),
    ],
)
def test_flags_a_capture_cannot_honour_are_refused(tree_capture, tmp_path, capsys, flags, flag):
    err = one_line_exit_2(
        capsys, lambda: divergence_by_depth.main(["--capture", str(tree_capture), *flags, "--out", str(tmp_path)])
    )
    assert err.split("error: ")[1].startswith(flag) and "cannot honour" in err, err


def test_flags_the_synthetic_source_cannot_honour_are_refused(tmp_path, capsys):
    for flags, flag in ((["--target", "x"], "--target"), (["--device", "cpu"], "--device"), (["--dtype", "bfloat16"], "--dtype")):
        err = one_line_exit_2(capsys, lambda: divergence_by_depth.main(flags + ["--out", str(tmp_path)]))
        assert f"error: {flag}: the synthetic source cannot honour it" in err
    err = one_line_exit_2(
        capsys, lambda: compare_verifiers.main(["--latency", "x.json", "--cost-ratio", "0.2", "--out", str(tmp_path)])
    )
    assert "--cost-ratio" in err


def test_grid_flags_a_capture_cannot_honour(grid_capture, tmp_path, capsys):
    for flags, flag in ((["--samples", "3"], "--samples"), (["--jobs", "2"], "--jobs"), (["--method", "exact"], "--method")):
        err = one_line_exit_2(
            capsys,
            lambda: compare_verifiers.main(
                ["--capture", str(grid_capture), "--K-max", "2", "--L-max", "2", *flags, "--out", str(tmp_path), "--quiet"]
            ),
        )
        assert f"error: {flag}: the capture source cannot honour it" in err, err


@pytest.mark.parametrize("main", [divergence_by_depth.main, block_efficiency_grid.main, compare_verifiers.main])
def test_a_seed_beyond_2_63_is_one_line(main, capsys, tmp_path):
    err = one_line_exit_2(capsys, lambda: main(["--seed", str(2**63), "--out", str(tmp_path), "--quiet"]))
    assert "--seed" in err


@pytest.mark.parametrize("flags, flag", [(["--K", ""], "--K"), (["--K", "1,,2"], "--K"), (["--verifiers", ""], "--verifiers")])
def test_empty_list_flags_are_one_line(flags, flag, capsys, tmp_path):
    err = one_line_exit_2(capsys, lambda: block_efficiency_grid.main(flags + ["--out", str(tmp_path)]))
    assert f"error: {flag}:" in err


def test_core_errors_are_mapped_onto_the_flag(capsys, tmp_path):
    with pytest.raises(ValueError) as core:
        DepthProfileWorld(vocab=1)
    err = one_line_exit_2(capsys, lambda: divergence_by_depth.main(["--vocab", "1", "--out", str(tmp_path)]))
    assert err.strip().endswith("--" + str(core.value))  # the core's message, named by its flag


# -- decoding loops --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: speculative_decode(PAIR, [0], iid(2, 2), "specinfer", 5, 42), "rng"),
        (lambda: speculative_decode(PAIR, [0], iid(2, 2), "specinfer", 5, None), "rng"),
        (lambda: speculative_decode(PAIR, [9], iid(2, 2), "specinfer", 5, np.random.default_rng(0)), "prompt"),
        (lambda: speculative_decode(PAIR, [-1], iid(2, 2), "specinfer", 5, np.random.default_rng(0)), "prompt"),
        (lambda: speculative_decode(PAIR, [0], "iid", "specinfer", 5, np.random.default_rng(0)), "shape"),
        (lambda: speculative_decode(PAIR, [0], iid(2, 2), "nope", 5, np.random.default_rng(0)), "name"),
        (lambda: speculative_decode(PAIR, [0], iid(2, 2), 3, 5, np.random.default_rng(0)), "verifier"),
        (lambda: speculative_decode(PAIR, [0], iid(2, 2), "specinfer", -1, np.random.default_rng(0)), "new_tokens"),
        (lambda: speculative_decode("pair", [0], iid(2, 2), "specinfer", 1, np.random.default_rng(0)), "pair"),
        (lambda: greedy_decode(PAIR, [7], 3), "prompt"),
        (lambda: greedy_decode(PAIR, [0], 2.5), "new_tokens"),
    ],
)
def test_decoding_loops_raise_value_errors_naming_the_argument(call, name):
    with pytest.raises(ValueError, match=f"^{name}: "):
        call()


# -- one integer helper -------------------------------------------------------------------------------
def test_numpy_integers_are_integers_everywhere():
    from simlab import verifiers
    from simlab.latency import LatencyModel

    four = np.int64(4)
    assert Delayed(np.int64(2), four, np.int64(1)).tokens == 6
    assert verifiers.get("khisti", s=np.int64(5)).s == 5
    assert verifiers.get("spectr").acceptance_rate([0.5, 0.5], [0.9, 0.1], np.int64(2)) > 0
    assert LatencyModel.from_cost_ratio(0.1).tree_time(np.int64(3), [np.int64(1), 2]) > 0
    assert expected_block_efficiency(PAIR, [0], chain(1), "nss", method="mc", samples=np.int64(2)).samples == 2
    for bad in (True, 4.0, "4", None):
        with pytest.raises(ValueError, match="^x: must be an integer"):
            check_int(bad, "x", 1)


# -- one flag helper: a flag is a bool, never a truth value -------------------------------------------
def test_flags_take_only_bools():
    from simlab import verifiers
    from simlab.otlp import optimal_acceptance, solve_ot_lp

    assert check_bool(np.bool_(False), "x") is False and check_bool(True, "x") is True
    p, q = [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]
    # The same flag given as a NumPy bool reads the same: without replacement k = 2 accepts more.
    assert optimal_acceptance(p, q, 2, replacement=np.bool_(False)) == optimal_acceptance(p, q, 2, replacement=False)
    assert optimal_acceptance(p, q, 2, replacement=False) > optimal_acceptance(p, q, 2)
    for bad in (0, 1, "no", None, 0.0):
        with pytest.raises(ValueError, match="^x: must be True or False"):
            check_bool(bad, "x")
        with pytest.raises(ValueError, match="^replacement: must be True or False"):
            optimal_acceptance(p, q, 2, replacement=bad)
        with pytest.raises(ValueError, match="^replacement: must be True or False"):
            solve_ot_lp(p, q, 2, replacement=bad)
        with pytest.raises(ValueError, match="^replacement: must be True or False"):
            verifiers.get("optimal", replacement=bad)
        with pytest.raises(ValueError, match="^allow_lossy: must be True or False"):
            tree_verifiers.get("traversal", allow_lossy=bad)


# -- staging files left by a SIGKILL ------------------------------------------------------------------
def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_next_run_removes_what_a_killed_run_left(tmp_path):
    stale = tmp_path / f"{STAGING_PREFIX}{dead_pid()}-abc-nodes.parquet"
    live = tmp_path / f"{STAGING_PREFIX}{os.getppid()}-abc-nodes.parquet"  # a running process's file stays
    stale.write_bytes(b"half")
    live.write_bytes(b"in progress")
    assert divergence_by_depth.main(SMALL_DBD + ["--out", str(tmp_path)]) == 0
    assert not stale.exists() and live.exists()


def test_a_sigkilled_study_leaves_files_the_next_run_removes(tmp_path):
    """SIGKILL a study while it stages its outputs; the rerun of the same tool publishes cleanly and
    no hidden file is left."""
    import signal
    import time

    command = [
        sys.executable,
        "-c",
        "import sys, analyses.divergence_by_depth as d, backends.cli as c\n"
        "orig = c.OutputSet.stage\n"
        "def slow(self, name, write):\n    orig(self, name, write)\n    import time; time.sleep(60)\n"
        "c.OutputSet.stage = slow\nsys.exit(d.main(sys.argv[1:]))\n",
        *SMALL_DBD,
        "--out",
        str(tmp_path),
    ]
    process = subprocess.Popen(command, cwd=Path(__file__).resolve().parent.parent)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(f"{STAGING_PREFIX}*")):
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert list(tmp_path.glob(f"{STAGING_PREFIX}*"))
    assert divergence_by_depth.main(SMALL_DBD + ["--out", str(tmp_path)]) == 0
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [PUBLISHED]  # the list of published files only
    assert (tmp_path / "nodes.parquet").exists()


# -- end of sequence -----------------------------------------------------------------------------------
EOS = 2


def eos_pair(eos=EOS):
    pair = MarkovPair.random(3, np.random.default_rng(4), concentration=0.8, closeness=0.4)
    return MarkovPair(pair.target, pair.draft, eos_id=eos)


@pytest.mark.parametrize("verifier", ["specinfer", "spectr", "naive", "nss", "traversal", "bv", "naive_chain"])
def test_no_token_after_an_eos_is_counted(verifier):
    pair = eos_pair()
    table = NodeTable(pair, (0,))
    v = tree_verifiers.get(verifier)
    for tree, _ in Delayed(2, 1, 2).enumerate(table):
        law = v.outcome_law(tree)
        kept = sum(float(vec.sum()) * (path.index(EOS) + 1 if EOS in path else len(path) + 1) for path, vec in law.items())
        assert v.expected_block_efficiency(tree) == pytest.approx(kept, abs=1e-12)
        assert v.block_efficiency_by_depth(tree, [tree.depth()])[0] == pytest.approx(kept, abs=1e-12)
    plain = MarkovPair(pair.target, pair.draft)
    assert (
        expected_block_efficiency(pair, (0,), Delayed(2, 1, 2), verifier).mean
        < expected_block_efficiency(plain, (0,), Delayed(2, 1, 2), verifier).mean
    )


@pytest.mark.parametrize("verifier", ["specinfer", "traversal"])
def test_emitted_law_with_eos_is_the_target_law_until_eos(verifier):
    pair = eos_pair()
    law = emitted_sequence_law(pair, (0,), iid(2, 2), verifier, 3)
    target = target_sequence_law(pair, (0,), 3)
    assert any(len(s) < 3 and s[-1] == EOS for s in target)
    assert set(law) == set(target)
    assert max(abs(law[s] - target[s]) for s in target) <= 1e-12


def test_decoding_stops_at_eos_and_nothing_changes_without_one():
    pair = eos_pair()
    tokens, steps = speculative_decode(pair, (0,), iid(2, 2), "specinfer", 200, np.random.default_rng(1))
    assert tokens[-1] == EOS and EOS not in tokens[:-1] and sum(steps) == len(tokens)
    greedy = greedy_decode(pair, (0,), 200)
    assert EOS not in greedy[:-1]
    plain = MarkovPair(pair.target, pair.draft)
    a = simulate_block_efficiency(plain, (0,), iid(2, 2), "specinfer", steps=50, seed=3)
    b = simulate_block_efficiency(
        MarkovPair(pair.target, pair.draft, eos_id=None), (0,), iid(2, 2), "specinfer", steps=50, seed=3
    )
    assert a == b


# -- --help shows defaults and the valid names ---------------------------------------------------------
@pytest.mark.parametrize(
    "module, names",
    [
        ("analyses.divergence_by_depth", ["depth_profile", "distilled", "iid", "chain", "delayed"]),
        ("analyses.block_efficiency_grid", ["depth_profile", "specinfer", "traversal", "bv"]),
        ("analyses.compare_verifiers", ["depth_profile", "specinfer", "traversal"]),
        ("analyses.train_selector", ["distilled", "specinfer", "spectr"]),
        ("backends.capture", ["iid", "grid"]),
    ],
)
def test_help_shows_defaults_and_valid_names(module, names):
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent
    )
    assert result.returncode == 0 and "(default:" in result.stdout
    for name in names:
        assert name in result.stdout, (module, name)


def test_studies_write_to_a_folder_named_after_their_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert (
        block_efficiency_grid.main(
            [
                "--vocab",
                "3",
                "--roots-per-trajectory",
                "1",
                "--K",
                "1",
                "--L1-max",
                "1",
                "--L2-max",
                "1",
                "--verifiers",
                "specinfer",
                "--quiet",
            ]
        )
        == 0
    )
    assert (tmp_path / "out" / "block_efficiency_grid" / "synthetic-depth_profile-V3" / "block_efficiency_grid.parquet").exists()
