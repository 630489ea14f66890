"""Train the neural delayed-expansion selector (NDE): ``python -m analyses.train_selector``.

Labels every root of the source with E[tau + 1] and T-hat for every action of the grid
{1..K} x {0..L}^2 (``analyses.labels``; DDTE's estimator with ``--samples`` trees, s = 4, or
``--method exact`` enumeration where a tiny synthetic world allows it),
for each OT-based verifier and for Traversal (the baseline of ``evaluate_selector``), computes
the selector's features at each root (``simlab.selector.features``), splits the roots by
trajectory into train / validation / test (60 / 20 / 20), and trains one selector per OT-based
verifier on DDTE's loss (``simlab.selector``), deterministically from ``--seed``.

Output under ``--out`` (read by ``python -m analyses.evaluate_selector --run DIR``):
``labels.parquet``, ``roots.parquet`` (keys, split, scalar features), ``embeddings.npz``,
``selector-<verifier>.pt``, ``history.parquet``, ``training.{html,png}``, ``latency.json``,
``run.json``.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

from analyses._tool import OutputSet, ToolParser, chart_writer, check_flags, fail, parquet_writer, prepare_out, print_table, run_tool
from analyses.labels import PAPER_NAMES, grid_of, label_all
from analyses.selector_data import feature_arrays, static_choice, tensors, value_matrices
from analyses.sources import make_latency, make_source, parse_settings
from backends.synthetic import WORLDS

PROG = "python -m analyses.train_selector"
OT_VERIFIERS = ("nss", "naive", "spectr", "specinfer", "khisti")


@dataclass(frozen=True)
class Config:
    backend: str = "synthetic"
    target: str | None = None
    draft: str | None = None
    prompts: str | None = None
    capture: tuple[str, ...] = ()
    world: str = "distilled"  # contexts differ in how well the draft knows them (depth_profile's barely do)
    vocab: int = 32
    trajectories: int = 24
    roots_per_trajectory: int = 4
    spacing: int = 8
    settings: str = "0.6,1"
    verifiers: tuple[str, ...] = ("specinfer", "spectr")
    K_max: int = 4
    L_max: int = 8
    samples: int = 4
    method: str = "mc"
    cost_ratio: float = 0.1
    per_token: float = 0.01
    latency: str | None = None
    epochs: int = 200
    batch: int = 64
    lr: float = 1e-3
    lam: float = 1.0
    alpha: float = 0.1
    dropout: float = 0.1
    train_device: str = "cpu"
    device: str = "auto"
    jobs: int = 2
    seed: int = 0
    out: str = "out/train_selector"
    quiet: bool = False


def parse_args(argv) -> Config:
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    d = Config()
    parser.add_argument("--backend", choices=["synthetic", "hf"], default=d.backend, help="synthetic world, or two live models")
    parser.add_argument("--target", default=None, help="hf: target model folder")
    parser.add_argument("--draft", default=None, help="hf: draft model folder")
    parser.add_argument("--prompts", default=None, help="hf: prompt file (default: the shipped reference prompts)")
    parser.add_argument("--capture", nargs="+", default=(), help="grid captures (one per setting); features need their models")
    parser.add_argument("--world", default=d.world, help=f"synthetic world: {', '.join(WORLDS)}")
    parser.add_argument("--vocab", type=int, default=d.vocab, help="synthetic: vocabulary size")
    parser.add_argument("--trajectories", type=int, default=d.trajectories, help="trajectories (hf: prompts used); split unit")
    parser.add_argument("--roots-per-trajectory", type=int, default=d.roots_per_trajectory, help="roots along each trajectory")
    parser.add_argument("--spacing", type=int, default=d.spacing, help="tokens between roots")
    parser.add_argument("--settings", default=d.settings, help="'ddte' or a comma list of T or T:top_p")
    parser.add_argument("--verifiers", default=",".join(d.verifiers), help=f"OT-based verifiers, one selector each: {', '.join(OT_VERIFIERS)}")
    parser.add_argument("--K-max", type=int, default=d.K_max, help="largest K (1..8)")
    parser.add_argument("--L-max", type=int, default=d.L_max, help="largest L1 and L2 (0..16)")
    parser.add_argument("--samples", type=int, default=d.samples, help="trees per L1 and root (DDTE: s = 4; >= 2)")
    parser.add_argument("--method", choices=["mc", "exact"], default=d.method,
                        help="labels: DDTE's estimator (mc) or exact enumeration of every tree (tiny synthetic worlds only)")
    parser.add_argument("--cost-ratio", type=float, default=d.cost_ratio, help="synthetic latency: c = t_q / t_p")
    parser.add_argument("--per-token", type=float, default=d.per_token, help="synthetic latency: extra time per extra token, as a fraction")
    parser.add_argument("--latency", default=None, help="latency profile file (.json or .toml)")
    parser.add_argument("--epochs", type=int, default=d.epochs)
    parser.add_argument("--batch", type=int, default=d.batch)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--lam", type=float, default=d.lam, help="loss: weight of the tail penalty (lambda)")
    parser.add_argument("--alpha", type=float, default=d.alpha, help="loss: tail fraction of the batch (alpha)")
    parser.add_argument("--dropout", type=float, default=d.dropout)
    parser.add_argument("--train-device", default=d.train_device, help="torch device for training: cpu, cuda, auto")
    parser.add_argument("--device", default=d.device, help="hf: device of the models")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes over settings")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--out", default=d.out, help="output folder")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    verifiers = tuple(v.strip() for v in args.verifiers.split(",") if v.strip())
    bad = [v for v in verifiers if v not in OT_VERIFIERS]
    checks = [
        (bool(verifiers) and not bad, f"--verifiers: must be OT-based verifiers ({', '.join(OT_VERIFIERS)}), got {args.verifiers!r}"),
        (args.world in WORLDS, f"--world: unknown world {args.world!r}"),
        (args.backend != "hf" or args.capture or (args.target and args.draft), "--backend hf: needs --target and --draft"),
        (2 <= args.vocab <= 50_000, f"--vocab: must lie in [2, 50000], got {args.vocab}"),
        (3 <= args.trajectories <= 10_000, f"--trajectories: must lie in [3, 10000] (train, validation, test), got {args.trajectories}"),
        (args.roots_per_trajectory >= 1, f"--roots-per-trajectory: must be >= 1, got {args.roots_per_trajectory}"),
        (args.spacing >= 1, f"--spacing: must be >= 1, got {args.spacing}"),
        (1 <= args.K_max <= 8, f"--K-max: must lie in [1, 8], got {args.K_max}"),
        (0 <= args.L_max <= 16, f"--L-max: must lie in [0, 16], got {args.L_max}"),
        (args.samples >= 2, f"--samples: must be >= 2, got {args.samples}"),
        (args.method == "mc" or (args.backend == "synthetic" and not args.capture), "--method exact: only for synthetic worlds"),
        (0 < args.cost_ratio < float("inf"), f"--cost-ratio: must be a finite number > 0, got {args.cost_ratio}"),
        (0 <= args.per_token < float("inf"), f"--per-token: must be a finite number >= 0, got {args.per_token}"),
        (args.epochs >= 1, f"--epochs: must be >= 1, got {args.epochs}"),
        (args.batch >= 1, f"--batch: must be >= 1, got {args.batch}"),
        (0 < args.lr < 1, f"--lr: must lie in (0, 1), got {args.lr}"),
        (0 <= args.lam < float("inf"), f"--lam: must be a finite number >= 0, got {args.lam}"),
        (0 < args.alpha <= 1, f"--alpha: must lie in (0, 1], got {args.alpha}"),
        (0 <= args.dropout < 1, f"--dropout: must lie in [0, 1), got {args.dropout}"),
        (train_device_ok(args.train_device), f"--train-device: cpu, auto, or an available cuda device, got {args.train_device!r}"),
        (args.jobs >= 1, f"--jobs: must be >= 1, got {args.jobs}"),
        (args.seed >= 0, f"--seed: must be >= 0, got {args.seed}"),
    ]
    check_flags(PROG, checks)
    try:
        parse_settings(args.settings)
    except ValueError as exc:
        fail(PROG, str(exc))
    return Config(**{**vars(args), "verifiers": verifiers, "capture": tuple(args.capture)})


def train_device_ok(name: str) -> bool:
    """cpu and auto always; cuda[:N] only when this torch build has that device."""
    if name in ("cpu", "auto"):
        return True
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        return False
    return device.type == "cuda" and torch.cuda.is_available() and (device.index or 0) < torch.cuda.device_count()


def capture_models(config: Config):
    """Live models for the features of captured roots (hidden states are not stored in captures)."""
    if not config.capture:
        return None
    from backends.capture import load_settings
    from backends.hf import HFPair

    stored = load_settings(config.capture[0])
    return HFPair(stored.target, stored.draft, device=config.device, dtype=stored.dtype)


def _main(argv) -> int:
    from simlab.selector.train import TrainConfig, split_by_trajectory, train

    config = parse_args(sys.argv[1:] if argv is None else argv)
    out = prepare_out(PROG, config.out)
    grid = grid_of(config)
    try:
        source = make_source(config)
        if config.capture:
            models = capture_models(config)
            source.feature_pair = models
        settings = source.settings() if config.capture else parse_settings(config.settings)
        latency = make_latency(config, source)
        started = time.perf_counter()
        labels, records = label_all(source, settings, [*config.verifiers, "traversal"], grid, latency, seed=config.seed,
                                    jobs=config.jobs, quiet=config.quiet, features=True)
        label_seconds = time.perf_counter() - started
    except ValueError as exc:
        fail(PROG, str(exc).splitlines()[0])
    if len({r["trajectory"] for r in records}) < 3:
        fail(PROG, f"--trajectories: the source has {len({r['trajectory'] for r in records})} trajectories; "
                   "train, validation and test need >= 3 (captures: capture more prompts)")
    roots, arrays = feature_arrays(records)
    roots = roots.with_columns(pl.Series("split", split_by_trajectory(roots["trajectory"].to_list(), config.seed)))
    split = roots["split"].to_numpy()
    checkpoints, histories, summary = {}, [], []
    for verifier in config.verifiers:
        values = value_matrices(labels, verifier, roots, grid.actions())
        base = static_choice(values, roots["setting"].to_numpy(), split == "train")
        data = tensors(roots, arrays, values, base)
        train_config = TrainConfig(config.epochs, config.batch, config.lr, lam=config.lam, alpha=config.alpha,
                                   dropout=config.dropout, seed=config.seed, device=config.train_device)
        t0 = time.perf_counter()
        try:
            model, history = train(data.subset(np.flatnonzero(split == "train")), data.subset(np.flatnonzero(split == "validation")), train_config)
        except ValueError as exc:
            fail(PROG, str(exc))
        checkpoints[verifier] = {**model.checkpoint(), "verifier": verifier, "actions": grid.actions(), "static": base,
                                 "train_config": asdict(train_config)}
        histories.append(pl.DataFrame(history).with_columns(pl.lit(verifier).alias("verifier")))
        best = min(history, key=lambda h: h["validation_loss"])
        summary.append({"verifier": PAPER_NAMES[verifier], "train roots": int((split == "train").sum()),
                        "validation roots": int((split == "validation").sum()), "test roots": int((split == "test").sum()),
                        "epochs": len(history), "best epoch": best["epoch"], "validation loss": best["validation_loss"],
                        "seconds": time.perf_counter() - t0})
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
        print(f"Labelled {roots.height} roots x {len(grid.actions())} actions x {len(config.verifiers) + 1} verifiers in "
              f"{label_seconds:.1f} s ({roots.height / label_seconds:.2f} roots/s); latency: {latency.source}")
        print_table(pl.DataFrame(summary), "Selector training (DDTE loss; weights of the best validation epoch kept)")
        print(f"wrote {out}/selector-*.pt, labels.parquet, roots.parquet, embeddings.npz, history.parquet, training.html/.png; "
              f"evaluate with: python -m analyses.evaluate_selector --run {out}")
    return 0


def training_chart(history: pl.DataFrame):
    import altair as alt

    long = history.unpivot(index=["epoch", "verifier"], on=["train_loss", "validation_loss"], variable_name="split", value_name="loss")
    return alt.Chart(long).mark_line().encode(x="epoch:Q", y=alt.Y("loss:Q", scale=alt.Scale(zero=False)), color="split:N",
                                              tooltip=["epoch", "loss"]).properties(width=320, height=200).facet(
        column=alt.Column("verifier:N", title=None)).properties(title="Selector loss by epoch (DDTE loss)")


def main(argv=None) -> int:
    return run_tool(PROG, lambda: _main(argv))


if __name__ == "__main__":
    raise SystemExit(main())
