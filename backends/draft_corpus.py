"""Training material for drafts of the pretrained target: chat prompts and plain text, built here.

Nothing is downloaded: every prompt is made from the lab's own templates and this Python's
``pydoc_data`` topics and standard-library sources, **excluding** the topics and files the shipped
long-context prompts use (``backends.prompt_sets.LONG_CONTEXT``), and never from the shipped
``workloads`` prompts (written separately), so the drafts' held-out acceptance on those prompts is
measured on text they were not trained on.

* ``training_prompts(n, seed)``: ``n`` user turns in Spec-Bench's six categories (conversation,
  translation, summarisation, question answering, maths with seeded numbers, passage-based
  answers), in a seeded order; the target answers them (``backends.train_draft``) and the draft
  is distilled on those answers (distillation on target-generated text).
* ``plain_text(tokenizer, tokens, seed, code=True)``: documentation and code (``code=False``: the
  documentation only), ``tokens`` ids of it.
"""

from __future__ import annotations

import functools
import os
import random
from pathlib import Path

from backends.prompt_sets import LONG_CONTEXT

CONVERSATION_OPENERS = (
    "Can you give me a few tips on",
    "What do you think about",
    "I would like some advice about",
    "How should a beginner get started with",
    "Tell me something interesting about",
    "What are common mistakes people make with",
)
CONVERSATION_TOPICS = (
    "learning to cook simple meals",
    "keeping a daily journal",
    "training for a first five-kilometre run",
    "growing herbs on a windowsill",
    "learning a second language as an adult",
    "saving money on groceries",
    "taking better photos with a phone",
    "planning a weekend hiking trip",
    "keeping a small aquarium",
    "reading more books",
    "sleeping better",
    "learning to play the guitar",
    "organising a small kitchen",
    "writing a short story",
    "starting to draw",
    "making friends at a new job",
    "caring for a house plant",
    "riding a bicycle to work",
    "baking bread at home",
    "volunteering in the community",
    "studying for exams",
    "keeping a tidy desk",
    "adopting a cat",
    "learning chess",
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")
MATHS = (
    "A shop sells notebooks for {a} dollars each. How much do {b} notebooks cost?",
    "A tank holds {a} litres and {b} litres are used each day. How many full days does it last?",
    "Tom reads {a} pages a day. How many pages does he read in {b} days?",
    "A rectangle is {a} metres long and {b} metres wide. What is its area and its perimeter?",
    "A bus leaves with {a} passengers; {b} get off and 7 get on. How many are on the bus now?",
    "If {b} friends share {a} apples equally, how many does each get and how many are left?",
    "A car uses {b} litres of fuel per 100 kilometres. How much fuel does it need for {a} kilometres?",
    "What is {a} times {b}, and what is {a} plus {b}?",
)


@functools.cache
def _excluded() -> tuple[frozenset[str], frozenset[str]]:
    """(pydoc topics, standard-library files) left out: the long-context prompts' own, and every
    topic sharing a paragraph with them (the topics repeat one another's sections)."""
    import pydoc_data.topics as topics

    from backends.prompt_sets import long_context_prompts

    files = {name for _, kind, name, _, _ in LONG_CONTEXT if kind == "source"}
    shown = " ".join(" ".join(p.text.split()) for p in long_context_prompts())
    skip = {name for _, kind, name, _, _ in LONG_CONTEXT if kind == "topic"}
    for name, text in topics.topics.items():
        blocks = [" ".join(b.split()) for b in text.split("\n\n")]
        if any(len(b) >= 80 and b in shown for b in blocks):
            skip.add(name)
    return frozenset(skip), frozenset(files)


def _paragraphs() -> list[tuple[str, str]]:
    """(topic, paragraph) of every pydoc topic left in (``_excluded``), paragraphs of 200-900
    characters."""
    import pydoc_data.topics as topics

    skip, _ = _excluded()
    out = []
    for name in sorted(topics.topics):
        if name in skip:
            continue
        for block in topics.topics[name].split("\n\n"):
            text = " ".join(block.split())
            if 200 <= len(text) <= 900 and not text.startswith(("*", "|", ">>>")):
                out.append((name, text))
    return out


def _modules() -> list[str]:
    lib = Path(os.__file__).parent
    _, skip = _excluded()
    return [p.stem for p in sorted(lib.glob("*.py")) if p.name not in skip and not p.stem.startswith("_")]


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` user-turn texts (module docstring), the same for the same ``n``, ``seed`` and Python.

    Raises:
        ValueError: ``n`` < 1.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: must be an integer >= 1, got {n!r}")
    rng = random.Random(seed)
    paragraphs, modules = _paragraphs(), _modules()
    topic_names = sorted({t for t, _ in paragraphs})

    def sentence():
        text = rng.choice(paragraphs)[1]
        cut = text.find(". ")
        return text if cut < 0 else text[: cut + 1]

    makers = (
        lambda: f"{rng.choice(CONVERSATION_OPENERS)} {rng.choice(CONVERSATION_TOPICS)}?",
        lambda: f"Translate into {rng.choice(LANGUAGES)}: {sentence()}",
        lambda: f"Summarise in {rng.choice(('one sentence', 'two sentences', 'a few words'))}: {rng.choice(paragraphs)[1]}",
        lambda: rng.choice(
            (
                f"What is the Python standard-library module {rng.choice(modules)} used for?",
                f"Explain the Python topic '{rng.choice(topic_names)}' in simple words.",
            )
        ),
        lambda: rng.choice(MATHS).format(a=rng.randint(12, 480), b=rng.randint(2, 19)),
        lambda: (
            "Use the passage to answer the question.\nPassage: "
            f"{rng.choice(paragraphs)[1]}\nQuestion: {rng.choice(('What is the passage mainly about?', 'What rule does the passage state?', 'Give one example that follows from the passage.'))}"
        ),
    )
    return [makers[i % len(makers)]() for i in range(n)]


def plain_text(tokenizer, tokens: int, seed: int = 0, code: bool = True) -> list[int]:
    """``tokens`` ids of documentation and code (pydoc topics and standard-library sources outside
    the long-context prompts, in a seeded order, each followed by the EOS id); ``code=False``: the
    pydoc topics only (the standard-library source prompts of ``backends.roots`` stay unseen)."""
    import pydoc_data.topics as topics

    skip_topics, skip_files = _excluded()
    docs = [text for name, text in sorted(topics.topics.items()) if name not in skip_topics]
    if code:
        lib = Path(os.__file__).parent
        docs += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py")) if p.name not in skip_files]
    random.Random(seed).shuffle(docs)
    ids: list[int] = []
    for text in docs:
        if len(ids) >= tokens:
            break
        ids.extend(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
    return ids[:tokens]
