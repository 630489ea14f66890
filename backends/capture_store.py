"""The capture store: the file format of captures of p and q on draft trees, its writer, its
reader, and ``CapturedPair``, which replays p and q bit for bit.  (The tool that makes
captures is ``python -m backends.capture``.)

A capture folder holds:

* ``settings.json``: the ``CaptureSettings`` that determine its content;
* ``nodes-r<root>.parquet``: one shard per root (its presence marks the root as done): root id,
  prompt index, prompt category (``category``; null without one; absent before the column), root position (context length), root context, node path, depth, token,
  multiplicity (drafts through the node; 1 for grid captures), number of children, TV, L1, KL
  both ways, entropies, and the top-``store_top`` ids and probabilities of p and q;
* ``drafts-r<root>.parquet`` (``shape="grid"``): the grid drafts (L1, sample, trunk, branches);
* ``logits-r<root>.npz`` (``full=True``): both models' float32 logits per node, in node-row
  order, from which ``CapturedPair`` recomputes p and q with the capture's sampling settings.

Every file is written atomically.  A damaged file (garbage, wrong schema, truncated archive)
raises ``ValueError("capture: ... is damaged (...)")``, never a library's own exception.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import polars as pl

from backends.cli import atomic_write, write_parquet
from backends.roots import RootPlacement
from simlab.efficiency import GridDraft
from simlab.pairs import check_contexts
from simlab.sampling import SamplingSettings
from simlab.shapes import Delayed, named_shape

NODE_COLUMNS = ("root", "prompt", "position", "root_context", "path", "depth", "token", "multiplicity", "children",
                "l1", "tv", "kl_pq", "kl_qp", "h_p", "h_q", "p_top_ids", "p_top_probs", "q_top_ids", "q_top_probs")
DRAFT_COLUMNS = ("root", "prompt", "root_context", "L1", "sample", "trunk", "branches")


@dataclass(frozen=True)
class CaptureSettings:
    """Everything that determines a capture's content (stored as settings.json).

    ``shape`` is ``iid``, ``chain``, ``delayed`` (``width`` K, ``depth``, ``trunk`` L1) or
    ``grid`` (``samples`` trees ``Delayed(width, L1, depth)`` for every L1 in 0..depth).
    """

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
    labels: str = ""  # --shape grid --labels: comma-separated verifiers labelled at capture time
    roots_per_forward: int = 8  # roots whose trees share one forward (settings.json without it: 1, the earlier captures)
    evaluation: str = "cached"  # "cached": kept KV caches, each node once; "forward" (settings.json without it): levels re-run ancestors
    labels_engine: str = ""  # --labels: the engine the labels were computed with (numpy or torch; "unrecorded" before the field)
    pair: str = ""  # --pair: the named pretrained pair (backends.pretrained; target is then ""), else ""

    def tree_shape(self) -> Delayed:
        return named_shape(self.shape, self.width, self.depth, self.trunk)

    def tree_depth(self) -> int:
        """The deepest node a tree can have (grid: L1 + L2 up to twice ``depth``)."""
        return 2 * self.depth if self.shape == "grid" else self.depth

    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_k, self.top_p)

    def placement(self) -> RootPlacement:
        """Roots along each prompt's continuation: the prompt's end first, then every ``spacing`` tokens."""
        return RootPlacement(self.roots_per_prompt, self.spacing, first=0)


def differing_settings(stored: dict, mine: dict) -> list[str]:
    """Names of the settings that differ between a stored capture and this run (the prompt file's
    path is compared through the digest of its prompts, not as a string; model paths by folder)."""
    defaults = asdict(CaptureSettings("", "", ""))

    def same(key):
        a, b = stored.get(key, defaults.get(key)), mine.get(key)
        if key == "labels_engine" and a == "unrecorded":  # a capture from before the field: either engine resumes it
            return True
        if key in ("target", "draft") and a and b and Path(a).expanduser().exists() and Path(b).expanduser().exists():
            return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
        return a == b

    return [key for key in mine if key != "prompts" and not same(key)]


# -- paths ------------------------------------------------------------------------------------
def shard_path(out: Path, root: int) -> Path:
    """The node shard of one root; its presence marks the root as done."""
    return Path(out) / f"nodes-r{root:06d}.parquet"


def drafts_path(out: Path, root: int) -> Path:
    return Path(out) / f"drafts-r{root:06d}.parquet"


def labels_path(out: Path, root: int) -> Path:
    return Path(out) / f"labels-r{root:06d}.parquet"


def logits_path(out: Path, root: int) -> Path:
    return Path(out) / f"logits-r{root:06d}.npz"


# -- writer -----------------------------------------------------------------------------------
def save_settings(out: Path, settings: CaptureSettings) -> None:
    atomic_write(Path(out) / "settings.json", lambda tmp: Path(tmp).write_text(json.dumps(asdict(settings), indent=2, sort_keys=True)))


def save_nodes(out: Path, root: int, rows: list[dict]) -> None:
    """The node shard of one root (written last: it marks the root as done); a ``category`` column
    (the prompt's workload category, or null) is stored as strings."""
    write_parquet(pl.DataFrame(rows, schema_overrides={"category": pl.String} if rows and "category" in rows[0] else None),
                  shard_path(out, root))


def save_labels(out: Path, root: int, rows: list[dict]) -> None:
    """The grid labels of one root (``simlab.labels.grid_labels`` rows with root and prompt)."""
    write_parquet(pl.DataFrame(rows), labels_path(out, root))


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


def save_logits(path: Path, target: np.ndarray, draft: np.ndarray) -> None:
    """Atomically store both models' float32 logits (nodes, V) of one root."""

    def write(tmp):
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, target=target, draft=draft)

    atomic_write(Path(path), write)


# -- reader -----------------------------------------------------------------------------------
def read_safely(folder, read):
    """``read(folder)``, with any error of a damaged file (polars, numpy, zip, json) as one
    ``ValueError("capture: ... is damaged (...)")``; the store's own ValueErrors pass through."""
    try:
        return read(folder)
    except Exception as exc:
        if isinstance(exc, ValueError) and str(exc).startswith("capture:"):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise ValueError(f"capture: {str(folder)!r} is damaged ({type(exc).__name__}: {first})") from None


def load_settings(folder) -> CaptureSettings:
    """The ``CaptureSettings`` a capture folder was made with.

    Raises:
        ValueError: ``capture: ...`` for a folder without settings.json or with a damaged one.
    """
    path = Path(folder) / "settings.json"
    if not Path(folder).is_dir():
        raise ValueError(f"capture: {str(folder)!r} is not a folder")
    if not path.is_file():
        raise ValueError(f"capture: {str(folder)!r} has no settings.json (not a capture folder)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(CaptureSettings)}
        if not isinstance(data, dict) or not set(data) <= known:
            raise TypeError
        defaults = {"roots_per_forward": 1, "evaluation": "forward", "labels_engine": "unrecorded" if data.get("labels") else ""}
        settings = CaptureSettings(**{**defaults, **data})  # captures made before the flags
        settings.sampling()
        settings.placement()
        if settings.evaluation not in ("cached", "forward"):
            raise ValueError
        return settings
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError):
        raise ValueError(f"capture: {str(folder)!r} has a damaged settings.json") from None


def completed_roots(folder) -> list[int]:
    """Root ids whose node shard exists, ascending."""
    return sorted(int(f.stem.split("-r")[1]) for f in Path(folder).glob("nodes-r*.parquet"))


def _check_columns(table: pl.DataFrame, columns, file) -> pl.DataFrame:
    missing = set(columns) - set(table.columns)
    if table.height == 0 or missing:
        raise ValueError(f"capture: {str(file)!r} is damaged (missing columns {sorted(missing)} or no rows)")
    return table


def read_nodes(folder, root: int) -> pl.DataFrame:
    """The node rows of one root."""
    file = shard_path(folder, root)
    return _check_columns(read_safely(file, pl.read_parquet), NODE_COLUMNS, file)


def read_capture(folder) -> pl.DataFrame:
    """All node shards of a capture as one table (sorted by root, then node order within the root).

    Raises:
        ValueError: ``capture: ...`` for a folder without shards or with a damaged shard.
    """
    roots = completed_roots(folder)
    if not roots:
        raise ValueError(f"capture: no capture shards in {str(folder)!r}")
    return pl.concat([read_nodes(folder, r) for r in roots], how="diagonal")  # shards from before the category column too


def root_category(folder, root: int) -> str | None:
    """The prompt category stored with one root's node shard (None: none, or a shard from before
    the column)."""
    file = shard_path(folder, root)
    columns = read_safely(file, pl.read_parquet_schema)
    if "category" not in columns:
        return None
    return read_safely(file, lambda f: pl.read_parquet(f, columns=["category"], n_rows=1))["category"][0]


def read_grid_drafts(folder):
    """Yield (root, prompt, root context, drafts) for every completed root of a grid capture."""
    for root in completed_roots(folder):
        file = drafts_path(folder, root)
        if not file.exists():
            raise ValueError(f"capture: {str(folder)!r} is damaged (root {root} has no drafts file)")
        table = _check_columns(read_safely(file, pl.read_parquet), DRAFT_COLUMNS, file)
        drafts = tuple(GridDraft(int(L1), tuple(trunk), tuple(tuple(b) for b in branches))
                       for L1, trunk, branches in table.select("L1", "trunk", "branches").iter_rows())
        yield int(table["root"][0]), int(table["prompt"][0]), tuple(table["root_context"][0].to_list()), drafts


def read_labels(folder) -> pl.LazyFrame:
    """The grid labels of every completed root of a ``--labels`` capture, scanned lazily from the
    per-root shards (columns root, prompt and ``simlab.labels.LABEL_COLUMNS``).

    Raises:
        ValueError: ``capture: ...`` for a capture made without ``--labels``, or a completed root
            without its labels file.
    """
    stored = load_settings(folder)
    if not stored.labels:
        raise ValueError(f"capture: {str(folder)!r} was captured without --labels")
    files = [labels_path(folder, r) for r in completed_roots(folder)]
    missing = [f for f in files if not f.exists()]
    if missing:
        raise ValueError(f"capture: {str(folder)!r} is damaged ({missing[0].name} is missing)")
    if not files:
        raise ValueError(f"capture: no capture shards in {str(folder)!r}")
    return pl.scan_parquet([str(f) for f in files])


def read_logits(folder, root: int) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) float32 logits (nodes, V) of one root of a ``full`` capture."""
    def read(file):
        with np.load(file) as stored:  # each read of a member decompresses it: read once
            return stored["target"], stored["draft"]

    file = logits_path(folder, root)
    if not file.exists():
        raise ValueError(f"capture: {str(folder)!r} is damaged (root {root} has no logits file)")
    return read_safely(file, read)


def captured_tree(nodes: pl.DataFrame) -> dict[tuple[int, ...], tuple[int, ...]]:
    """The child lists of one root's captured tree (multiplicities kept, grouped by token in
    order of first appearance), from its node rows."""
    children: dict[tuple[int, ...], list[int]] = {}
    for path, multiplicity in nodes.select("path", "multiplicity").iter_rows():
        path = tuple(path)
        if path:
            children.setdefault(path[:-1], []).extend([path[-1]] * int(multiplicity))
    return {k: tuple(v) for k, v in children.items()}


class LabelsOnlyPair:
    """The stand-in pair of a grid capture made with ``--labels`` and without ``--full``: it holds
    no p or q, so the studies can replay its stored labels (``Root.labels``: the verifiers and
    grid it was labelled for) and nothing else; any use of p or q (another verifier, another
    grid, a node-level study) raises a ``ValueError`` that says so.

    Args:
        folder: the capture folder; labels: the comma-separated verifiers it was labelled for.
    """

    def __init__(self, folder, labels: str):
        self.folder, self.labels = str(folder), labels

    def _refuse(self):
        raise ValueError(f"capture: {self.folder!r} was captured without --full and holds labels for {self.labels} only "
                         "(with its grid); for other verifiers, grids or p and q, recapture with --full")

    @property
    def vocab_size(self) -> int:
        self._refuse()

    def distributions(self, contexts):
        self._refuse()


class CapturedPair:
    """Replays a ``full`` capture: p and q at captured nodes, recomputed from the stored logits
    with the capture's sampling settings (``SamplingSettings.probabilities``, the transform every
    live pair uses), so p and q equal the live ones bit for bit.

    ``distributions(contexts)`` answers captured contexts only.  ``roots`` restricts the replay
    to some root ids (default: every completed root).

    Raises:
        ValueError: ``capture: ...`` for a capture without ``full`` logits or with damaged files;
            ``context: ...`` for a context that was not captured.
    """

    def __init__(self, folder, roots=None):
        self.folder = str(folder)
        self.settings = load_settings(folder)
        if not self.settings.full:
            raise ValueError(f"capture: {self.folder!r} was captured without --full; recapture with --full to replay p and q")
        wanted = completed_roots(folder) if roots is None else list(roots)
        if not wanted:
            raise ValueError(f"capture: no capture shards in {self.folder!r}")
        self._rows: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
        transform = self.settings.sampling().probabilities
        for root in wanted:
            nodes = read_nodes(folder, root)
            target, draft = read_logits(folder, root)
            if target.shape[0] != nodes.height or draft.shape != target.shape:
                raise ValueError(f"capture: {self.folder!r} is damaged (root {root}: {target.shape[0]} logit rows for {nodes.height} nodes)")
            p, q = transform(target), transform(draft)
            context = tuple(nodes["root_context"][0].to_list())
            for i, path in enumerate(nodes["path"].to_list()):
                self._rows[context + tuple(path)] = (p[i], q[i])
        self.vocab_size = next(iter(self._rows.values()))[0].size

    def node_rows(self):
        """Iterate (context, p, q) over every captured node."""
        for context, (p, q) in self._rows.items():
            yield context, p, q

    def distributions(self, contexts):
        contexts = check_contexts(contexts, self.vocab_size)
        try:
            pairs = [self._rows[c] for c in contexts]
        except KeyError as exc:
            raise ValueError(f"context: {exc.args[0]} was not captured") from None
        return np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
