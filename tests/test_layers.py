"""Layering: simlab/ imports neither backends nor analyses; backends/ never imports analyses.

Every module's AST is walked (imports at any depth, function-local ones included), so a lazy
import cannot hide an upward dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"simlab": ("backends", "analyses"), "backends": ("analyses",)}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_upward(package):
    offenders = []
    modules = sorted((ROOT / package).rglob("*.py"))
    assert modules, package
    for path in modules:
        bad = imported_packages(path) & set(FORBIDDEN[package])
        if bad:
            offenders.append(f"{path.relative_to(ROOT)} imports {', '.join(sorted(bad))}")
    assert not offenders, offenders


def test_the_walk_sees_function_local_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from analyses import labels\n    import backends.hf\n")
    assert imported_packages(module) == {"analyses", "backends"}
