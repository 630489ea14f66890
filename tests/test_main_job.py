"""The main job's default run: its output folder is named after its source, its charts name the
source, and its tables are pinned (content hashes: every column but Khisti's as before the
one-source redesign; Khisti's since its guarded tail)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses import divergence_by_depth
from pinned import content_hash

PINNED = {  # from `python -m analyses.divergence_by_depth` after Khisti's guarded tail (issue 17)
    "divergence_by_depth.parquet": "9b83367f04e92bf1ca96261187141c0581f7cded8bc9fd0e0ba937b900461c6b",
    "nodes.parquet": "8e98f8f413fe2feddf9b3a159c1be68a86d068a5835354abba511d008bd00325",
}
PINNED_WITHOUT_KHISTI = {  # every column but Khisti's, unchanged since commit 764c548 (before the redesign)
    "divergence_by_depth.parquet": "0fb8fd822b46762f1de78d55ac56991c9db7038a1a7b9169a8d503ee1908e5ab",
    "nodes.parquet": "5957d9c651a1f771e2e17c9e035424fbbde93003e59ccfc4f8efe27847f857f2",
}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("main_job")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert divergence_by_depth.main(["--quiet"]) == 0
    return Path(cwd) / "out" / "divergence_by_depth" / "synthetic-depth_profile-V64"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_default_output_is_unchanged(default_run, name):
    frame = pl.read_parquet(default_run / name)
    assert content_hash(frame) == PINNED[name]
    assert content_hash(frame.select([c for c in frame.columns if "khisti" not in c])) == PINNED_WITHOUT_KHISTI[name]


def test_charts_name_their_source_and_setting(default_run):
    for name in ("divergence_by_depth.html", "acceptance_by_depth.html"):
        html = (default_run / name).read_text()
        assert "depth_profile, V=64, T=1, 24 roots" in html, name
