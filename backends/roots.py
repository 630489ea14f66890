"""Where the roots sit: one placement rule for every source and the capture tool.

A **root** is a context at which a speculative step starts.  Roots lie on **trajectories**: a
trajectory is a prefix (a prompt's tokens for real models; for synthetic worlds the empty
context or one start token) followed by target-sampled tokens, one uniform of the trajectory's
generator per token.  With ``RootPlacement(roots_per_trajectory=R, spacing=s, first=f)``, the
trajectory samples ``f + s R`` tokens and its roots are the contexts of length

    len(prefix) + f + s j,   j = 0..R-1,

so every root is followed by at least ``s`` target tokens of its own trajectory (its reference
continuation).  Real prompts use ``f = 0`` (the prompt's end is the first root); synthetic
worlds use ``f = s`` (a trajectory from the start needs context before its first root).
Roots of one trajectory share a prefix, so splits by trajectory never share contexts.
Root ids are ``trajectory * R + j``; a root's **offset** is ``f + s j``, the target tokens between
its prefix and it (``RootPlacement.offset_of``, ``Root.offset``): for a chat prompt, offset 0 is
the end of the chat template (the assistant's turn just opened) and offset ``s j > 0`` lies
``s j`` tokens inside the target's own reply.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.prompt_sets import PROMPT_SETS, Prompt, prompt_set, read_prompt_file
from simlab.checks import check_generator, check_int
from simlab.pairs import ModelPair, check_context, target_trajectory
from simlab.sampling import Stream, seeded_rng


@dataclass(frozen=True)
class RootPlacement:
    """How many roots per trajectory and how far apart (tokens).

    Args:
        roots_per_trajectory: R >= 1.
        spacing: s >= 1 target tokens between consecutive roots.
        first: f >= 0 target tokens between the prefix and the first root.

    Raises:
        ValueError: ``roots_per_trajectory: ...``, ``spacing: ...`` or ``first: ...``.
    """

    roots_per_trajectory: int = 2
    spacing: int = 16
    first: int = 0

    def __post_init__(self):
        object.__setattr__(self, "roots_per_trajectory", check_int(self.roots_per_trajectory, "roots_per_trajectory", 1))
        object.__setattr__(self, "spacing", check_int(self.spacing, "spacing", 1))
        object.__setattr__(self, "first", check_int(self.first, "first", 0))

    @property
    def sampled(self) -> int:
        """Target tokens sampled after a trajectory's prefix: f + s R."""
        return self.first + self.spacing * self.roots_per_trajectory

    def offsets(self) -> list[int]:
        """Root context lengths after the prefix: f + s j for j = 0..R-1."""
        return [self.first + self.spacing * j for j in range(self.roots_per_trajectory)]

    def tokens_needed(self, prefix_length: int, depth: int) -> int:
        """The longest context a trajectory and a tree of ``depth`` below its last root need."""
        return prefix_length + self.sampled + depth

    def root_id(self, trajectory: int, j: int) -> int:
        return trajectory * self.roots_per_trajectory + j

    def offset_of(self, root_id: int) -> int:
        """The offset of root ``root_id`` (``root_id``'s j = ``root_id mod R``): f + s j target
        tokens after its trajectory's prefix (0: the root is the prefix's end).

        Raises:
            ValueError: ``root_id: ...`` below 0.
        """
        j = check_int(root_id, "root_id", 0) % self.roots_per_trajectory
        return self.first + self.spacing * j


def place_roots(
    pair: ModelPair,
    prefix,
    placement: RootPlacement,
    rng: np.random.Generator,
    trajectory: int = 0,
    whole: bool = True,
    method: str = "forward",
) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Sample one trajectory after ``prefix`` and yield ``(root id, root context)`` for its roots.

    The trajectory is sampled whole (``placement.sampled`` tokens, one uniform of ``rng`` each)
    before the first root is yielded; ``whole=False`` stops at the last root's context (the
    same roots, for a generator that serves this trajectory only: the tail's uniforms are then
    never used; with ``first = 0`` and one root, nothing is sampled).  ``method``: how the target's
    p is evaluated (``simlab.pairs.target_trajectory``: ``forward`` or ``cached``).

    Raises:
        ValueError: a bad prefix, placement, generator or method.
    """
    prefix = check_context(prefix, pair.vocab_size, "prefix")
    check_generator(rng)
    length = placement.sampled if whole else placement.offsets()[-1]
    tokens = target_trajectory(pair, length, rng, prefix=prefix, method=method)
    for j, offset in enumerate(placement.offsets()):
        yield placement.root_id(trajectory, j), tokens[: len(prefix) + offset]


SHIPPED_PROMPTS = Path(__file__).resolve().parent / "prompts" / "reference_prompts.txt"
"""The prompts shipped with the lab (the real-model sources' default trajectory prefixes)."""


def read_prompt_records(path) -> list[Prompt]:
    """Prompts from a text file (one per non-empty line), JSON lines (``prompt`` or ``text``, and
    optionally ``category``, a non-empty string, and ``chat``, a boolean), or a named prompt set
    (``backends.prompt_sets.PROMPT_SETS``, when no file of that name exists).

    Raises:
        ValueError: ``prompts: ...`` for a missing or unreadable file, no prompt in it, a JSON
            line without text, or a bad ``category`` or ``chat`` field.
    """
    if str(path) in PROMPT_SETS and not Path(path).exists():
        return prompt_set(str(path))
    return read_prompt_file(path)


def read_prompts(path) -> list[str]:
    """The texts of ``read_prompt_records(path)`` (no chat template applied)."""
    return [record.text for record in read_prompt_records(path)]


def chat_text(tokenizer, text: str) -> str:
    """``text`` as one user turn of ``tokenizer``'s chat template, with the assistant's turn opened
    (the text a chat prompt's root ends with)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)


def prompt_texts(pair, records: list[Prompt]) -> list[str]:
    """The text each prompt is encoded from: a ``chat`` prompt as one user turn of the target
    tokenizer's chat template, with the assistant's turn opened (``add_generation_prompt``);
    others as they are.

    Raises:
        ValueError: ``prompts: ...`` for a chat prompt when the target's tokenizer has no template.
    """
    out = []
    for i, record in enumerate(records):
        if not record.chat:
            out.append(record.text)
            continue
        tokenizer = getattr(pair, "target_tokenizer", None)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"prompts: prompt {i + 1} asks for the chat template, but the target's tokenizer has none")
        out.append(chat_text(tokenizer, record.text))
    return out


def prompts_digest(records: list[Prompt]) -> str:
    """sha256 of the prompts (texts only, as captures have always recorded, unless a record has a
    category or asks for the chat template: then of every field)."""
    if all(r.category is None and not r.chat for r in records):
        return hashlib.sha256("\n".join(r.text for r in records).encode()).hexdigest()
    return hashlib.sha256(json.dumps([[r.text, r.category, r.chat] for r in records]).encode()).hexdigest()


def prompt_roots(
    pair,
    prompts: list[str],
    placement: RootPlacement,
    seed: int,
    depth: int,
    with_prompt_length: bool = False,
    trajectory: str = "forward",
) -> Iterator[tuple]:
    """Yield ``(root id, prompt index, root context)`` for the roots along every prompt's continuation
    (``with_prompt_length``: and the prompt's length in tokens, a fourth entry).

    Prompt i is encoded with ``pair.encode`` and continued by the target with the generator
    ``seeded_rng(seed, Stream.PROMPT, i)``; roots as ``place_roots`` puts them (``placement.first = 0``:
    the prompt's end is the first root; ``trajectory``: ``target_trajectory``'s method).  Every
    prompt is checked against the model's context
    (``pair.max_context``, with a tree of ``depth`` below the last root) before any is sampled.

    Raises:
        ValueError: ``prompts: ...`` for a prompt that encodes to nothing or is too long.
    """
    encoded = []
    for i, text in enumerate(prompts):
        prompt = pair.encode(text)
        if not prompt:
            raise ValueError(f"prompts: prompt {i + 1} encodes to no token")
        need = placement.tokens_needed(len(prompt), depth)
        limit = int(getattr(pair, "max_context", 0) or 0)
        if limit and need > limit:
            raise ValueError(
                f"prompts: prompt {i + 1} has {len(prompt)} tokens; with its roots and trees it needs {need}, "
                f"above the model's context of {limit}"
            )
        encoded.append(prompt)
    for i, prompt in enumerate(encoded):
        rng = seeded_rng(seed, Stream.PROMPT, i)  # this trajectory's own: its tail need not be sampled
        for root, context in place_roots(pair, prompt, placement, rng, trajectory=i, whole=False, method=trajectory):
            yield (root, i, context, len(prompt)) if with_prompt_length else (root, i, context)


def source_code_prompts(count: int, chars: int = 300) -> list[str]:
    """``count`` prompts of standard-library source code (a shifted domain for drafters trained
    on the documentation text): from each ``*.py`` file of the standard library, last file name
    first (the reference pair's ``--stdlib-chars`` takes the first), the ``chars`` characters from
    its first line that starts a ``def`` or ``class``.  Deterministic for one Python installation.

    Raises:
        ValueError: ``count: ...`` below 1, or more than the files that hold a definition.
    """
    count = check_int(count, "count", 1)
    out = []
    for path in sorted(Path(os.__file__).parent.glob("*.py"), reverse=True):
        text = path.read_text(encoding="utf-8", errors="replace")
        found = [m for m in (text.find("\ndef "), text.find("\nclass ")) if m >= 0]
        if found:
            start = min(found)
            out.append(text[start + 1 : start + 1 + chars])
        if len(out) == count:
            return out
    raise ValueError(f"count: only {len(out)} standard-library files hold a definition, asked for {count}")
