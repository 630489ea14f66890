"""scripts/widening_report.py's real-pair path: roots along the target's greedy reply, every root's
exact rows, and the means with SEs clustered by prompt, on the lab's micro reference pair."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simlab import widening as W
from simlab.sampling import SamplingSettings
from conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "widening_report.py"
SMALL = [
    "--trajectories", "2", "--roots", "2", "--spacing", "2", "--depth", "2", "--ranks", "3",
    "--rs-depth", "2", "--top-k", "2", "--temperatures", "0,1",
]  # fmt: skip


def load():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def tiny(micro_pair_dir, tmp_path_factory):
    """The lab's micro reference pair (``conftest.micro_pair_dir``, trained once per session) and two prompts."""
    prompts = tmp_path_factory.mktemp("widening_prompts") / "prompts.txt"
    prompts.write_text("def read(path):\nThe module defines\n")
    return ["--target", str(micro_pair_dir / "target"), "--draft", str(micro_pair_dir / "draft"), "--prompts", str(prompts)]


@pytest.fixture(scope="module")
def run(tiny):
    """(module, args, roots, per-root rows, tables) of the small real-pair run."""
    module = load()
    args, (settings, temperatures) = module.parse_args(tiny + SMALL)
    _, roots = module.greedy_roots(args)
    rows = module.collect(roots, args.depth, args.ranks, settings, args.rs_depth, args.top_k, temperatures)
    return module, args, roots, rows, module.summarise(rows)


def test_clustered_mean_and_ratio_against_hand_computed_values():
    m = load()
    # mean 3, influence (-2, -1, 0, 3) / 4, cluster sums -0.75, 0, 0.75: se^2 = 3/2 (0.5625 + 0.5625)
    assert m.clustered_mean([1.0, 2.0, 3.0, 6.0], ["a", "a", "b", "c"]) == pytest.approx((3.0, math.sqrt(1.6875)), abs=1e-12)
    # ratio 6 / 8, influence (1 - 1.5, 2 - 1.5, 3 - 3) / 8, one per cluster: se^2 = 3/2 (2 / 256)
    assert m.clustered_ratio([1.0, 2.0, 3.0], [2.0, 2.0, 4.0], [0, 1, 2]) == pytest.approx((0.75, math.sqrt(3 / 256)), abs=1e-12)
    assert math.isnan(m.clustered_mean([1.0, 2.0], [0, 0])[1])  # one prompt: no standard error
    assert all(math.isnan(x) for x in m.clustered_ratio([1.0], [0.0], [0]))
    with pytest.raises(ValueError, match="values"):
        m.clustered_mean([], [])


def test_roots_lie_along_the_targets_greedy_reply(run):
    module, args, roots, _, _ = run
    assert len(roots) == 4 and {r.trajectory for r in roots} == {0, 1}
    for first, second in zip(roots[::2], roots[1::2]):
        assert first.trajectory == second.trajectory and second.context[: len(first.context)] == first.context
        reply = second.context[len(first.context) :]
        assert len(reply) == args.spacing
        for i, token in enumerate(reply):
            p, _ = first.pair.with_settings(SamplingSettings(1.0)).distributions([first.context + reply[:i]])
            assert token == int(np.argmax(p[0])), "the root is not on the target's greedy reply"


def test_widening_rows_equal_the_rank_closed_form_at_every_root(run):
    """Per root: widening position k to width w gains sum_{r=2..w} R_k p_k(c_r)
    (docs/derivations/widening.md), and widening every position the sum over k."""
    _, args, roots, rows, _ = run
    joint = {(x["setting"], x["root"], x["position"], x["rank"]): x["joint"] for x in rows["rank"]}
    checked = 0
    for x in rows["widening"]:
        if x["width"] > args.ranks:
            continue
        positions = [x["position"]] if x["mode"] == "one_position" else range(1, args.depth + 1)
        closed = sum(joint[(x["setting"], x["root"], k, r)] for k in positions for r in range(2, x["width"] + 1))
        assert x["gain"] == pytest.approx(closed, abs=1e-12)
        checked += 1
    assert checked == len(roots) * 2 * (args.depth + 1) * (args.ranks - 1)
    greedy = [x["p"] for x in rows["rank"] if x["setting"] == "T=0"]
    sampled = [x["p"] for x in rows["rank"] if x["setting"] == "T=1"]
    assert set(greedy) <= {0.0, 1.0} and any(0.0 < x < 1.0 for x in sampled)  # each table under its own setting


def test_tables_are_clustered_means_of_the_roots_rows(run):
    module, args, roots, rows, tables = run
    prompt = {r.root: r.trajectory for r in roots}
    for t in tables["widening"]:
        part = [x for x in rows["widening"] if (x["setting"], x["mode"], x["position"], x["width"]) == tuple(
            t[k] for k in ("setting", "mode", "position", "width"))]  # fmt: skip
        assert t["roots"] == len(part) == len(roots)
        assert t["gain"] == pytest.approx(np.mean([x["gain"] for x in part]), abs=1e-12)
        per_prompt = {}
        for x in part:
            per_prompt[prompt[x["root"]]] = per_prompt.get(prompt[x["root"]], 0.0) + (x["gain"] - t["gain"]) / len(part)
        assert t["gain_se"] == pytest.approx(math.sqrt(2 * sum(s * s for s in per_prompt.values())), abs=1e-12)
    for t in tables["rank"]:
        part = [x for x in rows["rank"] if (x["setting"], x["position"], x["rank"]) == (t["setting"], t["position"], t["rank"])]
        rejected = sum(x["reach"] * (x["p"] + x["beyond"]) for x in part)
        if rejected > 0:
            assert t["conditional"] == pytest.approx(sum(x["joint"] for x in part) / rejected, abs=1e-12)
    for t in tables["rs"]:
        part = [
            x
            for x in rows["rs"]
            if (x["temperature"], x["draft"], x["verifier"]) == (t["temperature"], t["draft"], t["verifier"])
        ]
        base = [x for x in rows["rs"] if x["temperature"] == t["temperature"] and (x["draft"], x["verifier"]) == W.PAIRINGS[0]]
        assert t["value"] == pytest.approx(np.mean([x["value"] for x in part]), abs=1e-12)
        assert t["gain"] == pytest.approx(sum(x["value"] for x in part) / sum(x["value"] for x in base), abs=1e-12)
        assert t["lossless"] == ((t["draft"], t["verifier"]) != W.LOSSY_PAIRING)
    at_zero = {t["value"] for t in tables["rs"] if t["temperature"] == 0}
    assert max(at_zero) - min(at_zero) < 1e-12  # T = 0: every pairing accepts the same chain
    sampled = [x for x in rows["rs"] if x["draft"] == "sampled" and x["temperature"] == 1]
    assert all(x["trees"] <= args.top_k**args.rs_depth for x in sampled)  # top-k keeps the enumeration finite


def test_the_real_path_prints_its_tables(tiny, capsys):
    assert load().main(tiny + SMALL + ["--widening-settings", "1"]) == 0
    out = capsys.readouterr().out
    assert "means over 4 roots, SE clustered by prompt" in out
    assert "widening gains T=1" in out and "rejection sampling vs argmax matching, top_k=2, D=2" in out
    assert "rank statistics, T=0" not in out


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--depth", "3"], "--depth: applies to a real pair"),
        (["--pair", "smollm2", "--target", "x"], "--target: give --pair or --target"),
        (["--target", "x"], "--draft: --target needs a draft model"),
        (["--pair", "smollm2", "--trajectories", "0"], "--trajectories: must be >= 1"),
        (["--pair", "smollm2", "--temperatures", "0,-1"], "--temperatures: must be a comma list"),
        (["--pair", "smollm2", "--widening-settings", "hot"], "--widening-settings"),
    ],
)
def test_a_bad_flag_exits_2_with_one_line_before_loading(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        load().main(flags)
    assert exc.value.code == 2 and message in capsys.readouterr().err
