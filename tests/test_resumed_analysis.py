"""The main job's live run resumes its analysis as its capture resumes (``analyses._root_cache``).

An interrupted live run of ``analyses.divergence_by_depth`` keeps each analysed root's rows under
its capture folder; the rerun reuses them (verified: analysis settings, code, capture files and the
shared generator's state) and publishes tables byte-identical to an uninterrupted run.  A damaged
entry is recomputed; other analysis settings never reuse an entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses import _root_cache, divergence_by_depth
from conftest import live_pair_flags, write_prompts

TABLES = ("nodes.parquet", "divergence_by_depth.parquet", "engine_metrics.parquet")
NODE_ROWS = divergence_by_depth.node_rows
CODE_DIGEST = _root_cache.code_digest


def flags(micro_pair_dir, prompts, out, *extra) -> list[str]:
    # khisti and rrs_wor draw child samples from the study's one generator, shared across roots
    return [
        *live_pair_flags(micro_pair_dir),
        "--prompts",
        prompts,
        "--depth",
        "2",
        "--width",
        "2",
        "--k",
        "2",
        "--child-samples",
        "3",
        "--methods",
        "khisti,rrs_wor,optimal",
        "--engine-metrics",
        "specinfer,traversal",
        "--out",
        str(out),
        "--quiet",
        *extra,
    ]


def counted(monkeypatch, stop_after: int | None = None) -> list[int]:
    """Count the study's node rows computed (and interrupt after ``stop_after`` of them)."""
    calls = []

    def node_rows(*args, **kwargs):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(args[0])
        return NODE_ROWS(*args, **kwargs)

    monkeypatch.setattr(divergence_by_depth, "node_rows", node_rows)
    return calls


@pytest.fixture(scope="module", autouse=True)
def fixed_code():
    """The code's digest held fixed while these tests run (the shared checkout may be edited meanwhile);
    ``test_the_code_is_part_of_the_key`` checks the digest itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_root_cache, "code_digest", lambda *modules: "fixed")
        yield


def test_the_code_is_part_of_the_key(tmp_path):
    module = tmp_path / "study.py"
    module.write_text("X = 1\n")
    first = CODE_DIGEST(module)
    module.write_text("X = 2\n")
    assert CODE_DIGEST(module) != first and CODE_DIGEST() == CODE_DIGEST()


@pytest.fixture(scope="module")
def uninterrupted(micro_pair_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("resume")
    prompts = write_prompts(folder, 3)
    out = folder / "whole"
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, out)) == 0
    return prompts, out


def entries(out: Path) -> list[Path]:
    return sorted(out.glob("capture-*/analysis-*/r*.json"))


def test_an_interrupted_analysis_resumes_to_the_same_tables(micro_pair_dir, uninterrupted, tmp_path, monkeypatch):
    prompts, whole = uninterrupted
    out = tmp_path / "run"
    first = counted(monkeypatch, stop_after=7)
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, out)) == 130
    kept = entries(out)
    assert 1 <= len(kept) < 6 and not any((out / name).exists() for name in TABLES)
    again = counted(monkeypatch)
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, out)) == 0
    assert set(again).isdisjoint(int(p.stem[1:]) for p in kept) and len(entries(out)) == 6, (first, again)
    for name in TABLES:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name
    # a third run computes nothing
    none = counted(monkeypatch)
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, out)) == 0 and none == []
    for name in TABLES:
        assert (out / name).read_bytes() == (whole / name).read_bytes(), name


def test_a_damaged_entry_is_recomputed_and_other_settings_reuse_nothing(micro_pair_dir, uninterrupted, monkeypatch):
    prompts, whole = uninterrupted
    before = {name: (whole / name).read_bytes() for name in TABLES}
    damaged = entries(whole)[2]
    damaged.write_text(damaged.read_text().replace("0.", "1.", 1))  # the entry no longer matches its digest
    calls = counted(monkeypatch)
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, whole)) == 0
    assert set(calls) == {int(damaged.stem[1:])}
    for name in TABLES:
        assert (whole / name).read_bytes() == before[name], name
    calls = counted(monkeypatch)
    assert divergence_by_depth.main(flags(micro_pair_dir, prompts, whole, "--child-samples", "4")) == 0
    assert len(set(calls)) == 6 and len({p.parent for p in entries(whole)}) == 2
