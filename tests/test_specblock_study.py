"""The SpecBlock study and the trained drafter as tools: outputs on the synthetic stand-in and on the
micro pair (with micro drafters), budgets, lossless greedy decoding, deterministic training, one-line errors."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from conftest import live_pair_flags, one_error_line

from analyses import specblock

SMALL = [
    "--vocab",
    "24",
    "--trajectories",
    "2",
    "--roots-per-trajectory",
    "1",
    "--spacing",
    "6",
    "--budgets",
    "6,12",
    "--K",
    "3",
    "--beam-width",
    "3",
    "--quiet",
]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sb")
    assert specblock.main(SMALL + ["--out", str(out)]) == 0
    return out


def test_synthetic_outputs_and_budgets(synthetic_run):
    for name in (
        "specblock.parquet",
        "per_root.parquet",
        "by_depth.parquet",
        "by_slot.parquet",
        "not_run.parquet",
        "throughput.html",
        "throughput.png",
    ):
        assert (synthetic_run / name).stat().st_size > 0, name
    assert not (synthetic_run / "stream.parquet").exists()
    per_root = pl.read_parquet(synthetic_run / "per_root.parquet")
    assert set(per_root["builder"]) == {"eagle2", "block_topk", "rank_guided"}
    assert (per_root["tokens"] <= per_root["budget"]).all()
    assert set(pl.read_parquet(synthetic_run / "not_run.parquet")["builder"]) == {
        "no_shift",
        "no_valid_prefix",
        "attention_free",
        "stream",
    }
    for row in per_root.group_by("setting", "root", "budget", "builder").agg(pl.col("E").max() - pl.col("E").min()).iter_rows():
        assert row[-1] <= 1e-12  # every lossless verifier of a deterministic tree gives the same exact value
    by_slot = (
        pl.read_parquet(synthetic_run / "by_slot.parquet")
        .group_by("setting", "root", "budget", "builder", "verifier")
        .agg(pl.col("accepted").sum())
    )
    joined = by_slot.join(per_root, on=["setting", "root", "budget", "builder", "verifier"])
    assert np.allclose(joined["accepted"] + 1, joined["E"], atol=1e-12)  # accepted tokens by slot add up to E - 1


def test_the_drafters_train_deterministically(micro_pair_dir, tmp_path):
    from backends.block_drafter.__main__ import main
    from backends.block_drafter.drafter import load

    for name in ("a", "b"):
        assert main(["--pair", str(micro_pair_dir), "--micro", "--steps", "8", "--out", str(tmp_path / name), "--quiet"]) == 0
    (a, manifest), (b, _) = load(tmp_path / "a"), load(tmp_path / "b")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert (
        manifest["threads"] == 1
        and manifest["torch"] == torch.__version__
        and len(manifest["held_out"]["acceptance_by_slot"]) == 4
    )


def test_greedy_verification_with_the_trained_drafter_equals_greedy_decoding(micro_pair_dir, drafters):
    from backends.block_drafter.drafter import TorchBlockDrafter, load
    from backends.hf import HFPair
    from simlab.decoding import greedy_decode, speculative_decode
    from simlab.sampling import SamplingSettings
    from simlab.specblock import RankGuided

    pair = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu", settings=SamplingSettings(0.0))
    model, _ = load(drafters / "full")
    builder = RankGuided(TorchBlockDrafter(model, pair), budget=10, beam_width=3)
    prompt = pair.encode("The built-in functions")
    tokens, _ = speculative_decode(pair, prompt, builder, "greedy", 24, np.random.default_rng(0))
    assert tokens == greedy_decode(pair, prompt, 24)
    wrong = HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")
    wrong.vocab_size = model.vocab_size + 1
    with pytest.raises(ValueError, match="^vocab_size: "):
        TorchBlockDrafter(model, wrong)


def test_the_study_on_the_micro_pair_with_the_stream(micro_pair_dir, drafters, tmp_path):
    out = tmp_path / "hf"
    flags = [
        *live_pair_flags(micro_pair_dir),
        "--trajectories",
        "1",
        "--roots-per-trajectory",
        "1",
        "--budgets",
        "8",
        "--stream-prompts",
        "3",
        "--stream-tokens",
        "12",
        "--window",
        "1",
        "--out",
        str(out),
        "--quiet",
    ]
    assert specblock.main(flags) == 0
    per_root = pl.read_parquet(out / "per_root.parquet")
    assert set(per_root["builder"]) == set(specblock.BUILDERS)
    trace = pl.read_parquet(out / "stream.parquet")
    assert trace.height == 3 * 4 and set(trace["policy"]) == {"none", "heads", "full", "bandit"}
    assert (trace.filter(pl.col("policy") == "none")["arm"] == "skip").all()
    assert (trace.filter(pl.col("policy") == "full")["update_seconds"] > 0).all()
    assert (out / "stream.png").stat().st_size > 0 and pl.read_parquet(out / "not_run.parquet").height == 0


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--budgets", "0"], "--budgets"),
        (["--K", "0"], "--K"),
        (["--rank-noise", "2"], "--rank-noise"),
        (["--capture", "x"], "--capture"),
        (["--drafters", "x"], "--drafters"),
        (["--stream-prompts", "5"], "--stream-prompts"),
        (["--blocks", "0"], "--blocks"),
        (["--block-ratio", "0"], "--block-ratio"),
        (["--eagle-depth", "-1"], "--eagle-depth"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(flags, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        specblock.main(flags + ["--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and flag in err, err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_missing_drafters_exit_2(micro_pair_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        specblock.main(
            [
                *live_pair_flags(micro_pair_dir),
                "--drafters",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
                "--quiet",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--drafters" in err and "python -m backends.block_drafter" in err, err


def test_drafter_tool_bad_arguments(micro_pair_dir, tmp_path, capsys):
    from backends.block_drafter.__main__ import main

    for flags, flag in ((["--pair", str(tmp_path)], "--pair"), (["--pair", str(micro_pair_dir), "--steps", "0"], "--steps")):
        with pytest.raises(SystemExit) as exc:
            main(flags + ["--out", str(tmp_path / "d"), "--quiet"])
        assert exc.value.code == 2 and flag in capsys.readouterr().err
