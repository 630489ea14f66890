"""Each package's module map (``docs/modules/<package>.md``) names exactly the package's modules.

A map is a Markdown table whose first column names modules in code spans (one or several per
row, each the dotted name of a module file ``<package>/<name>.py`` or a subpackage
``<package>/<name>/__init__.py``, one level below the package).  A module missing from the map,
or a name in the map that is not a module, fails the test with the names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("simlab", "backends", "analyses")
_ROW = re.compile(r"^\|\s*(`[^|]+)\|")


def package_modules(root: Path, package: str) -> set[str]:
    """The dotted names of the modules and subpackages one level below ``package``."""
    base = root / package
    files = {f"{package}.{f.stem}" for f in base.glob("*.py") if f.stem != "__init__"}
    subpackages = {f"{package}.{d.name}" for d in base.iterdir() if (d / "__init__.py").is_file()}
    return files | subpackages


def mapped_modules(map_file: Path) -> list[str]:
    """The names in code spans of the first column of the map's table rows."""
    names = []
    for line in map_file.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if match:
            names += re.findall(r"`([^`]+)`", match.group(1))
    return names


def map_errors(root: Path, package: str) -> list[str]:
    """What is wrong with ``docs/modules/<package>.md`` under ``root`` (empty when it is true)."""
    names = mapped_modules(root / "docs" / "modules" / f"{package}.md")
    actual = package_modules(root, package)
    errors = [f"{package}: {m} is not in the map" for m in sorted(actual - set(names))]
    errors += [f"{package}: the map names {m}, which is not a module of the package" for m in sorted(set(names) - actual)]
    errors += [f"{package}: the map names {m} twice" for m in sorted({m for m in names if names.count(m) > 1})]
    return errors


@pytest.mark.parametrize("package", PACKAGES)
def test_the_module_map_names_exactly_the_packages_modules(package):
    errors = map_errors(ROOT, package)
    assert not errors, "\n".join(errors)


def test_a_missing_a_stale_and_a_repeated_entry_are_reported(tmp_path):
    """The check can fail: a module left out, a name of no module, a name listed twice."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py"):
        (tmp_path / "pkg" / name).write_text("")
    (tmp_path / "docs" / "modules").mkdir(parents=True)
    (tmp_path / "docs" / "modules" / "pkg.md").write_text(
        "| module | what |\n|---|---|\n| `pkg.a`, `pkg.gone` | x |\n| `pkg.sub` | y |\n| `pkg.a` | again |\n"
    )
    assert map_errors(tmp_path, "pkg") == [
        "pkg: pkg.b is not in the map",
        "pkg: the map names pkg.gone, which is not a module of the package",
        "pkg: the map names pkg.a twice",
    ]
