"""Capture p and q on draft trees from real models: ``python -m backends.capture``.

For each prompt, a continuation is sampled from the target (seeded per prompt); roots sit along
it (``backends.roots``: the prompt's end, then every ``--spacing`` tokens).  At each root a
draft tree is drawn from the draft model (``--shape``; seeded by (seed, root id)), then p and q
are evaluated at every node in one tree-attention forward per model.  What is stored and how
it is read back is the capture store's business (``backends.capture_store``); with ``--full``
both models' logits are kept and ``CapturedPair`` replays p and q bit for bit.

Flags as the studies spell them: ``--settings T``, ``T:top_p`` or ``T:top_p:top_k`` (one sampling
setting per capture folder; ``--temperature``, ``--top-p`` and ``--top-k`` give the same parts one
by one) and ``--roots-per-trajectory`` (also ``--roots-per-prompt``).  A verifier lossless only for
a greedy target is labelled (``--labels``) only where ``SamplingSettings.greedy`` holds, the lab's
one definition of a greedy target (``label_refusal``).

``--shape grid`` captures the trees behind the action-grid studies (``compare_verifiers``,
``train_selector``): at each root, ``--samples`` trees ``Delayed(width, L1, depth)`` for every
L1 in 0..depth (``simlab.grid.draw_grid``); the node rows then cover the union of their
nodes, once each.  ``--labels specinfer,spectr,...`` also values every action of the grid
{1..width} x {0..depth}^2 for those verifiers while p and q are in memory
(``simlab.labels.grid_labels``, the studies' own label function) and stores the labels
(``labels-r*.parquet``) beside the per-node summaries, so a capture without ``--full`` (no
logits: about 1 GB per root at V = 128,000) still carries everything the selector needs.

Resumable: a killed run (even SIGKILL) rerun with the same command skips the roots already
captured and produces no duplicate and no missing rows, because every root is seeded by
(seed, root id) alone; staging files the killed run left are removed.  A root counts as captured
when its files pass ``capture_store.check_root`` (read back as the readers need them, the logits'
compressed data included, and holding the root their names say); a damaged one is captured again,
with one line saying so, and a file drawn under other settings stops the run with one line.  The models are part of the settings: ``model_fingerprints`` records which
target and draft a capture is drawn from (their files' digest, or a hub id's commit), and a resume
whose models differ is refused naming which; a local model folder is recorded as an absolute path
(``absolute_models``), and the studies that reopen a capture's models open them as the capture did,
checking their fingerprints (``open_captured_pair``).  Every path the run reads (the prompt file,
local model folders) is checked before anything is created (``check_inputs``).

Evaluation (``--evaluation cached`` / ``forward``, ``--roots-per-forward``), sharding under ``torchrun``,
locking, out-of-memory retries, ``--labels-engine torch`` and the memory figures: ``docs/derivations/capture.md``.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

from backends import capture_store as store
from backends import pretrained
from backends.capture_lock import CaptureLock
from backends.cli import (
    ToolParser,
    check_flags,
    fail_from,
    name_list,
    prepare_out,
    progress_bar,
    shard_device,
    shard_environment,
    slow_step,
)
from backends.hf import check_model_folder, oom_errors
from backends.pretrained import DEFAULT_DRAFT, PAIRS, open_pair, parse_draft
from backends.roots import prompt_roots, prompt_texts, prompts_digest, read_prompt_records
from simlab import tree_verifiers
from simlab.builders import Delayed
from simlab.checks import check_device
from simlab.pairs import TRAJECTORY_METHODS
from simlab.grid import draw_grid, draw_grids
from simlab.drafting import Drafting, lossless_pairing
from simlab.errors import ArgumentError, CaptureError, argument_of
from simlab.labels import grid_labels, verifier_Ks
from simlab.device_rows import SUMMARY_COLUMNS, summaries
from simlab.distributions import top_ranked
from simlab.measures import node_divergences
from simlab.sampling import SamplingSettings, Stream, seeded_rng
from simlab.trees import DraftTree, NodeTable

PROG = "python -m backends.capture"
SHAPES = store.SHAPES


def multiplicity(tree, path) -> int:
    """Drafts through a node: its count in the parent's child list (1 at the root)."""
    return tree.child_list(path[:-1]).count(path[-1]) if path else 1


def draft_root(pair, settings: store.CaptureSettings, root_id: int, context: tuple[int, ...]):
    """(tree, grid drafts or None, table) at one root, seeded by (seed, root id) alone; the table
    holds the logits of every node a child was drafted from (float32, ``rows="logits"``)."""
    rng = seeded_rng(settings.seed, Stream.TREE, root_id)
    table = NodeTable(pair, context, rows="logits")  # float32 logits, not float64 rows: the same draws in half the memory
    if settings.shape == "grid":
        axes = settings.grid_axes()
        drafts = draw_grid(
            table, K_max=axes.width, L1_values=axes.L1_values, L2_max=axes.depth, samples=settings.samples, rng=rng
        )
        return union_tree(drafts), drafts, table
    return settings.tree_shape().sample(table, rng), None, table


def label_engine(device, choice: str) -> str:
    """``--labels-engine``: ``numpy``, ``torch``, or ``auto`` (the batched torch engine where the
    models run on CUDA, the numpy reference on a CPU), for models on ``device``."""
    if choice != "auto":
        return choice
    return "torch" if str(device).startswith("cuda") else "numpy"


def label_refusal(name: str, width: int, sampling: SamplingSettings) -> str | None:
    """Why ``--labels`` cannot label the grid with verifier ``name`` (its trees' children are i.i.d.
    draws from q: one per trunk and branch node, K at the branch point) at the sampling settings
    ``sampling``, or None: refused before any model is loaded, as ``grid_labels`` would refuse at
    the first root.  A verifier that needs a greedy target (``needs_greedy_target``) is refused
    unless ``sampling.greedy``, the lab's one definition of a greedy target (``simlab.sampling``)."""
    verifier = tree_verifiers.get(name)
    for K in {1, *verifier_Ks(name, range(1, width + 1))}:
        if not lossless_pairing(verifier.lossless_for, Drafting.IID, K):
            return (
                f"--labels: {name} is not lossless for the grid's i.i.d. children (K = {K}); it is lossless for "
                f"{', '.join(sorted(law.value for law in verifier.lossless_for))}"
            )
    if verifier.needs_greedy_target and not sampling.greedy:
        return f"--labels: {name} is lossless only for a greedy target (--settings 0), not at {sampling.name}"
    return None


def resident_logits(pair, engine: str) -> bool:
    """Whether the capture keeps the logits on the models' device: with the torch label engine, a
    pair that offers it and settings that allow it (``HFPair.resident_possible``: no top-p)."""
    return engine == "torch" and hasattr(pair, "resident_possible") and pair.resident_possible()


SUMMARY_CHUNK = 64
"""Nodes per batch of device-side summaries (2 x 64 x V float64: 131 MB at V = 128,000)."""


def node_rows(table: NodeTable, nodes, top: int) -> list[dict]:
    """Per node: ``simlab.measures.node_divergences`` and the ``top`` most probable tokens of p and
    q (stable order: lowest ids first among ties); on the device, in chunks, when every node's
    logits are resident there (``simlab.device_rows.summaries``), else node by node on the host."""
    if not (nodes and all(table.resident(path) for path in nodes)):
        out = []
        for path in nodes:
            p, q = table.p(path), table.q(path)
            order_p, order_q = top_ranked(p, top), top_ranked(q, top)  # np.argsort(-p, kind="stable")[:top]
            out.append(
                {
                    **node_divergences(p, q),
                    "p_top_ids": order_p.tolist(),
                    "p_top_probs": p[order_p].tolist(),
                    "q_top_ids": order_q.tolist(),
                    "q_top_probs": q[order_q].tolist(),
                }
            )
        return out
    out = []
    for start in range(0, len(nodes), SUMMARY_CHUNK):
        part = summaries(*table.torch_rows(nodes[start : start + SUMMARY_CHUNK]), top)
        for j in range(len(part["l1"])):
            out.append(
                {
                    **{name: float(part[name][j]) for name in SUMMARY_COLUMNS},
                    **{name: part[name][j].tolist() for name in ("p_top_ids", "p_top_probs", "q_top_ids", "q_top_probs")},
                }
            )
    return out


def capture_group(pair, settings: store.CaptureSettings, group, max_batch: int, max_tokens: int, engine: str = "numpy"):
    """One (rows, logits or None, drafts or None, labels or None) per root of ``group`` (a list of
    (root id, prompt index, context)): draw each root's tree (its drafting table keeps the logits
    of every node a child was drawn from, so the stored q is the q the children were drawn
    from), evaluate the nodes it lacks, the leaves, and with ``--labels`` value each root's grid
    (``engine``: ``simlab.labels.grid_labels`` on the models' device; the verifiers the torch
    engine does not serve use numpy).

    ``settings.evaluation``: ``"cached"``: the group's roots share a ``backends.tree_cache.
    TreeSession`` (one batch row each, KV caches kept), grid trees are drawn in lockstep
    (``simlab.grid.draw_grids``: one forward per model and level for the whole group) and
    the leaves come from the same caches, so every node is evaluated once; other shapes use one
    session per root.  ``"forward"``: each root's levels are tree forwards that evaluate the
    ancestors again, and the leaves are evaluated by ``HFPair.forest_logits`` (``max_tokens``
    per forward; ``roots_per_forward`` 1: one tree forward per root).  ``max_batch``: tree tokens
    per root and forward."""
    if resident_logits(pair, engine):
        pair = pair.with_resident_logits()
    drafting = pair if max_batch == pair.max_batch else pair.with_max_batch(max_batch)  # an OOM retry drafts smaller too
    if settings.evaluation == "cached":
        drafted = draft_cached(drafting, settings, group)
    else:
        drafted = draft_forward(drafting, settings, group, max_tokens)
    return [
        finish_root(pair, settings, *root, tree, drafts, table, engine) for root, (tree, drafts, table) in zip(group, drafted)
    ]


def draft_forward(pair, settings: store.CaptureSettings, group, max_tokens: int):
    """(tree, grid drafts or None, table) per root by ``--evaluation forward`` (``capture_group``):
    each root drafted alone, then the leaves of the group's trees in ``forest_logits`` packs."""
    drafted = [draft_root(pair, settings, root_id, context) for root_id, _, context in group]
    leaves = [
        (context, [n for n in tree.nodes() if not table.known(n)]) for (_, _, context), (tree, _, table) in zip(group, drafted)
    ]
    if settings.roots_per_forward > 1:
        logits = pair.forest_logits(leaves, max_tokens=max_tokens, max_batch=pair.max_batch)
    else:
        logits = [pair.node_logits(context, paths) for context, paths in leaves]
    for (_, paths), (_, _, table), both in zip(leaves, drafted, logits):
        table.add_logits(paths, *both)
    return drafted


def draft_cached(pair, settings: store.CaptureSettings, group):
    """(tree, grid drafts or None, table) per root by ``--evaluation cached``, every node evaluated once
    (``capture_group``)."""
    contexts = [context for _, _, context in group]
    if settings.shape != "grid":  # one session per root: its shape draws level by level on its own
        drafted = [draft_root(pair.session([context]).member(0), settings, root_id, context) for root_id, _, context in group]
        for tree, _, table in drafted:
            table.fetch(tree.nodes())  # the leaves, from the same caches
        return drafted
    session = pair.session(contexts)
    tables = [NodeTable(session.member(b), context, rows="logits") for b, context in enumerate(contexts)]

    def fetch(frontiers):  # every root's next nodes in one forward per model
        for table, paths, both in zip(tables, frontiers, session.logits(frontiers)):
            table.add_logits(paths, *both)

    rngs = [seeded_rng(settings.seed, Stream.TREE, root_id) for root_id, _, _ in group]  # as draft_root's: (seed, root id) alone
    axes = settings.grid_axes()
    every = draw_grids(
        tables, rngs, fetch=fetch, K_max=axes.width, L1_values=axes.L1_values, L2_max=axes.depth, samples=settings.samples
    )
    drafted = [(union_tree(drafts), drafts, table) for drafts, table in zip(every, tables)]
    fetch([[n for n in tree.nodes() if not table.known(n)] for tree, _, table in drafted])  # the leaves
    return drafted


def finish_root(
    pair,
    settings: store.CaptureSettings,
    root_id: int,
    prompt_index: int,
    context: tuple[int, ...],
    tree,
    drafts,
    table: NodeTable,
    engine: str = "numpy",
):
    """(rows, logits or None, drafts, labels or None) of one root from the logits of every node of
    its tree in ``table`` (p and q computed per node, never all at once; the logits ``--full``
    stores, so labels replay equal)."""
    nodes = tree.nodes()
    labels = None
    if settings.labels:
        axes = settings.grid_axes()
        labels = [
            {"root": root_id, "prompt": prompt_index, **row}
            for row in grid_labels(
                table,
                drafts,
                settings.labels.split(","),
                K_values=axes.K_values,
                L2_values=axes.L2_values,
                engine=engine,
                device=pair.device,
                stream=True,
            )
        ]
    rows = []
    for path, summary in zip(nodes, node_rows(table, nodes, settings.store_top)):
        rows.append(
            {
                "root": root_id,
                "prompt": prompt_index,
                "position": len(context),
                "root_context": list(context),
                "path": list(path),
                "depth": len(path),
                "token": path[-1] if path else -1,
                "multiplicity": multiplicity(tree, path) if drafts is None else 1,
                "children": len(tree.child_list(path)),
                **summary,
            }
        )
    return rows, (table.logits(nodes) if settings.full else None), drafts, labels


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


FROM_TARGET = store.FROM_TARGET
"""The draft fingerprint of a named pair's draft computed from the target's own weights by its spec
(``early-exit:L``, ``quant:B:G``): the target's fingerprint and the spec (``draft``) determine it."""
SKIPPED_FILES = ("manifest.json",)
"""Files of a model folder the fingerprint leaves out: the lab's record of how the folder was made
(its timings differ between bit-identical builds); hidden files and ``*.md`` are left out too."""


def folder_fingerprint(folder) -> str:
    """``"sha256:<hex>"``: SHA-256 over the sorted names, sizes and SHA-256 digests of the files at the
    top of a model folder (config, weights, tokenizer: every regular file but hidden ones, ``*.md``
    and ``SKIPPED_FILES``; symbolic links followed).  Cost: one read of every file on one core, about
    1 s per 0.5 GB (measured: 1.1 s for SmolLM2-135M's 538 MB converted folder on a shared 2-core
    machine; about 30 s for a 16 GB model), once per run after the models load.

    Raises:
        ValueError: ``folder: ...`` for a folder that cannot be read.
    """
    digest = hashlib.sha256()
    try:
        files = sorted(f for f in Path(folder).iterdir() if f.is_file() and not f.name.startswith(".") and f.suffix != ".md")
        for file in files:
            if file.name in SKIPPED_FILES:
                continue
            inner = hashlib.sha256()
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 22), b""):
                    inner.update(block)
            digest.update(f"{file.name}\0{file.stat().st_size}\0{inner.hexdigest()}\n".encode())
    except OSError as exc:
        raise ArgumentError("folder", f"cannot read the model folder {str(folder)!r} ({exc.strerror or exc})") from None
    return f"sha256:{digest.hexdigest()}"


def hub_fingerprint(name: str, what: str) -> str:
    """``"hub:<commit>"``: the commit of hub model ``name`` that the Hugging Face cache holds for its
    default branch (the one a load just resolved; no network).

    Raises:
        ValueError: ``<what>: ...`` where the cache holds no config.json of ``name``.
    """
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(name, "config.json")
    commit = Path(found).parent.name if isinstance(found, str) else ""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ArgumentError(
            what,
            f"cannot tell which commit of the hub model {name!r} was loaded (the Hugging Face cache holds no "
            "config.json of it); download it into a folder and pass the folder",
        )
    return f"hub:{commit}"


def model_fingerprints(settings: store.CaptureSettings) -> dict[str, str]:
    """``target_fingerprint`` and ``draft_fingerprint`` of the models ``settings`` names, as loaded:
    a local folder's ``folder_fingerprint``, a hub id's ``hub_fingerprint``; a named pair's target is
    its converted folder (``backends.pretrained.target_folder``), its adapter draft the folder it
    loads from (``backends.pretrained.adapter_folder``: a draft trained into the user cache shadows
    a shipped one), its other drafts ``FROM_TARGET``.  Called once the models are loaded (a hub
    commit is known then, and a named pair's target folder exists); cost: ``folder_fingerprint``.

    Raises:
        ValueError: ``target: ...`` or ``draft: ...`` for a model that cannot be fingerprinted.
    """

    def folder(path: Path, what: str) -> str:
        try:
            return folder_fingerprint(path)
        except ArgumentError as exc:
            raise exc.renamed(what) from None

    def of(name: str, what: str) -> str:
        return folder(Path(name).expanduser(), what) if check_model_folder(name, what) else hub_fingerprint(name, what)

    if settings.pair:
        target_dir, draft_dir = pretrained.model_folders(settings.pair, settings.draft)
        draft = folder(draft_dir, "draft") if draft_dir is not None else FROM_TARGET
        return {"target_fingerprint": folder(target_dir, "target"), "draft_fingerprint": draft}
    return {"target_fingerprint": of(settings.target, "target"), "draft_fingerprint": of(settings.draft, "draft")}


def absolute_models(settings: store.CaptureSettings) -> store.CaptureSettings:
    """``settings`` with a local model folder given as a relative path (or with ``~``) made absolute
    against the current folder, so a study that opens the capture's models later, from another
    folder, opens the same ones; an absolute path, a hub id and a named pair's models unchanged.
    A resume of a capture that recorded a relative path compares it by the folder it names from
    the resuming run's folder (``capture_store.differing_settings``).

    Raises:
        ValueError: ``target: ...`` or ``draft: ...`` for a local name that is not a model folder.
    """
    if settings.pair:
        return settings

    def absolute(name: str, what: str) -> str:
        local = check_model_folder(name, what)
        return str(Path(name).expanduser().absolute()) if local and not Path(name).is_absolute() else name

    return replace(settings, target=absolute(settings.target, "target"), draft=absolute(settings.draft, "draft"))


def open_captured_pair(stored: store.CaptureSettings, device: str, note=None):
    """The ``HFPair`` of the models the capture with settings ``stored`` was drawn from, opened as the
    capture opens them (``open_pair`` with its dtype, sampling settings and ``trim_draft_vocab``), once
    their fingerprints (``model_fingerprints``, computed after the load) equal the ones the capture
    records (``capture_store.check_models``): for the studies that evaluate what a capture lacks
    (``analyses.sweep --fill``) or read the models' hidden states (``analyses.train_selector``).  A
    capture that records no fingerprints (made before them) is opened unchecked, and ``note`` (a
    callable taking one line, or None) is told so.  Cost: the load, then ``folder_fingerprint`` of
    each local folder.

    Raises:
        CaptureError: ``capture: ...`` for a model that differs from the captured one (naming which and
            both fingerprints), a model folder recorded as a relative path that names none from the
            current folder, or a model that cannot be opened or fingerprinted; ``device: ...``.
    """
    fingerprinted = bool(stored.target_fingerprint or stored.draft_fingerprint)
    if not stored.pair:
        for which in ("target", "draft"):
            name, fingerprint = getattr(stored, which), getattr(stored, f"{which}_fingerprint")
            if fingerprint.startswith("sha256:") and not Path(name).expanduser().is_absolute() and not Path(name).is_dir():
                raise CaptureError(
                    f"the capture records its {which} model folder as the relative path {name!r}, which names no "
                    f"folder from {os.getcwd()!r}; run from the folder the capture was made in"
                )
    try:
        pair = open_pair(
            stored.pair or None,
            stored.target or None,
            stored.draft,
            device=device,
            dtype=stored.dtype,
            settings=stored.sampling(),
            trim_draft_vocab=stored.trim_draft_vocab,
        )
        now = model_fingerprints(stored) if fingerprinted else {}
    except ValueError as exc:
        if argument_of(exc)[0] in OPENING_ARGUMENTS:
            raise CaptureError(f"opening the capture's models: {exc}") from None
        raise
    if fingerprinted:
        store.check_models(stored, now)
    elif note is not None:
        note(
            "note: the capture records no model fingerprints (made before them): its models are opened unchecked, "
            "as whatever its recorded paths hold now"
        )
    return pair


OPENING_ARGUMENTS = ("target", "draft", "trim_draft_vocab")
"""The arguments whose errors, opening a capture's models, mean those models cannot be opened
(``open_captured_pair`` reports them as the capture's: ``capture: opening the capture's models: ...``)."""


def check_inputs(settings: store.CaptureSettings) -> list:
    """The prompt records of ``settings`` (``backends.roots.read_prompt_records``), once every path the
    capture reads is checked: the prompt file (or set) and the local model folders
    (``backends.hf.check_model_folder``; a hub id and a named pair's models are checked as they load).
    Reads no weights and creates nothing.

    Raises:
        ValueError: ``prompts: ...``, ``target: ...`` or ``draft: ...``.
    """
    records = read_prompt_records(settings.prompts)
    if not settings.pair:
        check_model_folder(settings.target, "target")
        check_model_folder(settings.draft, "draft")
    return records


def run_settings(settings: store.CaptureSettings, records: list, device: str, labels_engine: str) -> store.CaptureSettings:
    """The settings a run records: ``settings`` with its local model folders as absolute paths
    (``absolute_models``), the digest of its prompt records (``backends.roots.prompts_digest``) and, with ``--labels``, the label engine ``labels_engine``
    resolves to on ``device``."""
    engine = label_engine(check_device(device, "device"), labels_engine) if settings.labels else ""
    return replace(absolute_models(settings), prompts_sha256=prompts_digest(records), labels_engine=engine)


def run(
    settings: store.CaptureSettings,
    out: Path,
    *,
    device: str = "auto",
    quiet: bool = False,
    rank: int = 0,
    world: int = 1,
    labels_engine: str = "auto",
) -> int:
    """Capture every root of this process's share not already in ``out``; returns roots captured.

    Every path it reads is checked before ``out`` is created (``check_inputs``).  The folder is held
    (``backends.capture_lock``) from the first check of its settings to the last shard; settings.json
    is claimed (``capture_store.claim_settings``: written if absent, else compared, the models'
    fingerprints included) by every rank once its models are loaded, before its first shard, and
    checked unchanged before each group's shards, which record its hash.

    Raises:
        ValueError: naming the argument (``prompts``, ``target``, ``draft``, ``device``, ``out``...);
            ``out: ...`` for a folder another run holds, one with other settings or models, or one
            that cannot be resumed (``capture_store.check_legacy``); ``capture: ...`` for a captured
            root drawn under other settings.
    """
    records = check_inputs(settings)
    settings = run_settings(settings, records, device, labels_engine)
    Path(out).mkdir(parents=True, exist_ok=True)
    with CaptureLock(
        out, rank, world, store.settings_hash(settings), note=lambda line: print(f"{PROG}: {line}", file=sys.stderr)
    ):
        store.check_resumable(out, settings)  # before the models load: a wrong folder is refused at once
        note = store.check_legacy(out)
        if note:
            print(f"{PROG}: {note}", file=sys.stderr)
        return _capture(settings, records, out, device, quiet, rank, world)


def _capture(settings: store.CaptureSettings, records: list, out: Path, device: str, quiet: bool, rank: int, world: int) -> int:
    """``run``'s work, the folder held: load the models, claim the settings, capture this rank's groups."""
    with slow_step(PROG, f"loading {settings.pair or settings.target} and {settings.draft}", quiet):
        pair = open_pair(
            settings.pair,
            settings.target,
            settings.draft,
            device=device,
            dtype=settings.dtype,
            settings=settings.sampling(),
            trim_draft_vocab=settings.trim_draft_vocab,
        )
    if settings.trim_draft_vocab:
        if pair.draft_vocab_size <= pair.vocab_size:
            raise ValueError(
                f"trim_draft_vocab: the draft's vocabulary ({pair.draft_vocab_size} ids) is not larger than the "
                f"target's ({pair.vocab_size}); there is nothing to trim"
            )
        print(
            f"{PROG}: note: q is the draft's softmax over the target's {pair.vocab_size} ids of its {pair.draft_vocab_size}, "
            "renormalised (--trim-draft-vocab; recorded in settings.json)",
            file=sys.stderr,
        )
    with slow_step(PROG, "fingerprinting the models' files", quiet):
        settings = replace(settings, **model_fingerprints(settings))
    prompts = prompt_texts(pair, records)  # chat prompts in the target's template
    with slow_step(PROG, f"sampling the continuations of {len(prompts)} prompts", quiet):
        roots = list(
            prompt_roots(
                pair, prompts, settings.placement(), settings.seed, settings.tree_depth(), trajectory=settings.trajectory
            )
        )
    drawn_under = store.claim_settings(out, settings)  # every rank, before any shard
    G = settings.roots_per_forward
    groups = [roots[i : i + G] for i in range(0, len(roots), G)]  # fixed by root order: a resumed run forms the same groups
    mine = [g for j, g in enumerate(groups) if j % world == rank]
    with slow_step(PROG, "checking the roots captured already", quiet):
        done = captured_roots(out, [r[0] for g in mine for r in g], settings, drawn_under)
    todo = [g for g in mine if not all(r[0] in done for r in g)]
    if not mine:
        print(
            f"{PROG}: rank {rank} of {world} has nothing to do: {len(roots)} roots make {len(groups)} groups of up to {G} "
            f"(--roots-per-forward), fewer than the {world} ranks",
            file=sys.stderr,
        )
    elif not todo:
        print(
            f"{PROG}: rank {rank} of {world} has nothing to do: its {sum(len(g) for g in mine)} roots are captured already",
            file=sys.stderr,
        )
    captured, max_batch, max_tokens = 0, pair.max_batch, pair.forest_tokens
    bar = progress_bar(total=sum(len(g) for g in todo), desc="roots", unit="root", quiet=quiet)
    try:  # closed on every exit, so an error's line never shares the bar's
        for group in todo:
            while True:
                try:
                    results = capture_group(pair, settings, group, max_batch, max_tokens, settings.labels_engine or "numpy")
                    break
                except oom_errors():
                    if max_batch == 1 and max_tokens == 1:
                        raise
                    max_batch, max_tokens = max(1, max_batch // 2), max(1, max_tokens // 2)
                    _empty_cuda_cache()
                    print(
                        f"{PROG}: out of GPU memory at root {group[0][0]}; retrying with {max_batch} tree tokens per forward "
                        f"({max_tokens} per multi-root forward)",
                        file=sys.stderr,
                    )
            store.check_unchanged(out, drawn_under)
            for (root_id, prompt_index, context), (rows, logits, drafts, labels) in zip(group, results):
                if root_id in done:  # captured before a kill; its group is evaluated whole again
                    continue
                if logits is not None:
                    store.save_logits(out, root_id, *logits, settings_sha256=drawn_under)
                if drafts is not None:
                    store.save_drafts(out, root_id, prompt_index, context, drafts, settings_sha256=drawn_under)
                if labels is not None:
                    store.save_labels(out, root_id, labels, settings_sha256=drawn_under)
                store.save_nodes(
                    out,
                    root_id,
                    [{**row, "category": records[prompt_index].category} for row in rows],
                    settings_sha256=drawn_under,
                )
                captured += 1
            bar.update(len(group))
    finally:
        bar.close()
    return captured


def captured_roots(out: Path, roots, settings: store.CaptureSettings, drawn_under: str) -> set[int]:
    """The roots of ``roots`` captured in ``out`` already: those with a node shard whose files pass
    ``capture_store.check_root``; a damaged one is left out (captured again) with one line on stderr.

    Raises:
        capture_store.MixedCapture: a file of one of them drawn under other settings.
    """
    done = set()
    for root in roots:
        if not store.shard_path(out, root).exists():
            continue
        damage = store.check_root(out, root, settings, drawn_under)
        if damage is None:
            done.add(root)
        else:
            print(f"{PROG}: root {root} is damaged ({damage}); capturing it again", file=sys.stderr)
    return done


def _empty_cuda_cache():
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def parse_args(argv):
    parser = ToolParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=None, help="target model: local folder or hub id (or --pair)")
    parser.add_argument(
        "--draft",
        default=None,
        help="draft model: local folder or hub id (with --pair: its draft, early-exit:L, adapter:L or quant:B:G)",
    )
    parser.add_argument(
        "--pair",
        choices=list(PAIRS),
        default=None,
        help=f"a named pretrained pair instead of --target (backends.pretrained; --draft default {DEFAULT_DRAFT})",
    )
    parser.add_argument(
        "--prompts",
        required=True,
        help="prompt file: text (one per line) or .jsonl (prompt, category, chat), "
        "or a prompt set (backends.prompt_sets: workloads, long-context, code, seed-workloads)",
    )
    parser.add_argument("--out", required=True, help="output folder (resumes if it holds the same capture)")
    parser.add_argument(
        "--roots-per-trajectory",
        "--roots-per-prompt",
        dest="roots_per_prompt",
        type=int,
        default=4,
        help="roots along each prompt's continuation (the studies' spelling; --roots-per-prompt: the same)",
    )
    parser.add_argument("--spacing", type=int, default=8, help="tokens between roots")
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="iid",
        help="draft trees: iid, chain, delayed; grid: --samples trees Delayed(width, L1, depth) for every L1 in 0..depth",
    )
    parser.add_argument("--width", type=int, default=4, help="K (grid: the largest K)")
    parser.add_argument("--depth", type=int, default=4, help="tree depth in tokens (grid: the largest L1 and L2)")
    parser.add_argument("--samples", type=int, default=4, help="grid: trees per L1 and root (labels: E_se needs 4 or more)")
    parser.add_argument("--trunk", type=int, default=1, help="L1 of a delayed tree")
    parser.add_argument(
        "--settings",
        default=None,
        help="the capture's one sampling setting, as the studies spell it: T, T:top_p or T:top_p:top_k "
        "(e.g. 0.6, 1:0.9, 1::40; T = 0 is greedy; default 1, or --temperature, --top-p, --top-k)",
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy); or --settings")
    parser.add_argument("--top-p", type=float, default=None, help="nucleus threshold in (0, 1]; or --settings")
    parser.add_argument("--top-k", type=int, default=None, help="top-k truncation; or --settings")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="weights")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    parser.add_argument("--store-top", type=int, default=8, help="top ids and probabilities stored per node")
    parser.add_argument("--full", action="store_true", help="also store float32 logits of every node (replayable)")
    parser.add_argument(
        "--labels",
        default=None,
        help="--shape grid: label every root's grid at capture time for these "
        "verifiers (comma-separated; simlab.labels.grid_labels), stored beside the node summaries",
    )
    parser.add_argument(
        "--labels-engine",
        choices=["auto", "numpy", "torch"],
        default="auto",
        help="--labels: the label computation (auto: the batched torch engine on CUDA, numpy on a CPU; "
        "equal to 1e-12, not bit for bit)",
    )
    parser.add_argument(
        "--roots-per-forward",
        type=int,
        default=8,
        help="roots whose trees share each forward per model (cached: one batch row each, at every "
        "drafting level and for the leaves; forward: the leaves' masked forward; 1: one root per forward)",
    )
    parser.add_argument(
        "--evaluation",
        choices=["cached", "forward"],
        default="cached",
        help="cached: KV caches kept from level to level, every node evaluated once; forward: each "
        "drafting level a tree forward that evaluates the ancestors again (captures made before "
        "this flag; resume them with --evaluation forward)",
    )
    parser.add_argument(
        "--trajectory",
        choices=list(TRAJECTORY_METHODS),
        default="cached",
        help="the continuations' target p: cached, one-token forwards from the target's KV cache; forward, "
        "the whole context at every step (captures made before this flag; resume them with --trajectory forward)",
    )
    parser.add_argument(
        "--trim-draft-vocab",
        action="store_true",
        help="accept a draft whose vocabulary is larger than the target's: q is cut to the target's ids and "
        "renormalised (recorded in settings.json); without it such a pair is refused",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the continuations and the trees")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no progress lines")
    args = parser.parse_args(argv)
    check_flags(
        PROG,
        [
            (not (args.pair and args.target), "--target: --pair brings its own target; drop --target"),
            (bool(args.pair or args.target), "--target: give --target and --draft, or --pair"),
            (bool(args.pair or args.draft), "--draft: give --target and --draft, or --pair"),
            (args.width >= 1, "--width: must be >= 1"),
            (args.depth >= 1, "--depth: must be >= 1"),
            (args.shape != "delayed" or 0 <= args.trunk < args.depth, "--trunk: must lie in [0, depth)"),
            (args.store_top >= 1, "--store-top: must be >= 1"),
            (args.samples >= 1, "--samples: must be >= 1"),
            (args.roots_per_forward >= 1, f"--roots-per-forward: must be >= 1, got {args.roots_per_forward}"),
            (not {"samples"} & parser.given or args.shape == "grid", "--samples: only --shape grid draws several trees per root"),
            (not {"trunk"} & parser.given or args.shape == "delayed", "--trunk: only --shape delayed has a trunk"),
            (not args.labels or args.shape == "grid", "--labels: only --shape grid has a label grid"),
            (not {"labels_engine"} & parser.given or args.labels, "--labels-engine: only with --labels"),
            (args.labels is None or args.labels.strip(), "--labels: give at least one verifier"),
        ],
    )
    try:
        args.labels = ",".join(name_list(args.labels, "--labels", tree_verifiers.names())) if args.labels else ""
        sampling = sampling_flags(args, parser.given)
    except ValueError as exc:
        fail_from(PROG, exc, parser, {"top_k": "--top-k", "top_p": "--top-p"})
    args.temperature, args.top_p, args.top_k = sampling.temperature, sampling.top_p, sampling.top_k
    check_flags(
        PROG,
        [
            (reason is None, reason)
            for reason in [label_refusal(name, args.width, sampling) for name in args.labels.split(",") if name]
        ],
    )
    if args.pair:
        try:
            args.target, args.draft = "", parse_draft(args.draft, args.pair)
        except ValueError as exc:
            fail_from(PROG, exc, parser)
    settings = store.CaptureSettings(
        args.target,
        args.draft,
        args.prompts,
        args.roots_per_prompt,
        args.spacing,
        args.shape,
        args.width,
        args.depth,
        args.trunk,
        args.temperature,
        args.top_p,
        args.top_k,
        args.dtype,
        args.store_top,
        args.full,
        args.seed,
        samples=args.samples,
        labels=args.labels,
        roots_per_forward=args.roots_per_forward,
        evaluation=args.evaluation,
        trajectory=args.trajectory,
        trim_draft_vocab=args.trim_draft_vocab,
        pair=args.pair or "",
    )
    try:
        settings.sampling()
        settings.placement()
        seeded_rng(args.seed)
    except ValueError as exc:
        fail_from(PROG, exc, parser, {"roots_per_trajectory": "--roots-per-trajectory", "top_k": "--top-k", "top_p": "--top-p"})
    return settings, args.out, args.device, args.quiet, args.labels_engine, parser


SETTING_FLAGS = ("temperature", "top_p", "top_k")
"""The flags ``--settings`` stands for (each kept as the way to give one part of the setting)."""


def sampling_flags(args, given) -> SamplingSettings:
    """The capture's one sampling setting: ``--settings`` (one entry, parsed as the studies parse it:
    ``analyses._flags.parse_settings``), else ``--temperature``, ``--top-p`` and ``--top-k``.

    Args:
        args: the parsed flags (``settings``, ``temperature``, ``top_p``, ``top_k``).
        given: the dests written on the command line (``ToolParser.given``).

    Raises:
        ArgumentError: ``settings: ...`` for an entry that is not a setting, more than one setting
            (a capture folder holds one) or ``--settings`` given with one of ``SETTING_FLAGS``;
            ``temperature: ...``, ``top_k: ...`` or ``top_p: ...`` for a value out of range.
    """
    from simlab.sampling import parse_settings

    if args.settings is None:
        return SamplingSettings(args.temperature, args.top_k, args.top_p)
    also = [name for name in SETTING_FLAGS if name in given]
    if also:
        flag = "--" + also[0].replace("_", "-")
        raise ArgumentError("settings", f"gives the whole sampling setting; drop {flag} (or give {flag} without --settings)")
    parsed = parse_settings(args.settings)
    if len(parsed) != 1:
        raise ArgumentError(
            "settings",
            f"a capture folder holds one sampling setting, got {len(parsed)} ({', '.join(s.name for s in parsed)}); "
            "capture each setting into its own --out folder",
        )
    return parsed[0]


def main(argv=None) -> int:
    settings, out_arg, device, quiet, labels_engine, parser = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        rank, world, local = shard_environment(os.environ)
        check_inputs(settings)  # before --out is created
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    out = prepare_out(PROG, out_arg)
    device = shard_device(device, world, local)
    try:
        captured = run(settings, out, device=device, quiet=quiet, rank=rank, world=world, labels_engine=labels_engine)
    except ValueError as exc:
        fail_from(PROG, exc, parser)
    if not quiet:
        print(f"captured {captured} root{'' if captured == 1 else 's'} into {out} (rank {rank} of {world})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
