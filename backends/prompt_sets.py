"""Named prompt sets like the seed papers' workloads (``--prompts NAME``).

* ``workloads``: ``backends/prompts/workloads.jsonl``, 52 short tasks written for the lab (never
  copied from a benchmark) in Spec-Bench's six categories (Xia et al. 2024): ``conversation``,
  ``translation``, ``summarisation``, ``qa``, ``maths`` and ``retrieval`` (short passages and a
  question answered from them), 8-9 each, every one a user turn of the target's chat template.
* ``long-context``: 12 prompts of several hundred to a few thousand tokens, built at load time
  from the standard library's own documents and code (``LONG_CONTEXT``): a section of the
  ``pydoc_data`` topics to summarise (``long_summarisation``) or to answer a question about
  (``long_qa``), or the beginning of a standard-library module to continue (``long_continuation``),
  the kind of context TreeGraft's prompt-lookup drafter copies from (its benchmarks: CNN/DM
  articles, few-shot GSM8K).  Deterministic for one Python installation: fixed topics and files,
  each cut at the last paragraph (topics) or line (code) boundary within a fixed character budget.
* ``code``: ``backends/prompts/code.jsonl``, 44 short Python tasks written for the lab (never
  copied from a benchmark) in the spirit of HumanEval (Chen et al. 2021: a signature and docstring
  to complete) and LiveCodeBench (Jain et al. 2024: code execution, repair and test writing):
  ``code_completion`` (a function signature and docstring with examples to complete, 12),
  ``code_explain`` (explain a snippet and what it prints, 12), ``code_fix`` (find and fix the one
  bug of a short function, 12) and ``code_tests`` (write pytest tests for a function, 8), every
  one a user turn of the target's chat template.
* ``seed-workloads``: ``workloads``, then ``code``, then ``long-context`` (108 prompts, every
  category of the three), the seed papers' kinds of workload in one run.

The loader (``backends.roots.read_prompt_records``) takes a set's name wherever a prompt file is
taken, when no file of that name exists.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    """One prompt of a prompt file: its text, its category (a workload name such as ``"maths"``,
    or None) and whether the target's chat template wraps it as a user turn (``chat``)."""

    text: str
    category: str | None = None
    chat: bool = False


RESERVED_CATEGORIES = ("(all)", "(none)")
"""Category names a prompt may not take: the studies' by-category tables name their overall block
and their block of roots without a category so (``analyses._categories``)."""

WORKLOADS = Path(__file__).resolve().parent / "prompts" / "workloads.jsonl"
CODE = Path(__file__).resolve().parent / "prompts" / "code.jsonl"
COMBINED = ("workloads", "code", "long-context")
"""The sets ``seed-workloads`` joins, in this order."""

LONG_CONTEXT = (  # (category, kind, topic or file, character budget, instruction)
    ("long_summarisation", "topic", "with", 4000, "Summarise the documentation above in a short paragraph."),
    ("long_summarisation", "topic", "import", 6000, "Summarise the documentation above in five bullet points."),
    ("long_summarisation", "topic", "try", 8000, "Summarise the documentation above for a beginner, in a few sentences."),
    ("long_summarisation", "topic", "execmodel", 9600, "Summarise the main rules described above in a short paragraph."),
    ("long_qa", "topic", "raise", 4000, "According to the documentation above, what does 'raise ... from None' do?"),
    (
        "long_qa",
        "topic",
        "function",
        7000,
        "According to the documentation above, when are default parameter values "
        "evaluated, and why does that matter for a mutable default such as a list?",
    ),
    (
        "long_qa",
        "topic",
        "assignment",
        9000,
        "According to the documentation above, what happens when the target of an assignment is a subscription such as a[i] = x?",
    ),
    (
        "long_qa",
        "topic",
        "comparisons",
        10300,
        "According to the documentation above, how is a chained comparison such as "
        "a < b < c evaluated, and how often is b evaluated?",
    ),
    ("long_continuation", "source", "bisect.py", 2000, "Continue the module above: write its next function in the same style."),
    ("long_continuation", "source", "colorsys.py", 3200, "Continue the module above: write its next function in the same style."),
    ("long_continuation", "source", "fnmatch.py", 4800, "Continue the module above: write its next function in the same style."),
    ("long_continuation", "source", "textwrap.py", 9000, "Continue the module above: write the next method in the same style."),
)


def _cut(text: str, budget: int, boundary: str) -> str:
    """``text`` up to its last ``boundary`` within ``budget`` characters (all of it if shorter)."""
    if len(text) <= budget:
        return text.rstrip()
    end = text.rfind(boundary, 0, budget)
    return text[: end if end > 0 else budget].rstrip()


def long_context_prompts() -> list[Prompt]:
    """The ``long-context`` set (module docstring), built from this Python's standard library.

    Raises:
        ValueError: ``prompts: ...`` when a topic or file of ``LONG_CONTEXT`` is missing here.
    """
    import pydoc_data.topics as topics

    lib = Path(os.__file__).parent
    out = []
    for category, kind, name, budget, instruction in LONG_CONTEXT:
        if kind == "topic":
            if name not in topics.topics:
                raise ValueError(f"prompts: this Python's pydoc_data has no topic {name!r} (the long-context set needs it)")
            document = f"Here is a section of the Python documentation:\n\n{_cut(topics.topics[name], budget, chr(10) * 2)}"
        else:
            path = lib / name
            if not path.is_file():
                raise ValueError(f"prompts: this Python has no standard-library file {name!r} (the long-context set needs it)")
            code = _cut(path.read_text(encoding="utf-8", errors="replace"), budget, "\n")
            document = f"Here is the beginning of the standard-library module {name}:\n\n{code}"
        out.append(Prompt(f"{document}\n\n{instruction}", category, chat=True))
    return out


def prompt_set(name: str) -> list[Prompt]:
    """The named set's prompts.

    Raises:
        ValueError: ``prompts: ...`` for an unknown name.
    """
    if name == "workloads":
        return read_prompt_file(WORKLOADS)
    if name == "long-context":
        return long_context_prompts()
    if name == "code":
        return read_prompt_file(CODE)
    if name == "seed-workloads":
        return [prompt for part in COMBINED for prompt in prompt_set(part)]
    raise ValueError(f"prompts: unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")


PROMPT_SETS = {
    "workloads": "52 short tasks in Spec-Bench's six categories (backends/prompts/workloads.jsonl)",
    "long-context": "12 long prompts built from the standard library's documents and code",
    "code": "44 Python tasks: complete, explain, fix, write tests (backends/prompts/code.jsonl)",
    "seed-workloads": "workloads, code and long-context in one set (108 prompts)",
}
"""The named sets (name -> one line)."""


def read_prompt_file(path) -> list[Prompt]:
    """Prompts from a text file (one per non-empty line) or JSON lines (``prompt`` or ``text``, and
    optionally ``category``, a non-empty string, and ``chat``, a boolean); the file half of
    ``backends.roots.read_prompt_records``.

    Raises:
        ValueError: ``prompts: ...`` for a missing or unreadable file, no prompt in it, a JSON
            line without text, or a bad ``category`` (also one of ``RESERVED_CATEGORIES``) or ``chat`` field.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"prompts: no such file {str(path)!r} (or prompt set: {', '.join(PROMPT_SETS)})")
    try:
        lines = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"prompts: cannot read {str(path)!r} ({exc})") from None
    if file.suffix != ".jsonl":
        records = [Prompt(line) for line in lines]
    else:
        records = []
        for n, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                text = record.get("prompt", record.get("text"))
            except (json.JSONDecodeError, AttributeError):
                text = None
            if text is None:
                raise ValueError(f"prompts: line {n} of {path} is not a JSON object with a 'prompt' or 'text' field")
            category, chat = record.get("category"), record.get("chat", False)
            if category is not None and (not isinstance(category, str) or not category.strip()):
                raise ValueError(f"prompts: line {n} of {path} has a category that is not a non-empty string: {category!r}")
            if category in RESERVED_CATEGORIES:
                raise ValueError(f"prompts: line {n} of {path} has the category {category!r}, a name the studies' tables reserve")
            if not isinstance(chat, bool):
                raise ValueError(f"prompts: line {n} of {path} has a 'chat' field that is not true or false: {chat!r}")
            records.append(Prompt(str(text), category, chat))
    if not records:
        raise ValueError(f"prompts: {path} holds no prompt")
    return records
