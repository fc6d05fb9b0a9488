"""Room on the disk a DiskStore lives on: telling a full disk from a broken
index, the headroom its index needs to change at all on a full disk, and
value files that no entry names (a write cut short).

SQLite cannot delete a row, or even open a WAL database, without writing its
journal: on a disk filled to the last byte, ``graphcache rm``, DELETE and a
restarted server all failed. A DiskStore that has written keeps a small
reserve file in its folder; when an index write finds the disk full, the
reserve is given up and the write tried again (opening the index needed
between 128 and 192 KiB on tmpfs), and it is put back once there is room.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

RESERVE_NAME = "reserve"
RESERVE_BYTES = 512 * 1024
# A value file no entry names, older than this, was left by a write that
# died: a write in progress keeps touching its file, and publishes it within
# a transaction right after.
ORPHAN_AGE = 600.0
_SQLITE_FULL = 13
_SQLITE_IOERR = 10
_HEX2 = re.compile(r"[0-9a-f]{2}$")


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s filesystem."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(exc: BaseException, path: str | os.PathLike[str]) -> bool:
    """True when ``exc`` says the disk (or a quota) is full.

    SQLite reports it as SQLITE_FULL, or, when even its shared-memory file
    cannot grow, as a disk I/O error: that one counts as full only when the
    filesystem has less than the reserve left.
    """
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, sqlite3.OperationalError):
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        text = str(exc)
        if code == _SQLITE_FULL or "database or disk is full" in text:
            return True
        if code == _SQLITE_IOERR or "disk I/O error" in text:
            free = free_bytes(path)
            return free is not None and free < RESERVE_BYTES
    return False


class Reserve:
    """A file of ``RESERVE_BYTES`` zeros in the store's folder: room that only
    index bookkeeping (open, delete, pin) may take when the disk is full."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / RESERVE_NAME

    def release(self) -> bool:
        """Give the reserve up; True when there was one."""
        try:
            os.remove(self.path)
        except OSError:
            return False
        log.warning("the disk holding %s is full: its index used the reserve", self.path.parent)
        return True

    def restore(self) -> None:
        """Put the reserve back when the disk has room for it and then some."""
        if self.path.exists():
            return
        free = free_bytes(self.path.parent)
        if free is None or free < 2 * RESERVE_BYTES:
            return
        tmp = self.path.with_name(f".{RESERVE_NAME}.{os.getpid()}")
        try:
            # Written, not truncated to size: a sparse file holds no room.
            with open(tmp, "wb") as fh:
                fh.write(bytes(RESERVE_BYTES))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def remove_file(path: str | os.PathLike[str]) -> int:
    """Remove a file; the bytes it held (0 when it was not there)."""
    try:
        size = os.stat(path).st_size
        os.remove(path)
    except OSError:
        return 0
    return size


def sweep_orphans(folder: Path, referenced: Iterable[str], min_age: float = ORPHAN_AGE) -> tuple[int, int]:
    """Remove value files (``ab/cd/*.val``) that no entry names and that are
    older than ``min_age`` seconds; returns (files, bytes) removed."""
    named = {os.path.normpath(name) for name in referenced}
    cutoff = time.time() - min_age
    files = freed = 0
    for top in _hex_dirs(folder):
        for sub in _hex_dirs(top):
            for entry in os.scandir(sub):
                if not entry.name.endswith(".val") or not entry.is_file(follow_symlinks=False):
                    continue
                rel = os.path.join(top.name, sub.name, entry.name)
                if rel in named or entry.stat(follow_symlinks=False).st_mtime > cutoff:
                    continue
                size = remove_file(entry.path)
                files += 1
                freed += size
            with contextlib.suppress(OSError):
                sub.rmdir()  # only when empty
        with contextlib.suppress(OSError):
            top.rmdir()
    if files:
        log.warning(
            "removed %d value file(s) (%d bytes) no entry of %s named: left by writes that died", files, freed, folder
        )
    return files, freed


SPOOL_PREFIX = ".upload-"  # an upload's file while it arrives (service.upload)


def claim(fd: int) -> None:
    """Mark the upload file open on ``fd`` as in flight for as long as this
    process holds it open (an exclusive ``flock``: the kernel drops it when
    the process dies, however it dies), so no server sharing the folder
    sweeps it as left by a dead upload (``sweep_spool``). Where locks are
    not available the file is swept by its age alone, as before."""
    with contextlib.suppress(OSError, ImportError):
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _claimed(path: str) -> bool:
    """Whether a live process holds the upload file at ``path`` (``claim``)."""
    try:
        import fcntl
    except ImportError:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # a lock taken here goes with it
    return False


def _spool_files(folder: Path) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(folder) if e.name.startswith(SPOOL_PREFIX)]
    except OSError:
        return []


def spooled_bytes(folder: Path) -> int:
    """Bytes the upload files in ``folder`` hold now (room a put must count)."""
    total = 0
    for entry in _spool_files(folder):
        with contextlib.suppress(OSError):
            total += entry.stat(follow_symlinks=False).st_size
    return total


def sweep_spool(folder: Path, min_age: float) -> tuple[int, int]:
    """Remove the upload files in ``folder`` not written for ``min_age``
    seconds (an upload in progress writes its file as it arrives, and stores
    it within the store's timeout after) and held by no live process (a
    slow upload to another server sharing the folder, whose settings allow
    it longer, is still held: ``claim``); returns (files, bytes)."""
    cutoff = time.time() - min_age
    files = freed = 0
    for entry in _spool_files(folder):
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            if st.st_mtime < cutoff and not _claimed(entry.path):
                os.remove(entry.path)
                files += 1
                freed += st.st_size
    if files:
        log.warning("removed %d upload file(s) (%d bytes) left in %s by uploads that died", files, freed, folder)
    return files, freed


def _hex_dirs(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if _HEX2.match(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def human(n: float) -> str:
    """Bytes as a person reads them: 512 B, 3.5 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
