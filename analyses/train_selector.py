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
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from analyses._grid_study import GridStudyConfig, add_grid_study_flags, check_grid_study_flags, grid_source
from analyses._labels import feature_record, grid_of, label_all, label_root
from analyses._categories import with_category
from analyses._selector_data import STATIC_BASELINES, feature_arrays, fit_selector, value_matrices
from analyses._study import WROTE, Opened, Report, Study, chart_files, live_timing_reason, parse, run_study
from backends.cli import ToolParser, chart_writer, fail, name_list, slow_step
from analyses._flags import study_config
from simlab.checks import check_device
from simlab import tree_verifiers
from simlab import verifiers as node_verifiers

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


def flags(parser: ToolParser, d: Config) -> None:
    """The grid study's flags, ``--verifiers``, the training flags and ``--out``."""
    add_grid_study_flags(parser, d)
    ot_based = ", ".join(node_verifiers.ot_based())
    parser.add_argument("--verifiers", default=",".join(d.verifiers), help=f"OT-based verifiers, one selector each: {ot_based}")
    for flag, kind, text in (
        ("--epochs", int, None),
        ("--batch", int, None),
        ("--lr", float, None),
        ("--lam", float, "loss: weight of the tail penalty (lambda)"),
        ("--alpha", float, "loss: tail fraction of the batch (alpha)"),
        ("--dropout", float, None),
    ):
        parser.add_argument(flag, type=kind, default=getattr(d, flag[2:]), help=text)
    parser.add_argument(
        "--loss-baseline",
        choices=STATIC_BASELINES,
        default=d.loss_baseline,
        help="the static baseline of the loss: static_iid = DDTE's i.i.d. rollouts (L1 = 0); "
        "static_all_actions = the best of every delayed action (the lab's option)",
    )
    parser.add_argument("--train-device", default=d.train_device, help="torch device for training: cpu, cuda, auto")
    parser.add_argument("--out", default=None, help="output folder (default: out/train_selector/<source>)")


def _checked(check, *args) -> tuple[object, str | None]:
    """(``check(*args)``, None), or (None, the message of the ``ValueError`` it raised)."""
    try:
        return check(*args), None
    except ValueError as exc:
        return None, str(exc)


def config_of(args, parser: ToolParser) -> Config:
    """The typed config (``--verifiers`` as a tuple of OT-based names), or exit 2 with one line."""
    verifiers, verifiers_error = _checked(name_list, args.verifiers, "--verifiers", node_verifiers.ot_based())
    device_error = _checked(check_device, args.train_device, "--train-device")[1]
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
    return study_config(Config, args, verifiers=verifiers)


def parse_args(argv) -> tuple[Config, ToolParser]:
    """(config, parser) from the command line ``argv`` (with the named pair's defaults)."""
    return parse(STUDY, argv)


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


def open_source(config: Config, parser: ToolParser, say) -> Opened:
    """The grid study's source, settings and latency model (a capture's ``--device`` honoured: the
    features' live models run there)."""
    return Opened(*grid_source(PROG, parser, config, study_honours={"capture": {"device"}}))


def values(config: Config, opened: Opened, say) -> tuple[pl.DataFrame, list[dict], float]:
    """(labels of the verifiers and Traversal, feature records, labelling seconds) of every root in
    one process (``analyses._labels.label_all``; a capture's features from its live models)."""
    with slow_step(PROG, "loading the captured models for the features", config.quiet):
        models = capture_models(opened.source, config.device)
    started = time.perf_counter()
    labels, records = label_all(
        opened.source,
        opened.settings,
        [*config.verifiers, "traversal"],
        grid_of(config),
        opened.latency,
        seed=config.seed,
        jobs=config.jobs,
        quiet=config.quiet,
        features=True,
        feature_pair=models,
    )
    return labels, records, time.perf_counter() - started


def value_root(config: Config, opened: Opened, task) -> dict:
    """One root's label rows and feature record (seeded by (seed, setting index, trajectory, root)
    alone, as ``label_all`` labels it) and the seconds they took."""
    started = time.perf_counter()
    verifiers = [*config.verifiers, "traversal"]
    rows = label_root(task.root, verifiers, grid_of(config), opened.latency, seed=config.seed, key=task.setting_index)
    record = feature_record(task.root, task.setting, opened.latency)
    return {"rows": rows, "record": record, "seconds": time.perf_counter() - started}


def merge(config: Config, opened: Opened, payloads) -> tuple[pl.DataFrame, list[dict], float]:
    """``values``'s triple from every root's payload in task order (seconds: summed over roots)."""
    labels = with_category(pl.DataFrame([row for payload in payloads for row in payload["rows"]]))
    return labels, [p["record"] for p in payloads], float(sum(p["seconds"] for p in payloads))


def shardable(config: Config, opened: Opened, parser: ToolParser) -> str | None:
    """Why a sharded run would not match one process: a capture's features need its live models
    (loaded once, by one process), or live models timed on each rank's machine."""
    if config.capture:
        return "a capture's features come from its live models, which one process loads; run it unsharded"
    return live_timing_reason(config, parser)


def fit_all(config: Config, labels: pl.DataFrame, roots: pl.DataFrame, arrays, actions) -> tuple[dict, pl.DataFrame, list]:
    """One selector per verifier (``analyses._selector_data.fit_selector``): ({verifier: checkpoint},
    the history of every verifier, one summary row each); exit 2 with the trainer's line on failure."""
    from simlab.selector.train import TrainConfig

    split = roots["split"].to_numpy()
    checkpoints, histories, summary = {}, [], []
    for verifier in config.verifiers:
        values = value_matrices(labels, verifier, roots, actions)
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
            model, history, base = fit_selector(roots, arrays, values, split, train_config, actions, config.loss_baseline)
        except ValueError as exc:
            fail(PROG, str(exc))
        checkpoints[verifier] = {
            **model.checkpoint(),
            "verifier": verifier,
            "actions": actions,
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
    return checkpoints, pl.concat(histories), summary


def checkpoint_writer(checkpoint: dict):
    """A ``write(tmp_path)`` of ``checkpoint`` by ``torch.save``."""

    def write(tmp):
        import torch

        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        open(tmp, "wb").write(buffer.getvalue())

    return write


def run(config: Config, opened: Opened, labelled: tuple[pl.DataFrame, list[dict], float], say) -> Report:
    """Split the roots by trajectory, train one selector per verifier; the checkpoints, labels,
    roots, embeddings, history, chart, latency and ``run.json``, and the training table."""
    from simlab.selector.train import split_by_trajectory

    labels, records, label_seconds = labelled
    if len({r["trajectory"] for r in records}) < 3:
        fail(
            PROG,
            f"--trajectories: the source has {len({r['trajectory'] for r in records})} trajectories; "
            "train, validation and test need >= 3 (captures: capture more prompts)",
        )
    actions = grid_of(config).actions()
    roots, arrays = feature_arrays(records)
    roots = roots.with_columns(pl.Series("split", split_by_trajectory(roots["trajectory"].to_list(), config.seed)))
    checkpoints, history, summary = fit_all(config, labels, roots, arrays, actions)
    meta = {**asdict(config), "actions": actions, "label_seconds": label_seconds, "roots": roots.height}
    outputs = {
        "labels.parquet": labels,
        "roots.parquet": roots,
        "embeddings.npz": lambda tmp: np.savez(tmp, **arrays),
        "history.parquet": history,
        "latency.json": lambda tmp: opened.latency.save(tmp),
        "run.json": lambda tmp: open(tmp, "w").write(json.dumps(meta, indent=2)),
        **{f"selector-{verifier}.pt": checkpoint_writer(ckpt) for verifier, ckpt in checkpoints.items()},
        **chart_files("training", training_chart(history), chart_writer),
    }
    printed = (
        f"Labelled {roots.height} roots x {len(actions)} actions x {len(config.verifiers) + 1} verifiers in "
        f"{label_seconds:.1f} s ({roots.height / label_seconds:.2f} roots/s); latency: {opened.latency.source}",
        (
            pl.DataFrame(summary),
            f"Selector training (DDTE loss, baseline {config.loss_baseline}; weights of the best validation epoch kept)",
        ),
        WROTE,
        f"evaluate with: python -m analyses.evaluate_selector --run {opened.out}",
    )
    return Report(outputs, None, printed)


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


STUDY = Study(PROG, __doc__, Config, flags, config_of, open_source, value_root, merge, run, values, shardable=shardable)


def main(argv=None) -> int:
    return run_study(STUDY, argv)


if __name__ == "__main__":
    raise SystemExit(main())
