"""The study runner: what every study over roots does once, given what the study declares.

A study declares a ``Study`` (its program name and docstring, its typed config and flags, its
refusals, its live-model defaults, how it opens its source and latency, the drafters it times,
how it values one root and how it reports) and its ``main`` is ``run_study(STUDY, argv)``.
``run_study`` parses the flags once into the config (lists as tuples of ints or names, never
strings), opens the source and latency model, prepares ``--out``, values the roots, stages every
output the report names (parquet frames, HTML + PNG charts, other files, the by-category table),
publishes them atomically (``backends.cli.OutputSet``), prints the tables and the "wrote" line,
and maps every ``ValueError`` onto its flag (one line on stderr, exit 2).

Sharding across processes and machines (``torchrun`` or ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set
by hand, read as ``backends.capture`` reads them: ``backends.cli.shard_environment``; a live source
opened with ``--device auto`` opens on the rank's own GPU, ``cuda:LOCAL_RANK``, where CUDA is
usable: ``analyses._flags.live_device``): with ``WORLD_SIZE`` = W > 1 the roots, enumerated over the
settings in the source's order (index i = 0, 1, ...), are split round-robin: rank R values the roots
with ``i % W == R`` (``study.value_root``) into its own part, ``<out>/parts/rank-R-of-W.json``,
rewritten atomically after every ``SHARD_BATCH`` roots (or the first root ``SHARD_SECONDS`` after
the last rewrite) and marked complete at the end.  A part
records the key of the run (the study, its config without ``out`` and ``quiet``, W, the code: ``run_key``); a rerun of a
killed rank reuses the roots its part already holds (a complete part is not recomputed; another key
is started afresh).  Merge: rank 0, after its own share, waits for every part of the same key to be
complete (``SIMLAB_SHARD_WAIT`` seconds, default 86400; polled every second; it says what each
missing rank's part is: none yet, in progress, another run's: ``part_state``), then orders the
payloads by root index, which is the order of a one-process run, and reports and publishes as one
process does: the tables are byte-identical to a one-process run whenever each root's value depends
on that root alone (``study.shardable`` refuses the configurations where it does not).  A merge after
the fact is rank 0 rerun with the same W: its part is complete, so it only waits for the others and
merges.  Other ranks print one "wrote part" line and publish nothing.  Parts are JSON (floats by
``repr``, read back bit for bit).  A study whose roots are valued in stages (a fit on some roots
before the others are valued) declares ``Study.sharded``: each stage is a ``value_share`` and a
``merge_parts`` under its own ``stage`` name (``<out>/parts/STAGE-rank-R-of-W.json``), every rank
waiting for every part of a stage before the next.

One node: ``torchrun --standalone --nproc_per_node 4 --no-python python -m analyses.STUDY FLAGS
--out DIR``; several nodes sharing ``DIR`` (a shared file system): ``torchrun --nnodes N
--nproc_per_node P --node_rank K --rdzv_backend c10d --rdzv_endpoint HOST:PORT --no-python python -m
analyses.STUDY FLAGS --out DIR`` on each node.  ``--out`` must be given when sharded (every rank
writes into it).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import numpy as np
import polars as pl

from analyses._categories import print_by_category, stage_by_category
from backends.cli import (
    OutputSet,
    ToolParser,
    chart_writer,
    fail,
    fail_from,
    parquet_writer,
    print_table,
    progress,
    progress_bar,
    run_tool,
    shard_environment,
)
from analyses._flags import check_named, note_hf_defaults, study_out, with_drafter_time, with_hf_defaults

WROTE = "wrote"
"""A ``Report.printed`` item: where the "wrote" line goes (default: after every other item)."""

SHARD_BATCH = 4
"""Roots a rank values between two atomic rewrites of its part (or fewer: ``SHARD_SECONDS``)."""
SHARD_SECONDS = 30.0
"""Seconds after which a rank rewrites its part at the next root it values, however few (a live
root takes minutes: a kill then loses at most the root in progress)."""


@dataclass(frozen=True)
class Opened:
    """What a study's ``open`` returns: the source of roots, its sampling settings (a tuple of
    ``simlab.sampling.SamplingSettings``), the latency model (``simlab.latency.LatencyModel`` or
    None for a study that times nothing) and, for a study that must place files before its source
    exists (a live capture), the output folder it prepared (else None: the runner prepares it)."""

    source: object
    settings: tuple
    latency: object = None
    out: Path | None = None


@dataclass(frozen=True)
class ByCategory:
    """A ``Report.printed`` item: the by-category table (``analyses._categories.print_by_category``)."""

    table: pl.DataFrame | None
    columns: tuple
    title: str
    where: object = None


@dataclass(frozen=True)
class Report:
    """What a study's ``run`` returns.

    Attributes:
        outputs: file name -> content, in the order of the "wrote" line: a polars DataFrame
            (written as parquet) or a callable ``write(tmp_path)`` (any other file, e.g.
            ``latency.json``; charts: ``chart_files``).
        by_category: the by-category table (``analyses._categories.by_category``) or None;
            staged as ``by_category.parquet`` (not named in the "wrote" line).
        printed: what is printed on stdout after publishing, unless ``--quiet``: items
            ``(frame, title)`` (a table), strings (a line), ``ByCategory`` and ``WROTE``.
    """

    outputs: dict
    by_category: pl.DataFrame | None = None
    printed: tuple = ()


@dataclass(frozen=True)
class RootTask:
    """One root to value: its index in the run's order (settings in order, then the source's
    roots), the setting's index and ``SamplingSettings``, and the ``backends.sources.base.Root``."""

    index: int
    setting_index: int
    setting: object
    root: object


def _never(config, opened, parser) -> None:
    return None


@dataclass(frozen=True)
class Study:
    """A study's declaration (``run_study`` does the rest).

    Attributes:
        prog: ``python -m analyses.NAME`` (error lines, default ``--out``).
        doc: the module docstring (its first paragraph is ``--help``'s description).
        config_type: the config dataclass; ``config_type()`` gives the flags' defaults.
        flags: ``flags(parser, defaults)`` adds the study's flags.
        config: ``config(args, parser) -> Config``: the typed config from the parsed flags, or exit 2
            with one line (the study's refusals).
        open: ``open(config, parser, progress) -> Opened``.
        value_root: ``value_root(config, opened, task) -> payload``: one root's values, JSON-able,
            depending on that root alone (the sharded path).
        merge: ``merge(config, opened, payloads) -> values``: the payloads of every root in task
            order, as ``run`` takes them.
        run: ``run(config, opened, values, progress) -> Report``.
        values: ``values(config, opened, progress) -> values``: the one-process path (None:
            ``merge`` of ``value_root`` over every root).
        sharded: ``sharded(config, opened, rank, world, progress) -> values or None``: the sharded
            path of a study that values its roots in stages (each stage a ``value_share`` and a
            ``merge_parts`` under its own ``stage`` name); None: ``value_share`` then, on rank 0,
            ``merge_parts``.  None is returned on the ranks that publish nothing.
        hf_defaults: field -> default with ``--backend hf`` (``with_hf_defaults``).
        drafters: (name, config field, flag) of the extra drafters the study times: the latency
            model gets each one's forward time (``with_drafter_time``).
        error_flags: error argument -> flag, beside the parser's own (``fail_from``).
        shardable: ``shardable(config, opened, parser) -> reason or None``: why this run cannot be
            sharded (exit 2 with it when ``WORLD_SIZE`` > 1); called before ``open`` with ``opened``
            None (the reasons the flags alone decide: nothing is opened or written before them) and
            again after it.
    """

    prog: str
    doc: str
    config_type: type
    flags: Callable
    config: Callable
    open: Callable
    value_root: Callable
    merge: Callable
    run: Callable
    values: Callable | None = None
    sharded: Callable | None = None
    hf_defaults: dict = field(default_factory=dict)
    drafters: tuple = ()
    error_flags: dict = field(default_factory=dict)
    shardable: Callable = _never


def parse(study: Study, argv) -> tuple[object, ToolParser]:
    """(config, parser) from ``argv``: the flags that name files given empty (``check_named``), the
    study's flags and refusals, then its live-model defaults."""
    parser = ToolParser(prog=study.prog, description=study.doc.split("\n\n")[0])
    study.flags(parser, study.config_type())
    if study.hf_defaults:
        note_hf_defaults(parser, study.hf_defaults)
    args = parser.parse_args(argv)
    check_named(study.prog, parser, args)
    config = study.config(args, parser)
    if hasattr(config, "backend"):  # a study with a source: its live-model defaults and the named pair's own
        config = with_hf_defaults(config, parser, study.hf_defaults or {})
    return config, parser


def tasks(opened: Opened) -> Iterator[RootTask]:
    """Every root of the run in order: the settings in order, each one's roots in the source's order."""
    index = 0
    for s, setting in enumerate(opened.settings):
        for root in opened.source.roots(setting):
            yield RootTask(index, s, setting, root)
            index += 1


def sampled_tasks(opened: Opened, desc: str, config) -> list[RootTask]:
    """``tasks(opened)`` as a list, with a progress bar on stderr while the source places them (a
    live source continues every prompt to reach its roots: minutes on a long prompt)."""
    total = sum(opened.source.count(setting) for setting in opened.settings)
    with progress_bar(tasks(opened), total=total, desc=desc, unit="root", quiet=getattr(config, "quiet", False)) as bar:
        return list(bar)


def run_study(study: Study, argv=None) -> int:
    """Run ``study`` on ``argv`` (default ``sys.argv[1:]``) as a command-line tool: 0 on success,
    2 with one line on stderr for a bad flag or input, 130 on an interrupt (``run_tool``)."""
    return run_tool(study.prog, lambda: _run(study, sys.argv[1:] if argv is None else argv))


def _run(study: Study, argv) -> int:
    try:
        rank, world, _ = shard_environment(os.environ)
    except ValueError as exc:
        fail(study.prog, str(exc))
    config, parser = parse(study, argv)
    quiet = getattr(config, "quiet", False)
    say = lambda message: progress(study.prog, message, quiet)
    if world > 1 and "out" not in parser.given:
        fail(study.prog, f"--out: a sharded run (WORLD_SIZE {world}) needs --out, the folder every rank writes its part into")
    try:
        if world > 1 and (reason := study.shardable(config, None, parser)):
            fail(study.prog, f"WORLD_SIZE: {world} processes cannot share this run ({reason})")
        opened = study.open(config, parser, say)
        if world > 1 and (reason := study.shardable(config, opened, parser)):
            fail(study.prog, f"WORLD_SIZE: {world} processes cannot share this run ({reason})")
        if opened.latency is not None:
            latency = opened.latency
            for name, ratio_field, flag in study.drafters:
                latency = with_drafter_time(latency, name, getattr(config, ratio_field), flag, parser)
            opened = replace(opened, latency=latency)
        out = opened.out if opened.out is not None else study_out(study.prog, config, opened.source.slug())
        opened = replace(opened, out=out)
        config = replace(config, out=str(out)) if hasattr(config, "out") else config
        if world > 1:
            values = (study.sharded or partial(_sharded, study))(config, opened, rank, world, say)
            if values is None:
                return 0
        elif study.values is not None:
            values = study.values(config, opened, say)
        else:
            values = study.merge(config, opened, [study.value_root(config, opened, task) for task in tasks(opened)])
        report = study.run(config, opened, values, say)
    except ValueError as exc:
        fail_from(study.prog, exc, parser, study.error_flags)
    publish(out, report)
    if not quiet:
        show(out, report)
    return 0


def publish(out: Path, report: Report) -> None:
    """Stage every output of ``report`` in ``out`` and publish them at once (``OutputSet``)."""
    with OutputSet(out) as outputs:
        for name, content in report.outputs.items():
            if isinstance(content, pl.DataFrame):
                outputs.stage(name, parquet_writer(content))
            else:
                outputs.stage(name, content)
        stage_by_category(outputs, report.by_category)
        outputs.publish()


def chart_files(name: str, chart, writer=chart_writer) -> dict:
    """``{NAME.html: writer, NAME.png: writer}`` of an altair ``chart`` for ``Report.outputs``
    (``writer``: ``backends.cli.chart_writer`` or a study's own)."""
    return {f"{name}.{fmt}": writer(chart, fmt) for fmt in ("html", "png")}


def wrote_line(out: Path, report: Report) -> str:
    """``wrote OUT/first, second, ...``: the outputs in order, ``NAME.html`` then ``NAME.png`` as ``NAME.html/.png``."""
    names = []
    for name in report.outputs:
        if name.endswith(".png") and names and names[-1] == name[: -len(".png")] + ".html":
            names[-1] += "/.png"
        else:
            names.append(name)
    return f"wrote {out}/{', '.join(names)}"


def show(out: Path, report: Report) -> None:
    """Print ``report.printed`` with the "wrote" line at its ``WROTE`` item (else last)."""
    items = report.printed if WROTE in report.printed else (*report.printed, WROTE)
    for item in items:
        if item is WROTE or item == WROTE:
            print(wrote_line(out, report))
        elif isinstance(item, str):
            print(item)
        elif isinstance(item, ByCategory):
            print_by_category(item.table, item.columns, item.title, item.where)
        else:
            frame, title = item
            print_table(frame, title)


# -- sharding ------------------------------------------------------------------------------------
def part_path(out: Path, rank: int, world: int, stage: str = "") -> Path:
    """Rank ``rank``'s part of a ``world``-process run under ``out`` (of stage ``stage``, a study
    that values its roots in stages: ``STAGE-rank-R-of-W.json``)."""
    return Path(out) / "parts" / f"{stage + '-' if stage else ''}rank-{rank}-of-{world}.json"


def run_key(study: Study, config, world: int, stage: str = "", depends: str = "", code: str | None = None) -> str:
    """sha256 of the study, its config (without ``out`` and ``quiet``), ``world``, ``stage``,
    ``depends`` (what a stage's values depend on beyond the config and their root: an earlier
    stage's values, a file's content) and the code that values the roots (``code``, default
    ``lab_code_digest()``: every module of ``simlab``, ``backends`` and ``analyses``): a part is
    reused only by a run of the same key, so an edit to any of that code starts the parts afresh.
    What the config names but does not hold (a capture's roots, a prompt file's text) is checked
    root by root (``root_identity``)."""
    fields = {k: v for k, v in asdict(config).items() if k not in ("out", "quiet")}
    code = lab_code_digest() if code is None else code
    text = json.dumps(
        {"prog": study.prog, "config": fields, "world": world, "stage": stage, "depends": depends, "code": code},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def lab_code_digest() -> str:
    """sha256 (hex) over the source of every module of the ``simlab``, ``backends`` and ``analyses``
    packages (each file's path in its package and its content's digest, in a fixed order)."""
    import analyses
    import backends
    import simlab

    hasher = hashlib.sha256()
    for package in (simlab, backends, analyses):
        top = Path(package.__file__).parent
        for path in sorted(top.rglob("*.py")):
            hasher.update(f"{package.__name__}/{path.relative_to(top).as_posix()}".encode())
            hasher.update(hashlib.sha256(path.read_bytes()).digest())
    return hasher.hexdigest()


def root_identity(task: RootTask) -> str:
    """sha256 (hex, 16 digits) of a task's setting, root id and root context: a part's value of root
    index i is used only while the run's root i is this same root (a capture recaptured or a prompt
    file edited under the same flags gives other roots, which are valued again)."""
    root = task.root
    head = json.dumps([getattr(task.setting, "name", str(task.setting)), getattr(root, "root", None)])
    context = np.asarray(getattr(root, "context", ()), dtype=np.int64).tobytes()
    return hashlib.sha256(head.encode() + context).hexdigest()[:16]


def json_plain(value):
    """``json.dumps``' ``default``: a NumPy array as a list, a NumPy bool, integer or float scalar as
    the Python value it holds (float64 exactly), so a part read back gives the same numbers.

    Raises:
        TypeError: ``payload: ...`` for any other type (not JSON).
    """
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"payload: {type(value).__name__} is not JSON")


_MISSING, _UNREADABLE = "missing", "unreadable"


def _load_part(path: Path):
    """The JSON at ``path``, or ``_MISSING`` (no file) or ``_UNREADABLE`` (not JSON)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return _MISSING
    except OSError:
        return _UNREADABLE
    try:
        return json.loads(text)
    except ValueError:
        return _UNREADABLE


def _of_run(raw, key: str) -> dict | None:
    return raw if isinstance(raw, dict) and raw.get("key") == key else None


def read_part(path: Path, key: str) -> dict | None:
    """The part at ``path`` (``{"key", "rank", "world", "complete", "roots": {index: payload}}``)
    when it is readable and of run ``key``, else None."""
    return _of_run(_load_part(path), key)


def write_part(path: Path, part: dict) -> None:
    """Write ``part`` to ``path`` atomically (``simlab.files.atomic_write``)."""
    from simlab.files import atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(part, default=json_plain)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


def value_share(
    study: Study, config, opened: Opened, rank: int, world: int, say, stage: str = "", key: str | None = None
) -> dict:
    """Value rank ``rank``'s roots (``index % world == rank``) into its part (of ``stage``: a study
    that values its roots in stages), resuming from the part on disk (a root is reused only where
    its ``root_identity`` is the run's); returns the complete part.  ``key``: the run's
    (default ``run_key(study, config, world, stage)``)."""
    from simlab.files import remove_stale_staging

    key = run_key(study, config, world, stage) if key is None else key
    path = part_path(opened.out, rank, world, stage)
    if path.parent.is_dir():
        remove_stale_staging(path.parent)  # a part's staging file left by a killed process
    part = read_part(path, key) or {"key": key, "rank": rank, "world": world, "complete": False, "roots": {}, "ids": {}}
    mine = {
        str(t.index): (t, root_identity(t))
        for t in sampled_tasks(opened, "sampling roots" if world == 1 else f"rank {rank} sampling roots", config)
        if t.index % world == rank
    }
    kept = {i: v for i, v in part["roots"].items() if i in mine and part.get("ids", {}).get(i) == mine[i][1]}
    if part["complete"] and len(kept) == len(mine) == len(part["roots"]):
        say(f"rank {rank} of {world}: part {path} is complete; nothing to value")
        return part
    if kept:
        say(f"rank {rank} of {world}: resuming {path} ({len(kept)} roots already valued)")
    part = {**part, "complete": False, "roots": kept, "ids": {i: mine[i][1] for i in kept}}
    fresh, written = 0, time.monotonic()
    quiet = getattr(config, "quiet", False)
    desc = ("roots" if world == 1 else f"rank {rank} roots") + (f" ({stage})" if stage else "")
    with progress_bar(total=len(mine), initial=len(kept), desc=desc, unit="root", quiet=quiet) as bar:
        for i, (task, identity) in mine.items():
            if i in part["roots"]:
                continue
            part["roots"][i] = study.value_root(config, opened, task)
            part["ids"][i] = identity
            fresh += 1
            bar.update()
            if fresh % SHARD_BATCH == 0 or time.monotonic() - written >= SHARD_SECONDS:
                write_part(path, part)
                written = time.monotonic()
    part["complete"] = True
    write_part(path, part)
    return part


def merge_parts(study: Study, config, opened: Opened, world: int, wait: float, say, stage: str = "", key: str | None = None):
    """Wait (at most ``wait`` seconds) until the ``world`` parts of this run (of ``stage``; ``key``
    as ``value_share``'s) are complete and hold exactly the run's roots (each rank's share, by
    ``root_identity``); the values of every root in index order (``study.merge``)."""
    key = run_key(study, config, world, stage) if key is None else key
    expected = {str(t.index): root_identity(t) for t in tasks(opened)}
    deadline, told = time.monotonic() + wait, None
    while True:
        raws = [_load_part(part_path(opened.out, r, world, stage)) for r in range(world)]
        parts = [_of_run(raw, key) for raw in raws]
        missing = [r for r, p in enumerate(parts) if not _holds_share(p, r, world, expected)]
        if not missing:
            break
        states = {r: part_state(raws[r], key, r, world, expected, Path(opened.out), stage) for r in missing}
        text = "; ".join(f"rank {r}: {said}" for r, (_, said) in states.items())
        if time.monotonic() > deadline:
            raise ValueError(
                f"WORLD_SIZE: ranks {', '.join(map(str, missing))} of {world} left no complete {stage + ' ' if stage else ''}"
                "part of this run's roots "
                f"under {Path(opened.out) / 'parts'} ({text}; rerun them with the same flags; rank 0 rerun then merges)"
            )
        kinds = {r: kind for r, (kind, _) in states.items()}
        if kinds != told:  # said again only when a rank's state changes kind, not per root valued
            say(f"waiting for the parts of ranks {', '.join(map(str, missing))} of {world} ({text})")
            told = kinds
        time.sleep(1.0)
    payloads = {int(i): payload for p in parts for i, payload in p["roots"].items()}
    return study.merge(config, opened, [payloads[i] for i in sorted(payloads)])


def part_state(raw, key: str, rank: int, world: int, expected: dict, out: Path, stage: str = "") -> tuple[str, str]:
    """``(kind, text)``: why ``raw`` (rank ``rank``'s part as read, ``_load_part``) is not its
    complete share of ``expected`` (root index -> ``root_identity``) in run ``key`` of ``world``
    ranks under ``out``.  Kinds: ``none`` (no part yet; the text names parts of this rank left by a
    run of another WORLD_SIZE), ``unreadable``, ``other`` (another run's part: other flags or code),
    ``progress`` (the text counts the share's roots valued so far) and ``stale`` (complete, with
    roots the run no longer has: a prompt file or capture changed under the same flags)."""
    if raw == _MISSING:
        mine = part_path(out, rank, world, stage).name
        others = sorted(p.name for p in (out / "parts").glob(mine.replace(f"-of-{world}.json", "-of-*.json")) if p.name != mine)
        return "none", "no part yet" + (f" ({', '.join(others)} there: started with another WORLD_SIZE)" if others else "")
    if not isinstance(raw, dict):
        return "unreadable", "its part cannot be read (damaged): rerun it"
    if raw.get("key") != key:
        return "other", "its part is of another run (other flags or code): rerun it with this run's flags"
    share = {i: v for i, v in expected.items() if int(i) % world == rank}
    if not raw.get("complete"):
        done = sum(1 for i in raw.get("roots", {}) if i in share and raw.get("ids", {}).get(i) == share[i])
        return "progress", f"in progress, {done} of {len(share)} roots"
    return "stale", "its part holds other roots (the prompts or capture changed): rerun it"


def _holds_share(part: dict | None, rank: int, world: int, expected: dict) -> bool:
    """Whether ``part`` is complete and holds exactly rank ``rank``'s share of ``expected`` (root
    index -> ``root_identity``), each root the run's own."""
    if part is None or not part["complete"]:
        return False
    share = {i: v for i, v in expected.items() if int(i) % world == rank}
    return set(part["roots"]) == set(share) and all(part.get("ids", {}).get(i) == v for i, v in share.items())


def _sharded(study: Study, config, opened: Opened, rank: int, world: int, say):
    key = run_key(study, config, world)  # once: an edit to the code during the run does not orphan its own part
    value_share(study, config, opened, rank, world, say, key=key)
    if rank != 0:
        if not getattr(config, "quiet", False):
            print(f"wrote part {part_path(opened.out, rank, world)} (rank 0 merges)")
        return None
    return merge_parts(study, config, opened, world, shard_wait(), say, key=key)


def shard_wait() -> float:
    """``SIMLAB_SHARD_WAIT``: the seconds rank 0 (or a rank at a stage's end) waits for the other
    ranks' parts (default 86400).

    Raises:
        ValueError: ``SIMLAB_SHARD_WAIT: ...`` for a value that is not a number >= 0.
    """
    text = os.environ.get("SIMLAB_SHARD_WAIT", "86400")
    try:
        wait = float(text)
    except ValueError:
        wait = -1.0
    if not wait >= 0:
        raise ValueError(f"SIMLAB_SHARD_WAIT: must be a number of seconds >= 0, got {text!r}")
    return wait


def live_timing_reason(config, parser: ToolParser) -> str | None:
    """A ``Study.shardable`` reason for a study that times live models: with ``--backend hf`` (not a
    capture) and ``--latency probe``, or (not a named pair, whose published profile prices it)
    neither ``--latency`` nor ``--cost-ratio`` given, each rank would time the models on its own
    machine, so the ranks' values would differ from one process's; else None.  The flags alone
    decide it."""
    live = getattr(config, "backend", None) == "hf" and not getattr(config, "capture", None)
    if live and getattr(config, "latency", None) == "probe":
        return "--latency probe: each rank would time the live models itself; pass --latency FILE or --cost-ratio"
    if live and not getattr(config, "pair", None) and not ({"latency", "cost_ratio"} & set(parser.given)):
        return "each rank would time the live models itself; pass --latency FILE or --cost-ratio"
    return None


def folder_only(prog: str, out: str) -> Opened:
    """``Opened`` for a study with no source of roots (it builds its own synthetic worlds or reads a
    file): no settings, no latency, and the output folder ``out`` prepared
    (``backends.cli.prepare_out``: exit 2 with one line when it cannot be written)."""
    from backends.cli import prepare_out

    return Opened(None, (), None, prepare_out(prog, out))


def no_roots(what: str) -> Callable:
    """A ``Study.shardable`` for a study that values no roots: it always refuses, with
    ``"the study values no roots: " + what`` (what it computes instead, in one process)."""
    return lambda config, opened, parser: f"the study values no roots: {what}"


def run_printing_study(study: Study, argv=None) -> int:
    """Run ``study``, a tool that prints its answer and writes no file, as ``run_study`` does but
    without ``--out``, publishing or the "wrote" line: the flags and refusals once (``parse``), its
    ``open``, ``values`` and ``run``, then ``report.printed`` on stdout (its ``outputs`` must be
    empty).  ``WORLD_SIZE`` > 1 is refused (``study.shardable``'s reason): there are no roots to
    share.  0 on success, 2 with one line on stderr for a bad flag or input (``study.error_flags``)."""
    return run_tool(study.prog, lambda: _run_printing(study, sys.argv[1:] if argv is None else argv))


def _run_printing(study: Study, argv) -> int:
    config, parser = parse(study, argv)
    say = lambda message: progress(study.prog, message, getattr(config, "quiet", False))
    try:
        world = shard_environment(os.environ)[1]  # RANK / WORLD_SIZE / LOCAL_RANK malformed: one line
        opened = study.open(config, parser, say)
        if world > 1:
            fail(study.prog, f"WORLD_SIZE: {world} processes cannot share this run ({study.shardable(config, opened, parser)})")
        report = study.run(config, opened, study.values(config, opened, say), say)
    except ValueError as exc:
        fail_from(study.prog, exc, parser, study.error_flags)
    if report.outputs or report.by_category is not None:
        raise TypeError(f"{study.prog}: a printing study's Report names no outputs")
    for item in report.printed:
        if isinstance(item, str):
            print(item)
        else:
            print_table(*item)
    return 0


STUDY_NAMES = {
    "prog": "PROG",
    "doc": "__doc__",
    "config_type": "Config",
    "flags": "flags",
    "config": "config_of",
    "open": "open_source",
    "value_root": "value_root",
    "merge": "merge",
    "run": "run",
    "values": "values",
    "sharded": "sharded",
    "shardable": "shardable",
    "hf_defaults": "HF_DEFAULTS",
}
"""``Study`` field -> the name a study module gives it (``declared``)."""


def declared(namespace: dict, **fields) -> Study:
    """The ``Study`` of a study module from its namespace (``globals()``), each field read under its
    conventional name (``STUDY_NAMES``: ``PROG``, ``__doc__``, ``Config``, ``flags``, ``config_of``,
    ``open_source``, ``value_root``, ``merge``, ``run``, ``values``, ``sharded``, ``shardable``, ``HF_DEFAULTS``);
    a name the module does not define keeps ``Study``'s default (None for ``value_root`` and
    ``merge``: a study whose ``shardable`` always refuses).  ``fields`` override or add fields
    (``drafters``, ``error_flags``, ``run=report``, ...)."""
    found = {name: namespace[key] for name, key in STUDY_NAMES.items() if key in namespace}
    return Study(**{"value_root": None, "merge": None, **found, **fields})


def titled(chart, width: int, height: int, title: str, subtitle: str):
    """``chart.properties(width=..., height=..., title=alt.TitleParams(title, subtitle=subtitle))``:
    an altair chart of ``width`` x ``height`` pixels (each facet's) under a title and subtitle."""
    import altair as alt

    return chart.properties(width=width, height=height, title=alt.TitleParams(title, subtitle=subtitle))


def flag_value(prog: str, parse: Callable, *args, **kwargs):
    """``parse(*args, **kwargs)`` (a flag's parser, e.g. ``backends.cli.int_list``), or exit 2 with
    one line (``backends.cli.fail``) carrying the ``ValueError``'s message, which names the flag."""
    try:
        return parse(*args, **kwargs)
    except ValueError as exc:
        fail(prog, str(exc))
