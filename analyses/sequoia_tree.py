"""Sequoia's hardware-aware tree from an acceptance vector and a latency profile: ``python -m analyses.sequoia_tree``.

Reads a positional acceptance vector (p_1..p_W: the probability that the j-th sibling drafted
without replacement is the accepted one) and a latency profile (``simlab.latency``), solves
Sequoia's DP (``simlab.builders.sequoia``) for every budget and depth, and prints the tree that
maximises expected tokens per second: its budget, depth, expected accepted tokens (root included,
under the positional model), T-hat, throughput, nodes per depth and the tree in tuple notation.

    python -m analyses.sequoia_tree --acceptance vector.json --latency profile.json --budgets 16,32,63,90

The vector file is JSON: a list [p_1, ..., p_W], an object {"acceptance": [...]}, or Sequoia's
demo config ({"acceptance_rate_vector": [0, p_1, ..., p_W, p_none]}, whose first and last
entries are dropped as Sequoia's ``tree_search.py`` does).  Without ``--latency`` the times
come from ``--cost-ratio``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl

from backends.cli import ToolParser, fail, fail_from, int_list, print_table

PROG = "python -m analyses.sequoia_tree"


def read_vector(path: str) -> list[float]:
    """The acceptance vector (p_1..p_W) of a JSON file (module docstring).

    Raises:
        ValueError: ``acceptance: ...`` for a missing, unreadable or malformed file.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"acceptance: no such file {path!r}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"acceptance: cannot parse {path!r} ({str(exc).splitlines()[0]})") from None
    if isinstance(data, dict) and "acceptance_rate_vector" in data:
        vector = data["acceptance_rate_vector"]
        if not isinstance(vector, list) or len(vector) < 3:
            raise ValueError(f"acceptance: {path!r}: acceptance_rate_vector must be [0, p_1, ..., p_W, p_none]")
        return vector[1:-1]
    if isinstance(data, dict) and "acceptance" in data:
        return data["acceptance"]
    if isinstance(data, list):
        return data
    raise ValueError(f"acceptance: {path!r} holds neither a list nor an object with 'acceptance' or 'acceptance_rate_vector'")


def main(argv=None) -> int:
    from simlab.builders.sequoia import check_acceptance, choose
    from simlab.latency import LatencyModel
    from simlab.latency_profiles import load

    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--acceptance", required=True, help="JSON file of the positional acceptance vector")
    parser.add_argument("--latency", default=None, help="a published profile name (simlab.latency_profiles, e.g. sequoia-demo) "
                        "or a profile file (.json or .toml; see simlab.latency)")
    parser.add_argument("--cost-ratio", type=float, default=0.1, help="c = t_q / t_p when no --latency is given")
    parser.add_argument("--budgets", default="16,32,63,90", help="draft-token budgets to choose among")
    parser.add_argument("--depth", type=int, default=8, help="the most draft levels")
    parser.add_argument("--context", type=int, default=64, help="context length l at which the step is timed (tokens)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.latency and "cost_ratio" in parser.given:
        fail(PROG, "--cost-ratio: a latency profile (--latency) was given; use one of the two")
    try:
        budgets = int_list(args.budgets, "--budgets", minimum=1)
        acceptance = check_acceptance(read_vector(args.acceptance))
        latency = load(args.latency) if args.latency else LatencyModel.from_cost_ratio(args.cost_ratio)
        spec, facts = choose(acceptance, latency, context=args.context, budgets=budgets, levels=args.depth)
    except ValueError as exc:
        fail_from(PROG, exc, parser, {"c": "--cost-ratio", "levels": "--depth"})
    per_depth: dict[int, int] = {}
    for node in spec:
        per_depth[len(node)] = per_depth.get(len(node), 0) + 1
    print(f"acceptance p_1..p_W = {[round(float(a), 4) for a in acceptance]}; latency: {latency.source}")
    print_table(pl.DataFrame([{"budget": facts["budget"], "levels": facts["levels"], "expected tokens": facts["expected_tokens"],
                               "T-hat (s)": facts["T"], "tokens/s": facts["tokens_per_second"]}]),
                f"Sequoia's tree for budgets {', '.join(map(str, budgets))} and depth <= {args.depth} (context {args.context})")
    print("nodes per depth:", [1] + [per_depth[d] for d in sorted(per_depth)])
    print("tree (tuple notation):", [list(node) for node in spec])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
