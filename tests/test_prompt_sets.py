"""The prompt loader (categories, the chat template) and the named prompt sets (``backends.prompt_sets``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import capture_flags

from backends.prompt_sets import CODE, COMBINED, LONG_CONTEXT, PROMPT_SETS, WORKLOADS, long_context_prompts, prompt_set
from backends.roots import (
    Prompt,
    RootPlacement,
    prompt_roots,
    prompt_texts,
    prompts_digest,
    read_prompt_records,
    read_prompts,
)
from simlab.pairs import MarkovPair, target_trajectory
from simlab.sampling import SamplingSettings, Stream, seeded_rng

SPEC_BENCH = ("conversation", "translation", "summarisation", "qa", "maths", "retrieval")


def test_the_workloads_cover_spec_benchs_six_categories():
    records = read_prompt_records("workloads")
    assert records == read_prompt_records(WORKLOADS)
    counts = {c: sum(r.category == c for r in records) for c in SPEC_BENCH}
    assert all(n >= 8 for n in counts.values()) and sum(counts.values()) == len(records), counts
    assert all(r.chat for r in records) and len({r.text for r in records}) == len(records)


def test_the_long_context_set_is_deterministic_and_long():
    records = long_context_prompts()
    assert records == long_context_prompts() == read_prompt_records("long-context")
    assert [r.category for r in records] == [entry[0] for entry in LONG_CONTEXT]
    assert {r.category for r in records} == {"long_summarisation", "long_qa", "long_continuation"} and all(
        r.chat for r in records
    )
    for record, (_, _, _, budget, instruction) in zip(records, LONG_CONTEXT):
        assert record.text.endswith(instruction) and 1500 <= len(record.text) <= budget + len(instruction) + 200


def test_the_loader_carries_category_and_chat(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ({"prompt": "a", "category": "maths", "chat": True}, {"text": "b"})))
    assert read_prompt_records(path) == [Prompt("a", "maths", True), Prompt("b")]
    assert read_prompts(path) == ["a", "b"]
    text = tmp_path / "p.txt"
    text.write_text("one\n\ntwo\n")
    assert read_prompt_records(text) == [Prompt("one"), Prompt("two")]


@pytest.mark.parametrize(
    "record, message",
    [
        ({"prompt": "a", "category": ""}, "has a category that is not a non-empty string"),
        ({"prompt": "a", "category": 3}, "has a category that is not a non-empty string"),
        ({"prompt": "a", "category": "(all)"}, "has the category '\\(all\\)', a name the studies' tables reserve"),
        ({"prompt": "a", "chat": "yes"}, "has a 'chat' field that is not true or false"),
        ({"category": "qa"}, "is not a JSON object with a 'prompt' or 'text' field"),
    ],
)
def test_bad_records_are_refused_naming_the_line(tmp_path, record, message):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "fine"}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=rf"^prompts: line 2 of .* {message}"):
        read_prompt_records(path)


def test_a_missing_file_names_the_prompt_sets(tmp_path):
    with pytest.raises(
        ValueError, match=r"^prompts: no such file .* \(or prompt set: workloads, long-context, code, seed-workloads\)"
    ):
        read_prompt_records(tmp_path / "nope.jsonl")
    assert set(PROMPT_SETS) == {"workloads", "long-context", "code", "seed-workloads"}
    with pytest.raises(
        ValueError, match=r"^prompts: unknown prompt set 'nope'; known: workloads, long-context, code, seed-workloads$"
    ):
        prompt_set("nope")


CODE_CATEGORIES = {"code_completion": 12, "code_explain": 12, "code_fix": 12, "code_tests": 8}


def _code_block(text: str) -> str:
    """The one fenced Python block of a code prompt."""
    assert text.count("```python\n") == 1 and text.endswith("\n```"), text[:80]
    return text.split("```python\n", 1)[1][: -len("\n```")]


def test_the_code_set_has_its_categories_and_count_every_prompt_distinct():
    records = read_prompt_records("code")
    assert records == read_prompt_records(CODE) == prompt_set("code")
    assert {c: sum(r.category == c for r in records) for c in CODE_CATEGORIES} == CODE_CATEGORIES
    assert len(records) == sum(CODE_CATEGORIES.values()) >= 40 and all(r.chat for r in records)
    assert all(r.text.strip() for r in records) and len({r.text for r in records}) == len(records)
    assert len({_code_block(r.text) for r in records}) == len(records)  # no snippet asked twice


def test_every_code_snippet_is_python_and_each_task_has_its_kind():
    import ast

    for record in read_prompt_records("code"):
        tree = ast.parse(_code_block(record.text))  # a typo in a snippet fails here
        if record.category in ("code_completion", "code_fix", "code_tests"):
            assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef), record.text[:80]
            assert ast.get_docstring(tree.body[0]), record.text[:80]
        if record.category == "code_completion":  # a signature and docstring only: nothing to copy
            assert len(tree.body[0].body) == 1 and ">>> " in ast.get_docstring(tree.body[0])
        if record.category == "code_explain":  # a snippet with what it prints
            assert "print(" in _code_block(record.text).splitlines()[-1]


def test_seed_workloads_joins_the_three_sets_in_order_keeping_their_categories():
    records = read_prompt_records("seed-workloads")
    parts = [prompt_set(name) for name in COMBINED]
    assert COMBINED == ("workloads", "code", "long-context") and records == [r for part in parts for r in part]
    assert len(records) == 52 + 44 + 12 and all(r.chat for r in records)
    categories = [{r.category for r in part} for part in parts]
    assert all(not (a & b) for i, a in enumerate(categories) for b in categories[i + 1 :])  # no category in two sets
    assert len({r.text for r in records}) == len(records)


# -- roots along the target's reply (backends.roots) ------------------------------------------------
class _Tokenizer:
    chat_template = "user/assistant"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return f"<u>{messages[0]['content']}</u><a>"


class _TinyPair(MarkovPair):
    """A V = 8 Markov pair with a character tokenizer and a chat template (no model needed)."""

    target_tokenizer = _Tokenizer()
    max_context = 0

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(ord(c) % self.vocab_size for c in text)


def test_offsets_follow_the_placement_rule():
    assert [RootPlacement(3, 16).offset_of(r) for r in range(6)] == [0, 16, 32, 0, 16, 32]
    assert [RootPlacement(2, 5, first=5).offset_of(r) for r in range(4)] == [5, 10, 5, 10]
    assert [RootPlacement(3, 4).offset_of(r) for r in range(3)] == RootPlacement(3, 4).offsets()
    with pytest.raises(ValueError, match=r"^root_id: "):
        RootPlacement(3, 4).offset_of(-1)


def test_roots_lie_along_the_targets_reply_after_the_chat_template():
    """Root j of prompt i is the chat template followed by the first s j tokens the target samples
    with the prompt's own generator: j = 0 at the template's end, j > 0 inside the reply."""
    pair = _TinyPair.random(8, np.random.default_rng(0))
    texts = prompt_texts(pair, [Prompt("say hi", "qa", True), Prompt("add 2 and 3", "maths", True)])
    assert texts[0] == "<u>say hi</u><a>"
    placement, seed = RootPlacement(3, 4), 7
    roots = list(prompt_roots(pair, texts, placement, seed, depth=2, with_prompt_length=True))
    assert [(r, i) for r, i, _, _ in roots] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    for root, i, context, length in roots:
        template = pair.encode(texts[i])
        assert length == len(template) and context[:length] == template
        reply = target_trajectory(pair, 8, seeded_rng(seed, Stream.PROMPT, i), prefix=template)[length:]
        offset = placement.offset_of(root)
        assert len(context) - length == offset == 4 * (root % 3) and context[length:] == reply[:offset]
    assert roots[0][2] == pair.encode(texts[0]) and len(roots[1][2]) > len(pair.encode(texts[0]))


def test_the_chat_template_is_the_tokenizers_and_refused_without_one():
    class Tokenizer:
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return f"<user>{messages[0]['content']}</user><assistant>"

    class Pair:
        target_tokenizer = Tokenizer()

    assert prompt_texts(Pair(), [Prompt("hi", "qa", True), Prompt("plain")]) == ["<user>hi</user><assistant>", "plain"]
    Pair.target_tokenizer.chat_template = None
    with pytest.raises(ValueError, match=r"^prompts: prompt 1 asks for the chat template, but the target's tokenizer has none"):
        prompt_texts(Pair(), [Prompt("hi", chat=True)])


def test_the_digest_of_plain_prompts_is_the_one_captures_recorded():
    import hashlib

    records = [Prompt("a"), Prompt("b")]
    assert prompts_digest(records) == hashlib.sha256(b"a\nb").hexdigest()
    assert prompts_digest([Prompt("a", "qa"), Prompt("b")]) != prompts_digest(records)
    assert prompts_digest([Prompt("a", chat=True), Prompt("b")]) != prompts_digest(records)


def test_roots_carry_their_prompts_category_live_and_replayed(micro_pair_dir, tmp_path):
    from backends.capture import main as capture_main
    from backends.capture_store import read_capture
    from backends.sources import CaptureSource, HFSource

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(r) for r in ({"prompt": "The for statement is", "category": "qa"}, {"prompt": "A function definition"})
        )
    )
    target, draft = str(micro_pair_dir / "target"), str(micro_pair_dir / "draft")
    assert (
        capture_main(
            capture_flags(
                micro_pair_dir, prompts, tmp_path / "c", "--roots-per-prompt", "2", "--spacing", "3", "--depth", "2", "--full"
            )
        )
        == 0
    )
    stored = read_capture(str(tmp_path / "c")).select("root", "category").unique().sort("root").rows()
    assert stored == [(0, "qa"), (1, "qa"), (2, None), (3, None)]
    assert (
        capture_main(
            [
                "--target",
                target,
                "--draft",
                draft,
                "--prompts",
                str(prompts),
                "--out",
                str(tmp_path / "g"),
                "--roots-per-prompt",
                "1",
                "--spacing",
                "3",
                "--shape",
                "grid",
                "--width",
                "2",
                "--depth",
                "1",
                "--samples",
                "2",
                "--full",
                "--quiet",
            ]
        )
        == 0
    )
    assert [r.category for r in CaptureSource((str(tmp_path / "g"),), grid=True).roots(SamplingSettings())] == ["qa", None]
    live = HFSource(target, draft, str(prompts), roots_per_trajectory=2, spacing=3, depth=2, device="cpu")
    replay = CaptureSource((str(tmp_path / "c"),), grid=False)
    expected = ["qa", "qa", None, None]
    live_roots, replayed = list(live.roots(SamplingSettings())), list(replay.roots(SamplingSettings()))
    assert [r.category for r in live_roots] == expected
    assert [r.category for r in replayed] == expected
    # each root records where it lies: 0 = the prompt's end, 3 = three tokens into the target's reply
    assert [r.offset for r in live_roots] == [r.offset for r in replayed] == [0, 3, 0, 3]
    assert [r.context for r in live_roots] == [r.context for r in replayed]
    assert all(len(r.context) - r.prompt_length == r.offset for r in live_roots)
    # the replayed roots' prompt length is the live one (treegraft's prompt cache, the rosters' n-gram
    # corpus): before, a replay left it None and its users took the whole context, reply included
    assert [r.prompt_length for r in replayed] == [r.prompt_length for r in live_roots]
