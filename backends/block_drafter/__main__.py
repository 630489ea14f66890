"""Train SpecBlock's block drafter for a reference pair: ``python -m backends.block_drafter``.

Reads the pair built by ``python -m backends.reference_pair`` (``--pair``, default the seed-0
pair in the cache), trains the drafter on the same training documents (``train``), measures its
held-out acceptance by slot, and saves it under ``--out`` (default ``<pair>/block_drafter/<variant>``):
``drafter.pt`` and ``manifest.json`` (spec, seed, torch version, threads, device, CPU, seconds,
acceptance by slot).  ``--variant`` picks the drafter, one of the paper's training-time
ablations (``no_shift``, ``no_valid_prefix``) or the lab's earlier attention-free drafter
(``attention_free``); ``all``: the four in turn, each its own folder.  Deterministic under ``--seed`` and ``--threads`` (default 1).
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

PROG = "python -m backends.block_drafter"


def train_variant(pair_dir: Path, variant: str, spec, seed: int, log) -> tuple:
    """(model, manifest) of one trained variant (torch threads as the caller set them)."""
    import torch

    from backends.block_drafter.drafter import VARIANTS
    from backends.block_drafter.train import Trainer, slot_acceptance
    from backends.hf import feature_layers, load_model
    from backends.reference_pair import PairSpec, encode_documents, machine, split_corpus

    manifest = json.loads((pair_dir / "manifest.json").read_text())
    target, tokenizer = load_model(str(pair_dir / "target"), "cpu", "float32", "pair")
    for p in target.parameters():
        p.requires_grad_(False)
    layers = feature_layers(target.config)
    train_docs, test_docs = split_corpus(PairSpec(**manifest["spec"]), manifest["seed"])
    train_ids, test_ids = encode_documents(tokenizer, train_docs), encode_documents(tokenizer, test_docs)
    spec = replace(spec, **VARIANTS[variant])
    trainer = Trainer(spec, target, layers, train_ids, seed)
    log(
        f"block drafter ({variant}): {sum(p.numel() for p in trainer.model.parameters()) / 1e6:.2f}M parameters, "
        f"{spec.steps} steps on {len(train_ids)} training tokens"
    )
    seconds = trainer.train(log)
    acceptance = slot_acceptance(trainer.model, target, layers, test_ids)
    log(f"block drafter ({variant}): held-out acceptance by slot {acceptance['acceptance_by_slot']}")
    info = {
        "variant": variant,
        "seed": seed,
        "pair": str(pair_dir),
        "feature_layers": list(layers),
        **machine(),
        "seconds": round(seconds, 1),
        "held_out": acceptance,
        "torch_threads": torch.get_num_threads(),
    }
    return trainer.model, info


def main(argv=None) -> int:
    from backends.cli import ToolParser, check_flags, fail_from, prepare_out, run_tool
    from backends.reference_pair import DEFAULT_CACHE

    def body() -> int:
        import torch

        from backends.block_drafter.drafter import VARIANTS, save
        from backends.block_drafter.model import DrafterSpec

        d = DrafterSpec()
        parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
        parser.add_argument("--pair", default=str(DEFAULT_CACHE / "seed0"), help="the reference pair's folder")
        parser.add_argument("--variant", choices=[*VARIANTS, "all"], default="full", help="the drafter or an ablation")
        parser.add_argument("--out", default=None, help="output folder (default <pair>/block_drafter/<variant>)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the batches")
        parser.add_argument(
            "--steps", type=int, default=None, help=f"training steps (default {d.steps}; micro {DrafterSpec.micro().steps})"
        )
        parser.add_argument("--threads", type=int, default=1, help="torch threads (the weights depend on it)")
        parser.add_argument("--micro", action="store_true", help="the tiny drafter of the tests (for the micro pair)")
        parser.add_argument("--quiet", action="store_true", help="no progress lines")
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        pair = Path(args.pair).expanduser()
        check_flags(
            PROG,
            [
                (
                    (pair / "manifest.json").is_file() and (pair / "target").is_dir(),
                    f"--pair: {str(pair)!r} is not a reference pair (build one with python -m backends.reference_pair)",
                ),
                (args.threads >= 1, f"--threads: must be >= 1, got {args.threads}"),
                (args.steps is None or args.steps >= 1, f"--steps: must be >= 1, got {args.steps}"),
                (args.seed >= 0, f"--seed: must be >= 0, got {args.seed}"),
                (
                    args.out is None or args.variant != "all",
                    "--out: with --variant all each variant goes to <pair>/block_drafter/<variant>",
                ),
            ],
        )
        spec = DrafterSpec.micro() if args.micro else d
        if args.steps is not None:
            spec = replace(spec, steps=args.steps, rank_freeze=min(spec.rank_freeze, args.steps // 4))
        log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        variants = list(VARIANTS) if args.variant == "all" else [args.variant]
        outs = [prepare_out(PROG, args.out if args.out is not None else str(pair / "block_drafter" / v)) for v in variants]
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            for variant, out in zip(variants, outs):
                try:
                    model, info = train_variant(pair, variant, spec, args.seed, log)
                except ValueError as exc:
                    fail_from(PROG, exc, parser)
                save(model, out, info)
                print(
                    f"{variant}: acceptance by slot {info['held_out']['acceptance_by_slot']} (held-out roots, T = 0 chain), "
                    f"expected chain length {info['held_out']['expected_chain_length']}, rank-head accuracy (slot 0) "
                    f"{info['held_out']['rank_head_accuracy_slot0']}; {info['seconds']} s on {args.threads} thread(s); saved to {out}"
                )
        finally:
            torch.set_num_threads(previous)
        return 0

    return run_tool(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
