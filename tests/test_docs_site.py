"""The documentation: every relative link of the README and ``docs/`` resolves, and the site builds.

The fast checks read the Markdown itself: each relative link ``[text](path#anchor)`` outside code
must name an existing file, and an anchor must be a heading of the target page, slugged as GitHub
and the site (``pymdownx.slugs.slugify(case="lower")``, ``mkdocs.yml``) both slug it: lower case,
characters other than letters, digits, ``_``, ``-`` and spaces dropped, each space a ``-``, a
repeated heading suffixed ``-1``, ``-2``.  The last check runs ``mkdocs build --strict`` (a broken
link, anchor or cross-reference, or a mkdocstrings warning, fails it): 4.3 s on an idle core,
9-17 s wall at load 6-8; it is in the default suite, so CI builds the site strictly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!\!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (the hooks folder holds none)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def outside_fences(text: str):
    """(line number, line) of the lines outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield n, line


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and ``pymdownx.slugs.slugify(case="lower")`` make it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown page (repeats suffixed -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in outside_fences(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def broken_links(path: Path) -> list[str]:
    """``file:line: target (why)`` for each relative link of ``path`` that does not resolve."""
    out = []
    for n, raw in outside_fences(path.read_text(encoding="utf-8")):
        for match in _LINK.finditer(_CODE_SPAN.sub("", raw)):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                out.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{where} (no heading with that anchor)")
    return out


def test_every_relative_link_and_anchor_resolves():
    offenders = [line for page in pages() for line in broken_links(page)]
    assert not offenders, "\n".join(offenders)


def test_the_findings_index_links_every_section_it_names():
    """docs/results.md's findings index links its sections by anchor; those anchors exist."""
    results = ROOT / "docs" / "results.md"
    linked = re.findall(r"\]\(#([^)]+)\)", results.read_text(encoding="utf-8"))
    assert len(linked) >= 20
    assert set(linked) <= anchors(results)


def test_the_checker_finds_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    """The link check can fail: a missing file, a missing anchor and a link inside code."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Title: the `x` part\n\n## Title: the `x` part\n\ntext\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#title-the-x-part) [ok2](a.md#title-the-x-part-1) [web](https://example.org/x)\n"
        "[gone](missing.md) [bad](a.md#nope)\n"
        "`[in code](missing2.md)`\n\n```\n[fenced](missing3.md)\n```\n"
    )
    assert broken_links(page) == ["b.md:2: missing.md (no such file)", "b.md:2: a.md#nope (no heading with that anchor)"]


def test_slugs_agree_with_the_sites_slugify():
    """The fast check's anchors are the site's (pymdownx's slugify, as mkdocs.yml configures it)."""
    slugs = pytest.importorskip("pymdownx.slugs")
    slugify = slugs.slugify(case="lower")
    headings = [
        "0c. Traversal against the OT verifiers at matched settings, and delayed expansion (DDTE Tables 2-3, 6)",
        "13b. SpecTr-GBV as released (junemily/SpecTr-GBV@e399f44)",
        "Output folders and list flags",
        "3a. Synthetic world that copies from its context (`repetitive`, V = 64)",
        "An independent draft at a real vocabulary: Qwen2.5-Coder (--pair qwen2.5-coder)",
    ]
    assert [slug(h) for h in headings] == [slugify(h, "-") for h in headings]


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict`` into a temporary folder: a broken link, anchor or reference, or a
    docstring warning of the API reference, fails it."""
    import mkdocs  # noqa: F401  (a dev dependency: its absence fails the test)

    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists() and (tmp_path / "site" / "api" / "verifiers" / "index.html").exists()
