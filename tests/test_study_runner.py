"""The study runner (``analyses._study``): a study is a config, flags, ``open``, ``value_root`` and
``run``; the runner parses once, opens the source and latency, values the roots, publishes and prints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pytest

from analyses import _study
from analyses import compare_verifiers as cv
from analyses import divergence_by_depth as dbd
from analyses._flags import SourceConfig, add_latency_flags, add_source_flags, make_latency, make_source, study_config
from tests.conftest import one_error_line

PROG = "python -m analyses.toy"


@dataclass(frozen=True)
class Config(SourceConfig):
    cost_ratio: float = 0.1
    per_token: float = 0.01
    latency: str | None = None
    sizes: tuple[int, ...] = (1, 2)
    ratio: float = 0.25
    fail_with: str = ""
    out: str | None = None
    quiet: bool = False


def _flags(parser, d):
    add_source_flags(parser, d)
    add_latency_flags(parser, d)
    parser.add_argument("--sizes", default="1,2")
    parser.add_argument("--ratio", type=float, default=d.ratio)
    parser.add_argument("--fail-with", default="")
    parser.add_argument("--out")
    parser.add_argument("--quiet", action="store_true")


def _config(args, parser):
    return study_config(Config, args, sizes=tuple(int(s) for s in args.sizes.split(",")))


def _open(config, parser, say):
    source, settings = make_source(PROG, parser, config, quiet=True)
    return _study.Opened(source, settings, make_latency(PROG, parser, config, source, 4))


def _value_root(config, opened, task):
    return {"index": task.index, "setting": task.setting.name, "root": task.root.root, "context": len(task.root.context)}


def _run(config, opened, rows, say):
    if config.fail_with:
        raise ValueError(config.fail_with)
    frame = pl.DataFrame(rows)
    small = frame.head(1)
    printed = ((frame, "Toy"), _study.WROTE, "after the wrote line")
    drafter = dict(opened.latency.drafters)["small"](0, 1)
    return _study.Report(
        {"toy.parquet": frame, "small.parquet": small, **_study.chart_files("chart", None, _text_writer)},
        None,
        (*printed, f"drafter {drafter:.4f}, sizes {config.sizes}"),
    )


def _text_writer(chart, fmt):
    return lambda tmp: Path(tmp).write_text(fmt)


TOY = _study.Study(
    prog=PROG,
    doc="A toy study.\n\nMore.",
    config_type=Config,
    flags=_flags,
    config=_config,
    open=_open,
    value_root=_value_root,
    merge=lambda config, opened, payloads: payloads,
    run=_run,
    hf_defaults={"roots_per_trajectory": 1},
    drafters=(("small", "ratio", "--ratio"),),
    error_flags={"sizes": "--sizes"},
)


def test_the_runner_values_every_root_in_order_publishes_and_prints(tmp_path, capsys):
    argv = ["--settings", "1,0.5", "--trajectories", "2", "--sizes", "3,4", "--out", str(tmp_path)]
    assert _study.run_study(TOY, argv) == 0
    frame = pl.read_parquet(tmp_path / "toy.parquet")
    assert frame["index"].to_list() == list(range(8))
    assert frame["setting"].to_list() == ["T=1"] * 4 + ["T=0.5"] * 4
    assert (tmp_path / "chart.html").read_text() == "html" and (tmp_path / "chart.png").read_text() == "png"
    lines = capsys.readouterr().out.splitlines()
    wrote = f"wrote {tmp_path}/toy.parquet, small.parquet, chart.html/.png"
    assert lines[-3:] == [wrote, "after the wrote line", "drafter 0.2500, sizes (3, 4)"]  # the typed config: ints


def test_quiet_prints_nothing(tmp_path, capsys):
    assert _study.run_study(TOY, ["--out", str(tmp_path), "--quiet"]) == 0
    assert capsys.readouterr().out == ""


def test_a_value_error_is_one_line_on_its_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _study.run_study(TOY, ["--out", str(tmp_path), "--fail-with", "sizes: must be positive"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--sizes: must be positive" in err and one_error_line(err)
    assert not (tmp_path / "toy.parquet").exists()


def test_hf_defaults_are_noted_and_typed_configs_parsed_once():
    config, parser = _study.parse(cv.STUDY, ["--verifiers", "specinfer,traversal"])
    assert config.verifiers == ("specinfer", "traversal")
    config, _ = _study.parse(dbd.STUDY, ["--methods", "nss,spectr", "--engine-metrics", "specinfer"])
    assert config.methods == ("nss", "spectr") and config.engine_metrics == ("specinfer",)
    config, parser = _study.parse(dbd.STUDY, ["--backend", "hf", "--target", "t", "--draft", "d"])
    assert config.roots_per_trajectory == 2  # dbd's live default (HF_DEFAULTS), not its synthetic 24
    assert "with --backend hf: 2" in " ".join(parser.format_help().split())


def test_wrote_line_groups_a_charts_two_files():
    report = _study.Report({"a.parquet": None, "c.html": None, "c.png": None, "b.png": None, "x.json": None})
    assert _study.wrote_line(Path("o"), report) == "wrote o/a.parquet, c.html/.png, b.png, x.json"
