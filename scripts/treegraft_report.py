"""The tables of a ``python -m analyses.treegraft`` run over every root, with paired differences
clustered by prompt (docs/results.md sections 0g and Q5).

    python scripts/treegraft_report.py out/seed/qwen_treegraft [out/seed/qwen_treegraft_gpu ...] [--verifier onehot]

For each run folder (its ``per_root.parquet``) and each sampling setting, under one verifier
(default ``onehot``: at T = 0 it is greedy verification, at T > 0 the one-hot rule; every lossless
rule of a deterministic tree gives the same exact values there), one markdown row per policy:

* roots: the fixed policies and ``best`` over every root; ``learned`` over the held-out roots only
  (the study's ``test`` column: g_psi is trained on the others);
* E[tau + 1]: the mean over the roots, ± its standard error clustered by prompt (trajectory);
* T-hat (ms): the mean modelled round time;
* throughput: sum E / sum T-hat over the roots (tokens/s), and its ratios to all-small and all-mid
  over the same roots;
* the paired differences of the per-root throughput E / T-hat to all-small and to all-mid (tokens/s),
  mean ± SE clustered by prompt (``simlab.stats``).

Then the ablations against the fixed schedule (paired, tokens/s), how often an official stop cut the
fixed schedule's build, the best schedules and their counts, where a prompt has several roots the
same by place along the reply (``by_offset``), and the throughput by category.
Exits with status 2 and one line on a bad argument.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import polars as pl

from simlab.stats import clustered_mean_se

PROG = "scripts/treegraft_report.py"
ROWS = (
    ("all_small", "all-small (n-gram only)"),
    ("all_mid", "all-mid"),
    ("fixed", "fixed"),
    ("best", "best schedule (oracle, per root)"),
    ("no_expanded_positions", "no expanded positions"),
    ("destructive", "destructive grafting"),
    ("sequence_level", "CSD-style sequence"),
    ("learned", "learned g_psi (test roots)"),
)
ABLATIONS = ("destructive", "no_expanded_positions", "sequence_level")
KEY = ("trajectory", "root")
COLUMNS = (
    "setting",
    "trajectory",
    "root",
    "context_length",
    "category",
    "policy",
    "verifier",
    "schedule",
    "E",
    "T",
    "TPS",
    "stop",
    "early_stop",
    "test",
)


def read_run(folder: str, verifier: str) -> pl.DataFrame:
    """``per_root.parquet`` of ``folder`` under ``verifier``; ``ValueError`` naming the argument."""
    path = Path(folder) / "per_root.parquet"
    if not path.is_file():
        raise ValueError(f"run: {path} not found (a python -m analyses.treegraft --out folder)")
    try:
        frame = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ValueError(f"run: {path} cannot be read ({str(exc).splitlines()[0]})") from None
    lacking = [c for c in COLUMNS if c not in frame.columns]
    if lacking:
        raise ValueError(f"run: {path} lacks the columns {', '.join(lacking)} (not a treegraft per_root.parquet)")
    if frame.height == 0:
        raise ValueError(f"run: {path} holds no roots")
    if frame.select(pl.col("T").is_finite().not_() | (pl.col("T") <= 0)).to_series().any():
        raise ValueError(f"run: {path} has a T-hat that is not a positive number")
    for name in ("all_small", "all_mid", "fixed"):
        if name not in frame["policy"].unique().to_list():
            raise ValueError(f"run: {path} has no {name} rows (a treegraft run values every policy)")
    if frame.select(["setting", "verifier", "policy", *KEY]).is_duplicated().any():
        raise ValueError(f"run: {path} has more than one row for a root, policy and verifier")
    if verifier not in frame["verifier"].unique().to_list():
        raise ValueError(f"--verifier: {verifier!r} not in {path} (has {sorted(frame['verifier'].unique().to_list())})")
    return frame.filter(pl.col("verifier") == verifier)


def _policy(frame: pl.DataFrame, policy: str) -> pl.DataFrame:
    return frame.filter(pl.col("policy") == policy).sort(KEY)


def paired(frame: pl.DataFrame, policy: str, reference: str) -> tuple[float, float]:
    """Mean ± clustered SE of ``policy``'s per-root E / T minus ``reference``'s, over ``policy``'s roots."""
    mine = _policy(frame, policy).select(*KEY, pl.col("TPS").alias("a"))
    ref = _policy(frame, reference).select(*KEY, pl.col("TPS").alias("b"))
    both = mine.join(ref, on=list(KEY), how="inner")
    if both.height != mine.height:
        raise ValueError(f"run: {policy} has roots that {reference} lacks")
    return clustered_mean_se((both["a"] - both["b"]).to_numpy(), both["trajectory"].to_list())


def table(frame: pl.DataFrame, setting: str) -> list[str]:
    """The markdown rows of one setting."""
    lines = []
    for policy, label in ROWS:
        rows = _policy(frame, policy)
        if rows.height == 0:
            continue
        keys = rows.select(KEY)
        through = {}
        for name in ("all_small", "all_mid"):
            ref = _policy(frame, name).join(keys, on=list(KEY), how="semi")
            through[name] = ref["E"].sum() / ref["T"].sum()
        tps = rows["E"].sum() / rows["T"].sum()
        e, e_se = clustered_mean_se(rows["E"].to_numpy(), rows["trajectory"].to_list())
        diffs = [paired(frame, policy, ref) if policy != ref else (0.0, 0.0) for ref in ("all_small", "all_mid")]
        if policy == "fixed":
            label += " [" + ",".join(sorted(set(rows["schedule"].to_list()))[0]) + "]"
        cells = [
            setting,
            label,
            str(rows.height),
            f"{e:.2f} ± {e_se:.2f}",
            f"{1000 * rows['T'].mean():.1f}",
            f"{tps:.2f}",
            f"{tps / through['all_small']:.3f}",
            f"{tps / through['all_mid']:.3f}",
            *("0" if policy == ref else f"{d:+.2f} ± {s:.2f}" for (d, s), ref in zip(diffs, ("all_small", "all_mid"))),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def notes(frame: pl.DataFrame, setting: str) -> list[str]:
    """The ablations against the fixed schedule, the fixed schedule's stops, the best schedules, the
    roots by place along the reply (``by_offset``), categories."""
    out = []
    for name in ABLATIONS:
        if _policy(frame, name).height:
            d, s = paired(frame, name, "fixed")
            out.append(f"{setting}: {name} minus fixed {d:+.2f} ± {s:.2f} tokens/s")
    fixed = _policy(frame, "fixed")
    stops = Counter(s for s in fixed["stop"].to_list() if s)
    out.append(f"{setting}: fixed cut by an official stop at {fixed['early_stop'].sum()} of {fixed.height} roots {dict(stops)}")
    best = Counter(_policy(frame, "best")["schedule"].to_list())
    out.append(f"{setting}: best schedules {dict(best.most_common())}")
    out += by_offset(frame, setting)
    if frame["category"].null_count() < frame.height:
        named = frame.with_columns(pl.col("category").fill_null("(none)"))
        for category in sorted(named["category"].unique().to_list()):
            part = named.filter(pl.col("category") == category)
            cells = []
            for policy in ("all_small", "all_mid", "fixed", "best"):
                rows = _policy(part, policy)
                cells.append(f"{rows['E'].sum() / rows['T'].sum():.1f}" if rows.height else "-")
            out.append(
                f"{setting}: {category} ({_policy(part, 'fixed').height} roots) all-small / all-mid / fixed / best {' / '.join(cells)}"
            )
    return out


def by_offset(frame: pl.DataFrame, setting: str) -> list[str]:
    """Per place along the reply, where a prompt has several roots: the n-gram drafter's E, the
    throughput of all-small / all-mid / fixed / best and the paired difference of fixed to each
    single drafter (tokens/s, clustered by prompt).  The place is the run's ``offset`` (tokens past
    the prompt's end; live roots), else, where it is absent or null (synthetic roots, runs written
    without it), the context length past the trajectory's shortest root context, so labelled."""
    if "offset" in frame.columns and frame["offset"].null_count() == 0:
        placed, where = frame, "tokens into the reply"
    else:
        first = frame.group_by("trajectory").agg(pl.col("context_length").min().alias("start"))
        shift = (pl.col("context_length") - pl.col("start")).alias("offset")
        placed, where = (
            frame.drop("offset", strict=False).join(first, on="trajectory").with_columns(shift),
            "tokens past the first root",
        )
    offsets = sorted(placed["offset"].unique().to_list())
    if len(offsets) < 2:
        return []
    out = []
    for offset in offsets:
        part = placed.filter(pl.col("offset") == offset)
        small = _policy(part, "all_small")
        cells = []
        for policy in ("all_small", "all_mid", "fixed", "best"):
            rows = _policy(part, policy)
            cells.append(f"{rows['E'].sum() / rows['T'].sum():.1f}" if rows.height else "-")
        diffs = ", ".join(
            f"fixed minus {ref} {d:+.1f} ± {s:.1f}" for ref in ("all_small", "all_mid") for d, s in [paired(part, "fixed", ref)]
        )
        out.append(
            f"{setting}: {offset} {where} ({small.height} roots): n-gram E {small['E'].mean():.2f}; "
            f"all-small / all-mid / fixed / best {' / '.join(cells)} tokens/s; {diffs}"
        )
    return out


HEADER = [
    "| setting | policy | roots | E[tau+1] | T-hat (ms) | throughput (sum E / sum T) | vs all-small | vs all-mid "
    "| paired diff. to all-small (tok/s) | paired diff. to all-mid (tok/s) |",
    "|---|---|---|---|---|---|---|---|---|---|",
]


def report(folder: str, verifier: str) -> str:
    """The whole report of one run folder."""
    frame = read_run(folder, verifier)
    lines, extra = [f"## {folder} (verifier {verifier})", "", *HEADER], []
    for setting in sorted(frame["setting"].unique().to_list()):
        part = frame.filter(pl.col("setting") == setting)
        lines += table(part, setting)
        extra += notes(part, setting)
    context = frame["context_length"]
    prompts = frame["trajectory"].n_unique()
    return "\n".join([*lines, "", f"{prompts} prompts, contexts of {context.min()}-{context.max()} tokens", *extra, ""])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="python -m analyses.treegraft --out folders")
    parser.add_argument("--verifier", default="onehot", help="the verifier of the rows (default: onehot)")
    args = parser.parse_args(argv)
    try:
        texts = [report(folder, args.verifier) for folder in args.runs]
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    print("\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
