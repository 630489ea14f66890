"""Per-root analysis results kept under the capture folder they were computed from, so a rerun of a
study on the same capture resumes its analysis where an interrupted run stopped.

``RootCache(capture, settings)`` keeps one JSON file per root in ``<capture>/analysis-<key>/``,
where ``key`` digests the analysis ``settings`` (every setting the rows depend on), the source of
the code that computes them (every module of the ``simlab`` package, ``backends.capture_store``,
which reads p and q back, and ``code``, the study's own modules) and the NumPy and SciPy versions:
another setting, any edit to that code or another library version is another folder, never a
stale hit (the folders of earlier keys stay until the capture folder is removed).  An
entry records the digest of the root's capture files (its node shard and logits), the state of the
study's shared generator before and after the root, and its payload (JSON: floats written by
``repr``, so they read back bit for bit, NaN and infinities included).  ``get`` returns a payload
only when the entry's own digest, the key, the capture files and the generator state all match;
anything else (a damaged, truncated or foreign file) is recomputed and overwritten.  Entries are
written atomically (``simlab.files.atomic_write``), so an interrupted run leaves whole entries only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import scipy

import simlab
from analyses._study import json_plain  # NumPy scalars and arrays as the JSON types they stand for
from simlab.files import atomic_write


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def code_digest(*modules: str | Path) -> str:
    """sha256 over the source of every module of the ``simlab`` package and of ``modules`` (file
    paths), in a fixed order."""
    files = sorted(Path(simlab.__file__).parent.rglob("*.py")) + [Path(m) for m in modules]
    hasher = hashlib.sha256()
    for path in files:
        hasher.update(path.name.encode())
        hasher.update(_digest(path.read_bytes()).encode())
    return hasher.hexdigest()


class RootCache:
    """Per-root results under ``<capture>/analysis-<key>/`` (module docstring).

    Args:
        capture: the capture folder the roots come from (its files are digested per root).
        settings: the analysis settings the results depend on (JSON-serialisable).
        code: the study's module files (with ``simlab``'s and ``capture_store``'s, their source is part of the key).
    """

    def __init__(self, capture: str | Path, settings: dict, code=()):
        from backends import capture_store

        self.capture, self._store = Path(capture), capture_store
        code = code_digest(capture_store.__file__, *code)  # capture_store: how p and q are read back
        versions = {"numpy": np.__version__, "scipy": scipy.__version__}  # the solvers and samplers the rows use
        self.key = _digest(json.dumps({"settings": settings, "code": code, "versions": versions}, sort_keys=True).encode())
        self.folder = self.capture / f"analysis-{self.key[:16]}"

    def _path(self, root: int) -> Path:
        return self.folder / f"r{root:06d}.json"

    def _inputs(self, root: int) -> str:
        """sha256 of the root's capture files (node shard, then logits where captured)."""
        hasher = hashlib.sha256()
        for path in (self._store.shard_path(self.capture, root), self._store.logits_path(self.capture, root)):
            hasher.update(_digest(path.read_bytes()).encode() if path.is_file() else b"-")
        return hasher.hexdigest()

    def get(self, root: int, state: dict):
        """(payload, generator state after the root) of ``root`` when a verified entry computed
        from the generator state ``state`` exists, else None."""
        try:
            entry = json.loads(self._path(root).read_text())
            body = entry["body"]
            if _digest(json.dumps(body, sort_keys=True).encode()) != entry["digest"]:
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if body.get("key") != self.key or body.get("root") != root or body.get("before") != json.loads(json.dumps(state)):
            return None
        if body.get("inputs") != self._inputs(root):
            return None
        return body["payload"], body["after"]

    def put(self, root: int, before: dict, after: dict, payload) -> None:
        """Record ``root``'s ``payload`` computed from generator state ``before`` (leaving ``after``)."""
        body = {
            "key": self.key,
            "root": root,
            "inputs": self._inputs(root),
            "before": before,
            "after": after,
            "payload": payload,
        }
        body = json.loads(json.dumps(body, default=json_plain))
        text = json.dumps({"body": body, "digest": _digest(json.dumps(body, sort_keys=True).encode())})
        self.folder.mkdir(exist_ok=True)
        atomic_write(self._path(root), lambda tmp: Path(tmp).write_text(text))
