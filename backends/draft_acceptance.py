"""A named pair's draft measured by depth: python -m backends.draft_acceptance.

For a named pair (``--pair``: ``smollm2``, the default, or ``qwen2.5-coder``; ``backends.pretrained.PAIRS``)
and any of its drafts (``--draft``, default the pair's own, ``backends.pretrained.default_draft``:
``quant:4:64`` for ``smollm2``, which also takes ``adapter:L`` and ``early-exit:L``; the independent
``qwen2.5-coder-0.5b`` for ``qwen2.5-coder``, which also takes ``quant:B:G`` and ``early-exit:L``;
``backends.pretrained.parse_draft``), the mean one-draft acceptance 1 - TV(p, q) at T = 1 at depths
0..depth-1 along ``--paths`` paths per prompt sampled by the target and by the draft
(``backends.train_draft.acceptance_by_depth``, the measure the adapter drafts' manifests record),
on a named prompt set (``backends.prompt_sets``).  Prints one table headed by the pair, the draft
and the weight bytes it reads per token over the target's (``backends.pretrained.weight_ratio``;
``backends.qwen_pair.weight_ratio`` for the independent draft); ``--out FILE.json`` also writes the
numbers with the pair, the target's pinned file and the machine record (torch version, threads,
device), atomically.  Both models run on the CPU in float32 (``qwen2.5-coder``: about 10 GiB,
stated and checked before loading by ``backends.qwen_pair.open_pair``).
Seeded (``--seed``: an integer in [0, 2**63 - 1], checked before any model loads): same seed and
thread count, the same numbers.  A draft the pair does not take, a bad flag or a pair that cannot
be fetched, converted or loaded: one line on stderr, exit 2.  On stderr (none with ``--quiet``): a
line while the models load and, per sampler, a progress bar over the prompts (each prompt's paths
sampled, then scored).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PROG = "python -m backends.draft_acceptance"


def measure(target, draft, tokenizer, prompts: list[str], paths: int, depth: int, seed: int, quiet: bool = True) -> dict:
    """{"target": [...], "draft": [...]}: acceptance by depth (floats, rounded to 5 places) along
    target- and draft-sampled paths, one ``torch.Generator`` seeded ``seed`` drawing both in turn;
    unless ``quiet``, one progress bar per sampler on stderr (each prompt's paths sampled, then scored).

    Raises:
        ValueError: ``seed: ...`` (``simlab.checks.check_seed``), or what ``acceptance_by_depth``
            raises (``paths``, ``depth``).
    """
    import torch

    from backends.cli import progress_bar
    from backends.train_draft import acceptance_by_depth
    from simlab.checks import check_seed

    generator = torch.Generator().manual_seed(check_seed(seed))
    result = {}
    for sampler in ("target", "draft"):
        desc = f"{sampler}-sampled paths: prompts sampled, then scored"
        with progress_bar(total=2 * len(prompts), desc=desc, unit="step", quiet=quiet) as bar:
            by_depth = acceptance_by_depth(target, draft, tokenizer, prompts, paths, depth, sampler, generator, bar)
        result[sampler] = [round(float(a), 5) for a in by_depth]
    return result


def load_pair(pair: str, spec: str, log=None) -> tuple:
    """(target, draft, tokenizer) of the named ``pair`` with the normalised draft ``spec``, on the CPU
    in float32: ``smollm2`` from its converted folder (``backends.pretrained.target_folder``,
    ``load_target``, ``draft_model``), ``qwen2.5-coder`` through ``backends.pretrained.named_pair``
    (the target's tokenizer and chat template; memory stated and checked first).

    Raises:
        ValueError: ``pair: ...`` (a fetch, conversion or load failure, too little memory), ``draft: ...``.
    """
    from backends import pretrained, qwen_pair

    if pair == qwen_pair.NAME:
        opened = pretrained.named_pair(pair, spec, device="cpu", log=log)
        return opened.target, opened.draft, opened.target_tokenizer
    target, tokenizer = pretrained.load_target(pretrained.target_folder(log=log))
    return target, pretrained.draft_model(target, spec), tokenizer


def draft_weight_ratio(pair: str, spec: str, target, draft) -> float:
    """Weight bytes ``draft`` (spec ``spec``) reads per token over the 16-bit ``target``'s, from the
    loaded models' configs: ``backends.qwen_pair.weight_ratio`` on ``qwen2.5-coder`` (the independent
    draft's own config), else ``backends.pretrained.weight_ratio``."""
    from backends import pretrained, qwen_pair

    if pair == qwen_pair.NAME:
        return qwen_pair.weight_ratio(spec, target.config.to_dict(), draft.config.to_dict())
    return pretrained.weight_ratio(spec, target.config.to_dict())


def target_name(pair: str) -> str:
    """What the record names as the target: the pair's pinned file (``backends.train_draft.TARGET_NAME``
    for ``smollm2``; ``backends.qwen_pair.TARGET``'s title, wheels and sha256 for ``qwen2.5-coder``)."""
    from backends import qwen_pair
    from backends.train_draft import TARGET_NAME

    if pair != qwen_pair.NAME:
        return TARGET_NAME
    model = qwen_pair.TARGET
    return f"{model.title}, {model.requirement(1)} .. {model.requirement(len(model.parts))} GGUF sha256 {model.sha256}, float32"


def main(argv=None) -> int:
    from backends.cli import ToolParser, fail, fail_from, progress, run_tool, slow_step

    def body() -> int:
        import torch

        from backends import pretrained, qwen_pair
        from backends.prompt_sets import PROMPT_SETS, prompt_set
        from backends.reference_pair import machine
        from simlab.checks import check_seed
        from simlab.files import atomic_write

        parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
        parser.add_argument("--pair", choices=list(pretrained.PAIRS), default="smollm2", help="the named pair (default smollm2)")
        parser.add_argument(
            "--draft",
            default=None,
            help=f"the pair's draft (default: {pretrained.default_draft('smollm2')} for smollm2, "
            f"{pretrained.default_draft(qwen_pair.NAME)} for {qwen_pair.NAME})",
        )
        parser.add_argument("--prompts", default="workloads", help=f"a named prompt set: {', '.join(PROMPT_SETS)}")
        parser.add_argument("--paths", type=int, default=4, help="paths per prompt")
        parser.add_argument("--depth", type=int, default=9, help="depths measured (0..depth-1)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the paths")
        parser.add_argument("--threads", type=int, default=1, help="torch threads")
        parser.add_argument("--out", default=None, help="also write the numbers here (.json)")
        parser.add_argument("--quiet", action="store_true", help="no progress lines")
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        log = lambda message: progress(PROG, message, args.quiet)
        for name in ("paths", "depth", "threads"):
            if getattr(args, name) < 1:
                fail(PROG, f"--{name}: must be >= 1, got {getattr(args, name)}")
        try:
            check_seed(args.seed)  # as backends.train_draft: before any model loads
            spec = pretrained.parse_draft(args.draft, args.pair)
            prompts = [p.text for p in prompt_set(args.prompts)]
        except ValueError as exc:
            fail_from(PROG, exc, parser)
        out = Path(args.out) if args.out else None
        if out is not None and (out.suffix != ".json" or not out.parent.is_dir()):
            fail(PROG, f"--out: a .json file in an existing folder, got {args.out!r}")
        previous = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            started = time.time()
            try:
                with slow_step(PROG, f"loading the target and the draft {spec}", args.quiet):
                    target, draft, tokenizer = load_pair(args.pair, spec, log)
            except ValueError as exc:
                fail_from(PROG, exc, parser)
            log(f"{spec}: {len(prompts)} prompts x {args.paths} paths, depths 0..{args.depth - 1}, target- then draft-sampled")
            result = measure(target, draft, tokenizer, prompts, args.paths, args.depth, args.seed, args.quiet)
            ratio = draft_weight_ratio(args.pair, spec, target, draft)
            recorded = machine()
        finally:
            torch.set_num_threads(previous)
        record = {
            "pair": args.pair,
            "draft": spec,
            "target": target_name(args.pair),
            "prompts": args.prompts,
            "paths_per_prompt": args.paths,
            "seed": args.seed,
            "temperature": 1.0,
            "measure": "1 - TV(p, q) at depth d along paths sampled by the target or by the draft",
            "weight_ratio": round(ratio, 5),
            "acceptance_by_depth": result,
            **recorded,
            "seconds": round(time.time() - started, 1),
        }
        if out is not None:
            atomic_write(out, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1) + "\n"))
        print(
            f"{args.pair}, draft {spec} (weight bytes per token {ratio:.3f} of the target's), acceptance 1 - TV at T = 1 by depth:"
        )
        print("paths   " + " ".join(f"{d:>6d}" for d in range(args.depth)))
        for sampler in ("target", "draft"):
            print(f"{sampler:<8}" + " ".join(f"{a:6.3f}" for a in result[sampler]))
        return 0

    return run_tool(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
