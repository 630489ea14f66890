"""Who may write into a capture folder: one run at a time, the ranks of one ``torchrun`` together.

Every process of a capture (``backends.capture``) holds ``lock-rank<R>.json`` in its folder while
it runs: the file names its process id, host, rank, world size and the hash of its settings
(``backends.capture_store.settings_hash``), and the process holds an exclusive ``flock`` on it.
A process starting in the folder

* takes its own rank's file: refused while a live process holds it (that rank of a run is
  already going);
* then reads the other ranks' files: a live one with the same settings hash and the same world
  size is a fellow rank of its own run (the folder is shared); a live one with other settings or
  another world size is another run: refused (its own lock is released first).

Refusals are ``simlab.errors.ArgumentError`` about ``out`` (``"out: ..."``) naming the owner (process id, host, rank of world).  A
lock file whose flock is free is stale: its process has died (the kernel releases a dead
process's flock, even after SIGKILL).  Its own rank's stale file is taken over and another
rank's is removed, each with one line (``note``) naming the dead process.  Liveness is the flock,
not a probe of the process id, so a recycled id cannot keep a dead run's lock, and it holds
across hosts on file systems whose locks do (local disks, NFS v4).  The lock is released (its
file removed) when the run ends, on an error too.

Both checks happen after the own lock is written, so of two runs with other settings starting
at once at least one sees the other.  The settings check of ``capture_store.claim_settings`` and
the settings hash in every shard guard what the lock cannot (a run that ignores it).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from simlab.errors import ArgumentError

LOCK_GLOB = "lock-rank*.json"
READ_ATTEMPTS = 20
"""Reads of a live lock file still empty (its owner writes it just after taking the flock), 0.05 s apart."""


def lock_path(out: Path, rank: int) -> Path:
    """The lock file of ``rank`` in capture folder ``out``."""
    return Path(out) / f"lock-rank{rank}.json"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _flocked(fd: int) -> bool:
    """Take the exclusive flock of ``fd`` without waiting; False if another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as exc:  # a file system without locks (ENOLCK): no run could be kept out
        raise ArgumentError(
            "out",
            f"the capture folder's file system does not lock files ({exc.strerror or exc}); "
            "capture into a folder on one that does (a local disk, NFS v4)",
        ) from None


def _record(fd: int) -> dict | None:
    """The owner record in an open lock file, or None (empty or damaged)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
    try:
        record = json.loads(data.decode())
        return record if isinstance(record, dict) else None
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _owner(record: dict | None) -> str:
    if not record:
        return "an unknown process (its lock file names none)"
    return (
        f"process {record.get('pid')} on {record.get('host')} (rank {record.get('rank')} of {record.get('world_size')}, "
        f"settings hash {str(record.get('settings_sha256'))[:12]})"
    )


class CaptureLock:
    """The lock of one capture process (module docstring); a context manager.

    Args:
        out: the capture folder.
        rank, world: this process's RANK and WORLD_SIZE.
        settings_sha256: the hash of this run's settings.
        note: called with one line for each stale lock taken over or removed.

    Raises:
        ValueError: ``out: ...`` on ``acquire`` (``with``) while another run holds the folder.
    """

    def __init__(self, out, rank: int, world: int, settings_sha256: str, note=lambda line: None):
        self.out, self.rank, self.world, self.settings_sha256, self.note = Path(out), rank, world, settings_sha256, note
        self.path = lock_path(out, rank)
        self._fd: int | None = None

    def __enter__(self) -> "CaptureLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False

    def acquire(self) -> "CaptureLock":
        self._fd = self._take()
        try:
            for other in sorted(self.out.glob(LOCK_GLOB)):
                if other != self.path:
                    self._check(other)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding its flock) and let go of it."""
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None

    def _take(self) -> int:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                held = _flocked(fd)
            except ValueError:
                os.close(fd)
                raise
            if not held:
                record = self._live_record(fd)
                os.close(fd)
                raise self._refusal(record)
            if not _same_file(fd, self.path):  # removed by its owner or a taker-over between open and flock: again
                os.close(fd)
                continue
            stale = _record(fd)
            if stale:
                self.note(
                    f"taking over the stale lock {self.path.name} of process {stale.get('pid')} on {stale.get('host')} "
                    "(no longer running)"
                )
            mine = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "rank": self.rank,
                "world_size": self.world,
                "settings_sha256": self.settings_sha256,
            }
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(mine).encode())
            os.fsync(fd)
            return fd

    def _check(self, other: Path) -> None:
        try:
            fd = os.open(other, os.O_RDWR)
        except FileNotFoundError:  # released meanwhile
            return
        try:
            if _flocked(fd):
                if _same_file(fd, other):
                    record = _record(fd)
                    self.note(
                        f"removing the stale lock {other.name} of process {record.get('pid') if record else '?'} on "
                        f"{record.get('host') if record else '?'} (no longer running)"
                    )
                    other.unlink(missing_ok=True)
                return
            record = self._live_record(fd)
            if not self._fellow(record):
                raise self._refusal(record)
        finally:
            os.close(fd)

    def _fellow(self, record: dict | None) -> bool:
        """Whether a live lock's owner is a rank of this run (same settings hash and world size)."""
        return bool(record) and record.get("settings_sha256") == self.settings_sha256 and record.get("world_size") == self.world

    def _refusal(self, record: dict | None) -> ValueError:
        if self._fellow(record):
            who = f"rank {self.rank} of this capture, already running"
        elif record and record.get("settings_sha256") == self.settings_sha256:
            who = "another run with another WORLD_SIZE"
        else:
            who = "another run with other settings"
        return ArgumentError(
            "out",
            f"{str(self.out)!r} is being captured into by {who}: {_owner(record)}; wait for it to finish or use another folder",
        )

    @staticmethod
    def _live_record(fd: int) -> dict | None:
        """A live lock's record, read again for a moment while still empty (just taken, not yet written)."""
        for _ in range(READ_ATTEMPTS):
            record = _record(fd)
            if record:
                return record
            time.sleep(0.05)
        return None
