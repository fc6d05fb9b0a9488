"""Files a store holds, opened and written without trusting what is there.

A value file is opened once, never following a symlink (``O_NOFOLLOW``: a
link planted in the cache folder is not read through), never blocking
(``O_NONBLOCK``: a FIFO in a value file's place once froze a server's event
loop), and only as a regular file; anything else, and a file that cannot be
read (EIO, EACCES), is an ``UnreadableEntry``: a corrupt entry, set aside
like one, never a missing key and never a server error.

Folders the server writes private files into (uploads on their way in,
quarantine) are its own: made mode 0700, owned by this user, not a symlink,
and refused otherwise (``private_folder``); a private file is written once,
mode 0600, never through a link (``write_private``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Any

from graphcache.errors import StoreError, UnreadableEntry

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFLNK: "a symlink",
}


def open_value(path: str | os.PathLike[str]) -> Any:
    """An unbuffered binary file of the regular file at ``path``.

    Raises FileNotFoundError when nothing is there (a value replaced or
    evicted since its row was read: the caller looks again), and
    UnreadableEntry for anything else that is not a readable regular file
    (a symlink, which is not followed; a directory, FIFO or device; EACCES,
    EIO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        what = "a symlink (not followed)" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise UnreadableEntry(f"value file {os.fspath(path)} cannot be read: {what}", os.fspath(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise UnreadableEntry(f"value file {os.fspath(path)} is {kind}, not a file", os.fspath(path))
        os.set_blocking(fd, True)
        handle = os.fdopen(fd, "rb", buffering=0)
        handle.name = os.fspath(path)  # as open(path) names it (DiskStore remembers it)
        return handle
    except BaseException:
        os.close(fd)
        raise


def read_value(handle: Any, size: int, path: str = "") -> bytes:
    """``size`` bytes of an open value file; UnreadableEntry when the read
    fails (EIO) or the file ends early."""
    fileno = handle.fileno()
    try:
        data = os.read(fileno, size) if size else b""
        while len(data) < size:  # short read
            more = os.read(fileno, size - len(data))
            if not more:
                break
            data += more
    except OSError as exc:
        where = path or getattr(handle, "name", "")
        raise UnreadableEntry(f"value file {where} cannot be read: {exc.strerror or exc}", str(where)) from None
    return data


def private_folder(path: str | os.PathLike[str], what: str, elsewhere: str = "GRAPHCACHE_DIR") -> Path:
    """``path`` as a folder only this user may enter: made mode 0700 where
    absent; an existing one must be a real folder (not a symlink) owned by
    this user (one of ours open to others is narrowed to 0700). Raises
    StoreError naming ``what`` the folder is for and what to do (remove it,
    or point ``elsewhere``, the setting that places it, somewhere else)."""
    folder = Path(path)
    with contextlib.suppress(FileExistsError):
        folder.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(folder, 0o700)
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise StoreError(f"the folder for {what}, {folder}, cannot be used: {exc.strerror or exc}") from None
    uid = os.geteuid()
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a folder"
    elif st.st_uid != uid:
        problem = f"is owned by uid {st.st_uid}, not this server's uid {uid}"
    elif st.st_mode & 0o077:
        if st.st_uid == uid:
            # Ours, made with a wider mode (an older graphcache, a umask): narrowed.
            try:
                os.chmod(folder, 0o700, follow_symlinks=False)
                return folder
            except OSError:
                pass
        problem = f"has mode {stat.S_IMODE(st.st_mode):o}, open to other users"
    if problem is not None:
        raise StoreError(
            f"the folder for {what}, {folder}, {problem}: another local user could read or replace what is "
            f"written there; remove it (or point {elsewhere} elsewhere) and start again"
        )
    return folder


def write_private(folder: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to a new file ``name`` in ``folder`` (a
    ``private_folder``), mode 0600, never through a link or over a file."""
    path = folder / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    return path
