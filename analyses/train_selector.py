"""Train the neural delayed-expansion selector (NDE): ``python -m analyses.train_selector``.

Labels every root of the source with E[tau + 1] and T-hat for every action of the grid
{1..K} x {0..L}^2 (``analyses._labels``; DDTE's estimator with ``--samples`` trees, s = 4, or
``--method exact`` enumeration where a tiny synthetic world allows it),
for each OT-based verifier and for Traversal (the baseline of ``evaluate_selector``), computes
the selector's features at each root (``simlab.selector.features``), splits the roots by
trajectory into train / validation / test (60 / 20 / 20), and trains one selector per OT-based
verifier on DDTE's loss (``simlab.selector``), deterministically from ``--seed``.  The loss's
baseline is each setting's static choice on the training roots (``--loss-baseline``, default
``static_iid``: DDTE's plain i.i.d. rollouts, K in 1..4, L in 0..8; ``static_all_actions``: the
lab's choice over every delayed action; ``analyses._selector_data``).

Output under ``--out`` (read by ``python -m analyses.evaluate_selector --run DIR``):
``labels.parquet`` (with the engines' metrics ``accepted`` = E[tau] and ``unconditional`` =
[P(tau >= j)] per root and action, ``analyses._labels``), ``roots.parquet`` (keys, split, scalar
features), ``embeddings.npz``,
``selector-<verifier>.pt``, ``history.parquet``, ``training.{html,png}``, ``latency.json``,
``run.json``.
"""

from __future__ import annotations

import io
import json
import sys
import time
from dataclasses import asdict, dataclass, replace

import numpy as np
import polars as pl

from analyses._grid_study import GridStudyConfig, add_grid_study_flags, check_grid_study_flags, grid_source
from analyses._labels import grid_of, label_all
from analyses._selector_data import STATIC_BASELINES, feature_arrays, fit_selector, value_matrices
from backends.cli import (
    OutputSet,
    ToolParser,
    chart_writer,
    fail,
    fail_from,
    name_list,
    parquet_writer,
    print_table,
    run_tool,
    slow_step,
)
from simlab.checks import check_device
from simlab import tree_verifiers
from simlab import verifiers as node_verifiers
from backends.sources.flags import study_config, study_out, with_hf_defaults

PROG = "python -m analyses.train_selector"


@dataclass(frozen=True)
class Config(GridStudyConfig):
    """The study's settings (the command-line flags); the source defaults differ from
    ``compare_verifiers``'s: more roots, two settings, and the ``distilled`` world, whose contexts
    differ in how well the draft knows them (``depth_profile``'s barely do)."""

    world: str = "distilled"
    trajectories: int = 24
    roots_per_trajectory: int = 4
    spacing: int = 8
    settings: str = "0.6,1"
    verifiers: tuple[str, ...] = ("specinfer", "spectr")
    epochs: int = 200
    batch: int = 64
    lr: float = 1e-3
    lam: float = 1.0
    alpha: float = 0.1
    dropout: float = 0.1
    loss_baseline: str = "static_iid"
    train_device: str = "cpu"
    out: str | None = None


def parse_args(argv) -> tuple[Config, ToolParser]:
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    d = Config()
    add_grid_study_flags(parser, d)
    parser.add_argument(
        "--verifiers",
        default=",".join(d.verifiers),
        help=f"OT-based verifiers, one selector each: {', '.join(node_verifiers.ot_based())}",
    )
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch", type=int, default=d.batch)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--lam", type=float, default=d.lam, help="loss: weight of the tail penalty (lambda)")
    parser.add_argument("--alpha", type=float, default=d.alpha, help="loss: tail fraction of the batch (alpha)")
    parser.add_argument("--dropout", type=float, default=d.dropout)
    parser.add_argument(
        "--loss-baseline",
        choices=STATIC_BASELINES,
        default=d.loss_baseline,
        help="the static baseline of the loss: static_iid = DDTE's i.i.d. rollouts (L1 = 0); "
        "static_all_actions = the best of every delayed action (the lab's option)",
    )
    parser.add_argument("--train-device", default=d.train_device, help="torch device for training: cpu, cuda, auto")
    parser.add_argument("--out", default=None, help="output folder (default: out/train_selector/<source>)")
    args = parser.parse_args(argv)
    verifiers, verifiers_error = (), None
    try:
        verifiers = name_list(args.verifiers, "--verifiers", node_verifiers.ot_based())  # OT-based: one selector each
    except ValueError as exc:
        verifiers_error = str(exc)
    device_error = None
    try:
        check_device(args.train_device, "--train-device")
    except ValueError as exc:
        device_error = str(exc)
    check_grid_study_flags(
        PROG,
        args,
        [
            (verifiers_error is None, verifiers_error),
            (args.epochs >= 1, f"--epochs: must be >= 1, got {args.epochs}"),
            (args.batch >= 1, f"--batch: must be >= 1, got {args.batch}"),
            (0 < args.lr < 1, f"--lr: must lie in (0, 1), got {args.lr}"),
            (0 <= args.lam < float("inf"), f"--lam: must be a finite number >= 0, got {args.lam}"),
            (0 < args.alpha <= 1, f"--alpha: must lie in (0, 1], got {args.alpha}"),
            (0 <= args.dropout < 1, f"--dropout: must lie in [0, 1), got {args.dropout}"),
            (device_error is None, device_error),
        ],
        min_trajectories=3,
    )
    return study_config(Config, args, verifiers=verifiers), parser


def capture_models(source, device: str):
    """Live models for the features of captured roots (hidden states are not stored in captures):
    the models the capture was drawn from (``backends.capture.open_captured_pair``: opened as the
    capture opened them, refused where their fingerprints differ from the recorded ones), or None
    for another source.

    Raises:
        ValueError: ``capture: ...`` for a model that is not the captured one or cannot be opened.
    """
    from backends.capture import open_captured_pair

    if source.name != "capture":
        return None
    return open_captured_pair(source.stored, device, note=lambda line: print(f"{PROG}: {line}", file=sys.stderr))


def _main(argv) -> int:
    from simlab.selector.train import TrainConfig, split_by_trajectory

    config, parser = parse_args(sys.argv[1:] if argv is None else argv)
    config = with_hf_defaults(config, parser, {})  # the named pair's defaults (pair_study_defaults)
    grid = grid_of(config)
    source, settings, latency = grid_source(PROG, parser, config, study_honours={"capture": {"device"}})
    out = study_out(PROG, config, source.slug())
    config = replace(config, out=str(out))
    try:
        with slow_step(PROG, "loading the captured models for the features", config.quiet):
            models = capture_models(source, config.device)
        started = time.perf_counter()
        labels, records = label_all(
            source,
            settings,
            [*config.verifiers, "traversal"],
            grid,
            latency,
            seed=config.seed,
            jobs=config.jobs,
            quiet=config.quiet,
            features=True,
            feature_pair=models,
        )
        label_seconds = time.perf_counter() - started
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    if len({r["trajectory"] for r in records}) < 3:
        fail(
            PROG,
            f"--trajectories: the source has {len({r['trajectory'] for r in records})} trajectories; "
            "train, validation and test need >= 3 (captures: capture more prompts)",
        )
    roots, arrays = feature_arrays(records)
    roots = roots.with_columns(pl.Series("split", split_by_trajectory(roots["trajectory"].to_list(), config.seed)))
    split = roots["split"].to_numpy()
    checkpoints, histories, summary = {}, [], []
    for verifier in config.verifiers:
        values = value_matrices(labels, verifier, roots, grid.actions())
        train_config = TrainConfig(
            config.epochs,
            config.batch,
            config.lr,
            lam=config.lam,
            alpha=config.alpha,
            dropout=config.dropout,
            seed=config.seed,
            device=config.train_device,
        )
        t0 = time.perf_counter()
        try:
            model, history, base = fit_selector(roots, arrays, values, split, train_config, grid.actions(), config.loss_baseline)
        except ValueError as exc:
            fail(PROG, str(exc))
        checkpoints[verifier] = {
            **model.checkpoint(),
            "verifier": verifier,
            "actions": grid.actions(),
            "static": base,
            "static_baseline": config.loss_baseline,
            "train_config": asdict(train_config),
        }
        histories.append(pl.DataFrame(history).with_columns(pl.lit(verifier).alias("verifier")))
        best = min(history, key=lambda h: h["validation_loss"])
        summary.append(
            {
                "verifier": tree_verifiers.paper_name(verifier),
                "train roots": int((split == "train").sum()),
                "validation roots": int((split == "validation").sum()),
                "test roots": int((split == "test").sum()),
                "epochs": len(history),
                "best epoch": best["epoch"],
                "validation loss": best["validation_loss"],
                "seconds": time.perf_counter() - t0,
            }
        )
    history = pl.concat(histories)
    with OutputSet(out) as outputs:
        import torch

        outputs.stage("labels.parquet", parquet_writer(labels))
        outputs.stage("roots.parquet", parquet_writer(roots))
        outputs.stage("embeddings.npz", lambda tmp: np.savez(tmp, **arrays))
        outputs.stage("history.parquet", parquet_writer(history))
        outputs.stage("latency.json", lambda tmp: latency.save(tmp))
        run = {**asdict(config), "actions": grid.actions(), "label_seconds": label_seconds, "roots": roots.height}
        outputs.stage("run.json", lambda tmp: open(tmp, "w").write(json.dumps(run, indent=2)))
        for verifier, ckpt in checkpoints.items():

            def write(tmp, ckpt=ckpt):
                buffer = io.BytesIO()
                torch.save(ckpt, buffer)
                open(tmp, "wb").write(buffer.getvalue())

            outputs.stage(f"selector-{verifier}.pt", write)
        chart = training_chart(history)
        for fmt in ("html", "png"):
            outputs.stage(f"training.{fmt}", chart_writer(chart, fmt))
        outputs.publish()
    if not config.quiet:
        print(
            f"Labelled {roots.height} roots x {len(grid.actions())} actions x {len(config.verifiers) + 1} verifiers in "
            f"{label_seconds:.1f} s ({roots.height / label_seconds:.2f} roots/s); latency: {latency.source}"
        )
        print_table(
            pl.DataFrame(summary),
            f"Selector training (DDTE loss, baseline {config.loss_baseline}; weights of the best validation epoch kept)",
        )
        print(
            f"wrote {out}/selector-*.pt, labels.parquet, roots.parquet, embeddings.npz, history.parquet, training.html/.png; "
            f"evaluate with: python -m analyses.evaluate_selector --run {out}"
        )
    return 0


def training_chart(history: pl.DataFrame):
    import altair as alt

    long = history.unpivot(
        index=["epoch", "verifier"], on=["train_loss", "validation_loss"], variable_name="split", value_name="loss"
    )
    return (
        alt.Chart(long)
        .mark_line()
        .encode(x="epoch:Q", y=alt.Y("loss:Q", scale=alt.Scale(zero=False)), color="split:N", tooltip=["epoch", "loss"])
        .properties(width=320, height=200)
        .facet(column=alt.Column("verifier:N", title=None))
        .properties(title="Selector loss by epoch (DDTE loss)")
    )


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
