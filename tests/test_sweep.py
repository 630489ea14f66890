"""The configuration sweep (``analyses.sweep``): its rows are the core's exact values, a capture
replays the live rows, and bad configuration files exit 2 with one line."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from conftest import live_pair_flags, make_capture, one_error_line, write_prompts

from analyses import sweep
from backends.sources import SyntheticSource
from simlab import builders, tree_verifiers
from simlab.efficiency import expected_block_efficiency
from simlab.engine_metrics import tree_metrics
from simlab.sampling import SamplingSettings
from simlab.trees import NodeTable

CONFIGS = [
    {"engine": "eagle", "total_token": 6, "depth": 2, "top_k": 3},
    {"engine": "vllm", "num_speculative_tokens": 2, "method": "eagle"},
    {"engine": "sglang", "speculative_num_steps": 3, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 5},
]
FLAGS = ["--quiet", "--latency", "sequoia-demo", "--trajectories", "1", "--roots-per-trajectory", "2"]


def write_config(tmp_path, entries) -> str:
    path = tmp_path / "engines.json"
    path.write_text(json.dumps(entries) if not isinstance(entries, str) else entries)
    return str(path)


@pytest.mark.slow  # a whole run with its charts: about 6 s
def test_rows_equal_the_core_exact_values(tmp_path):
    out = tmp_path / "out"
    argv = ["--config", write_config(tmp_path, CONFIGS), "--settings", "1", "--vocab", "16", "--out", str(out), *FLAGS]
    assert sweep.main(argv) == 0
    rows = pl.read_parquet(out / "per_root.parquet")
    source = SyntheticSource("depth_profile", 16, 1, 2, 8, 0, stream="per_trajectory")
    lab = {
        "eagle total_token=6 depth=2 top_k=3": builders.EAGLE2(5, 2, 3),
        "vllm num_speculative_tokens=2": builders.EAGLE2(2, 1, 1),
        "sglang speculative_num_steps=3 speculative_eagle_topk=2 speculative_num_draft_tokens=5": builders.EAGLE2(4, 2, 2),
    }
    checked = 0
    for root in source.roots(SamplingSettings(1.0)):
        for name, builder in lab.items():
            for mode, verifier in (("one_hot", "onehot"), ("exact_match", "exact_match")):
                row = rows.filter((pl.col("root") == root.root) & (pl.col("config") == name) & (pl.col("mode") == mode))
                exact = expected_block_efficiency(root.pair, root.context, builder, verifier, method="exact")
                tree = builder.sample(NodeTable(root.pair, root.context))
                metrics = tree_metrics(tree, tree_verifiers.get(verifier), eos=False)
                assert row["E"][0] == pytest.approx(exact.mean, abs=1e-12)
                assert row["accept_length"][0] == pytest.approx(metrics.accept_length, abs=1e-12)
                assert row["chain"][0] == pytest.approx(metrics.chain, abs=1e-12) and row["E_se"][0] == 0.0
                checked += 1
    assert checked == 12
    summary = pl.read_parquet(out / "sweep.parquet")
    assert summary["TPS"].to_list() == sorted(summary["TPS"].to_list(), reverse=True)
    assert {"throughput.html", "throughput.png", "by_position.parquet", "not_run.parquet"} <= {p.name for p in out.iterdir()}


@pytest.mark.parametrize(
    "content, message",
    [
        ("[{", "is not JSON"),
        ("[]", "non-empty list"),
        (json.dumps([{"engine": "tensorrt"}]), "config[0]: engine must be one of"),
        (json.dumps([{"engine": "eagle", "total_token": 60, "depth": 7}]), "needs 'top_k'"),
        (json.dumps([{"engine": "eagle", "total_token": 60, "depth": 7, "top_k": 10, "topk": 4}]), "unknown key 'topk'"),
        (json.dumps([{"engine": "vllm", "num_speculative_tokens": 0}]), "num_speculative_tokens: must be an integer >= 1"),
        (json.dumps([{"engine": "eagle", "total_token": 1, "depth": 7, "top_k": 10}]), "total_token: counts the root"),
        (json.dumps({"configs": [{"engine": "sequoia", "budget": 8, "modes": ["lossy"]}]}), "modes must be"),
        # a vLLM proposer that is no argmax chain must not be valued as one under its name
        (json.dumps([{"engine": "vllm", "num_speculative_tokens": 3, "method": "ngram"}]), "method 'ngram' does not draft"),
        (json.dumps([{"engine": "vllm", "num_speculative_tokens": 3, "method": "medusa"}]), "method 'medusa' does not draft"),
        # EAGLE's torch.topk cannot keep 59 of 1 + 3 * 1 candidates: not a tree of 4 labelled total_token=60
        (json.dumps([{"engine": "eagle", "total_token": 60, "depth": 3, "top_k": 1}]), "exceeds EAGLE's top_k + depth"),
    ],
)
def test_bad_configuration_files_exit_2_with_one_line(tmp_path, capsys, content, message):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        sweep.main(["--config", write_config(tmp_path, content), "--out", str(out), *FLAGS])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and "--config" in err and message in err, err
    assert not out.exists()


def test_missing_configuration_file_and_grid_flags_beside_it(tmp_path, capsys):
    for argv, message in (
        (["--config", str(tmp_path / "none.json")], "cannot read"),
        (["--config", write_config(tmp_path, CONFIGS), "--chain-lengths", "3"], "--chain-lengths: --config lists"),
        (["--eagle-total-tokens", "1"], "--eagle-total-tokens: every value must be >= 2"),
        (["--drafters", str(tmp_path)], "--drafters: trained block drafters run on the live models"),  # not ignored
    ):
        with pytest.raises(SystemExit) as exit:
            sweep.main([*argv, "--out", str(tmp_path / "o"), *FLAGS])
        err = capsys.readouterr().err
        assert exit.value.code == 2 and one_error_line(err) and message in err, err


@pytest.mark.slow  # the micro pair, a capture and two runs
def test_a_replayed_capture_gives_the_live_rows(micro_pair_dir, tmp_path_factory, tmp_path):
    """A greedy (T = 0) chain capture of depth 3 holds every node of the top-1 chains up to 3
    tokens (ranked by the setting's one-hot q): the replay reads them, the live run computes them."""
    capture = make_capture(micro_pair_dir, tmp_path_factory, 2, "--shape", "chain", "--depth", "3", "--temperature", "0")
    chains = write_config(tmp_path, [{"engine": "vllm", "num_speculative_tokens": k} for k in (1, 2, 3)])
    common = ["--config", chains, "--draft-law", "setting", "--latency", "sequoia-demo", "--quiet"]
    prompts = write_prompts(tmp_path, 2)
    live = [
        *live_pair_flags(micro_pair_dir),
        "--prompts",
        prompts,
    ]
    live += ["--trajectories", "2", "--roots-per-trajectory", "1", "--spacing", "4", "--settings", "0", "--device", "cpu"]
    live += ["--out", str(tmp_path / "live")]
    assert sweep.main([*live, *common]) == 0
    assert sweep.main(["--capture", str(capture), "--out", str(tmp_path / "replay"), *common]) == 0
    key = ["setting", "root", "config", "mode"]
    a = pl.read_parquet(tmp_path / "live" / "per_root.parquet").sort(key)
    b = pl.read_parquet(tmp_path / "replay" / "per_root.parquet").sort(key)
    assert a.height == 12 and a.drop("trajectory").equals(b.drop("trajectory"))


@pytest.mark.slow  # the micro pair, a capture and two runs
def test_fill_evaluates_only_the_nodes_a_capture_lacks(micro_pair_dir, tmp_path_factory, tmp_path, capsys):
    """A T = 1 chain capture lacks most of EAGLE's top-k nodes: ``--fill`` evaluates those with the
    capture's models and gives the live rows (to float32 rounding of logits from other batches)."""
    capture = make_capture(micro_pair_dir, tmp_path_factory, 2, "--shape", "chain", "--depth", "3")
    common = ["--config", write_config(tmp_path, CONFIGS), "--latency", "sequoia-demo", "--settings", "1"]
    live = ["--backend", "hf", "--target", str(micro_pair_dir / "target"), "--draft", str(micro_pair_dir / "draft")]
    live += ["--prompts", write_prompts(tmp_path, 2), "--trajectories", "2", "--roots-per-trajectory", "1", "--spacing", "4"]
    assert sweep.main([*live, "--device", "cpu", "--quiet", "--out", str(tmp_path / "live"), *common]) == 0
    replay = ["--capture", str(capture), "--latency", "sequoia-demo", "--config", common[1], "--device", "cpu"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:  # no model call: every tree needs nodes the sampled chains missed
        sweep.main([*replay, "--quiet", "--out", str(tmp_path / "replay")])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and one_error_line(err) and "--fill evaluates them" in err, err
    assert sweep.main([*replay, "--fill", "--out", str(tmp_path / "filled")]) == 0
    assert "--fill evaluated" in capsys.readouterr().err
    key = ["setting", "root", "config", "mode"]
    a = pl.read_parquet(tmp_path / "live" / "per_root.parquet").sort(key)
    b = pl.read_parquet(tmp_path / "filled" / "per_root.parquet").sort(key)
    assert a.height == 12 and a.select(key).equals(b.select(key))
    for column in ("E", "accept_length", "accepted", "chain", "T"):
        np.testing.assert_allclose(a[column].to_numpy(), b[column].to_numpy(), rtol=1e-5, atol=1e-6)


def test_value_root_is_the_core_exact_value():
    """The sweep's per-root valuation without the tool around it (the default suite's cheap check)."""
    from analyses import _engine_valuation as valuation
    from analyses._engine_configs import make_config
    from simlab.latency import LatencyModel

    source = SyntheticSource("depth_profile", 8, 1, 1, 4, 0, stream="per_trajectory")
    root = next(iter(source.roots(SamplingSettings(1.0))))
    c = make_config(
        {"engine": "sglang", "speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4}
    )
    builder = valuation.Builders(sweep.Config(), None, None).get(c, root, SamplingSettings(1.0))
    rows, missing = valuation.value_root(
        c, builder, root, SamplingSettings(1.0), 0, sweep.Config(), LatencyModel.from_cost_ratio(0.1), False
    )
    assert builder == builders.EAGLE2(3, 1, 2) and set(missing) == {"probabilistic"}
    for row in rows:
        exact = expected_block_efficiency(root.pair, root.context, builder, row["verifier"], method="exact").mean
        assert row["E"] == pytest.approx(exact, abs=1e-12) and row["_plain"].accept_length == pytest.approx(exact, abs=1e-12)
    assert {r["mode"] for r in rows} == {"exact_match", "one_hot"}


def test_vllm_chain_methods_are_accepted():
    from analyses._engine_configs import make_config

    for method in ("eagle", "eagle3", "draft_model", "deepseek_mtp", ""):
        assert make_config({"engine": "vllm", "num_speculative_tokens": 3, "method": method}).method == method


def test_grid_points_eagle_cannot_build_are_listed_not_valued():
    """The grid keeps an EAGLE point whose total_token - 1 exceeds its k + depth k^2 candidates
    only as a ``not_run`` row; the points it can build are valued (their trees have budget tokens)."""
    from analyses._engine_configs import grid_configs

    configs = grid_configs(((8, 60), (3,), (1, 4)), (), (), (), (), ("one_hot",))
    assert {c.label: bool(c.unrunnable) for c in configs} == {
        "eagle total_token=8 depth=3 top_k=1": True,  # 7 > 1 + 3
        "eagle total_token=8 depth=3 top_k=4": False,
        "eagle total_token=60 depth=3 top_k=1": True,
        "eagle total_token=60 depth=3 top_k=4": True,  # 59 > 4 + 48
    }


def test_a_sampled_configuration_does_not_depend_on_its_neighbours(tmp_path):
    """A Sequoia row is the same whether or not other configurations come before it in the file:
    its trees' seed stream is its label's (a planted fault, seeding by position, changes the row)."""
    sequoia = {"engine": "sequoia", "budget": 8}
    rows = []
    for i, entries in enumerate(([sequoia], [CONFIGS[1], sequoia])):
        out = tmp_path / f"out{i}"
        argv = ["--config", write_config(tmp_path, entries), "--settings", "1", "--vocab", "8", "--out", str(out), *FLAGS]
        assert sweep.main(argv) == 0
        table = pl.read_parquet(out / "per_root.parquet").filter(pl.col("config") == "sequoia budget=8")
        rows.append(table.sort("root", "mode").select("root", "mode", "E").rows())
    assert rows[0] == rows[1] and len(rows[0]) > 0


def test_a_capture_ranked_by_the_raw_law_is_refused_at_any_setting_but_t1(capsys):
    """``--draft-law raw`` needs the drafters' untempered q, which a capture holds only at T = 1
    (``analyses._engine_valuation.refuse_raw_draft_law_on_capture``): refused with one line elsewhere."""
    from types import SimpleNamespace

    from analyses._engine_valuation import refuse_raw_draft_law_on_capture

    replay = SimpleNamespace(capture=("folder",), draft_law="raw")
    with pytest.raises(SystemExit) as info:
        refuse_raw_draft_law_on_capture("prog", replay, [SamplingSettings(), SamplingSettings(temperature=0.5)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and one_error_line(err) and err.startswith("prog: error: --draft-law: a capture"), err
    refuse_raw_draft_law_on_capture("prog", replay, [SamplingSettings()])  # T = 1: the capture's q is the raw law
    refuse_raw_draft_law_on_capture(
        "prog", SimpleNamespace(capture=("f",), draft_law="setting"), [SamplingSettings(temperature=0)]
    )
    refuse_raw_draft_law_on_capture("prog", SimpleNamespace(capture=(), draft_law="raw"), [SamplingSettings(temperature=0)])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "flags, flag",
    [
        (["--drafters", ""], "--drafters"),  # not "needs --backend hf": the value is empty
        (["--backend", "hf", "--drafters", " "], "--drafters"),
        (["--capture", ""], "--capture"),
        (["--backend", "hf", "--target", "", "--draft", "d"], "--target"),
    ],
)
def test_an_empty_name_is_refused_as_empty(tmp_path, capsys, flags, flag):
    """A flag that names a file, folder or model given an empty value is refused as empty
    (``analyses._flags.check_named``), before the study's other checks."""
    with pytest.raises(SystemExit) as exc:
        sweep.main([*flags, "--quiet", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and f"error: {flag}: got an empty value" in err, err
    assert not (tmp_path / "o").exists()
