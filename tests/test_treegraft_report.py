"""scripts/treegraft_report.py: the per-policy table of a TreeGraft run, its paired differences
clustered by prompt, and its one-line errors, on a per-root frame written by hand."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "treegraft_report.py"


def load():
    return load_script(SCRIPT)


def frame(tmp_path, edit=None) -> Path:
    """Three prompts, the first with two roots (category "qa", the others none); all-small 1 token
    in 0.1 s, all-mid 2 tokens in 0.2 s + 0.1 s per root index, fixed (2 + trajectory) tokens in
    0.25 s, destructive 1 token in 0.25 s; learned on prompt 2 only.  ``edit``: a function of the
    frame, whose result is written instead."""
    rows = []
    for trajectory, root in ((0, 0), (0, 1), (1, 0), (2, 0)):
        values = {"all_small": (1.0, 0.1), "all_mid": (2.0, 0.2 + 0.1 * root), "fixed": (2.0 + trajectory, 0.25)}
        values["destructive"] = (1.0, 0.25)
        if trajectory == 2:
            values["learned"] = (1.5, 0.1)
        for policy, (E, T) in values.items():
            rows.append(
                {
                    "setting": "T=1",
                    "trajectory": trajectory,
                    "root": root,
                    "context_length": 10 + root,
                    "category": "qa" if trajectory == 0 else None,
                    "policy": policy,
                    "verifier": "onehot",
                    "schedule": "101",
                    "E": E,
                    "T": T,
                    "TPS": E / T,
                    "stop": "",
                    "early_stop": False,
                    "test": trajectory == 2,
                }
            )
    table = pl.DataFrame(rows)
    (edit(table) if edit else table).write_parquet(tmp_path / "per_root.parquet")
    return tmp_path


def test_rows_against_hand_computed_values(tmp_path):
    m = load()
    text = m.report(str(frame(tmp_path)), "onehot")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines() if line.startswith("| T=1")}
    fixed = rows["fixed [1,0,1]"]  # the run's own fixed schedule
    # E over the 4 roots: 2, 2, 3, 4 -> mean 2.75; influence (x - 2.75) / 4 clustered by prompt:
    # sums (-1.5 / 4, 0.25 / 4, 1.25 / 4), se^2 = 3 / 2 * (2.25 + 0.0625 + 1.5625) / 16
    assert fixed[3] == f"2.75 ± {math.sqrt(1.5 * 3.875 / 16):.2f}"
    assert fixed[4] == "250.0" and rows["all-mid"][4] == "225.0"  # mean T-hat in ms
    assert fixed[5] == f"{11 / 1.0:.2f}" and fixed[6] == f"{11 / 1.0 / (4 / 0.4):.3f}"
    # paired to all-small: per-root TPS 8, 8, 12, 16 minus 10 each -> -2, -2, 2, 6, mean 1
    d = [-3.0, -3.0, 1.0, 5.0]  # minus the mean 1
    sums = [(d[0] + d[1]) / 4, d[2] / 4, d[3] / 4]
    assert fixed[8] == f"+1.00 ± {math.sqrt(1.5 * sum(s * s for s in sums)):.2f}"
    learned = rows["learned g_psi (test roots)"]  # over its one test root: ratios on that root only
    assert learned[2] == "1" and learned[6] == f"{15 / 10:.3f}" and learned[7] == f"{15 / 10:.3f}"
    assert learned[8].startswith("+5.00 ± nan")  # one prompt: no clustered SE
    # destructive minus fixed: per-root TPS 4 - (8, 8, 12, 16) = -4, -4, -8, -12, mean -7
    assert "T=1: destructive minus fixed -7.00 ± " in text
    assert "T=1: qa (2 roots) all-small / all-mid / fixed / best" in text and "T=1: (none) (2 roots)" in text


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys):
    m = load()
    assert m.main([str(tmp_path / "missing")]) == 2
    assert m.main([str(frame(tmp_path)), "--verifier", "nss"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "per_root.parquet not found" in err[0] and "--verifier: 'nss'" in err[1]


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda f: f.filter(~((pl.col("policy") == "all_mid") & (pl.col("trajectory") == 1))), "has roots that all_mid lacks"),
        (lambda f: f.filter(pl.col("policy") != "all_mid"), "has no all_mid rows"),
        (lambda f: f.with_columns(pl.when(pl.col("policy") == "fixed").then(0.0).otherwise(pl.col("T")).alias("T")), "T-hat"),
        (lambda f: pl.concat([f, f.head(1)]), "more than one row"),
        (lambda f: f.head(0), "holds no roots"),
        (lambda f: f.drop("schedule"), "lacks the columns schedule"),
    ],
)
def test_bad_runs_refused_naming_the_problem(tmp_path, capsys, edit, message):
    m = load()
    assert m.main([str(frame(tmp_path, edit))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scripts/treegraft_report.py: run: ") and message in err[0], err


def test_a_damaged_file_is_refused_with_one_line(tmp_path, capsys):
    m = load()
    (tmp_path / "per_root.parquet").write_bytes(b"PAR1 not parquet")
    assert m.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be read" in err[0], err


def test_roots_by_place_along_the_reply(tmp_path):
    """Prompt 0's second root (one token further) is reported apart from the prompts' ends: at the
    end all-small 3 / 0.3, all-mid 6 / 0.6, fixed 9 / 0.75 (E 2, 3, 4), per-root fixed minus
    all-small -2, +2, +6 (mean 2, SE 4 / sqrt 3 = 2.31); one token in, all-mid 2 / 0.3 and fixed
    2 / 0.25, one prompt (no SE: nan).  The place is the run's ``offset`` where it has one; without
    it, the context past the trajectory's shortest root, so labelled."""
    m = load()
    with_offset = frame(tmp_path, lambda f: f.with_columns(pl.col("root").alias("offset")))
    lines = [line for line in m.report(str(with_offset), "onehot").splitlines() if "reply (" in line]
    assert lines[0] == (
        "T=1: 0 tokens into the reply (3 roots): n-gram E 1.00; all-small / all-mid / fixed / best "
        "10.0 / 10.0 / 12.0 / - tokens/s; fixed minus all_small +2.0 ± 2.3, fixed minus all_mid +2.0 ± 2.3"
    )
    assert lines[1].startswith(
        "T=1: 1 tokens into the reply (1 roots): n-gram E 1.00; all-small / all-mid / fixed / best 10.0 / 6.7 / 8.0 / -"
    )
    assert "fixed minus all_mid +1.3 ± nan" in lines[1] and len(lines) == 2
    # prompt 1's root lies 5 tokens into its reply: its offset places it, not its context length
    moved = frame(
        tmp_path, lambda f: f.with_columns(pl.when(pl.col("trajectory") == 1).then(5).otherwise(pl.col("root")).alias("offset"))
    )
    assert [line.split(" (")[0] for line in m.report(str(moved), "onehot").splitlines() if "reply (" in line] == [
        f"T=1: {k} tokens into the reply" for k in (0, 1, 5)
    ]
    inferred = m.report(str(frame(tmp_path, lambda f: f.with_columns(pl.lit(None).alias("offset")))), "onehot")
    assert [line.split(" (")[0] for line in inferred.splitlines() if "first root (" in line] == [
        f"T=1: {k} tokens past the first root" for k in (0, 1)
    ]
    one = frame(tmp_path, lambda f: f.filter(pl.col("root") == 0))  # one root per prompt: no such lines
    assert "reply (" not in m.report(str(one), "onehot") and "first root (" not in m.report(str(one), "onehot")
