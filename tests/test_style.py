"""Style: ``ruff check`` with the project's small rule set (``[tool.ruff]`` in pyproject.toml:
syntax errors, undefined names, unused imports and locals, redefinitions) finds nothing, and
``ruff format --check`` finds every file in its layout (run ``ruff format`` before committing).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("simlab", "backends", "analyses", "tests", "benchmarks", "scripts")


def ruff() -> list[str]:
    """The command that runs ruff: the module of this interpreter, else a ``ruff`` on the PATH."""
    probe = subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "ruff"]
    if shutil.which("ruff"):
        return ["ruff"]
    pytest.fail("ruff is not installed: it is in the dev extra (pip install -e '.[dev]')")


def run_ruff(*paths: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([*ruff(), "check", "--no-cache", *paths], cwd=cwd, capture_output=True, text=True)


def test_ruff_check_finds_nothing():
    result = run_ruff(*CHECKED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_finds_every_file_formatted():
    result = subprocess.run([*ruff(), "format", "--check", "--no-cache", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_check_fails_on_an_unformatted_file(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "m.py").write_text("x = [1,2 ,3]\n")
    result = subprocess.run([*ruff(), "format", "--check", "--no-cache", "m.py"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "m.py" in result.stdout


def test_ruff_check_fails_on_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "m.py").write_text("import os\n\n\ndef f():\n    return undefined_name\n")
    result = run_ruff("m.py", cwd=tmp_path)
    assert result.returncode == 1 and "F401" in result.stdout and "F821" in result.stdout


def test_no_docstring_cites_a_path_outside_the_repository():
    """Sources are cited as paper + official repo@commit, or a page under docs/ (docs/sources.md)."""
    outside = ("../shared/", "/work/", "shared/reference/")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for package in CHECKED
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.name != "test_style.py"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(o in line for o in outside)
    ]
    assert not offenders, offenders
