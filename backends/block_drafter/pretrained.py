"""The block drafter of a named pretrained pair: ``python -m backends.block_drafter --pair smollm2``.

* **Target**: ``backends.pretrained`` (the float32 copy in the user cache; ``layers``: its first
  layers only, a truncated copy of the real weights, for tests), frozen; feature layers
  ``backends.hf.feature_layers`` (1, 15, 30 on SmolLM2's 30 layers: after the first layer, the
  middle one, and the final norm, whose head gives p).
* **Data** (``Corpus``): ``backends.draft_corpus.plain_text`` (documentation and standard-library
  code, none of the shipped prompts' text), ``held_out_tokens + text_tokens`` ids in the seed's
  order; the first ``held_out_tokens`` are held out (the acceptance by slot is measured on
  ``held_out_roots`` roots there, prefixes of ``prefix`` tokens), the rest cut into rows of
  ``row_length`` whose target features are computed once (``train.FeatureRows``).  At most one
  document straddles the cut.  Plain text, not target-regenerated replies: the official losses'
  masks check the target's argmax, not the corpus token, so they train towards the target either way.
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

    def __post_init__(self):
        check_int(self.text_tokens, "text_tokens", 1)
        check_int(self.row_length, "row_length", 4)
        check_int(self.held_out_roots, "held_out_roots", 1)
        check_int(self.prefix, "prefix", 2)
        check_int(self.held_out_tokens, "held_out_tokens", self.prefix + 1)
        if self.text_tokens < self.row_length:
            raise ValueError(f"text_tokens: {self.text_tokens} tokens make no row of {self.row_length}")


def drafter_dir() -> Path:
    """The folder of the pretrained pair's trained block drafters (one sub-folder per variant)."""
    from backends.pretrained import cache_dir

    return cache_dir() / "block_drafter"


def training_data(tokenizer, corpus: Corpus, seed: int):
    """(rows int64 (n, row_length), held-out ids int64 (held_out_tokens,)) of ``corpus``.

    Raises:
        ValueError: ``text_tokens: ...`` when the text runs out before the ids asked for.
    """
    import torch

    from backends.draft_corpus import plain_text

    want = corpus.held_out_tokens + corpus.text_tokens
    ids = torch.tensor(plain_text(tokenizer, want, seed), dtype=torch.long)
    if len(ids) < want:
        raise ValueError(f"text_tokens: the plain text gives {len(ids)} ids, {want} asked for")
    train = ids[corpus.held_out_tokens :]
    n = len(train) // corpus.row_length
    return train[: n * corpus.row_length].view(n, corpus.row_length), ids[: corpus.held_out_tokens]


def train_named(name: str, variant: str, spec, seed: int, corpus: Corpus, log, layers: int | None = None) -> tuple:
    """(model, manifest) of ``variant`` trained for the named pair ``name`` (its target loaded by
    ``backends.pretrained``; ``layers``: its first ``layers`` only), as ``train_on``.

    Raises:
        ValueError: ``pair: ...`` (unknown name, target not loadable), or what ``train_on`` raises.
    """
    from backends.pretrained import PAIRS, load_target, target_folder

    if name not in PAIRS:
        raise ValueError(f"pair: unknown pair {name!r}; known: {', '.join(PAIRS)}")
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
    rows, held = training_data(tokenizer, corpus, seed)
    started = time.time()
    source = FeatureRows(target, feature_layers(target.config), rows, log=log)
    feature_seconds = time.time() - started
    model, info = fit(spec, variant, target, source, held, seed, log, name, roots=corpus.held_out_roots, prefix=corpus.prefix)
    info.update(
        target_layers=int(target.config.num_hidden_layers),
        data={
            "source": "backends.draft_corpus.plain_text (seeded order; the first held_out_tokens held out)",
            **vars(corpus),
            "rows": len(rows),
            "rows_sha256": digest(rows),
            "held_out_sha256": digest(held),
        },
        feature_seconds=round(feature_seconds, 1),
    )
    return model, info
