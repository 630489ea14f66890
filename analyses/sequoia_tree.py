"""Sequoia's hardware-aware tree from an acceptance vector and a latency profile: ``python -m analyses.sequoia_tree``.

Reads a positional acceptance vector (p_1..p_W: the probability that the j-th sibling drafted
without replacement is the accepted one) and a latency profile (``simlab.latency``), solves
Sequoia's DP (``simlab.builders.sequoia``) for every budget and depth, and prints the tree that
maximises expected tokens per second: its budget, depth, expected accepted tokens (root included,
under the positional model), T-hat, throughput, nodes per depth and the tree in tuple notation.

    python -m analyses.sequoia_tree --acceptance vector.json --latency profile.json --budgets 16,32,63,90
    python -m analyses.sequoia_tree --acceptance demo-config.json      # Sequoia's demo files as shipped

``--acceptance`` reads:

* a JSON list [p_1, ..., p_W], or an object {"acceptance": [...]};
* a tensor file (``.pt``, Sequoia's ``acceptance-rate-vector.pt``): a 1-D float tensor
  [0, p_1, ..., p_W, p_none] of probabilities, loaded safely (``torch.load(...,
  weights_only=True)``, onto the CPU: the shipped file was saved from a CUDA device); its first
  and last entries are dropped as Sequoia's ``tree_search.py`` does;
* Sequoia's config (``demo-config.json``): ``acceptance_rate_vector`` is that list or names
  such a ``.pt`` file (relative to the config's folder).  When the config also carries Sequoia's
  size rule (``max_depth``, ``valid_budget``, ``target_time``, ``draft_time``), the tool applies
  it as ``tree_search.py`` does (``simlab.builders.sequoia.sequoia_size``: budgets in nodes, root
  included; minimise (l t_draft + t_target(m)) / T[m][l]) and prints the DP's best expected
  accepted tokens by budget, the chosen (m, l), the time per token, the speedup over the first
  budget's target time and the tree; ``--latency``, ``--cost-ratio``, ``--budgets``, ``--depth`` and
  ``--context`` are refused there (pass the ``.pt`` file itself for the lab's latency model), and
  the config's ``dst`` (where ``tree_search.py`` saves its tree) is not written.

Without ``--latency`` the times come from ``--cost-ratio``.  Bad input: one line, exit 2.
Source: Sequoia@0ff3ff7 ``tree_search.py``, ``demo-config.json``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyses._study import Opened, Report, declared, no_roots, run_printing_study
from backends.cli import ToolParser, fail, fail_from, int_list
from simlab.builders.sequoia import check_acceptance, choose, sequoia_size, tree_dp
from simlab.latency import LatencyModel
from simlab.latency_profiles import load

PROG = "python -m analyses.sequoia_tree"
SIZE_RULE = ("max_depth", "valid_budget", "target_time", "draft_time")
"""The keys of a Sequoia config that carry its size rule (``tree_search.py``)."""


def read_tensor_vector(path: Path) -> list[float]:
    """p_1..p_W from a tensor file holding Sequoia's [0, p_1, ..., p_W, p_none] (float64 values of
    the stored floats), loaded with ``torch.load(path, map_location="cpu", weights_only=True)``.

    Raises:
        ValueError: ``acceptance: ...`` when the file cannot be loaded safely, or does not hold a
            1-D float tensor of at least 3 probabilities (finite, in [0, 1], summing to 1 up to
            float32 rounding, 1e-6) starting with 0.
    """
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused or a damaged file: one line, whatever torch raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"acceptance: cannot load {str(path)!r} as a tensor file ({first})") from None
    if not isinstance(data, torch.Tensor) or data.ndim != 1 or not data.dtype.is_floating_point or data.numel() < 3:
        what = (
            f"a {data.ndim}-D {data.dtype} tensor of {data.numel()} entries"
            if isinstance(data, torch.Tensor)
            else type(data).__name__
        )
        raise ValueError(f"acceptance: {str(path)!r} must hold a 1-D float tensor [0, p_1, ..., p_W, p_none], got {what}")
    vector = data.detach().to(torch.float64).tolist()
    if not all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in vector) or abs(sum(vector) - 1.0) > 1e-6 or vector[0] != 0.0:
        raise ValueError(
            f"acceptance: {str(path)!r} must hold probabilities [0, p_1, ..., p_W, p_none] (in [0, 1], first 0, "
            f"summing to 1), got first {vector[0]!r} and sum {sum(vector)!r}"
        )
    return vector[1:-1]


def read_acceptance(path: str) -> tuple[list[float], dict | None]:
    """(p_1..p_W, Sequoia's size rule or None) from ``path`` (module docstring); the size rule is
    the config's ``SIZE_RULE`` entries when it carries all of them.

    Raises:
        ValueError: ``acceptance: ...`` for a missing, unreadable or malformed file, or a config
            with only part of the size rule.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"acceptance: no such file {path!r}")
    if file.suffix == ".pt":
        return read_tensor_vector(file), None
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"acceptance: cannot parse {path!r} ({str(exc).splitlines()[0]})") from None
    if isinstance(data, dict) and "acceptance_rate_vector" in data:
        vector = data["acceptance_rate_vector"]
        if isinstance(vector, str):
            named = file.parent / vector
            if not named.is_file():
                raise ValueError(f"acceptance: {path!r} names {vector!r}, which is not a file next to it ({str(named)!r})")
            vector = read_tensor_vector(named)
        elif not isinstance(vector, list) or len(vector) < 3:
            raise ValueError(
                f"acceptance: {path!r}: acceptance_rate_vector must be [0, p_1, ..., p_W, p_none] or a .pt file name"
            )
        else:
            vector = vector[1:-1]
        present = [k for k in SIZE_RULE if k in data]
        if present and len(present) < len(SIZE_RULE):
            raise ValueError(
                f"acceptance: {path!r} carries part of Sequoia's size rule ({', '.join(present)}); "
                f"it needs all of {', '.join(SIZE_RULE)}"
            )
        return vector, ({k: data[k] for k in (*SIZE_RULE, "max_budget") if k in data} if present else None)
    if isinstance(data, dict) and "acceptance" in data:
        return data["acceptance"], None
    if isinstance(data, list):
        return data, None
    raise ValueError(f"acceptance: {path!r} holds neither a list nor an object with 'acceptance' or 'acceptance_rate_vector'")


def sequoia_rule(acceptance, rule: dict) -> dict:
    """Sequoia's ``tree_search.py`` on a config's size rule: the DP's best expected accepted tokens
    (root included) by valid budget at ``max_depth`` levels, the chosen (m, l), its time per token,
    the speedup (first budget's target time over it) and the tree (tuple notation).

    Raises:
        ValueError: ``acceptance: ...`` for a malformed size rule; as ``sequoia_size``.
    """
    budgets, times, levels = rule["valid_budget"], rule["target_time"], rule["max_depth"]
    if not isinstance(budgets, list) or not isinstance(times, list) or not budgets or len(budgets) != len(times):
        raise ValueError(f"acceptance: valid_budget and target_time must be lists of one length, got {budgets!r} and {times!r}")
    if "max_budget" in rule and max(budgets) > rule["max_budget"]:
        raise ValueError(f"acceptance: valid_budget {budgets} exceeds max_budget {rule['max_budget']}")
    if not isinstance(levels, int) or isinstance(levels, bool) or levels < 1:
        raise ValueError(f"acceptance: max_depth must be an integer >= 1, got {levels!r}")
    table = tree_dp(acceptance, max(budgets), levels)
    m, l, seconds = sequoia_size(table, draft_time=rule["draft_time"], budgets=budgets, target_times=times, levels=levels)
    return {
        "best_by_budget": {b: table.value(b, levels) for b in budgets},
        "nodes": m,
        "levels": l,
        "time_per_token": seconds,
        "speedup": float(times[0]) / seconds,
        "expected_tokens": table.value(m, l),
        "spec": table.spec(m, l),
    }


def tree_lines(spec) -> tuple[str, str]:
    """The printed lines of a tree (tuple notation ``spec``): its nodes per depth, root included, and the tree."""
    per_depth: dict[int, int] = {}
    for node in spec:
        per_depth[len(node)] = per_depth.get(len(node), 0) + 1
    return (
        f"nodes per depth: {[1] + [per_depth[d] for d in sorted(per_depth)]}",
        f"tree (tuple notation): {[list(node) for node in spec]}",
    )


@dataclass(frozen=True)
class Config:
    """The tool's settings (the command-line flags), ``--budgets`` a tuple of ints parsed once."""

    acceptance: str = ""
    latency: str | None = None
    cost_ratio: float = 0.1
    budgets: tuple[int, ...] = (16, 32, 63, 90)
    depth: int = 8
    context: int = 64
    backend = None  # not a field: no source of roots (no live-model defaults)


def flags(parser: ToolParser, d: Config) -> None:
    """``--acceptance`` (required), ``--latency``, ``--cost-ratio``, ``--budgets``, ``--depth``, ``--context``."""
    parser.add_argument("--acceptance", required=True, help="the acceptance vector: JSON, a .pt tensor file, or Sequoia's config")
    parser.add_argument(
        "--latency",
        default=d.latency,
        help="a published profile name (simlab.latency_profiles, e.g. sequoia-demo) "
        "or a profile file (.json or .toml; see simlab.latency)",
    )
    parser.add_argument("--cost-ratio", type=float, default=d.cost_ratio, help="c = t_q / t_p when no --latency is given")
    parser.add_argument("--budgets", default=",".join(map(str, d.budgets)), help="draft-token budgets to choose among")
    parser.add_argument("--depth", type=int, default=d.depth, help="the most draft levels")
    parser.add_argument("--context", type=int, default=d.context, help="context length l at which the step is timed (tokens)")


def config_of(args, parser: ToolParser) -> Config:
    """The typed config, or exit 2 with one line (``--latency`` with ``--cost-ratio``; a bad ``--budgets``)."""
    if args.latency and "cost_ratio" in parser.given:
        fail(PROG, "--cost-ratio: a latency profile (--latency) was given; use one of the two")
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    return Config(args.acceptance, args.latency, args.cost_ratio, budgets, args.depth, args.context)


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The study's input in place of a source: ``Opened.source`` is (p_1..p_W, Sequoia's size rule
    or None) read from ``--acceptance`` (``read_acceptance``, ``check_acceptance``); the latency
    model (``--latency`` or ``--cost-ratio``) where there is no size rule.  Exit 2 with one line for
    a size-rule config given the lab's flags."""
    vector, rule = read_acceptance(config.acceptance)
    acceptance = check_acceptance(vector)
    if rule is not None:
        clash = [f for f in ("latency", "cost_ratio", "budgets", "depth", "context") if f in parser.given]
        if clash:
            fail(
                PROG,
                f"--{clash[0].replace('_', '-')}: {config.acceptance!r} carries Sequoia's own size rule "
                "(valid_budget, target_time, draft_time, max_depth); pass its .pt vector for the lab's latency model",
            )
        return Opened((acceptance, rule), ())
    latency = load(config.latency) if config.latency else LatencyModel.from_cost_ratio(config.cost_ratio)
    return Opened((acceptance, None), (), latency)


def values(config: Config, opened: Opened, say):
    """(spec, facts): Sequoia's own size rule (``sequoia_rule``; spec None) or the lab's choice
    (``simlab.builders.sequoia.choose``) over the budgets and depths."""
    acceptance, rule = opened.source
    if rule is not None:
        return None, sequoia_rule(acceptance, rule)
    return choose(acceptance, opened.latency, context=config.context, budgets=config.budgets, levels=config.depth)


def run(config: Config, opened: Opened, chosen, say) -> Report:
    """The printed answer: the acceptance vector, the table of the choice, the tree."""
    (acceptance, rule), (spec, facts) = opened.source, chosen
    shown = [round(float(a), 4) for a in acceptance]
    if rule is not None:
        best = pl.DataFrame(
            [
                {"budget m (nodes, root included)": m, f"best expected tokens (<= {rule['max_depth']} levels)": v}
                for m, v in facts["best_by_budget"].items()
            ]
        )
        chosen_line = (
            f"chosen: m = {facts['nodes']} nodes, l = {facts['levels']} levels (root included), expected tokens "
            f"{facts['expected_tokens']:.6f}, time per token {facts['time_per_token']:.6f}, speedup {facts['speedup']:.6f}"
        )
        printed = (
            f"acceptance p_1..p_W = {shown}; Sequoia's size rule from {config.acceptance}",
            (best, "Sequoia's DP by valid budget (tree_search.py)"),
            chosen_line,
            *tree_lines(facts["spec"]),
        )
        return Report({}, printed=printed)
    keys = {
        "budget": "budget",
        "levels": "levels",
        "expected tokens": "expected_tokens",
        "T-hat (s)": "T",
        "tokens/s": "tokens_per_second",
    }
    title = (
        f"Sequoia's tree for budgets {', '.join(map(str, config.budgets))} and depth <= {config.depth} (context {config.context})"
    )
    printed = (
        f"acceptance p_1..p_W = {shown}; latency: {opened.latency.source}",
        (pl.DataFrame([{k: facts[v] for k, v in keys.items()}]), title),
        *tree_lines(spec),
    )
    return Report({}, printed=printed)


STUDY = declared(
    globals(), shardable=no_roots("it solves one dynamic program"), error_flags={"c": "--cost-ratio", "levels": "--depth"}
)


def main(argv=None) -> int:
    return run_printing_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
