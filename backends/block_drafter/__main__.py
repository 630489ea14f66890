"""Train SpecBlock's block drafter for a pair: ``python -m backends.block_drafter``.

Reads the pair built by ``python -m backends.reference_pair`` (``--pair``, default the seed-0
pair in the cache), trains the drafter on the same training documents (``train``), measures its
held-out acceptance by slot, and saves it under ``--out`` (default ``<pair>/block_drafter/<variant>``).
``--pair smollm2`` (a named pretrained pair, ``backends.pretrained``) trains the drafter of that
target on its own replies and plain text instead (``backends.block_drafter.pretrained``:
``--prompts``, ``--text-tokens`` and the other flags of its group; default ``--out``: the pair's cache, where the studies look).  Each writes
``drafter.pt`` and ``manifest.json`` (spec, seed, data, torch version, threads, device, CPU, seconds,
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
    """(model, manifest) of one trained variant for a reference pair (torch threads as the caller set them)."""
    from backends.block_drafter.train import fit
    from backends.hf import load_model
    from backends.reference_pair import PairSpec, encode_documents, split_corpus

    manifest = json.loads((pair_dir / "manifest.json").read_text())
    target, tokenizer = load_model(str(pair_dir / "target"), "cpu", "float32", "pair")
    for p in target.parameters():
        p.requires_grad_(False)
    train_docs, test_docs = split_corpus(PairSpec(**manifest["spec"]), manifest["seed"])
    train_ids, test_ids = encode_documents(tokenizer, train_docs), encode_documents(tokenizer, test_docs)
    return fit(spec, variant, target, train_ids, test_ids, seed, log, str(pair_dir))


NAMED_FLAGS = ("prompts", "reply_tokens", "text_tokens", "held_out_tokens", "row_length", "held_out_roots", "target_layers")
"""Flags only a named pretrained pair honours (the reference pair's data is its own split)."""


def main(argv=None) -> int:
    from backends.cli import ToolParser, check_flags, fail_from, prepare_out, run_tool
    from backends.reference_pair import DEFAULT_CACHE

    def body() -> int:
        import torch

        from backends.block_drafter.drafter import VARIANTS, save
        from backends.block_drafter.model import DrafterSpec
        from backends.block_drafter.pretrained import Corpus, drafter_dir, train_named
        from backends.pretrained import PAIRS

        d, c = DrafterSpec(), Corpus()
        parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
        parser.add_argument(
            "--pair",
            default=str(DEFAULT_CACHE / "seed0"),
            help=f"a reference pair's folder, or a named pretrained pair ({', '.join(PAIRS)})",
        )
        parser.add_argument("--variant", choices=[*VARIANTS, "all"], default="full", help="the drafter or an ablation")
        parser.add_argument(
            "--out", default=None, help="output folder (default <pair>/block_drafter/<variant>; named pair: its cache)"
        )
        parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the batches (and a named pair's text)")
        parser.add_argument(
            "--steps",
            type=int,
            default=None,
            help=f"training steps (default {d.steps}; named pair {DrafterSpec.pretrained().steps}; micro {DrafterSpec.micro().steps})",
        )
        parser.add_argument("--threads", type=int, default=1, help="torch threads (the weights depend on it)")
        parser.add_argument("--micro", action="store_true", help="the tiny drafter of the tests")
        g = parser.add_argument_group("named pretrained pair (backends.block_drafter.pretrained)")
        g.add_argument("--prompts", type=int, default=None, help=f"chat prompts the target answers (default {c.prompts})")
        g.add_argument("--reply-tokens", type=int, default=None, help=f"tokens per reply at most (default {c.reply_tokens})")
        g.add_argument("--text-tokens", type=int, default=None, help=f"training tokens of plain text (default {c.text_tokens})")
        g.add_argument("--held-out-tokens", type=int, default=None, help=f"held-out tokens (default {c.held_out_tokens})")
        g.add_argument("--row-length", type=int, default=None, help=f"tokens per training row (default {c.row_length})")
        g.add_argument(
            "--held-out-roots", type=int, default=None, help=f"roots of the acceptance by slot (default {c.held_out_roots})"
        )
        g.add_argument(
            "--target-layers", type=int, default=None, help="the target's first N layers only (a truncated copy, tests)"
        )
        parser.add_argument("--quiet", action="store_true", help="no progress lines")
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        named = args.pair in PAIRS
        pair = Path(args.pair).expanduser()
        given = [f for f in NAMED_FLAGS if getattr(args, f) is not None]
        check_flags(
            PROG,
            [
                (
                    named or ((pair / "manifest.json").is_file() and (pair / "target").is_dir()),
                    f"--pair: {str(pair)!r} is not a reference pair (build one with python -m backends.reference_pair) "
                    f"nor a named pair ({', '.join(PAIRS)})",
                ),
                (named or not given, f"--{given[0].replace('_', '-')}: only a named pretrained pair takes it" if given else ""),
                (args.threads >= 1, f"--threads: must be >= 1, got {args.threads}"),
                (args.steps is None or args.steps >= 1, f"--steps: must be >= 1, got {args.steps}"),
                (args.seed >= 0, f"--seed: must be >= 0, got {args.seed}"),
                (
                    args.out is None or args.variant != "all",
                    "--out: with --variant all each variant goes to <pair>/block_drafter/<variant>",
                ),
            ],
        )
        try:
            corpus = Corpus(**{f: getattr(args, f) for f in NAMED_FLAGS[:-1] if getattr(args, f) is not None})
            if args.target_layers is not None and args.target_layers < 1:
                raise ValueError(f"target_layers: must be >= 1, got {args.target_layers}")
        except ValueError as exc:
            fail_from(PROG, exc, parser)
        spec = DrafterSpec.micro() if args.micro else DrafterSpec.pretrained() if named else d
        if args.steps is not None:
            spec = replace(spec, steps=args.steps, rank_freeze=min(spec.rank_freeze, args.steps // 4))
        log = (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
        variants = list(VARIANTS) if args.variant == "all" else [args.variant]
        root = drafter_dir() if named else pair / "block_drafter"
        outs = [prepare_out(PROG, args.out if args.out is not None else str(root / v)) for v in variants]
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            for variant, out in zip(variants, outs):
                try:
                    if named:
                        model, info = train_named(args.pair, variant, spec, args.seed, corpus, log, args.target_layers)
                    else:
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
