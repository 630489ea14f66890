"""Evaluate trained selectors: ``python -m analyses.evaluate_selector --run DIR``.

On the roots of one split (default: test, trajectories never seen in training) of a
``train_selector`` run, for each OT-based verifier, these policies:

* ``static_iid``: DDTE's static baseline, the verifier's best plain i.i.d. rollouts (K in 1..4,
  L in 0..8: the grid's actions with L1 = 0) per sampling setting, chosen on the training roots;
  the reference of the ``/ static`` ratios;
* ``static_all_actions``: the lab's static option, the best of every delayed action (K, L1, L2)
  per setting, chosen on the training roots (``docs/departures.md``);
* ``selector``: the learned policy, argmax_a pi(a | c) per root (NDE);
* ``oracle``: the per-context best action argmax_a E(c, a) / T(c, a), a bound DDTE never reports;
* ``oracle_in_sample``: the same bound chosen and valued on all draws (optimistic: it keeps
  the noise it chose on);
* ``traversal_static_iid`` / ``traversal_static_all_actions``: Traversal Verification on its own
  best static action of each kind (chosen on the training roots); ``traversal_static_iid`` is
  the reference of the ``/ Traversal`` ratios.

The selector's loss had its own static baseline (``train_selector --loss-baseline``; a run from
before that flag used ``static_all_actions``), reported in the ``loss_baseline`` column.

Every policy but ``oracle_in_sample`` is valued on the held-out half of the tree draws
(``E_holdout``); the oracle chooses on the other half (``E_select``), so its value is not
inflated by the noise it chose on (but it chooses on half the draws: with s = 4 that is a
noisy choice, so the two oracles bracket the per-context optimum).  Throughput of a policy = sum over roots of E / sum of T (tokens per second).  Output under
``--out`` (default: ``<run>/evaluation``): ``evaluation.parquet`` (verifier, setting, policy, E,
throughput, ratios), ``per_root.parquet`` (every root's chosen actions and values),
``evaluation.{html,png}``; tables in the layout of DDTE Tables 4-7, and the fraction of
contexts where the selector loses more than 5% of throughput against ``static_iid``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analyses._categories import by_category, with_category
from analyses._selector_data import DEFAULT_RUN, STATIC_BASELINES, choose, static_choice, value_matrices
from analyses._study import WROTE, ByCategory, Opened, Report, Study, chart_files, run_study
from backends.cli import ToolParser, chart_writer, check_flags, fail, prepare_out
from simlab import tree_verifiers

PROG = "python -m analyses.evaluate_selector"
POLICIES = (
    "static_iid",
    "static_all_actions",
    "selector",
    "oracle",
    "oracle_in_sample",
    "traversal_static_iid",
    "traversal_static_all_actions",
)
REFERENCE, TRAVERSAL_REFERENCE = "static_iid", "traversal_static_iid"
"""The policies the ratios divide by: DDTE's static baseline, for the verifier and for Traversal."""
LOSS_THRESHOLD = 0.05


@dataclass(frozen=True)
class Config:
    """The study's settings (the command-line flags): the ``train_selector`` run folder, the split
    evaluated, the output folder and ``--quiet``."""

    run: str = DEFAULT_RUN
    split: str = "test"
    out: str | None = None
    quiet: bool = False


def flags(parser: ToolParser, d: Config) -> None:
    """``--run``, ``--split``, ``--out`` and ``--quiet``."""
    parser.add_argument("--run", default=d.run, help="output folder of python -m analyses.train_selector")
    parser.add_argument("--split", choices=["test", "validation", "train"], default=d.split, help="roots to evaluate on")
    parser.add_argument("--out", default=None, help="output folder (default: <run>/evaluation)")
    parser.add_argument("--quiet", action="store_true")


def config_of(args, parser: ToolParser) -> Config:
    """The config, or exit 2 with one line when ``--run`` is not a ``train_selector`` output folder."""
    run = Path(args.run)
    check_flags(
        PROG,
        [
            (run.is_dir(), f"--run: {args.run!r} is not a folder"),
            ((run / "run.json").is_file(), f"--run: {args.run!r} is not a train_selector output (no run.json)"),
        ],
    )
    return Config(args.run, args.split, args.out, args.quiet)


def open_run(config: Config, parser: ToolParser, say) -> Opened:
    """No source of roots: the output folder (``--out``, default ``<run>/evaluation``), prepared."""
    return Opened(
        None, (), None, prepare_out(PROG, config.out if config.out is not None else str(Path(config.run) / "evaluation"))
    )


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str:
    """Always refused: the study values no roots (it reads a ``train_selector`` run's labels)."""
    return "the study values no roots: it reads the labels of a train_selector run"


def values(config: Config, opened: Opened, say) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``evaluate``'s (summary, per-root table) of the run, or exit 2 with one line naming ``--run``
    whatever the reader raised (a damaged or foreign run folder)."""
    try:
        return evaluate(*load_run(Path(config.run)), config.split)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        fail(PROG, f"--run: cannot evaluate {config.run!r} ({type(exc).__name__}: {first})")


def load_run(run: Path):
    """(run.json, labels, roots, embeddings, {verifier: checkpoint})."""
    import torch

    meta = json.loads((run / "run.json").read_text())
    if not isinstance(meta, dict) or "verifiers" not in meta or "actions" not in meta:
        raise ValueError("run.json is not a train_selector record")
    labels, roots = pl.read_parquet(run / "labels.parquet"), pl.read_parquet(run / "roots.parquet")
    with np.load(run / "embeddings.npz") as data:
        arrays = {k: data[k] for k in data.files}
    if any(a.shape[0] != roots.height for a in arrays.values()) or meta.get("roots", roots.height) != roots.height:
        raise ValueError("roots.parquet, embeddings.npz and run.json disagree on the number of roots")
    checkpoints = {
        v: torch.load(io.BytesIO((run / f"selector-{v}.pt").read_bytes()), weights_only=False) for v in meta["verifiers"]
    }
    return meta, labels, roots, arrays, checkpoints


def selector_actions(checkpoint, roots: pl.DataFrame, arrays, rows: np.ndarray) -> np.ndarray:
    """The selector's argmax action index for each root in ``rows`` (eval mode, CPU)."""
    from simlab.selector.model import Selector

    return choose(Selector.from_checkpoint(checkpoint), roots, arrays, rows)


def evaluate(meta, labels, roots, arrays, checkpoints, split: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary per verifier, setting and policy; per-root table)."""
    actions = [tuple(a) for a in meta["actions"]]
    settings = roots["setting"].to_numpy()
    train_mask, rows = roots["split"].to_numpy() == "train", np.flatnonzero(roots["split"].to_numpy() == split)
    if rows.size == 0:
        raise ValueError(f"--split: the run has no {split} roots")
    trav = value_matrices(labels, "traversal", roots, actions)

    def static_picks(values, baseline):
        static = static_choice(values, settings, train_mask, actions, baseline)
        return np.array([static[str(settings[r])] for r in rows])

    per_root, loss_baseline = [], {}
    category = (  # (setting, root) -> the root's prompt category; runs made before the column: none
        dict(zip(zip(labels["setting"], labels["root"]), labels["category"])) if "category" in labels.columns else {}
    )
    for verifier, ckpt in checkpoints.items():
        values = value_matrices(labels, verifier, roots, actions)
        loss_baseline[verifier] = ckpt.get("static_baseline", "static_all_actions")  # runs before the field: all actions
        chosen = {
            **{baseline: static_picks(values, baseline) for baseline in STATIC_BASELINES},
            "selector": selector_actions(ckpt, roots, arrays, rows),
            "oracle": np.argmax(values["E_select"][rows] / values["T"][rows], axis=1),
            "oracle_in_sample": np.argmax(values["E"][rows] / values["T"][rows], axis=1),
            **{f"traversal_{baseline}": static_picks(trav, baseline) for baseline in STATIC_BASELINES},
        }
        for policy, picks in chosen.items():
            source = trav if policy.startswith("traversal") else values
            E = source["E" if policy == "oracle_in_sample" else "E_holdout"][rows, picks]
            T = source["T"][rows, picks]
            for i, r in enumerate(rows):
                per_root.append(
                    {
                        "verifier": verifier,
                        "policy": policy,
                        "setting": settings[r],
                        "trajectory": int(roots["trajectory"][int(r)]),
                        "root": int(roots["root"][int(r)]),
                        "category": category.get((str(settings[r]), int(roots["root"][int(r)]))),
                        "K": actions[picks[i]][0],
                        "L1": actions[picks[i]][1],
                        "L2": actions[picks[i]][2],
                        "E": float(E[i]),
                        "T": float(T[i]),
                    }
                )
    per_root = with_category(pl.DataFrame(per_root))
    return summarise(per_root, loss_baseline), per_root


def summarise(per_root: pl.DataFrame, loss_baseline: dict[str, str]) -> pl.DataFrame:
    """Per verifier, setting (and ``all``) and policy of ``evaluate``'s per-root rows: roots, mean E,
    throughput (sum E / sum T) and its ratios to the static baseline and to Traversal's; with each
    verifier's selector loss baseline (``loss_baseline``)."""
    summary = []
    for (verifier, setting, policy), group in per_root.group_by("verifier", "setting", "policy", maintain_order=True):
        summary.append(
            {
                "verifier": verifier,
                "setting": setting,
                "policy": policy,
                "roots": group.height,
                "E": group["E"].mean(),
                "TPS": group["E"].sum() / group["T"].sum(),
            }
        )
    for (verifier, policy), group in per_root.group_by("verifier", "policy", maintain_order=True):
        summary.append(
            {
                "verifier": verifier,
                "setting": "all",
                "policy": policy,
                "roots": group.height,
                "E": group["E"].mean(),
                "TPS": group["E"].sum() / group["T"].sum(),
            }
        )
    table = pl.DataFrame(summary).with_columns(pl.col("verifier").replace_strict(loss_baseline).alias("loss_baseline"))
    static = table.filter(pl.col("policy") == REFERENCE).select(
        "verifier", "setting", pl.col("E").alias("E_static"), pl.col("TPS").alias("TPS_static")
    )
    trav_tps = table.filter(pl.col("policy") == TRAVERSAL_REFERENCE).select(
        "verifier", "setting", pl.col("TPS").alias("TPS_traversal")
    )
    table = (
        table.join(static, on=["verifier", "setting"])
        .join(trav_tps, on=["verifier", "setting"])
        .with_columns(
            (pl.col("E") / pl.col("E_static")).alias("E_ratio_static"),
            (pl.col("TPS") / pl.col("TPS_static")).alias("TPS_ratio_static"),
            (pl.col("TPS") / pl.col("TPS_traversal")).alias("TPS_ratio_traversal"),
        )
        .drop("E_static", "TPS_static", "TPS_traversal")
    )
    return table


def losses(per_root: pl.DataFrame) -> pl.DataFrame:
    """Per verifier: the fraction of contexts where the selector's throughput E/T is more than 5%
    below DDTE's static baseline's (``static_iid``) at the same root."""
    key = ["verifier", "setting", "root"]
    tps = lambda p: per_root.filter(pl.col("policy") == p).select(*key, (pl.col("E") / pl.col("T")).alias(p))
    both = tps("selector").join(tps(REFERENCE), on=key)
    return both.group_by("verifier", maintain_order=True).agg(
        pl.len().alias("contexts"),
        (pl.col("selector") < (1 - LOSS_THRESHOLD) * pl.col(REFERENCE)).mean().alias("fraction losing > 5%"),
        (pl.col("selector") > pl.col(REFERENCE)).mean().alias("fraction winning"),
    )


def chart(table: pl.DataFrame):
    import altair as alt

    data = table.filter(pl.col("setting") == "all").with_columns(
        pl.col("verifier").replace_strict(tree_verifiers.paper_names(), default=pl.col("verifier"))
    )
    return (
        alt.Chart(data)
        .mark_bar()
        .encode(
            x=alt.X("policy:N", sort=list(POLICIES), title=None),
            y=alt.Y("TPS:Q", title="throughput (tokens/s)"),
            color="policy:N",
            column=alt.Column("verifier:N", title=None),
            tooltip=["verifier", "policy", "E", "TPS", "TPS_ratio_static"],
        )
        .properties(
            width=180, height=220, title="Static vs selector vs per-context oracle vs Traversal (held-out roots and draws)"
        )
    )


def run(config: Config, opened: Opened, evaluated: tuple[pl.DataFrame, pl.DataFrame], say) -> Report:
    """The summary, per-root rows, losses, by-category table, chart and the DDTE-layout tables."""
    table, per_root = evaluated
    lost = losses(per_root)
    loss_baseline = dict(table.select("verifier", "loss_baseline").unique().iter_rows())
    categories = by_category(per_root, lambda part: summarise(part, loss_baseline))
    outputs = {
        "evaluation.parquet": table,
        "per_root.parquet": per_root,
        "losses.parquet": lost,
        **chart_files("evaluation", chart(table), chart_writer),
    }
    printed = (
        *report(table, lost, config.split),
        ByCategory(
            categories,
            ("verifier", "setting", "policy", "roots", "E", "TPS", "TPS_ratio_static", "TPS_ratio_traversal"),
            f"E[tau+1] and throughput on the {config.split} roots",
            pl.col("setting") == "all",
        ),
        WROTE,
    )
    return Report(outputs, categories, printed)


def report(table: pl.DataFrame, lost: pl.DataFrame, split: str) -> list:
    """The printed tables (``analyses._study.Report.printed`` items): DDTE Tables 4-7's layout,
    the ratios to Traversal, the loss baselines and the contexts the selector loses."""
    named = lambda frame: frame.with_columns(
        pl.col("verifier").replace_strict(tree_verifiers.paper_names(), default=pl.col("verifier"))
    )
    overall, items = table.filter(pl.col("setting") == "all"), []
    for metric, title in (("E", "Block efficiency E[tau+1] (tokens per step)"), ("TPS", "Throughput (tokens/s)")):
        items.append(
            (
                named(overall.pivot(on="policy", index="verifier", values=metric).select("verifier", *POLICIES)),
                f"{title} on the {split} roots, by policy (cf. DDTE Tables 6-7; oracle = per-context best action)",
            )
        )
    ratios = table.filter(pl.col("policy") == "selector").pivot(on="setting", index="verifier", values="TPS_ratio_static")
    items.append(
        (
            named(ratios),
            "Selector / static_iid (DDTE's static baseline) throughput by setting (cf. DDTE Table 5; 'all' = ratio of totals)",
        )
    )
    ratios = table.filter(pl.col("policy") == "selector").pivot(on="setting", index="verifier", values="E_ratio_static")
    items.append((named(ratios), "Selector / static_iid block efficiency by setting (cf. DDTE Table 4)"))
    vs = overall.filter(pl.col("policy").is_in(["selector", "oracle", "static_all_actions"])).pivot(
        on="policy", index="verifier", values="TPS_ratio_traversal"
    )
    items.append((named(vs), "Throughput relative to Traversal on its best static i.i.d. rollouts (traversal_static_iid)"))
    baselines = ", ".join(
        f"{tree_verifiers.paper_name(v)}: {b}"
        for v, b in overall.select("verifier", "loss_baseline").unique(maintain_order=True).iter_rows()
    )
    items.append(f"(the selectors' loss baseline: {baselines})")
    items.append((named(lost), f"Contexts where the selector's throughput is more than {LOSS_THRESHOLD:.0%} below static_iid's"))
    return items


STUDY = Study(PROG, __doc__, Config, flags, config_of, open_run, None, None, run, values, shardable=shardable)


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
