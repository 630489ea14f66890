"""The reference pair's default folder follows the user cache the named pairs use."""

from __future__ import annotations

import importlib
from pathlib import Path

import backends.reference_pair as reference_pair


def _default(monkeypatch, **env) -> Path:
    for name in ("SIMLAB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return importlib.reload(reference_pair).DEFAULT_CACHE


def test_simlab_cache_then_xdg_then_home(monkeypatch, tmp_path):
    try:
        assert _default(monkeypatch, SIMLAB_CACHE=str(tmp_path / "a")) == tmp_path / "a" / "reference_pair"
        assert _default(monkeypatch, XDG_CACHE_HOME=str(tmp_path / "x")) == tmp_path / "x" / "simlab" / "reference_pair"
        assert _default(monkeypatch) == Path.home() / ".cache" / "simlab" / "reference_pair"
    finally:
        monkeypatch.undo()
        importlib.reload(reference_pair)
