"""Peak memory and time of one labelled grid-capture root (issue 16's memory target): ``python scripts/capture_memory.py``.

    OMP_NUM_THREADS=1 python scripts/capture_memory.py --vocab 128000    # the issue's V; about a minute on this CPU
    OMP_NUM_THREADS=1 python scripts/capture_memory.py --pair smollm2 --samples 2 \
        --labels specinfer,spectr,traversal,ot_exact,naive,bv             # the pretrained pair (issue 23)
    OMP_NUM_THREADS=1 python scripts/capture_memory.py --pair qwen2.5-coder --samples 2 \
        --labels specinfer                                                # Qwen2.5-Coder-1.5B, its 0.5B draft

Builds two randomly initialised GPT-2 models at ``--vocab`` (``backends.reference_pair.random_pair``,
into ``--models``, reused when present), or loads the named pretrained pair ``--pair`` with its
default draft (``backends.pretrained.default_draft``: ``quant:4:64`` for ``smollm2``, the 0.5B model
``qwen2.5-coder-0.5b`` for ``qwen2.5-coder``; the root is then the first prompt of ``pair_prompts``), then runs
``backends.capture.capture_group`` for one root of DDTE's grid (width 4, depth 8, 4 trees per L1,
labels for ``--labels``, one root per forward) and prints the nodes, the seconds and the process's
peak resident memory (``resource.getrusage``), beside the peak after loading the models.  The random
models' distributions mean nothing; the sizes do.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kilobytes on Linux


def pair_prompts(pair: str) -> str:
    """The prompt set (``backends.prompt_sets``) a named pair's root comes from: the ``prompts`` its
    study defaults declare (``backends.pretrained.pair_study_defaults``), else ``workloads``.

    Raises:
        ValueError: ``pair: ...`` for an unknown pair.
    """
    from backends.pretrained import pair_study_defaults

    return pair_study_defaults(pair).get("prompts") or "workloads"


def named_settings(pair: str, grid: dict):
    """The ``backends.capture_store.CaptureSettings`` of one root of the named ``pair``: its default
    draft (``backends.pretrained.default_draft``), its prompt set (``pair_prompts``), one root per
    forward, and ``grid`` (``shape``, ``width``, ``depth``, ``samples``, ``labels``).

    Raises:
        ValueError: ``pair: ...`` for an unknown pair.
    """
    from backends import capture_store
    from backends.pretrained import default_draft

    return capture_store.CaptureSettings("", default_draft(pair), pair_prompts(pair), pair=pair, roots_per_forward=1, **grid)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/capture_memory.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=None, help="the random pair's vocabulary (default 128000)")
    parser.add_argument("--depth", type=int, default=8, help="the grid's largest L1 and L2")
    parser.add_argument("--samples", type=int, default=4, help="trees per L1")
    parser.add_argument("--models", type=Path, default=None, help="folder for the random pair (default: a temporary one)")
    parser.add_argument("--pair", default=None, help="a named pretrained pair (backends.pretrained) instead of random models")
    parser.add_argument("--labels", default="specinfer", help="comma-separated verifiers labelled (default specinfer)")
    args = parser.parse_args(argv)
    from backends import capture_store
    from backends.capture import capture_group
    from backends.cli import check_flags, fail, name_list
    from backends.hf import HFPair
    from backends.pretrained import PAIRS, named_pair
    from backends.reference_pair import random_pair
    from simlab import tree_verifiers

    prog = "scripts/capture_memory.py"
    named = args.pair is not None
    vocab = 128_000 if args.vocab is None else args.vocab
    check_flags(
        prog,
        [
            (not (named and args.vocab is not None), "--vocab: a named --pair has its own vocabulary"),
            (not (named and args.models is not None), "--models: a named --pair is loaded, not built"),
            (named or vocab >= 2, f"--vocab: must be >= 2, got {vocab}"),
            (args.depth >= 1, f"--depth: must be >= 1, got {args.depth}"),
            (args.samples >= 1, f"--samples: must be >= 1, got {args.samples}"),
            (not named or args.pair in PAIRS, f"--pair: unknown pair {args.pair!r}; known: {', '.join(PAIRS)}"),
        ],
    )
    try:
        labels = ",".join(name_list(args.labels, "--labels", tree_verifiers.names()))
    except ValueError as exc:
        fail(prog, str(exc))
    grid = {"shape": "grid", "width": 4, "depth": args.depth, "samples": args.samples, "labels": labels}
    with tempfile.TemporaryDirectory() as tmp:
        if named:
            from backends.roots import prompt_texts, read_prompt_records

            settings = named_settings(args.pair, grid)
            pair = named_pair(args.pair, settings.draft, device="cpu")
            prompt = pair.encode(prompt_texts(pair, read_prompt_records(settings.prompts)[:1])[0])
        else:
            folder = args.models or Path(tmp)
            if not (folder / "target").is_dir():
                random_pair(folder, vocab)
            settings = capture_store.CaptureSettings(f"{folder}/target", f"{folder}/draft", "", roots_per_forward=1, **grid)
            pair = HFPair(settings.target, settings.draft, device="cpu")
            prompt = np.random.default_rng(0).integers(0, vocab, 16)
        loaded = peak_gb()
        root = (0, 0, tuple(int(t) for t in prompt))
        start = time.perf_counter()
        ((rows, _, _, labels),) = capture_group(pair, settings, [root], pair.max_batch, pair.forest_tokens)
        print(
            f"V = {pair.vocab_size}: {len(rows)} nodes, {len(labels)} labels in {time.perf_counter() - start:.1f} s; "
            f"peak RSS {peak_gb():.2f} GB (after loading the models {loaded:.2f} GB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
