"""Atomic file writes shared by the core (latency profiles) and the tools.

A file is written to a hidden staging file beside its destination and renamed into place, so a
reader never sees half a file.  Staging files are named ``.simlab-staging-<pid>-<random>-<name>``:
a process killed with SIGKILL cannot remove its own, so ``remove_stale_staging(folder)`` (called
by every tool when it opens its output folder) deletes those whose process no longer runs.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

STAGING_PREFIX = ".simlab-staging-"
_STAGING = re.compile(re.escape(STAGING_PREFIX) + r"(\d+)-")


def staging_file(folder: Path, name: str) -> Path:
    """A new, empty staging file in ``folder`` for the final file ``name``."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{STAGING_PREFIX}{os.getpid()}-", suffix=f"-{name}")
    os.close(fd)
    return Path(tmp)


def atomic_write(path: Path, write) -> None:
    """Write through ``write(tmp_path)`` to a staging file beside ``path``, then rename it.

    The file gets the permissions of a normally created file (0666 less the umask).  On any
    exception or interrupt the staging file is removed and ``path`` is untouched.
    """
    path = Path(path)
    tmp = staging_file(path.parent, path.name)
    try:
        write(str(tmp))
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_staging(folder: Path) -> int:
    """Delete the staging files in ``folder`` left by processes that no longer run; returns how many.

    Files of running processes (another run writing to the same folder) are kept.
    """
    removed = 0
    for entry in Path(folder).glob(f"{STAGING_PREFIX}*"):
        match = _STAGING.match(entry.name)
        if match and not _alive(int(match.group(1))) and entry.is_file():
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
