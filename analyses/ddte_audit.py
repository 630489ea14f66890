"""The DDTE audit: how much of a published number each public-code convention explains: ``python -m analyses.ddte_audit``.

At every root of a source (default: the synthetic ``depth_profile`` world, V = 32, DDTE's eight
sampling settings) the study labels DDTE's delayed-tree grid (K <= 4, L1, L2 <= 8, ``--samples``
trees per L1, the same trees for every verifier and convention: common random numbers) for
SpecInfer, SpecTr, Khisti and Traversal under

* **exact**: the lab's conventions (one trunk child, rho*, Khisti's guarded tail);
* **per_path**: the trunk children of the authors' public tree code, one edge per path (a trunk
  node lists its drafted child K times: ``Delayed(..., trunk_children="per_path")``), valued as if
  the copies were K i.i.d. draws: **lossy** for SpecInfer, SpecTr and Khisti (their labels are
  computed with ``allow_lossy``), exact for Traversal;
* **four_step**: SpecTr's rho by a four-step search (``SpecTr(rho="four_step")``, lossless);
* **rank**: Khisti's tail resolved by rank (``Khisti(tail="rank")``, lossless);
* **public**: all three together, as the public code runs.

Reported per setting, verifier and convention: the mean label inflation over the grid (E under
the convention minus exact E, per action, paired by tree), the best static action chosen on the
convention's labels with its claimed throughput and its exact one (the value of that choice
under the lab's exact conventions), and the gap to Traversal's exact best static throughput.
Output under ``--out`` (default ``out/ddte_audit/<source>/``): ``ddte_audit.parquet`` (summary),
``labels.parquet`` (every root, action, verifier and convention), ``inflation.{html,png}``.
The selector trained on each convention's labels is not part of this study (issue 17, open).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np
import polars as pl
from tqdm import tqdm

from backends.cli import OutputSet, add_output_flags, chart_writer, check_flags, fail_from, parquet_writer, prepare_out, print_table, run_tool
from backends.sources.flags import LatencyConfig, SourceConfig, make_latency, make_source, study_parser, with_hf_defaults

PROG = "python -m analyses.ddte_audit"
CONVENTIONS = ("exact", "per_path", "four_step", "rank", "public")
VERIFIERS = ("specinfer", "spectr", "khisti", "traversal")
REFUSALS = {"capture": {"capture": "the audit draws its own grid trees; use --backend hf or a synthetic world"}}
HF_DEFAULTS = {"roots_per_trajectory": 2, "spacing": 8}


@dataclass(frozen=True)
class Config(SourceConfig, LatencyConfig):
    """The study's settings (the command-line flags)."""

    trajectories: int = 4
    roots_per_trajectory: int = 1
    settings: str = "ddte"
    samples: int = 2
    out: str | None = None
    quiet: bool = False


def parse_args(argv) -> tuple[Config, object]:
    d = Config()
    parser = study_parser(PROG, __doc__, d)
    parser.add_argument("--samples", type=int, default=d.samples, help="grid trees per L1 (shared by verifiers and conventions)")
    add_output_flags(parser, PROG)
    args = parser.parse_args(argv)
    config = Config(**{**vars(args), "capture": tuple(args.capture)})
    check_flags(PROG, [(config.samples >= 1, f"--samples: must be >= 1, got {config.samples}")])
    return config, parser


def convention(verifier: str, name: str):
    """(tree verifier, trunk_children) of ``verifier`` under convention ``name``; None where the
    convention does not touch that verifier (its labels are the exact ones)."""
    from simlab import tree_verifiers

    options = {}
    if name in ("four_step", "public") and verifier == "spectr":
        options["rho"] = "four_step"
    if name in ("rank", "public") and verifier == "khisti":
        options["tail"] = "rank"
    trunk = "per_path" if name in ("per_path", "public") else "shared"
    if name != "exact" and not options and trunk == "shared":
        return None
    return tree_verifiers.get(verifier, allow_lossy=trunk == "per_path", **options), trunk


def label(config: Config, source, settings, latency) -> list[dict]:
    """One row per root, setting, verifier, convention and grid action."""
    from simlab.efficiency import draw_grid, grid_block_efficiency
    from simlab.trees import NodeTable

    rows = []
    bar = tqdm(total=sum(source.count(s) for s in settings), desc="roots", unit="root", file=sys.stderr, disable=config.quiet)
    for setting in settings:
        for root in source.roots(setting):
            table = NodeTable(root.pair, root.context)
            drafts = draw_grid(table, K_max=4, L1_values=tuple(range(9)), L2_max=8, samples=config.samples,
                               rng=np.random.default_rng([config.seed, root.root]))
            times = {}
            for v in VERIFIERS:
                for name in CONVENTIONS:
                    chosen = convention(v, name)
                    if chosen is None:
                        continue
                    verifier, trunk = chosen
                    grid = grid_block_efficiency(table, drafts, verifier, trunk_children=trunk)
                    for action, estimate in grid.items():
                        if action not in times:
                            times[action] = latency.delayed_time(*action, len(root.context))
                        rows.append({"setting": setting.name, "root": root.root, "verifier": v, "convention": name,
                                     "K": action[0], "L1": action[1], "L2": action[2], "E": estimate.mean, "T": times[action]})
            bar.update()
    bar.close()
    return rows


def summarise(labels: pl.DataFrame) -> pl.DataFrame:
    """Per setting, verifier and convention: mean inflation, the best static action on the convention's
    labels, its claimed and exact throughput, and the gap to Traversal's exact best."""
    key = ["setting", "root", "verifier", "K", "L1", "L2"]
    exact = labels.filter(pl.col("convention") == "exact").select(*key, pl.col("E").alias("E_exact"))
    filled = []
    for name in CONVENTIONS:  # a convention that does not touch a verifier keeps its exact labels
        own = labels.filter(pl.col("convention") == name).drop("convention")
        missing = labels.filter(pl.col("convention") == "exact").drop("convention").join(own.select(key), on=key, how="anti")
        filled.append(pl.concat([own, missing]).with_columns(pl.lit(name).alias("convention")))
    full = pl.concat(filled).join(exact, on=key)
    inflation = full.group_by("setting", "verifier", "convention").agg((pl.col("E") - pl.col("E_exact")).mean().alias("inflation"),
                                                                      (pl.col("E") - pl.col("E_exact")).max().alias("max_inflation"))
    per_action = full.group_by("setting", "verifier", "convention", "K", "L1", "L2").agg(
        (pl.col("E").sum() / pl.col("T").sum()).alias("claimed_TPS"), (pl.col("E_exact").sum() / pl.col("T").sum()).alias("exact_TPS"))
    best = per_action.sort("claimed_TPS", descending=True).group_by("setting", "verifier", "convention", maintain_order=True).first()
    traversal = best.filter((pl.col("verifier") == "traversal") & (pl.col("convention") == "exact")).select(
        "setting", pl.col("exact_TPS").alias("traversal_TPS"))
    out = best.join(inflation, on=["setting", "verifier", "convention"]).join(traversal, on="setting").with_columns(
        (pl.col("claimed_TPS") / pl.col("traversal_TPS") - 1).alias("claimed_vs_traversal"),
        (pl.col("exact_TPS") / pl.col("traversal_TPS") - 1).alias("exact_vs_traversal"))
    return out.select("setting", "verifier", "convention", "inflation", "max_inflation", "K", "L1", "L2", "claimed_TPS", "exact_TPS",
                      "claimed_vs_traversal", "exact_vs_traversal").sort("setting", "verifier", "convention")


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


def _main(argv) -> int:
    import altair as alt

    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    config = with_hf_defaults(config, parser, HF_DEFAULTS)
    source, settings = make_source(PROG, parser, config, stream="per_trajectory", grid=False, depth=16, study_refusals=REFUSALS,
                                   quiet=config.quiet)
    latency = make_latency(PROG, parser, config, source, 40)
    out = prepare_out(PROG, config.out if config.out is not None else f"out/ddte_audit/{source.slug()}")
    try:
        labels = pl.DataFrame(label(config, source, settings, latency))
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    summary = summarise(labels)
    chart = alt.Chart(summary).mark_bar().encode(
        x=alt.X("convention:N", sort=list(CONVENTIONS), title=None), y=alt.Y("inflation:Q", title="mean label inflation (tokens)"),
        color="convention:N", column=alt.Column("verifier:N", title=None), tooltip=list(summary.columns)).properties(
        width=140, height=180, title=alt.TitleParams("Label inflation of the public-code conventions over DDTE's grid (all settings)",
                                                     subtitle=f"source: {source.describe()}; latency: {latency.source}"))
    with OutputSet(out) as outputs:
        outputs.stage("ddte_audit.parquet", parquet_writer(summary))
        outputs.stage("labels.parquet", parquet_writer(labels))
        for fmt in ("html", "png"):
            outputs.stage(f"inflation.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        print(f"Source: {source.describe()}; {labels['root'].n_unique()} roots per setting; latency: {latency.source}")
        overall = summary.group_by("verifier", "convention", maintain_order=True).agg(
            pl.col("inflation").mean(), pl.col("max_inflation").max(), pl.col("claimed_vs_traversal").mean(),
            pl.col("exact_vs_traversal").mean()).sort("verifier", "convention")
        print_table(overall, "Mean over settings: label inflation, and the best static action's throughput vs Traversal's "
                             "(claimed under the convention, exact for the same action)")
        print(f"wrote {out}/ddte_audit.parquet, labels.parquet, inflation.html/.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
