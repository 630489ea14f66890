"""The main job's default run: its output folder is named after its source, its charts name the
source, and its tables are pinned (the content hash of the output before the one-source redesign)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from analyses import divergence_by_depth
from pinned import content_hash

PINNED = {  # from `python -m analyses.divergence_by_depth` at commit 764c548, before the redesign
    "divergence_by_depth.parquet": "229b632c3b8e53f5ed5addf593443f77a201d4c07c7d0ddbb595b5b287711439",
    "nodes.parquet": "45c0f20a93ccaf5d2aef801b0206c7105dfe847a813718de035020dddd1c1c16",
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
    assert content_hash(pl.read_parquet(default_run / name)) == PINNED[name]


def test_charts_name_their_source_and_setting(default_run):
    for name in ("divergence_by_depth.html", "acceptance_by_depth.html"):
        html = (default_run / name).read_text()
        assert "depth_profile, V=64, T=1, 24 roots" in html, name
