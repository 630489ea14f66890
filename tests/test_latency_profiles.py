"""Published latency profiles (``simlab.latency_profiles``) and ``--latency NAME|list|probe``."""

from __future__ import annotations

import pytest

from analyses import treegraft
from conftest import one_error_line
from simlab.builders.cost import DraftCost, DraftForward
from simlab.latency import LatencyModel
from simlab.latency_profiles import PROFILES, UNPUBLISHED, listing, names, profile

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


@pytest.mark.parametrize("name", names())
def test_every_profile_loads_with_its_source(name):
    model = profile(name)
    assert isinstance(model, LatencyModel) and model.source.startswith(name)
    entry = PROFILES[name]
    assert ("official repo" in entry.source and "@" in entry.source) or "arXiv" in entry.source
    assert entry.note and model.target(0, 1) > 0 and model.draft(0, 1) > 0
    assert ("ratio" in model.source) == (entry.unit == "ratio")


def test_the_published_numbers_are_the_profiles():
    """Each table holds the source's figures (read off the files and papers named in the module docstring)."""
    seq = profile("sequoia-demo")
    assert [seq.target(0, n) for n in (1, 2, 4, 8, 16, 32)] == pytest.approx([1.0, 1.0, 1.0, 1.2, 1.4, 1.8])
    assert seq.draft(100, 7) == pytest.approx(0.03) and seq.target(64, 1) == seq.target(0, 1)
    tg = profile("treegraft-a100")
    assert tg.target(0, 64) == pytest.approx(0.08199, abs=1e-5) and tg.draft(0, 1) == pytest.approx(0.04809, abs=1e-5)
    assert tg.forward("small")(0, 1) == pytest.approx(0.00092)
    sb = profile("specblock-a100")
    assert sb.target(0, 91) == pytest.approx(0.037)
    assert sb.step_time(0, DraftCost.levels([1] * 7)) == pytest.approx(0.017 + 0.037)  # EAGLE-3: 7 levels drafted
    assert sb.step_time(0, DraftCost((DraftForward(4, 0, "block"),) * 2, 8)) == pytest.approx(0.007 + 0.037)


def test_the_qwen_profiles_are_the_speed_benchmarks_tables():
    """``qwen2.5-a100`` (vLLM) and ``qwen2.5-a100-hf`` (transformers): one forward is 1 / (tokens/s) of
    the page's BF16 rows (1.5B the target, 0.5B the draft) at each input length, linear between them,
    the same for every n."""
    vllm, hf = profile("qwen2.5-a100"), profile("qwen2.5-a100-hf")
    inputs = (1, 6144, 14336, 30720)
    assert [vllm.target(l, 1) for l in inputs] == pytest.approx([1 / v for v in (183.33, 176.68, 168.69, 152.04)], rel=1e-12)
    assert [vllm.draft(l, 1) for l in inputs] == pytest.approx([1 / v for v in (311.55, 304.79, 290.28, 264.51)], rel=1e-12)
    assert [hf.target(l, 1) for l in inputs] == pytest.approx([1 / v for v in (39.68, 40.88, 40.43, 38.59)], rel=1e-12)
    assert [hf.draft(l, 1) for l in inputs] == pytest.approx([1 / v for v in (47.40, 47.45, 47.11, 47.16)], rel=1e-12)
    assert vllm.target(1, 64) == vllm.target(1, 1) and vllm.draft(6144, 16) == vllm.draft(6144, 1)
    assert vllm.target(10240, 1) == pytest.approx((1 / 176.68 + 1 / 168.69) / 2, rel=1e-12)
    assert "QwenLM/Qwen2.5@" in PROFILES["qwen2.5-a100"].source and "vLLM 0.6.3" in PROFILES["qwen2.5-a100"].source
    assert "transformers 4.46.0" in PROFILES["qwen2.5-a100-hf"].source


def test_an_unknown_profile_is_a_value_error_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"^latency: unknown profile 'h100'; known: sequoia-demo"):
        profile("h100")


def test_latency_list_prints_every_profile_and_exits_0(capsys):
    with pytest.raises(SystemExit) as info:
        treegraft.main(["--latency", "list"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.strip() == listing()
    assert all(name in out for name in [*PROFILES, *UNPUBLISHED]) and "81.99 ms" in out


@pytest.mark.parametrize(
    "value, message",
    [
        ("h100", "--latency: unknown profile 'h100'; use one of sequoia-demo"),
        ("probe", "--latency: probe measures live models"),
    ],
)
def test_bad_latency_names_exit_2_with_one_line(tmp_path, capsys, value, message):
    with pytest.raises(SystemExit) as info:
        treegraft.main(SMALL + ["--latency", value, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and message in err and one_error_line(err), err


def test_the_shared_flag_gives_the_profile_and_probe_gives_the_sources_own():
    from dataclasses import dataclass

    from analyses._flags import LatencyConfig, SourceConfig, make_latency, study_parser

    @dataclass(frozen=True)
    class Config(SourceConfig, LatencyConfig):
        pass

    class Source:
        name = "hf"

        def latency(self, largest_tree):
            return LatencyModel.from_cost_ratio(0.5)

    for flags, expected in (
        (["--latency", "sequoia-demo"], profile("sequoia-demo")),
        (["--latency", "probe"], LatencyModel.from_cost_ratio(0.5)),
        ([], LatencyModel.from_cost_ratio(0.5)),
    ):  # no flag: the source's own, as before
        parser = study_parser("prog", "doc", Config())
        config = Config(**{**vars(parser.parse_args(flags)), "capture": ()})
        assert make_latency("prog", parser, config, Source(), 8) == expected


def test_on_a_pretrained_pair_the_seed_claim_studies_default_to_their_gpu_profile(capsys):
    from dataclasses import dataclass

    from analyses import _grid_study, compare_builders, ddte_audit, specblock, treegraft
    from analyses._flags import LatencyConfig, SourceConfig, make_latency, study_parser, with_drafter_time
    from simlab.latency import ForwardTime

    @dataclass(frozen=True)
    class Config(SourceConfig, LatencyConfig):
        pass

    class Source:
        name = "hf"
        named_pair = "smollm2"

        def latency(self, largest_tree):
            return LatencyModel.from_cost_ratio(0.5)

    class Micro(Source):
        named_pair = None

    for study in (treegraft, specblock, compare_builders, ddte_audit, _grid_study):
        assert study.GPU_PROFILE in PROFILES
    for flags, source, expected in (
        ([], Source(), profile("treegraft-a100")),  # the default, said on stderr
        (["--latency", "probe"], Source(), LatencyModel.from_cost_ratio(0.5)),
        (["--cost-ratio", "0.2"], Source(), LatencyModel.from_cost_ratio(0.2, per_token=LatencyConfig().per_token)),
        ([], Micro(), LatencyModel.from_cost_ratio(0.5)),  # not a pretrained pair: the source's own, as before
        (["--latency", ""], Source(), LatencyModel.from_cost_ratio(0.5)),  # '' asks for no profile: the source's own
    ):
        parser = study_parser("prog", "doc", Config())
        config = Config(**{**vars(parser.parse_args(flags)), "capture": ()})
        assert make_latency("prog", parser, config, source, 8, gpu_profile="treegraft-a100") == expected
    assert "the published GPU profile 'treegraft-a100'" in capsys.readouterr().err
    # the profile times the pair's own draft by the weights it reads, not the profile's drafter

    class Priced(Source):
        draft = "adapter:14"

        def draft_weight_ratio(self):
            return 0.25

    parser = study_parser("prog", "doc", Config())
    config = Config(**{**vars(parser.parse_args([])), "capture": ()})
    priced = make_latency("prog", parser, config, Priced(), 8, gpu_profile="treegraft-a100")
    assert priced.target == profile("treegraft-a100").target and priced.drafters == profile("treegraft-a100").drafters
    assert priced.draft(0, 1) == 0.25 * profile("treegraft-a100").target(0, 1)
    assert "adapter:14: 0.250 x the target's forward" in priced.source
    assert "the draft timed as 0.250 x its target forward" in capsys.readouterr().err
    # --per-token means nothing under the GPU profile: refused, not ignored
    parser = study_parser("prog", "doc", Config())
    config = Config(**{**vars(parser.parse_args(["--per-token", "0.3"])), "capture": ()})
    with pytest.raises(SystemExit) as exit_info:
        make_latency("prog", parser, config, Source(), 8, gpu_profile="treegraft-a100")
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and "--per-token: the pretrained pair's default" in err
    # a profile's own extra drafter is kept unless its ratio flag is given
    parser = study_parser("prog", "doc", Config())
    parser.add_argument("--small-ratio", type=float, default=0.011)
    parser.parse_args([])
    kept = with_drafter_time(profile("treegraft-a100"), "small", 0.011, "small_ratio", parser)
    assert kept == profile("treegraft-a100")
    parser.parse_args(["--small-ratio", "0.5"])
    asked = with_drafter_time(profile("treegraft-a100"), "small", 0.5, "small_ratio", parser)
    assert dict(asked.drafters)["small"] == ForwardTime.constant(0.5 * profile("treegraft-a100").target(0, 1))
    added = with_drafter_time(profile("sequoia-demo"), "block", 0.1, "block_ratio", parser)
    assert dict(added.drafters)["block"] == ForwardTime.constant(0.1 * profile("sequoia-demo").target(0, 1))


@pytest.mark.slow
def test_a_study_runs_under_a_named_profile_and_says_which(tmp_path, capsys):
    from analyses import compare_verifiers

    flags = [
        "--vocab",
        "6",
        "--trajectories",
        "2",
        "--roots-per-trajectory",
        "1",
        "--settings",
        "1",
        "--K-max",
        "2",
        "--L-max",
        "2",
        "--samples",
        "2",
        "--verifiers",
        "specinfer,traversal",
        "--jobs",
        "1",
        "--latency",
        "specblock-a100",
        "--out",
        str(tmp_path),
    ]
    assert compare_verifiers.main(flags) == 0
    assert "latency: specblock-a100 (seconds): SpecBlock, paper arXiv 2605.07243" in capsys.readouterr().out


def test_sequoias_tool_takes_a_profile_name(tmp_path, capsys):
    import json

    from analyses import sequoia_tree

    (tmp_path / "acc.json").write_text(json.dumps([0.55, 0.2, 0.1]))
    assert (
        sequoia_tree.main(
            ["--acceptance", str(tmp_path / "acc.json"), "--latency", "sequoia-demo", "--budgets", "4,8,16", "--depth", "5"]
        )
        == 0
    )
    assert "latency: sequoia-demo (ratio profile, units of t_target(1))" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        sequoia_tree.main(["--acceptance", str(tmp_path / "acc.json"), "--latency", "nope"])
    assert info.value.code == 2 and "--latency: unknown profile 'nope'" in capsys.readouterr().err
