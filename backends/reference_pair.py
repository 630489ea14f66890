"""A real target/draft pair the lab can build offline: ``python -m backends.reference_pair``.

Trains, deterministically from a seed, a GPT-2-architecture target (4.2M parameters) and a
draft with under a tenth of its parameters, sharing one byte-level BPE tokenizer (Hugging Face
``tokenizers``, vocabulary 4096), on English text every Python ships: the documentation topics
of the standard library's ``pydoc_data`` (plus, with ``--stdlib-chars``, standard-library source code).  One
tenth of the documents is held out; the held-out perplexity of each model is reported.  Both
models are saved in Hugging Face format (``save_pretrained``) under the cache directory, with a
``manifest.json`` of the settings and results; ``backends.hf.HFPair`` loads them like any hub
model.  ``--micro`` builds the tiny pair the tests use (seconds, not minutes).

Reproducible: training pins torch's thread count (``--threads``, default 1: on a CPU the same
seed then gives the same weights on any machine of the same kind, and one thread is also the
faster choice on a shared machine) and the manifest records the torch version, the thread
count, the device and the CPU beside the seed, sizes and held-out perplexities.

No network is used at any point.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from backends.cli import ToolParser, fail, prepare_out
from backends.model_cache import cache_root
from simlab.checks import check_int, check_seed
from simlab.files import umask

PROG = "python -m backends.reference_pair"
DEFAULT_CACHE = cache_root() / "reference_pair"
"""``$SIMLAB_CACHE``, else ``$XDG_CACHE_HOME/simlab``, else ``~/.cache/simlab`` (``backends.model_cache.cache_root``), then ``reference_pair``."""


@dataclass(frozen=True)
class PairSpec:
    """Sizes and training budget of a reference pair (all counts in tokens or steps)."""

    vocab: int = 4096
    context: int = 64
    target_layers: int = 4
    target_width: int = 256
    target_heads: int = 4
    draft_layers: int = 1
    draft_width: int = 64
    draft_heads: int = 2
    steps: int = 900
    draft_steps: int = 600
    batch: int = 8
    learning_rate: float = 3e-3
    stdlib_chars: int = 0  # > 0 adds that many characters of standard-library source code
    pydoc_chars: int = 0  # 0: all of pydoc_data's topics

    @classmethod
    def micro(cls) -> "PairSpec":
        return cls(
            vocab=400,
            context=128,
            target_layers=2,
            target_width=48,
            target_heads=2,
            draft_layers=1,
            draft_width=16,
            draft_heads=1,
            steps=60,
            draft_steps=60,
            batch=16,
            learning_rate=1e-2,
            stdlib_chars=0,
            pydoc_chars=60_000,
        )


def corpus(stdlib_chars: int, pydoc_chars: int = 0) -> list[str]:
    """The training documents: pydoc topics (sorted by name; the first ``pydoc_chars`` characters'
    worth if > 0) and a prefix of the standard library's sources (``stdlib_chars``)."""
    import pydoc_data.topics as topics

    docs, total = [], 0
    for name in sorted(topics.topics):
        if pydoc_chars and total >= pydoc_chars:
            break
        docs.append(topics.topics[name])
        total += len(docs[-1])
    if stdlib_chars > 0:
        lib = Path(os.__file__).parent
        total = 0
        for path in sorted(lib.glob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            docs.append(text)
            total += len(text)
            if total >= stdlib_chars:
                break
    return docs


def split_corpus(spec: PairSpec, seed: int) -> tuple[list[str], list[str]]:
    """(training, held-out) documents of the pair built from ``spec`` and ``seed``: a seeded
    shuffle holds out one tenth (at least one) of ``corpus(spec.stdlib_chars, spec.pydoc_chars)``."""
    docs = corpus(spec.stdlib_chars, spec.pydoc_chars)
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    held = set(order[: max(1, len(docs) // 10)])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def encode_documents(tokenizer, texts: list[str]):
    """One long int64 tensor: each text's ids followed by the EOS id."""
    import torch

    ids = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
    return torch.tensor(ids, dtype=torch.long)


def train_tokenizer(docs: list[str], vocab: int):
    """A byte-level BPE tokenizer wrapped as a ``transformers`` fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=vocab, min_frequency=2, special_tokens=["<|endoftext|>"], show_progress=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )


def _model(spec: PairSpec, layers: int, width: int, heads: int, vocab: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab,
        n_positions=spec.context,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def _batches(ids, spec: PairSpec, rng: random.Random):
    import torch

    starts = [rng.randrange(0, len(ids) - spec.context - 1) for _ in range(spec.batch)]
    return torch.stack([ids[s : s + spec.context] for s in starts])


def _train(model, ids, spec: PairSpec, steps: int, seed: int, log, name: str):
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=spec.learning_rate, total_steps=steps, pct_start=0.1)
    model.train()
    for step in range(steps):
        batch = _batches(ids, spec, rng)
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"{name}: step {step + 1}/{steps} loss {loss.item():.3f}")
    model.eval()


def perplexity(model, ids, context: int) -> float:
    """Held-out perplexity over non-overlapping windows of ``context`` tokens."""
    import torch

    windows = [ids[i : i + context] for i in range(0, len(ids) - context, context)]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), 32):
            batch = torch.stack(windows[start : start + 32])
            total += model(batch, labels=batch).loss.item() * batch.shape[0]
            count += batch.shape[0]
    return math.exp(total / max(count, 1))


def machine() -> dict:
    """What the weights depend on besides the seed: torch version, threads, device, CPU."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": "cpu",
        "cpu": cpu,
        "machine": platform.machine(),
        "python": sys.version.split()[0],
    }


def build(out: Path, seed: int = 0, spec: PairSpec | None = None, log=print, threads: int | None = 1) -> dict:
    """Train and save the pair under ``out`` (``out/target``, ``out/draft``, ``out/manifest.json``).

    ``threads``: torch's intra-op thread count during training (None: leave it as it is); the
    previous count is restored afterwards.
    """
    import torch

    spec = spec or PairSpec()
    started = time.time()
    seed = check_seed(seed)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(check_int(threads, "threads", 1))
    try:
        return _build(out, seed, spec, log, started)
    finally:
        torch.set_num_threads(previous)


def _build(out: Path, seed: int, spec: PairSpec, log, started: float) -> dict:
    import torch

    torch.manual_seed(seed)
    train_docs, test_docs = split_corpus(spec, seed)
    tokenizer = train_tokenizer(train_docs, spec.vocab)
    train_ids, test_ids = encode_documents(tokenizer, train_docs), encode_documents(tokenizer, test_docs)
    vocab = len(tokenizer)
    log(
        f"corpus: {len(train_docs)} training and {len(test_docs)} held-out documents, "
        f"{len(train_ids)} / {len(test_ids)} tokens, vocabulary {vocab}"
    )
    results = {}
    for name, layers, width, heads, steps in (
        ("target", spec.target_layers, spec.target_width, spec.target_heads, spec.steps),
        ("draft", spec.draft_layers, spec.draft_width, spec.draft_heads, spec.draft_steps),
    ):
        model = _model(spec, layers, width, heads, vocab)
        params = sum(p.numel() for p in model.parameters())
        log(f"{name}: {params / 1e6:.2f}M parameters")
        _train(model, train_ids, spec, steps, seed + (0 if name == "target" else 1), log, name)
        ppl = perplexity(model, test_ids, spec.context)
        log(f"{name}: held-out perplexity {ppl:.1f}")
        path = out / name
        path.mkdir(parents=True, exist_ok=True)
        save_model(path, model, tokenizer)
        results[name] = {"parameters": params, "held_out_perplexity": ppl, "path": str(path)}
    manifest = {"seed": seed, "spec": asdict(spec), **machine(), "results": results, "seconds": round(time.time() - started, 1)}
    tmp = out / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, out / "manifest.json")
    return manifest


def random_pair(folder: Path, vocab: int) -> None:
    """Two randomly initialised GPT-2 models sharing a word-level tokenizer of ``vocab`` ids, saved
    under ``folder/target`` (4 layers x 256) and ``folder/draft`` (1 x 128), seeded, nothing
    downloaded: for throughput and memory measurements at vocabularies no trained pair here has
    (``scripts/gpu_bench.py``, ``scripts/capture_memory.py``); their distributions mean nothing."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    core = Tokenizer(models.WordLevel(words, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="t0", eos_token="t0", bos_token="t0")
    torch.manual_seed(0)
    for name, layers, width in (("target", 4, 256), ("draft", 1, 128)):
        config = GPT2Config(vocab_size=vocab, n_positions=256, n_embd=width, n_layer=layers, n_head=4)
        save_model(folder / name, GPT2LMHeadModel(config), tokenizer)


def save_model(folder: Path, model, tokenizer) -> None:
    """``save_pretrained`` of ``model`` and ``tokenizer`` into ``folder``, every file with the
    permissions of a normally created one (0666 less the umask; safetensors alone writes 0600)."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for file in Path(folder).iterdir():
        if file.is_file():
            os.chmod(file, 0o666 & ~umask())


def main(argv=None) -> int:
    parser = ToolParser(prog=PROG, description="Train the offline reference target/draft pair.")
    parser.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_CACHE}/seed<SEED>)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the corpus split and the training")
    parser.add_argument("--steps", type=int, default=None, help="training steps of each model (default 900 target, 600 draft)")
    parser.add_argument("--stdlib-chars", type=int, default=None, help="add this many characters of standard-library source")
    parser.add_argument("--threads", type=int, default=1, help="torch threads during training (the weights depend on it)")
    parser.add_argument("--micro", action="store_true", help="the tiny pair used by the tests (seconds)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.threads < 1:
        fail(PROG, f"--threads: must be >= 1, got {args.threads}")
    try:
        check_seed(args.seed)
    except ValueError as exc:
        fail(PROG, f"--{exc}")
    spec = PairSpec.micro() if args.micro else PairSpec()
    if args.steps is not None:
        if args.steps < 1:
            fail(PROG, f"--steps: must be >= 1, got {args.steps}")
        spec = PairSpec(**{**asdict(spec), "steps": args.steps, "draft_steps": args.steps})
    if args.stdlib_chars is not None:
        spec = PairSpec(**{**asdict(spec), "stdlib_chars": max(0, args.stdlib_chars)})
    out = prepare_out(
        PROG,
        args.out
        if args.out is not None
        else str(DEFAULT_CACHE / (f"micro-seed{args.seed}" if args.micro else f"seed{args.seed}")),
    )
    log = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    manifest = build(out, args.seed, spec, log, threads=args.threads)
    for name, result in manifest["results"].items():
        print(
            f"{name}: {result['parameters'] / 1e6:.2f}M parameters, held-out perplexity {result['held_out_perplexity']:.1f}, saved to {result['path']}"
        )
    print(
        f"took {manifest['seconds']} s on {manifest['threads']} thread(s), torch {manifest['torch']}; manifest: {out / 'manifest.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
