"""Capture p and q on draft trees from real models: ``python -m backends.capture``.

For each prompt, a continuation is sampled from the target (seeded per prompt); roots sit at
fixed spacing along it.  At each root a draft tree is drawn from the draft model (``--shape``),
then p and q are evaluated at every node in one tree-attention forward per model.  Per node the
capture stores: root id, prompt index, root position (context length), node path, depth,
token, multiplicity (drafts through the node), number of children, TV, L1, KL both ways,
entropies, and the top-``--store-top`` ids and probabilities of p and q.  With ``--full`` it
also stores both models' float32 logits per node (``logits-r<root>.npz``), from which p and q
are recomputed bit for bit (``CapturedPair``), so every analysis can be rerun without the
models.  Output folder:

* ``settings.json``: the run's settings and seed (a rerun with other settings is refused);
* ``nodes-r<root>.parquet``: one shard per root, written atomically after the root is done.

``--shape grid`` captures the trees behind the action-grid studies (``compare_verifiers``,
``train_selector``): at each root, ``--samples`` trees ``Delayed(width, L1, depth)`` for every
L1 in 0..depth (``simlab.efficiency.draw_grid``), stored as ``drafts-r<root>.parquet`` (L1,
sample, trunk, branches); the node rows then cover the union of their nodes, once each
(``children`` = distinct child tokens in the union, ``multiplicity`` = 1).  With ``--full``,
``analyses.sources.CaptureSource`` replays them.

Resumable: a killed run (even SIGKILL) rerun with the same command skips the roots whose shard
exists and produces no duplicate and no missing rows, because every root is seeded by
(seed, root id) alone.  Under ``torchrun`` each process captures the roots with
``root % WORLD_SIZE == RANK`` on ``cuda:LOCAL_RANK``; ``read_capture`` reads all shards as one
table.
"""

from __future__ import annotations

import json
import os
import sys
import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
from tqdm import tqdm

from analyses._tool import check_flags, ToolParser, atomic_write, fail, prepare_out, write_parquet
from backends.synthetic.base import SamplingSettings, seeded_rng
from simlab.distributions import sample_categorical
from simlab.measures import node_divergences
from simlab.efficiency import GridDraft, draw_grid
from simlab.shapes import Delayed, named_shape
from simlab.trees import DraftTree, NodeTable

PROG = "python -m backends.capture"


@dataclass(frozen=True)
class CaptureSettings:
    """Everything that determines a capture's content (stored as settings.json)."""

    target: str
    draft: str
    prompts: str
    roots_per_prompt: int = 4
    spacing: int = 8
    shape: str = "iid"
    width: int = 4
    depth: int = 4
    trunk: int = 1
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    dtype: str = "float32"
    store_top: int = 8
    full: bool = False
    seed: int = 0
    prompts_sha256: str = ""  # of the prompt texts; the prompts path itself may differ on resume
    samples: int = 4  # --shape grid: draws per L1

    def tree_shape(self) -> Delayed:
        return named_shape(self.shape, self.width, self.depth, self.trunk)

    def tree_depth(self) -> int:
        """The deepest node a tree can have (grid: L1 + L2 up to twice ``depth``)."""
        return 2 * self.depth if self.shape == "grid" else self.depth

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_k, self.top_p)


def differing_settings(stored: dict, mine: dict) -> list[str]:
    """Names of the settings that differ between a stored capture and this run (the prompt file's
    path is compared through the digest of its prompts, not as a string; model paths by folder)."""
    defaults = asdict(CaptureSettings("", "", ""))

    def same(key):
        a, b = stored.get(key, defaults.get(key)), mine.get(key)
        if key in ("target", "draft") and a and b and Path(a).expanduser().exists() and Path(b).expanduser().exists():
            return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
        return a == b

    return [key for key in mine if key != "prompts" and not same(key)]


def read_prompts(path: str) -> list[str]:
    """Prompts from a text file (one per non-empty line) or JSON lines (``prompt`` or ``text``).

    Raises:
        ValueError: missing or unreadable file, no prompt in it, a JSON line without text.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"--prompts: no such file {path!r}")
    lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    if file.suffix == ".jsonl":
        prompts = []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                prompts.append(str(record.get("prompt", record.get("text"))))
                if record.get("prompt", record.get("text")) is None:
                    raise KeyError
            except (json.JSONDecodeError, KeyError, AttributeError):
                raise ValueError(f"--prompts: line {n} of {path} is not a JSON object with a 'prompt' or 'text' field") from None
        lines = prompts
    if not lines:
        raise ValueError(f"--prompts: {path} holds no prompt")
    return lines


def multiplicity(tree, path) -> int:
    """Drafts through a node: its count in the parent's child list (1 at the root)."""
    return tree.child_list(path[:-1]).count(path[-1]) if path else 1


def capture_root(pair, settings: CaptureSettings, root_id: int, prompt_index: int, context: tuple[int, ...]):
    """(rows, logits or None) for one root: draw its tree, evaluate every node once."""
    rng = seeded_rng(settings.seed, 1, root_id)
    drafts = None
    if settings.shape == "grid":
        drafts = draw_grid(NodeTable(pair, context), K_max=settings.width, L1_values=range(settings.depth + 1),
                           L2_max=settings.depth, samples=settings.samples, rng=rng)
        tree = union_tree(drafts)
    else:
        tree = settings.tree_shape().sample(NodeTable(pair, context), rng)
    nodes = tree.nodes()
    logits_p, logits_q = pair.node_logits(context, nodes)
    p_rows, q_rows = pair.transform(logits_p), pair.transform(logits_q)
    top = settings.store_top
    rows = []
    for i, path in enumerate(nodes):
        p, q = p_rows[i], q_rows[i]
        order_p = np.argsort(-p, kind="stable")[:top]
        order_q = np.argsort(-q, kind="stable")[:top]
        rows.append({
            "root": root_id, "prompt": prompt_index, "position": len(context), "root_context": list(context),
            "path": list(path), "depth": len(path),
            "token": path[-1] if path else -1, "multiplicity": multiplicity(tree, path) if drafts is None else 1,
            "children": len(tree.child_list(path)), **node_divergences(p, q),
            "p_top_ids": order_p.tolist(), "p_top_probs": p[order_p].tolist(),
            "q_top_ids": order_q.tolist(), "q_top_probs": q[order_q].tolist(),
        })
    return rows, ((logits_p, logits_q) if settings.full else None), drafts


def union_tree(drafts) -> DraftTree:
    """Every node of the grid drafts as one tree (distinct children only; no table attached)."""
    children: dict[tuple[int, ...], list[int]] = {}
    for d in drafts:
        for path in Delayed.build(None, d.trunk, d.branches).nodes():
            if path:
                kids = children.setdefault(path[:-1], [])
                if path[-1] not in kids:
                    kids.append(path[-1])
    return DraftTree(None, {k: tuple(v) for k, v in children.items()})


def drafts_path(out: Path, root: int) -> Path:
    return out / f"drafts-r{root:06d}.parquet"


def save_drafts(out: Path, root: int, prompt: int, context, drafts) -> None:
    """One row per grid draft: L1, sample index within its L1, trunk and branches (token ids)."""
    seen: dict[int, int] = {}
    rows = []
    for d in drafts:
        seen[d.L1] = seen.get(d.L1, -1) + 1
        rows.append({"root": root, "prompt": prompt, "root_context": list(context), "L1": d.L1, "sample": seen[d.L1],
                     "trunk": list(d.trunk), "branches": [list(b) for b in d.branches]})
    write_parquet(pl.DataFrame(rows, schema_overrides={"trunk": pl.List(pl.Int64), "branches": pl.List(pl.List(pl.Int64))}),
                  drafts_path(out, root))


def read_grid_drafts(folder: str):
    """Yield (root, prompt, root context, drafts) for every root of a ``--shape grid`` capture."""
    for file in sorted(Path(folder).glob("drafts-r*.parquet")):
        if not shard_path(Path(folder), int(file.stem.split("-r")[1])).exists():
            continue  # a root whose capture was interrupted
        table = pl.read_parquet(file)
        if table.height == 0 or not {"root", "prompt", "root_context", "L1", "trunk", "branches"} <= set(table.columns):
            raise ValueError(f"--capture: {file} is not a grid-drafts file")
        drafts = tuple(GridDraft(int(L1), tuple(trunk), tuple(tuple(b) for b in branches))
                       for L1, trunk, branches in table.select("L1", "trunk", "branches").iter_rows())
        yield int(table["root"][0]), int(table["prompt"][0]), tuple(table["root_context"][0].to_list()), drafts


def roots_of(pair, settings: CaptureSettings, prompts: list[str]):
    """Yield (root id, prompt index, root context) for every root, in order."""
    for i, text in enumerate(prompts):
        prompt = pair.encode(text)
        if not prompt:
            raise ValueError(f"--prompts: prompt {i + 1} encodes to no token")
        need = len(prompt) + settings.roots_per_prompt * settings.spacing + settings.tree_depth()
        if pair.max_context and need > pair.max_context:
            raise ValueError(f"--prompts: prompt {i + 1} has {len(prompt)} tokens; with its roots and trees it needs {need}, "
                             f"above the model's context of {pair.max_context}")
        rng = seeded_rng(settings.seed, 0, i)
        tokens = list(prompt)
        for _ in range(settings.roots_per_prompt * settings.spacing):
            p, _ = pair.distributions([tuple(tokens)])
            tokens.append(sample_categorical(p[0], rng))
        for j in range(settings.roots_per_prompt):
            yield i * settings.roots_per_prompt + j, i, tuple(tokens[: len(prompt) + j * settings.spacing])


def shard_path(out: Path, root: int) -> Path:
    """The shard of one root; its presence marks the root as done."""
    return out / f"nodes-r{root:06d}.parquet"


def run(settings: CaptureSettings, out: Path, *, device: str = "auto", quiet: bool = False, rank: int = 0, world: int = 1) -> int:
    """Capture every root of this process's share not already in ``out``; returns roots captured."""
    from backends.hf import HFPair

    torch_oom = _oom_error()
    prompts = read_prompts(settings.prompts)
    settings = replace(settings, prompts_sha256=hashlib.sha256("\n".join(prompts).encode()).hexdigest())
    stored = out / "settings.json"
    if stored.exists():
        differ = differing_settings(json.loads(stored.read_text()), asdict(settings))
        if differ:
            raise ValueError(f"--out: {str(out)!r} holds a capture with other settings ({', '.join(differ)}); use a new folder")
    pair = HFPair(settings.target, settings.draft, device=device, dtype=settings.dtype, settings=settings.sampling())
    roots = list(roots_of(pair, settings, prompts))  # validates every prompt before anything is written
    if rank == 0 and not stored.exists():
        atomic_write(stored, lambda tmp: Path(tmp).write_text(json.dumps(asdict(settings), indent=2, sort_keys=True)))
    todo = [r for r in roots if r[0] % world == rank and not shard_path(out, r[0]).exists()]
    done = 0
    for root_id, prompt_index, context in tqdm(todo, desc="roots", unit="root", file=sys.stderr, disable=quiet):
        while True:
            try:
                rows, logits, drafts = capture_root(pair, settings, root_id, prompt_index, context)
                break
            except torch_oom:
                if pair.max_batch == 1:
                    raise
                pair.max_batch = max(1, pair.max_batch // 2)
                _empty_cuda_cache()
                print(f"{PROG}: out of GPU memory at root {root_id}; retrying with batch {pair.max_batch}", file=sys.stderr)
        if logits is not None:
            save_logits(out / f"logits-r{root_id:06d}.npz", *logits)
        if drafts is not None:
            save_drafts(out, root_id, prompt_index, context, drafts)
        write_parquet(pl.DataFrame(rows), shard_path(out, root_id))
        done += 1
    return done


def save_logits(path: Path, target: np.ndarray, draft: np.ndarray) -> None:
    """Atomically store both models' float32 logits (nodes, V) of one root."""

    def write(tmp):
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, target=target, draft=draft)

    atomic_write(path, write)


def _oom_error():
    try:
        import torch

        return torch.cuda.OutOfMemoryError
    except (ImportError, AttributeError):
        return MemoryError


def _empty_cuda_cache():
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def read_capture(folder: str) -> pl.DataFrame:
    """All shards of a capture as one table (sorted by root, then node order within the root)."""
    files = sorted(Path(folder).glob("nodes-r*.parquet"))
    if not files:
        raise ValueError(f"--capture: no capture shards in {folder!r}")
    return pl.concat([pl.read_parquet(f) for f in files])


def load_settings(folder: str) -> CaptureSettings:
    """The ``CaptureSettings`` a capture folder was made with (ValueError if it has none)."""
    path = Path(folder) / "settings.json"
    if not path.is_file():
        raise ValueError(f"--capture: {folder!r} has no settings.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return CaptureSettings(**data)
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError):
        raise ValueError(f"--capture: {folder!r} has a damaged settings.json") from None


class CapturedPair:
    """Replays a ``--full`` capture: p and q at captured nodes, recomputed from the stored logits.

    ``distributions(contexts)`` answers captured contexts only (ValueError otherwise).
    """

    def __init__(self, folder: str):
        from simlab.distributions import sampling_distribution

        self.settings = load_settings(folder)
        if not self.settings.full:
            raise ValueError(f"--capture: {folder!r} was captured without --full; recapture with --full to replay p and q")
        table = read_capture(folder)
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        s = self.settings.sampling()
        transform = lambda z: sampling_distribution(z.astype(np.float64), temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        for root, group in table.group_by("root", maintain_order=True):
            with np.load(Path(folder) / f"logits-r{int(root[0]):06d}.npz") as stored:
                target, draft = stored["target"], stored["draft"]  # each read decompresses: read once
            context = tuple(group["root_context"][0].to_list())
            for i, path in enumerate(group["path"].to_list()):
                self._rows[context + tuple(path)] = (transform(target[i]), transform(draft[i]))
        self.vocab_size = next(iter(self._rows.values()))[0].size

    def node_rows(self):
        """Iterate (context, p, q) over every captured node."""
        for context, (p, q) in self._rows.items():
            yield context, p, q

    def distributions(self, contexts):
        try:
            pairs = [self._rows[tuple(int(t) for t in c)] for c in contexts]
        except KeyError as exc:
            raise ValueError(f"context: {exc.args[0]} was not captured") from None
        return np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])


def parse_args(argv) -> tuple[CaptureSettings, str, str, bool]:
    parser = ToolParser(prog=PROG, description="Capture target and draft distributions on draft trees.")
    parser.add_argument("--target", required=True, help="target model: local folder or hub id")
    parser.add_argument("--draft", required=True, help="draft model: local folder or hub id")
    parser.add_argument("--prompts", required=True, help="prompt file: text (one per line) or .jsonl")
    parser.add_argument("--out", required=True, help="output folder (resumes if it holds the same capture)")
    parser.add_argument("--roots-per-prompt", type=int, default=4)
    parser.add_argument("--spacing", type=int, default=8, help="tokens between roots")
    parser.add_argument("--shape", choices=["iid", "chain", "delayed", "grid"], default="iid",
                        help="grid: --samples trees Delayed(width, L1, depth) for every L1 in 0..depth (the action-grid studies)")
    parser.add_argument("--width", type=int, default=4, help="K (grid: the largest K)")
    parser.add_argument("--depth", type=int, default=4, help="tree depth in tokens (grid: the largest L1 and L2)")
    parser.add_argument("--samples", type=int, default=4, help="grid: trees per L1 and root")
    parser.add_argument("--trunk", type=int, default=1, help="L1 of a delayed tree")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--store-top", type=int, default=8, help="top ids and probabilities stored per node")
    parser.add_argument("--full", action="store_true", help="also store float32 logits of every node")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    checks = [
        (args.roots_per_prompt >= 1, "--roots-per-prompt: must be >= 1"), (args.spacing >= 1, "--spacing: must be >= 1"),
        (args.width >= 1, "--width: must be >= 1"), (args.depth >= 1, "--depth: must be >= 1"),
        (args.shape != "delayed" or 0 <= args.trunk < args.depth, "--trunk: must lie in [0, depth)"),
        (args.temperature >= 0, "--temperature: must be >= 0"), (args.top_p is None or 0 < args.top_p <= 1, "--top-p: must lie in (0, 1]"),
        (args.top_k is None or args.top_k >= 1, "--top-k: must be >= 1"), (args.store_top >= 1, "--store-top: must be >= 1"),
        (args.samples >= 1, "--samples: must be >= 1"),
    ]
    check_flags(PROG, checks)
    settings = CaptureSettings(args.target, args.draft, args.prompts, args.roots_per_prompt, args.spacing, args.shape,
                               args.width, args.depth, args.trunk, args.temperature, args.top_p, args.top_k, args.dtype,
                               args.store_top, args.full, args.seed, samples=args.samples)
    return settings, args.out, args.device, args.quiet


def main(argv=None) -> int:
    settings, out_arg, device, quiet = parse_args(sys.argv[1:] if argv is None else argv)
    out = prepare_out(PROG, out_arg)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and device == "auto":
        from backends.hf import pick_device

        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if pick_device() == "cuda" else "cpu"
    try:
        captured = run(settings, out, device=device, quiet=quiet, rank=rank, world=world)
    except ValueError as exc:
        fail(PROG, str(exc).splitlines()[0])
    if not quiet:
        print(f"captured {captured} roots into {out} (rank {rank} of {world})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
