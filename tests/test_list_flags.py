"""Every list flag of every study and tool names each value once (issue 40, item 2): a repeated
value would copy that configuration's rows, double its roots and shrink its standard error by
sqrt(2) without a word.  A repeat is refused with one line naming the flag, before anything is
written; the kit's parsers (``backends.cli.int_list``, ``float_list``, ``name_list``) hold the
rule, and the studies that re-read a list from their config go through them too.  A schedule
(treegraft's ``--fixed``, one 0/1 per layer) is a sequence, where values recur."""

from __future__ import annotations

import importlib
import json

import pytest

from backends import cli
from conftest import one_error_line

REPEATS = [
    ("analyses.sweep", ["--chain-lengths", "3,3"], "--chain-lengths"),
    ("analyses.sweep", ["--sequoia-budgets", "4,4"], "--sequoia-budgets"),
    ("analyses.sweep", ["--eagle-total-tokens", "5,5"], "--eagle-total-tokens"),
    ("analyses.sweep", ["--eagle-depths", "2,2"], "--eagle-depths"),
    ("analyses.sweep", ["--eagle-top-ks", "2,02"], "--eagle-top-ks"),
    ("analyses.sweep", ["--treegraft-budgets", "8,8"], "--treegraft-budgets"),
    ("analyses.sweep", ["--specblock-budgets", "6,6"], "--specblock-budgets"),
    ("analyses.sweep", ["--modes", "one_hot,one_hot"], "--modes"),
    ("analyses.parallel_drafters", ["--budgets", "4,4"], "--budgets"),
    ("analyses.specblock", ["--budgets", "6, 6"], "--budgets"),
    ("analyses.compare_builders", ["--budgets", "4,16,4"], "--budgets"),
    ("analyses.compare_builders", ["--builders", "iid,iid"], "--builders"),
    ("analyses.compare_builders", ["--verifiers", "specinfer,specinfer"], "--verifiers"),
    ("analyses.block_efficiency_grid", ["--K", "1,1"], "--K"),
    ("analyses.block_efficiency_grid", ["--verifiers", "bv,bv"], "--verifiers"),
    ("analyses.compare_verifiers", ["--verifiers", "specinfer,specinfer"], "--verifiers"),
    ("analyses.train_selector", ["--verifiers", "specinfer,specinfer"], "--verifiers"),
    ("analyses.divergence_by_depth", ["--methods", "naive,naive"], "--methods"),
    ("analyses.divergence_by_depth", ["--engine-metrics", "nss,nss"], "--engine-metrics"),
    ("analyses.lossy_rules", ["--epsilons", "0.3,0.3"], "--epsilons"),
    ("analyses.lossy_rules", ["--alphas", "1,1e0"], "--alphas"),
    ("analyses.lossy_rules", ["--singles", "1,1.0"], "--singles"),
    ("analyses.lossy_rules", ["--accs", "0.5,0.50"], "--accs"),
    ("analyses.sequoia_tree", ["--budgets", "16,16"], "--budgets"),
    ("backends.latency_probe", ["--target", "t", "--draft", "d", "--contexts", "16,16"], "--contexts"),
]


def _refusal(module: str, flags: list[str], tmp_path, capsys) -> str | None:
    """The one error line of ``module``'s tool on ``flags``, or None when it parses them."""
    tool = importlib.import_module(module)
    if module == "analyses.sequoia_tree":
        (tmp_path / "acc.json").write_text(json.dumps([0.55, 0.2, 0.1]))
        flags = ["--acceptance", str(tmp_path / "acc.json"), *flags]
    else:
        flags = [*flags, "--out", str(tmp_path / "out" / ("profile.json" if module == "backends.latency_probe" else ""))]
    try:
        getattr(tool, "parse_args", tool.main)(flags)
    except SystemExit as exc:
        assert exc.code == 2
        err = capsys.readouterr().err.strip()
        assert one_error_line(err), err
        return err
    return None


@pytest.mark.parametrize("module, flags, flag", REPEATS, ids=[f"{m.rsplit('.', 1)[1]}{f[-2]}" for m, f, _ in REPEATS])
def test_a_repeated_value_is_refused_naming_the_flag(module, flags, flag, tmp_path, capsys):
    err = _refusal(module, flags, tmp_path, capsys)
    assert err is not None and f"error: {flag}: " in err and ("twice" in err or "increasing" in err), err
    assert not (tmp_path / "out").exists()  # nothing made before the refusal


def test_the_old_integer_lists_planted_fault_is_caught(tmp_path, capsys, monkeypatch):
    """The mutant: ``int_list`` without its repeat check (the kit before issue 40) lets
    ``parallel_drafters --budgets 4,4`` through, which the refusal test above fails on."""
    monkeypatch.setattr(cli, "_no_repeats", lambda values, text, flag: None)
    assert _refusal("analyses.parallel_drafters", ["--budgets", "4,4"], tmp_path, capsys) is None
    assert _refusal("analyses.lossy_rules", ["--epsilons", "0.3,0.3"], tmp_path, capsys) is None


def test_the_kits_list_parsers():
    assert cli.int_list("1, 2,4", "--x") == (1, 2, 4)
    with pytest.raises(ValueError, match=r"^--x: 3 appears twice in '3,03'"):
        cli.int_list("3,03", "--x")
    assert cli.int_list("1,0,1", "--fixed", minimum=0, repeats=True) == (1, 0, 1)  # a sequence
    assert cli.float_list("0.3, 1", "--y", 0, 1) == (0.3, 1.0)
    with pytest.raises(ValueError, match=r"^--y: 0.3 appears twice in '0.3,3e-1'"):
        cli.float_list("0.3,3e-1", "--y", 0, 1)
    for text, message in (("", "empty list"), ("0.3,x", "comma-separated numbers"), ("nan", r"in \[0, 1\]"), ("2", r"\[0, 1\]")):
        with pytest.raises(ValueError, match=f"^--y: .*{message}"):
            cli.float_list(text, "--y", 0, 1)
    with pytest.raises(ValueError, match=r"^--z: a name appears twice"):
        cli.name_list("a,a", "--z", ["a", "b"])
    for text in ("a,,b", "a,b,"):
        with pytest.raises(ValueError, match=r"^--z: an empty entry"):
            cli.name_list(text, "--z", ["a", "b"])


def test_a_schedule_keeps_its_repeats_and_the_studies_reread_lists_through_the_kit():
    """treegraft's ``--fixed`` is one 0/1 per layer (repeats are its point); the lists a study
    re-reads from its config (a config built in code, not by the flags) are refused the same way."""
    from analyses import compare_builders, specblock, treegraft

    config, _ = treegraft.parse_args(["--fixed", "1,1,0,1,1", "--out", "/tmp/unused-simlab"])
    assert treegraft.builders_for(config, None)[1]["fixed"].schedule == (1, 1, 0, 1, 1)
    with pytest.raises(ValueError, match=r"^--budgets: 4 appears twice"):
        specblock.measure(specblock.Config(budgets="4,4"), None, None, None, None)
    with pytest.raises(ValueError, match=r"^--budgets: 4 appears twice"):
        compare_builders.measure_root(compare_builders.Config(budgets="4,4"), None, None, None)
