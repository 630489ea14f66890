"""Atomic file writes shared by the core (latency profiles) and the tools."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` to a temporary file beside ``path``, then rename it.

    The file gets the permissions of a normally created file (0666 less the umask).
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
