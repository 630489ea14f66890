"""The prompt loader (categories, the chat template) and the named prompt sets (``backends.prompt_sets``)."""

from __future__ import annotations

import json

import pytest
from conftest import capture_flags

from backends.prompt_sets import LONG_CONTEXT, PROMPT_SETS, WORKLOADS, long_context_prompts
from backends.roots import Prompt, prompt_texts, prompts_digest, read_prompt_records, read_prompts
from simlab.sampling import SamplingSettings

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
    with pytest.raises(ValueError, match=r"^prompts: no such file .* \(or prompt set: workloads, long-context\)"):
        read_prompt_records(tmp_path / "nope.jsonl")
    assert set(PROMPT_SETS) == {"workloads", "long-context"}


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
    assert [r.category for r in live.roots(SamplingSettings())] == expected
    assert [r.category for r in replay.roots(SamplingSettings())] == expected
