"""Measure per-forward times of a real model pair: ``python -m backends.latency_probe``.

A warm-up microbenchmark (DDTE Sec. 6, App. E: the per-forward times t_p(l) and t_q(l) are
measured in a warm-up run on the serving machine).  For each model and each grid point (l, n)
it runs a prefix of l random token ids once (untimed, ``use_cache=True``), then times one
forward of n new tokens on top of that KV cache (position ids l..l+n-1, clipped to the model's last position: a tree forward's positions are depths).  The cache is cut
back to l tokens between runs; ``warmup`` untimed runs come first and the stored time is the
median of ``repeats`` timed runs.  The result is a ``simlab.latency.LatencyModel`` whose
tables are indexed by context l and new tokens n, in seconds.

    python -m backends.latency_probe --target DIR --draft DIR --out profile.json
    python -m backends.latency_probe --pair smollm2 --draft early-exit:24 --out profile.json

writes the profile (JSON, atomically; ``LatencyModel.load`` reads it) and prints the table, then
the measured cost ratio c = t_q / t_p at every grid point and its median over the grid
(``cost_ratios``): the draft's price measured on this machine, beside the weight-byte price the
studies give a named pair's draft (``backends.pretrained.weight_ratio``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import polars as pl

from backends.cli import ToolParser, check_flags, fail, fail_from, int_list, print_table, progress, slow_step
from backends.pretrained import PAIRS, open_pair, parse_draft
from backends.tree_cache import cache_kwarg, cache_of
from simlab.checks import check_int, check_seed
from simlab.latency import ForwardTime, LatencyModel, check_axis

PROG = "python -m backends.latency_probe"


def _cut_back(cache, context: int, tokens: int) -> bool:
    """Remove the last ``tokens`` entries of a transformers cache in place; False if it cannot."""
    if not hasattr(cache, "crop") or not getattr(cache, "is_croppable", True):
        return False
    cache.crop(-tokens)  # negative: remove that many tokens (transformers 4.x and 5.x alike)
    return cache.get_seq_length() == context


def forward_seconds(pair, model, context: int, tokens: int, *, repeats: int, warmup: int, generator) -> float:
    """Median seconds of one forward of ``tokens`` new tokens on a cached prefix of ``context`` tokens.

    Token ids are drawn uniformly from the model's vocabulary with ``generator`` (a CPU
    ``torch.Generator``): a (1, context) prefix, run once untimed for its KV cache, and a
    (1, tokens) block at position ids context..context+tokens-1 (clipped to the model's last position), timed ``repeats`` times after
    ``warmup`` untimed runs.  Only the block's forward is timed; on CUDA the device is
    synchronised before and after it.
    """
    import torch

    vocab = int(model.get_input_embeddings().weight.shape[0])
    ids = torch.randint(vocab, (1, context + tokens), generator=generator).to(pair.device)
    prefix, block = ids[:, :context], ids[:, context:]
    positions = torch.arange(context, context + tokens, device=pair.device)[None]
    limit = int(getattr(pair, "max_context", 0) or 0)
    if limit:  # a tree forward's positions are depths: n tree tokens may exceed the positions left
        positions = positions.clamp(max=limit - 1)
    cuda = torch.device(pair.device).type == "cuda"
    sync = (lambda: torch.cuda.synchronize(pair.device)) if cuda else (lambda: None)
    key = cache_kwarg(model)
    times = []
    with torch.no_grad():
        cache = None
        for run in range(warmup + repeats):
            if cache is None:  # first run, or a cache that could not be cut back: rebuild the prefix
                cache = cache_of(model(prefix, use_cache=True))
            sync()
            start = time.perf_counter()
            model(block, position_ids=positions, use_cache=True, **{key: cache})
            sync()
            if run >= warmup:
                times.append(time.perf_counter() - start)
            cache = cache if _cut_back(cache, context, tokens) else None
    return max(statistics.median(times), sys.float_info.min)  # a timer too coarse for the forward reads 0


def measure(
    pair,
    *,
    contexts: Sequence[int] = (16, 64, 256),
    tokens: Sequence[int] = (1, 4, 16, 64),
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
    progress=None,
) -> LatencyModel:
    """Measure t_q (``pair.draft``) and t_p (``pair.target``) on this machine (DDTE Sec. 6, App. E).

    For every context length l in ``contexts`` and every block size n in ``tokens`` the time of
    one forward of n new tokens on a cached prefix of l tokens is measured (``forward_seconds``):
    the median of ``repeats`` runs after ``warmup`` untimed ones, in seconds.  Token ids come
    from a ``torch.Generator`` seeded with ``seed``.

    Args:
        pair: a ``backends.hf.HFPair`` (``.draft``, ``.target``, ``.device``, ``.max_context``).
        contexts: context lengths l in tokens, strictly increasing, >= 1.
        tokens: new tokens per forward n, strictly increasing, >= 1.
        repeats: timed runs per grid point (>= 1); warmup: untimed runs before them (>= 0).
        progress: optional ``f(message)`` called before each grid point (e.g. to log to stderr).

    Returns:
        A ``LatencyModel`` whose ``draft`` and ``target`` tables have shape
        (len(contexts), len(tokens)), and whose ``source`` names the models, device, dtype,
        torch version and date.

    Raises:
        ValueError: naming the argument: a bad axis, repeats < 1, warmup < 0, or
            max(contexts) + max(tokens) above ``pair.max_context`` (when it is nonzero).
    """
    import torch

    contexts, tokens = check_axis(contexts, "contexts", 1), check_axis(tokens, "tokens", 1)
    repeats, warmup = check_int(repeats, "repeats", 1), check_int(warmup, "warmup", 0)
    limit = int(getattr(pair, "max_context", 0) or 0)
    if limit and contexts[-1] >= limit:
        raise ValueError(
            f"contexts: the largest context {contexts[-1]} does not fit the model's context of {limit} tokens "
            "(with room for one new position)"
        )
    tables = {}
    for name in ("draft", "target"):
        model = getattr(pair, name)
        generator = torch.Generator().manual_seed(check_seed(seed))
        rows = []
        for l in contexts:
            if progress:
                progress(f"{name}: context {l}, tokens {', '.join(map(str, tokens))}")
            rows.append([forward_seconds(pair, model, l, n, repeats=repeats, warmup=warmup, generator=generator) for n in tokens])
        tables[name] = ForwardTime(contexts, tokens, rows)
    dtype = str(next(pair.target.parameters()).dtype).removeprefix("torch.")
    names = {
        name: getattr(getattr(pair, name), "name_or_path", "") or type(getattr(pair, name)).__name__
        for name in ("target", "draft")
    }
    source = (
        f"latency_probe: target {names['target']}, draft {names['draft']}, device {pair.device}, dtype {dtype}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), median of {repeats} after {warmup} warm-up, "
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}"
    )
    return LatencyModel(tables["draft"], tables["target"], source)


def table(latency: LatencyModel) -> pl.DataFrame:
    """One row per (model, context, tokens) with the time in milliseconds."""
    rows = [
        {"model": name, "context": l, "tokens": n, "milliseconds": 1e3 * t}
        for name, forward in (("draft", latency.draft), ("target", latency.target))
        for l, row in zip(forward.contexts, forward.seconds)
        for n, t in zip(forward.tokens, row)
    ]
    return pl.DataFrame(rows)


def cost_ratios(latency: LatencyModel) -> pl.DataFrame:
    """One row per grid point (context, tokens) of the profile: both times in milliseconds and the
    measured cost ratio t_q / t_p (``ratio``, float64), read off the tables at the draft's grid
    (the target's table interpolated where its grid differs; ``simlab.latency.ForwardTime``)."""
    forward = latency.draft
    rows = [
        {
            "context": l,
            "tokens": n,
            "draft_ms": 1e3 * t,
            "target_ms": 1e3 * latency.target(l, n),
            "ratio": t / latency.target(l, n),
        }
        for l, row in zip(forward.contexts, forward.seconds)
        for n, t in zip(forward.tokens, row)
    ]
    return pl.DataFrame(
        rows,
        schema={"context": pl.Int64, "tokens": pl.Int64, "draft_ms": pl.Float64, "target_ms": pl.Float64, "ratio": pl.Float64},
    )


def parse_args(argv):
    parser = ToolParser(prog=PROG, description="Measure draft and target forward times (a latency profile).")
    parser.add_argument("--target", default=None, help="target model: local folder or hub id (or --pair)")
    parser.add_argument(
        "--draft",
        default=None,
        help="draft model: local folder or hub id (with --pair: its draft, early-exit:L, adapter:L or quant:B:G)",
    )
    parser.add_argument(
        "--pair", choices=list(PAIRS), default=None, help="a named pretrained pair instead of --target (backends.pretrained)"
    )
    parser.add_argument("--out", required=True, help="profile file to write (.json)")
    parser.add_argument("--contexts", default="16,64,256", help="context lengths l (tokens), comma-separated")
    parser.add_argument("--tokens", default="1,4,16,64", help="new tokens per forward n, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per point (the median is stored)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs before them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--quiet", action="store_true", help="print nothing (no table, no progress)")
    args = parser.parse_args(argv)
    args.parser = parser
    check_flags(
        PROG,
        [
            (not (args.pair and args.target), "--target: --pair brings its own target; drop --target"),
            (bool(args.pair or (args.target and args.draft)), "--target: give --target and --draft, or --pair"),
        ],
    )
    try:
        args.contexts, args.tokens = int_list(args.contexts, "--contexts"), int_list(args.tokens, "--tokens")
        check_axis(args.contexts, "contexts", 1), check_axis(args.tokens, "tokens", 1)
        check_int(args.repeats, "repeats", 1), check_int(args.warmup, "warmup", 0), check_seed(args.seed)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    out = Path(args.out)
    parent = out.parent if str(out.parent) else Path(".")
    check_flags(
        PROG,
        [
            (out.suffix == ".json", f"--out: the profile must be a .json file, got {args.out!r}"),
            (not out.is_dir(), f"--out: {args.out!r} is a folder; name a .json file"),
            (parent.is_dir(), f"--out: no such folder {str(parent)!r}"),
            (not parent.is_dir() or os.access(parent, os.W_OK), f"--out: cannot write to folder {str(parent)!r}"),
        ],
    )
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    log = None if args.quiet else (lambda message: progress(PROG, message))
    try:
        draft = parse_draft(args.draft, args.pair) if args.pair else args.draft
        with slow_step(PROG, f"loading {args.pair or args.target} and {draft}", args.quiet):
            pair = open_pair(args.pair, args.target, args.draft, device=args.device, dtype=args.dtype)
        latency = measure(
            pair,
            contexts=args.contexts,
            tokens=args.tokens,
            repeats=args.repeats,
            warmup=args.warmup,
            seed=args.seed,
            progress=log,
        )
    except ValueError as exc:
        fail_from(PROG, exc, args.parser)
    try:
        latency.save(args.out)
    except OSError as exc:
        fail(PROG, f"--out: cannot write {args.out!r} ({exc.strerror or exc})")
    if not args.quiet:
        print_table(table(latency), f"forward times on {pair.device} ({latency.source}); profile: {args.out}")
        ratios = cost_ratios(latency)
        print_table(
            ratios,
            f"cost ratio t_q / t_p measured on {pair.device}: median {ratios['ratio'].median():.3f} over the grid "
            f"({ratios['ratio'].min():.3f}-{ratios['ratio'].max():.3f})",
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
