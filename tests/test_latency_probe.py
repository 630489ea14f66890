"""The latency probe on the micro pair: shapes and signs of the tables, the CLI round trip, bad input.

No assertion is made on the size of a time (timings are noisy); only that each is positive and finite.
"""

from __future__ import annotations

import math

import pytest

from backends.hf import HFPair
from backends.latency_probe import cost_ratios, forward_seconds, main, measure
from simlab.latency import ForwardTime, LatencyModel
from conftest import one_error_line

CONTEXTS, TOKENS = (4, 8), (1, 2)


@pytest.fixture(scope="module")
def pair(micro_pair_dir):
    return HFPair(str(micro_pair_dir / "target"), str(micro_pair_dir / "draft"), device="cpu")


def flags(pair_dir, out, *extra):
    return [
        "--target",
        str(pair_dir / "target"),
        "--draft",
        str(pair_dir / "draft"),
        "--out",
        str(out),
        "--contexts",
        "4,8",
        "--tokens",
        "1,2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--device",
        "cpu",
        *extra,
    ]


def test_measure_gives_positive_tables_on_the_grid(pair):
    latency = measure(pair, contexts=CONTEXTS, tokens=TOKENS, repeats=1, warmup=0)
    for forward in (latency.draft, latency.target):
        assert forward.contexts == CONTEXTS and forward.tokens == TOKENS
        assert len(forward.seconds) == 2 and all(len(row) == 2 for row in forward.seconds)
        assert all(t > 0 and math.isfinite(t) for row in forward.seconds for t in row)
    assert "cpu" in latency.source and "torch" in latency.source
    assert latency.delayed_time(2, 1, 1, 4) > 0


def test_cache_is_cut_back_between_runs(pair):
    """Repeated timed runs leave the prefix cache at its length (else later runs see a longer context)."""
    import torch

    calls = []

    def spy(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        ids = args[0] if args else kwargs["input_ids"]
        calls.append((ids.shape[1], cache.get_seq_length() if cache is not None else 0, kwargs.get("position_ids")))

    handle = pair.draft.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        forward_seconds(pair, pair.draft, 5, 3, repeats=3, warmup=2, generator=torch.Generator().manual_seed(0))
    finally:
        handle.remove()
    assert calls[0][:2] == (5, 0)  # the prefix, once
    assert [(n, cached, p.tolist()) for n, cached, p in calls[1:]] == [(3, 5, [[5, 6, 7]])] * 5


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
        ({"contexts": ()}, "contexts"),
        ({"contexts": (8, 4)}, "contexts"),
        ({"contexts": (0, 4)}, "contexts"),
        ({"tokens": (0,)}, "tokens"),
        ({"contexts": (4, 200)}, "contexts"),  # beyond the micro pair's context of 128 tokens
    ],
)
def test_measure_rejects_bad_arguments(pair, kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        measure(pair, **{"contexts": CONTEXTS, "tokens": TOKENS, "repeats": 1, "warmup": 0, **kwargs})


def test_cli_writes_a_profile_that_loads_back(micro_pair_dir, tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(flags(micro_pair_dir, out)) == 0
    printed = capsys.readouterr().out
    latency = LatencyModel.load(out)
    for forward in (latency.draft, latency.target):
        assert forward.contexts == CONTEXTS and forward.tokens == TOKENS
    assert latency.source.startswith("latency_probe:")
    for name, forward in (("draft", latency.draft), ("target", latency.target)):
        for row in forward.seconds:
            for t in row:
                assert f"{1e3 * t:.3f}" in printed, (name, t)
    ratios = cost_ratios(latency)["ratio"]
    assert f"cost ratio t_q / t_p measured on cpu: median {ratios.median():.3f} over the grid" in printed


def test_cost_ratios_are_the_draft_time_over_the_target_time_at_each_grid_point():
    draft = ForwardTime((4, 8), (1, 2), ((1.0, 2.0), (3.0, 5.0)))
    target = ForwardTime((4, 8), (1, 2), ((4.0, 4.0), (6.0, 10.0)))
    frame = cost_ratios(LatencyModel(draft, target, "test"))
    assert frame["context"].to_list() == [4, 4, 8, 8] and frame["tokens"].to_list() == [1, 2, 1, 2]
    assert frame["ratio"].to_list() == [0.25, 0.5, 0.5, 0.5] and frame["target_ms"].to_list() == [4e3, 4e3, 6e3, 1e4]
    on_other_grid = cost_ratios(LatencyModel(draft, ForwardTime.constant(2.0), "test"))
    assert on_other_grid["ratio"].to_list() == [0.5, 1.0, 1.5, 2.5]


def test_cli_quiet_prints_nothing(micro_pair_dir, tmp_path, capsys):
    assert main(flags(micro_pair_dir, tmp_path / "p.json", "--quiet")) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--contexts", "a,b"], "--contexts"),
        (["--tokens", "1,,2"], "--tokens"),
        (["--repeats", "0"], "--repeats"),
        (["--contexts", "4,500"], "--contexts"),
        (["--tokens", "2,1"], "--tokens"),
        (["--dtype", "int8"], "--dtype"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(micro_pair_dir, tmp_path, capsys, extra, flag):
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as exc:
        main(flags(micro_pair_dir, out) + extra)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and flag in err, err
    assert not out.exists()


def test_cli_bad_out_and_missing_model(micro_pair_dir, tmp_path, capsys):
    for out, words in ((tmp_path / "p.txt", ".json"), (tmp_path / "none" / "p.json", "no such folder")):
        with pytest.raises(SystemExit) as exc:
            main(flags(micro_pair_dir, out))
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--out" in err and words in err
    with pytest.raises(SystemExit) as exc:
        main(["--target", str(tmp_path / "none"), "--draft", str(tmp_path / "none"), "--out", str(tmp_path / "p.json")])
    assert exc.value.code == 2 and "does not exist" in capsys.readouterr().err
