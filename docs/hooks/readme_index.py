"""MkDocs hook: the repository's README.md is the site's index page.

The README lives at the repository root (outside ``docs/``) and links to pages as ``docs/X.md``;
this hook adds it to the site as ``index.md`` and rewrites those links to ``X.md``, so the same
file reads correctly on GitHub and in the site.  Registered in ``mkdocs.yml`` (``hooks:``).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

README = Path(__file__).resolve().parents[2] / "README.md"
_DOCS_LINK = re.compile(r"\]\(docs/")


def readme_markdown() -> str:
    """README.md with its ``docs/`` links made relative to the docs folder."""
    return _DOCS_LINK.sub("](", README.read_text(encoding="utf-8"))


def on_files(files, config):
    """Add the README as ``index.md`` (a page of the site, first in the nav)."""
    files.append(File.generated(config, "index.md", content=readme_markdown()))
    return files
