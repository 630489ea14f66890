"""Tree-widening gains and rejection sampling against argmax matching, on a synthetic world or a real pair
(docs/results.md section 14).

    OMP_NUM_THREADS=1 python scripts/widening_report.py            # synthetic world, about 20 s on one thread
    OMP_NUM_THREADS=1 python scripts/widening_report.py --pair smollm2 --prompts workloads --trajectories 8 --roots 2
    OMP_NUM_THREADS=1 python scripts/widening_report.py --target TARGET_DIR --draft DRAFT_DIR --prompts FILE

Without flags: ``DepthProfileWorld(8, seed=0)`` at context (3,), D = 4 (the output of docs/results.md
section 14's synthetic tables).

With a real pair (``--pair NAME [--draft SPEC]``, a named pair of ``backends.pretrained``, or two
Hugging Face folders or hub ids ``--target``/``--draft``): the roots are placed along the target's
greedy reply to each of the first ``--trajectories`` prompts (``backends.sources.live.HFSource`` at
T = 0, ``--roots`` per prompt, ``--spacing`` tokens apart; the first is the prompt's end, for a chat
prompt the end of the target's chat template).  At every root, exactly (``simlab.widening``):

* rank statistics and widening gains along the draft's greedy chain of ``--depth`` tokens, at each
  setting of ``--widening-settings`` (default T = 0 and T = 1, no top-k: ranks by the draft's
  untempered law, the target's token drawn from the setting's p; widths 2, 3, 4, one position at a
  time and every position);
* E[tau + 1] of a ``--rs-depth``-token chain under argmax matching and under rejection sampling at
  each temperature of ``--temperatures``, every setting with top-k = ``--top-k``: a chain sampled
  from q has up to k^D outcomes, all enumerated, so top-k keeps the enumeration finite (at a real
  vocabulary without top-k it is not).

Each table is the mean over the roots with its standard error clustered by prompt (cluster-robust:
sqrt(G / (G - 1) sum_g (sum_{i in g} psi_i)^2), psi_i a root's influence; NaN with one prompt).
Pooled ratios (the rank-r rate given rejection of ranks below r, pooled as an engine's counters pool
over the steps that reach a position; the gain of rejection sampling as the ratio of the mean
E[tau + 1]s) take the delta method's influence.  Exits with status 2 and one line on a bad flag.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from simlab import widening as W
from simlab.pairs import TRAJECTORY_METHODS, rooted
from simlab.sampling import SamplingSettings
from simlab.stats import clustered_mean_se, clustered_se
from simlab.trees import NodeTable

PROG = "scripts/widening_report.py"
WIDTHS = (2, 3, 4)


def synthetic() -> None:
    """The synthetic world's tables (docs/results.md section 14)."""
    from backends.synthetic import DepthProfileWorld

    world = DepthProfileWorld(8, seed=0, settings=SamplingSettings(1.0))  # profile TV 0.1 -> 0.5 over 8 depths
    ctx, D = (3,), 4
    print("rank statistics, T=1, raw ranking: position rank token p conditional joint")
    for r in W.rank_statistics(world, ctx, D, ranks=3):
        print(f"  {r['position']} {r['rank']} {r['token']} {r['p']:.4f} {r['conditional']:.4f} {r['joint']:.4f}")
    for T in (0.0, 1.0):
        w = world.with_settings(SamplingSettings(T))
        print(f"widening gains T={T:g}: mode position width value gain (verifier)")
        for r in W.widening_gains(w, ctx, D, WIDTHS):
            print(
                f"  {r['mode']} {r['position']} {r['width']} {r['value']:.4f} {r['gain']:+.4f} ({r['verifier']}, chain {r['chain']:.4f})"
            )
    print("rejection sampling vs argmax matching, D=4: T draft verifier E[tau+1] gain lossless")
    for r in W.rejection_sampling_gain(world, ctx, D, [0.0, 0.3, 0.6, 1.0, 1.5], lossy=True):
        print(f"  {r['temperature']:g} {r['draft']} {r['verifier']} {r['value']:.4f} {r['gain']:.4f} {r['lossless']}")


# ---- clustered means over roots ----------------------------------------------------------------


# ``simlab.stats``: CR1 standard errors, sqrt(G / (G - 1) sum_g (sum_{i in g} psi_i)^2); NaN with G < 2
clustered_mean = clustered_mean_se


def clustered_ratio(numerators: list[float], denominators: list[float], clusters: list) -> tuple[float, float]:
    """sum a_i / sum b_i and its standard error clustered by ``clusters`` (the delta method: influence
    (a_i - r b_i) / sum b); NaN where sum b is 0.

    Raises:
        ValueError: ``numerators: ...`` for lists of unequal or zero length.
    """
    if not numerators or not len(numerators) == len(denominators) == len(clusters):
        raise ValueError(f"numerators: need equal, non-empty lists, got {len(numerators)}, {len(denominators)}, {len(clusters)}")
    total = sum(denominators)
    if total == 0.0:
        return float("nan"), float("nan")
    ratio = sum(numerators) / total
    return ratio, clustered_se([(a - ratio * b) / total for a, b in zip(numerators, denominators)], clusters)


# ---- the real pair -----------------------------------------------------------------------------


def parse_list(text: str, flag: str, convert, low: float) -> tuple:
    try:
        values = tuple(convert(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(not v >= low for v in values):
        raise ValueError(f"{flag}: must be a comma list of numbers >= {low:g}, got {text!r}")
    return values


def parse_args(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    real = parser.add_argument_group("a real pair (without one: the synthetic world)")
    real.add_argument("--pair", help="a named pretrained pair (backends.pretrained.PAIRS), e.g. smollm2")
    real.add_argument("--target", help="target model folder or hub id (instead of --pair)")
    real.add_argument(
        "--draft", help="with --pair: its draft spec (early-exit:L, adapter:L, quant:B:G); else a model folder or hub id"
    )
    real.add_argument("--prompts", default="workloads", help="a prompt set (workloads, long-context) or file")
    real.add_argument("--trajectories", type=int, default=8, help="prompts used, from the top of the file")
    real.add_argument("--roots", type=int, default=2, help="roots per prompt along the target's greedy reply")
    real.add_argument("--spacing", type=int, default=8, help="tokens between roots")
    real.add_argument("--depth", type=int, default=4, help="D of the widened chain")
    real.add_argument("--ranks", type=int, default=3, help="ranks reported per position")
    real.add_argument("--widening-settings", default="0,1", help="settings of the widening tables (backends' --settings form)")
    real.add_argument("--rs-depth", type=int, default=2, help="D of the rejection-sampling chains")
    real.add_argument("--top-k", type=int, default=8, help="top-k of every rejection-sampling setting")
    real.add_argument("--temperatures", default="0,0.3,0.6,1", help="temperatures of the rejection-sampling table")
    real.add_argument("--seed", type=int, default=0)
    real.add_argument("--device", default="cpu")
    real.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    real.add_argument(
        "--trajectory",
        default="cached",
        choices=TRAJECTORY_METHODS,
        help="how the target's greedy reply is evaluated: its KV cache, or the whole context per token (the reference)",
    )
    args = parser.parse_args(argv)
    given = {a for a in vars(args) if getattr(args, a) != parser.get_default(a)}
    if not (args.pair or args.target):
        if given:
            parser.error(f"--{sorted(given)[0].replace('_', '-')}: applies to a real pair (give --pair or --target)")
        return args, None
    try:
        if args.pair and args.target:
            raise ValueError("--target: give --pair or --target, not both")
        if args.target and not args.draft:
            raise ValueError("--draft: --target needs a draft model")
        for flag in ("trajectories", "roots", "spacing", "depth", "ranks", "rs_depth", "top_k"):
            if getattr(args, flag) < 1:
                raise ValueError(f"--{flag.replace('_', '-')}: must be >= 1, got {getattr(args, flag)}")
        from simlab.sampling import parse_settings

        try:
            widening = parse_settings(args.widening_settings)
        except ValueError as exc:
            raise ValueError(f"--widening-settings: {exc}") from None
        temperatures = parse_list(args.temperatures, "--temperatures", float, 0.0)
    except ValueError as exc:
        parser.error(str(exc))
    return args, (widening, temperatures)


def greedy_roots(args) -> tuple[object, list]:
    """The source and its roots along the target's greedy reply (T = 0), ``--roots`` per prompt."""
    from backends.sources.live import HFSource

    source = HFSource(
        args.target,
        args.draft,
        args.prompts,
        args.trajectories,
        args.roots,
        args.spacing,
        depth=max(args.depth, args.rs_depth) + 1,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        pair=args.pair,
        trajectory=args.trajectory,
    )
    return source, list(source.roots(SamplingSettings(0.0)))


def collect(roots, depth: int, ranks: int, widening_settings, rs_depth: int, top_k: int, temperatures) -> dict:
    """Every root's exact rows: ``rank`` and ``widening`` per (setting name, root), ``rs`` per root.

    Each row is ``simlab.widening``'s, with ``setting`` (the widening's setting name), ``root`` and
    ``prompt`` (the root's trajectory) added."""
    out: dict = {"rank": [], "widening": [], "rs": []}
    for root in roots:
        tag = {"root": root.root, "prompt": root.trajectory}
        for s in widening_settings:
            table = NodeTable(rooted(root.pair.with_settings(s), len(root.context)), root.context)
            out["rank"] += [r | tag | {"setting": s.name} for r in W.rank_statistics(table, None, depth, ranks)]
            out["widening"] += [r | tag | {"setting": s.name} for r in W.widening_gains(table, None, depth, WIDTHS)]
        pair = root.pair.with_settings(SamplingSettings(1.0, top_k=top_k))
        out["rs"] += [r | tag for r in W.rejection_sampling_gain(pair, root.context, rs_depth, temperatures, lossy=True)]
    return out


def groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """Rows grouped by ``keys`` (insertion order kept)."""
    out: dict = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def summarise(collected: dict) -> dict:
    """The tables: means over the roots with SEs clustered by prompt (module docstring).

    ``rank``: per (setting, position, rank), ``p`` (the mean of P(Y = c_r | reached)), ``joint``
    (the mean of R_k p(c_r)) and ``conditional`` pooled over the steps that reach the position
    (sum_i R_i p_i(c_r) / sum_i R_i (1 - p_i(c_1..c_{r-1})): an engine's counters; NaN where no
    root rejects the ranks above), each with ``*_se`` and ``roots``.  ``widening``: per (setting,
    mode, position, width), ``chain``, ``value`` and ``gain`` with SEs.  ``rs``: per (temperature,
    draft, verifier), ``value`` (E[tau + 1]) and ``gain`` (its ratio to the argmax/exact-match mean).
    """
    tables: dict = {"rank": [], "widening": [], "rs": []}
    for (setting, k, r), rows in groups(collected["rank"], ("setting", "position", "rank")).items():
        cl = [x["prompt"] for x in rows]
        p, p_se = clustered_mean([x["p"] for x in rows], cl)
        joint, joint_se = clustered_mean([x["joint"] for x in rows], cl)
        left = [x["reach"] * (x["p"] + x["beyond"]) for x in rows]  # R (1 - p(c_1..c_{r-1}))
        cond, cond_se = clustered_ratio([x["joint"] for x in rows], left, cl)
        tables["rank"].append(
            {"setting": setting, "position": k, "rank": r, "roots": len(rows), "p": p, "p_se": p_se}
            | {"conditional": cond, "conditional_se": cond_se, "joint": joint, "joint_se": joint_se}
        )
    for key, rows in groups(collected["widening"], ("setting", "mode", "position", "width")).items():
        cl = [x["prompt"] for x in rows]
        row = dict(zip(("setting", "mode", "position", "width"), key)) | {"roots": len(rows)}
        for name in ("chain", "value", "gain"):
            row[name], row[f"{name}_se"] = clustered_mean([x[name] for x in rows], cl)
        row["lossless"] = all(x["lossless"] for x in rows)
        tables["widening"].append(row)
    by_t = groups(collected["rs"], ("temperature",))
    for (t,), rows in by_t.items():
        base = {x["root"]: x["value"] for x in rows if (x["draft"], x["verifier"]) == W.PAIRINGS[0]}
        for (draft, verifier), part in groups(rows, ("draft", "verifier")).items():
            cl = [x["prompt"] for x in part]
            value, value_se = clustered_mean([x["value"] for x in part], cl)
            gain, gain_se = clustered_ratio([x["value"] for x in part], [base[x["root"]] for x in part], cl)
            tables["rs"].append(
                {"temperature": t, "draft": draft, "verifier": verifier, "roots": len(part), "value": value}
                | {"value_se": value_se, "gain": gain, "gain_se": gain_se, "lossless": all(x["lossless"] for x in part)}
            )
    return tables


def report(tables: dict, args, widening_settings) -> None:
    """The printed tables (module docstring)."""
    for s in widening_settings:
        print(f"rank statistics, {s.name}, raw ranking, D={args.depth}: position rank p(se) conditional(se) joint(se)")
        for r in (x for x in tables["rank"] if x["setting"] == s.name):
            print(
                f"  {r['position']} {r['rank']} {r['p']:.4f} ({r['p_se']:.4f}) {r['conditional']:.4f} ({r['conditional_se']:.4f}) "
                f"{r['joint']:.4f} ({r['joint_se']:.4f})"
            )
        print(f"widening gains {s.name}: mode position width chain value gain(se) (verifier)")
        for r in (x for x in tables["widening"] if x["setting"] == s.name):
            print(
                f"  {r['mode']} {r['position']} {r['width']} {r['chain']:.4f} {r['value']:.4f} {r['gain']:+.4f} ({r['gain_se']:.4f})"
                f"{'' if r['lossless'] else ' LOSSY'}"
            )
    print(
        f"rejection sampling vs argmax matching, top_k={args.top_k}, D={args.rs_depth}: "
        "T draft verifier E[tau+1](se) gain(se) lossless"
    )
    for r in tables["rs"]:
        print(
            f"  {r['temperature']:g} {r['draft']} {r['verifier']} {r['value']:.4f} ({r['value_se']:.4f}) "
            f"{r['gain']:.4f} ({r['gain_se']:.4f}) {r['lossless']}"
        )


def real(args, widening_settings, temperatures) -> None:
    started, cpu = time.perf_counter(), time.process_time()
    try:
        source, roots = greedy_roots(args)
        prompts = len({r.trajectory for r in roots})
        print(
            f"Real pair: {source.describe()}; prompts {args.prompts} ({prompts} prompts x {args.roots} roots along the "
            f"target's greedy reply, {args.spacing} tokens apart, the first the prompt's end); means over {len(roots)} roots, "
            "SE clustered by prompt"
        )
        tables = summarise(collect(roots, args.depth, args.ranks, widening_settings, args.rs_depth, args.top_k, temperatures))
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    report(tables, args, widening_settings)
    print(
        f"cost: {time.perf_counter() - started:.1f} s wall, {time.process_time() - cpu:.1f} s CPU (this process), "
        f"load {os.getloadavg()[0]:.2f}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )


def main(argv=None) -> int:
    args, parsed = parse_args(sys.argv[1:] if argv is None else argv)
    if parsed is None:
        synthetic()
    else:
        real(args, *parsed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
