"""Messages (issue 28): an interrupt's line after a closed progress bar, refusals before any work,
errors in the caller's units."""

from __future__ import annotations

import pytest

from analyses import ddte_audit, specblock, treegraft
from conftest import one_error_line
from test_ddte_audit import SMALL as DDTE
from test_specblock_study import SMALL as SPECBLOCK
from test_treegraft_study import SMALL as TREEGRAFT


def _loud(flags):
    return [f for f in flags if f != "--quiet"]


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "study, flags, target",
    [
        (ddte_audit, DDTE, "analyses.ddte_audit.draw_grid"),
        (treegraft, TREEGRAFT, "simlab.treegraft.schedules.evaluate_schedules"),
        (specblock, SPECBLOCK, "analyses.specblock.accepted_lengths"),
    ],
)
def test_an_interrupt_closes_the_bar_before_its_line(study, flags, target, monkeypatch, capsys, tmp_path):
    """SIGINT (a KeyboardInterrupt) inside the roots loop, the progress bar open: the
    "interrupted" line starts a line of its own and is the last thing on stderr (no bar drawn
    after it), as in compare_builders (before: glued to the bar, which was redrawn after it)."""
    monkeypatch.setattr(target, _interrupt)
    assert study.main(_loud(flags) + ["--out", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "roots" in err and err.endswith(f"\n{study.PROG}: interrupted; no partial output was published\n"), repr(err[-300:])


def test_treegraft_refuses_zero_epochs_before_any_work(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        treegraft.main(_loud(TREEGRAFT) + ["--epochs", "0", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and one_error_line(err) and "--epochs" in err and "roots" not in err, err
    assert not (tmp_path / "o").exists()


def test_sequoia_says_what_does_not_fit_in_the_callers_units():
    from simlab.builders.sequoia import Sequoia

    with pytest.raises(
        ValueError,
        match=r"^budget: no tree of 5 draft tokens \(root excluded\) fits in depth 3 with width 1 "
        r"\(at most 3 draft tokens\)$",
    ):
        Sequoia((0.5,), budget=5, depth=3)
    assert len(Sequoia((0.5,), budget=3, depth=3).spec) == 3  # exactly the most that fits
