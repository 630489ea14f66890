"""A named pair's draft measured by depth: python -m backends.draft_acceptance.

For any draft of the pretrained pair (``--draft``: ``quant:B:G``, ``adapter:L``, ``early-exit:L``;
``backends.pretrained.parse_draft``), the mean one-draft acceptance 1 - TV(p, q) at T = 1 at depths
0..depth-1 along ``--paths`` paths per prompt sampled by the target and by the draft
(``backends.train_draft.acceptance_by_depth``, the measure the adapter drafts' manifests record),
on a named prompt set (``backends.prompt_sets``).  Prints one table; ``--out FILE.json`` also
writes the numbers with the machine record (torch version, threads, device), atomically.
Seeded (``--seed``: an integer in [0, 2**63 - 1], checked before any model loads): same seed and
thread count, the same numbers.  On stderr (none with ``--quiet``): a line while the models load
and, per sampler, a progress bar over the prompts (each prompt's paths sampled, then scored).
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


def main(argv=None) -> int:
    from backends.cli import ToolParser, fail, fail_from, progress, run_tool, slow_step

    def body() -> int:
        import torch

        from backends import pretrained
        from backends.prompt_sets import PROMPT_SETS, prompt_set
        from backends.reference_pair import machine
        from backends.train_draft import TARGET_NAME
        from simlab.checks import check_seed
        from simlab.files import atomic_write

        parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
        parser.add_argument("--draft", default=None, help=f"the pair's draft (default {pretrained.DEFAULT_DRAFT})")
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
            spec = pretrained.parse_draft(args.draft)
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
                folder = pretrained.target_folder(log=log)
                with slow_step(PROG, f"loading the target and the draft {spec}", args.quiet):
                    target, tokenizer = pretrained.load_target(folder)
                    draft = pretrained.draft_model(target, spec)
            except ValueError as exc:
                fail_from(PROG, exc, parser)
            log(f"{spec}: {len(prompts)} prompts x {args.paths} paths, depths 0..{args.depth - 1}, target- then draft-sampled")
            result = measure(target, draft, tokenizer, prompts, args.paths, args.depth, args.seed, args.quiet)
            ratio = pretrained.weight_ratio(spec, target.config.to_dict())
            recorded = machine()
        finally:
            torch.set_num_threads(previous)
        record = {
            "draft": spec,
            "target": TARGET_NAME,
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
        print(f"{spec} (weight bytes per token {ratio:.3f} of the target's), acceptance 1 - TV at T = 1 by depth:")
        print("paths   " + " ".join(f"{d:>6d}" for d in range(args.depth)))
        for sampler in ("target", "draft"):
            print(f"{sampler:<8}" + " ".join(f"{a:6.3f}" for a in result[sampler]))
        return 0

    return run_tool(PROG, body)


if __name__ == "__main__":
    raise SystemExit(main())
