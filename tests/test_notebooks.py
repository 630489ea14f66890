"""The notebooks run top to bottom, headless (nbclient), on small settings."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


ON_THE_MICRO_PAIR = {"03_tree_builders.ipynb"}
"""Notebooks that load the micro pair and its block drafter: given the session's (``SIMLAB_NOTEBOOK_PAIR``,
conftest's ``drafters``) instead of training their own, the same settings (``PairSpec.micro()``, seed 0)."""


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path, monkeypatch, request):
    monkeypatch.setenv("SIMLAB_NOTEBOOK_SMALL", "1")
    if path.name in ON_THE_MICRO_PAIR:
        request.getfixturevalue("drafters")
        monkeypatch.setenv("SIMLAB_NOTEBOOK_PAIR", str(request.getfixturevalue("micro_pair_dir")))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent.parent)}}
    ).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors


def test_there_are_notebooks():
    assert {p.name for p in NOTEBOOKS} >= {
        "00_otlp_solvers.ipynb",
        "01_divergence_by_depth.ipynb",
        "02_delayed_expansion_selector.ipynb",
    }
