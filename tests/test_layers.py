"""Layering: simlab/ imports neither backends nor analyses; backends/ never imports analyses; no
import cycle among the lab's modules at any depth; no runnable study imports another.

Every module's AST is walked (imports at any depth, function-local ones included), so a lazy
import can hide neither an upward dependency nor a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"simlab": ("backends", "analyses"), "backends": ("analyses",)}
PACKAGES = ("simlab", "backends", "analyses")
ALLOWED_CYCLES: dict[frozenset[str], str] = {}
"""Import cycles tolerated, each with its reason (none today: add one only with a stated reason)."""


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
    module.write_text("def f():\n    from analyses import _labels\n    import backends.hf\n")
    assert imported_packages(module) == {"analyses", "backends"}


def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``known`` it imports anywhere in its file (``from package import
    module`` counts as importing the module; relative imports resolved)."""
    graph = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                    package = package[: len(package) - (node.level - 1)]
                    base = ".".join(package + ([node.module] if node.module else []))
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
            else:
                continue
            for module in wanted:
                while module and module not in known:
                    module = module.rpartition(".")[0]
                if module and module != name:
                    targets.add(module)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
    return out


def test_no_import_cycle_at_any_depth():
    found = [sorted(c) for c in cycles(import_graph(modules(ROOT))) if c not in ALLOWED_CYCLES]
    assert not found, f"import cycles (function-level imports included): {found}"


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import g\n")
    (package / "b.py").write_text("def g():\n    from . import c\n")
    (package / "c.py").write_text("def h():\n    import pkg.a\n")
    (package / "d.py").write_text("from pkg import a\n")
    graph = import_graph(modules(tmp_path, ("pkg",)))
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]


def runnable_studies(known: dict[str, Path]) -> set[str]:
    """The ``analyses`` modules run as ``python -m analyses.X``: those defining a top-level ``main``."""
    return {
        name
        for name, path in known.items()
        if name.startswith("analyses.")
        and any(
            isinstance(node, ast.FunctionDef) and node.name == "main" for node in ast.parse(path.read_text(encoding="utf-8")).body
        )
    }


def test_no_runnable_study_imports_another():
    known = modules(ROOT)
    graph, studies = import_graph(known), runnable_studies(known)
    assert {"analyses.compare_builders", "analyses.specblock", "analyses.train_selector"} <= studies
    assert "analyses._builder_roster" not in studies
    offenders = []
    for study in sorted(studies):
        seen, todo = set(), [study]
        while todo:  # what the study reaches through helpers too
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        offenders += [f"{study} -> {other}" for other in sorted((seen & studies) - {study})]
    assert not offenders, f"a study imports another study (move the shared part into a helper module): {offenders}"


def test_helpers_and_studies_are_told_apart_by_name():
    """In ``analyses``, a runnable study (a module with ``main``) has a plain name and a helper a
    leading underscore (the map in ``analyses/__init__.py``)."""
    studies = {name.rsplit(".", 1)[-1] for name in runnable_studies(modules(ROOT)) if name.startswith("analyses.")}
    files = {path.stem for path in (ROOT / "analyses").glob("*.py") if path.stem not in ("__init__", "__main__")}
    assert studies and all(not name.startswith("_") for name in studies)
    assert all(name.startswith("_") for name in files - studies), sorted(files - studies)
