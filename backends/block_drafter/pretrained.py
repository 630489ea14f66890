"""The block drafter of a named pretrained pair: ``python -m backends.block_drafter --pair smollm2``.

* **Target**: ``backends.pretrained`` (the float32 copy in the user cache; ``layers``: its first
  layers only, a truncated copy of the real weights, for tests), frozen; feature layers
  ``backends.hf.feature_layers`` (1, 15, 30 on SmolLM2's 30 layers: after the first layer, the
  middle one, and the final norm, whose head gives p).
* **Data** (``Corpus``): the target's own replies, as the official drafter trains on
  target-regenerated answers: it answers ``prompts`` chat prompts (``backends.draft_corpus.
  training_prompts``, never the shipped ones) at T = 1, ``reply_tokens`` new tokens at most
  (``backends.train_draft.sample_replies``, seeded), and the conversations are followed by
  ``text_tokens`` ids of ``backends.draft_corpus.plain_text`` in the seed's order: the pydoc
  documentation only (``code=True``: standard-library code too), so that the source-code stream of
  ``analyses.specblock`` (``backends.roots.source_code_prompts``) stays a shifted domain, as it
  is for the reference pair's drafter.  The first ``held_out_tokens`` of that stream are held out (the
  conversations come first; the acceptance by slot is measured on ``held_out_roots`` roots there,
  prefixes of ``prefix`` tokens), the rest cut into rows of ``row_length`` whose target features
  are computed once (``train.FeatureRows``).  The official losses' masks check the target's
  argmax, not the corpus token, so the plain text trains towards the target too.
* **Drafter**: ``DrafterSpec.pretrained()`` (the target's width, two decoder layers with attention
  between the slots, as the official drafter), trained by ``train.Trainer``.
* **Where**: ``drafter_dir() / <variant>`` (``backends.pretrained.cache_dir() / "block_drafter"``),
  where the studies' ``--pair smollm2`` looks (``analyses._block_drafters``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simlab.checks import check_int


@dataclass(frozen=True)
class Corpus:
    """The training and held-out text of a named pair's drafter (module docstring), in tokens."""

    text_tokens: int = 32768
    held_out_tokens: int = 4096
    row_length: int = 256
    held_out_roots: int = 128
    prefix: int = 48
    prompts: int = 128
    reply_tokens: int = 128
    generate_batch: int = 32
    code: bool = False

    def __post_init__(self):
        check_int(self.text_tokens, "text_tokens", 1)
        check_int(self.prompts, "prompts", 0)
        check_int(self.reply_tokens, "reply_tokens", 1)
        check_int(self.generate_batch, "generate_batch", 1)
        check_int(self.row_length, "row_length", 4)
        check_int(self.held_out_roots, "held_out_roots", 1)
        check_int(self.prefix, "prefix", 2)
        check_int(self.held_out_tokens, "held_out_tokens", 1)
        if self.held_out_tokens < self.prefix + self.held_out_roots:
            raise ValueError(
                f"held_out_tokens: {self.held_out_roots} roots of {self.prefix}-token prefixes need at least "
                f"{self.prefix + self.held_out_roots} held-out tokens, got {self.held_out_tokens}"
            )
        if self.text_tokens < self.row_length:
            raise ValueError(f"text_tokens: {self.text_tokens} tokens make no row of {self.row_length}")


def drafter_dir() -> Path:
    """The folder of the pretrained pair's trained block drafters (one sub-folder per variant)."""
    from backends.pretrained import cache_dir

    return cache_dir() / "block_drafter"


def training_data(target, tokenizer, corpus: Corpus, seed: int, log=None):
    """(rows int64 (n, row_length), held-out ids int64 (held_out_tokens,), conversation tokens) of
    ``corpus`` (module docstring): ``target`` answers the prompts (a ``torch.Generator`` seeded with ``seed``).

    Raises:
        ValueError: ``text_tokens: ...`` when the text runs out, or the stream makes no training row.
    """
    import torch

    from backends.draft_corpus import plain_text, training_prompts
    from backends.train_draft import sample_replies

    conversations = []
    if corpus.prompts:
        generator = torch.Generator().manual_seed(seed)
        prompts = training_prompts(corpus.prompts, seed)
        conversations = sample_replies(target, tokenizer, prompts, corpus.reply_tokens, corpus.generate_batch, generator, log)
    text = plain_text(tokenizer, corpus.text_tokens, seed, code=corpus.code)
    if len(text) < corpus.text_tokens:
        raise ValueError(f"text_tokens: the plain text gives {len(text)} ids, {corpus.text_tokens} asked for")
    stream = torch.tensor([t for c in conversations for t in c] + text, dtype=torch.long)
    train = stream[corpus.held_out_tokens :]
    n = len(train) // corpus.row_length
    if n < 1:
        raise ValueError(f"text_tokens: {len(train)} training ids make no row of {corpus.row_length}")
    rows = train[: n * corpus.row_length].view(n, corpus.row_length)
    return rows, stream[: corpus.held_out_tokens], len(stream) - len(text)


def train_named(name: str, variant: str, spec, seed: int, corpus: Corpus, log, layers: int | None = None) -> tuple:
    """(model, manifest) of ``variant`` trained for the named pair ``name`` (its target loaded by
    ``backends.pretrained``; ``layers``: its first ``layers`` only), as ``train_on``.

    Raises:
        ValueError: ``pair: ...`` (unknown name, target not loadable), or what ``train_on`` raises.
    """
    from backends.pretrained import PAIRS, load_target, target_folder

    if name not in PAIRS:
        raise ValueError(f"pair: unknown pair {name!r}; known: {', '.join(PAIRS)}")
    if name != "smollm2":  # drafter_dir() and load_target(target_folder()) are SmolLM2's
        raise ValueError(f"pair: {name}: the block drafter is trained for smollm2 only so far")
    target, tokenizer = load_target(target_folder(log=log), layers=layers)
    return train_on(name, target, tokenizer, variant, spec, seed, corpus, log)


def train_on(name: str, target, tokenizer, variant: str, spec, seed: int, corpus: Corpus, log) -> tuple:
    """(model, manifest) of ``variant`` of ``spec`` trained on the loaded pretrained ``target`` (frozen
    here) and its ``tokenizer`` (module docstring; torch threads as the caller set them).

    Raises:
        ValueError: ``text_tokens: ...`` (too little text), or what ``train.Trainer`` raises.
    """
    import time

    from backends.block_drafter.train import FeatureRows, fit
    from backends.hf import feature_layers
    from backends.train_draft import digest

    for p in target.parameters():
        p.requires_grad_(False)
    started = time.time()
    rows, held, conversation_tokens = training_data(target, tokenizer, corpus, seed, log)
    data_seconds = time.time() - started
    started = time.time()
    source = FeatureRows(target, feature_layers(target.config), rows, log=log)
    feature_seconds = time.time() - started
    model, info = fit(spec, variant, target, source, held, seed, log, name, roots=corpus.held_out_roots, prefix=corpus.prefix)
    info.update(
        target_layers=int(target.config.num_hidden_layers),
        data={
            "source": "the target's T = 1 replies to backends.draft_corpus.training_prompts, then "
            "backends.draft_corpus.plain_text (seeded order; code: with standard-library code); the first "
            "held_out_tokens held out",
            **vars(corpus),
            "conversation_tokens": conversation_tokens,
            "rows": len(rows),
            "rows_sha256": digest(rows),
            "held_out_sha256": digest(held),
        },
        data_seconds=round(data_seconds, 1),
        feature_seconds=round(feature_seconds, 1),
    )
    return model, info
