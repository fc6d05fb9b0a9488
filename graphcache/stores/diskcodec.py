"""DiskStore's row codec (never unpickles; a value written to a file
beforehand is renamed into place), its build leases, and reading a value
file whole."""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache

from graphcache.errors import StoreFull
from graphcache.stores.space import remove_file
from graphcache.stores.valuefile import open_value, read_value

log = logging.getLogger("graphcache.stores.disk")


class NoPickleDisk(diskcache.Disk):
    """diskcache's row codec, without pickle.

    diskcache unpickles a value (or key) whose row says it was pickled
    (CVE-2025-69872): whoever can write the cache folder could run code in
    every process that reads it. Here such a row reads as its raw stored bytes
    (the pickle stream, never loaded), which are not an artifact and fail
    verification like any corrupt entry: quarantined by the service, counted
    and removed by GraphCache, shown as corrupt by ``graphcache ls``. Writes
    of anything but bytes or text are refused, so graphcache never pickles.
    """

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if mode == diskcache.core.MODE_RAW:
            return bytes(value) if type(value) is sqlite3.Binary else value
        if mode in (diskcache.core.MODE_PICKLE, diskcache.core.MODE_TEXT):
            log.warning("diskcache row stored in mode %d (not raw bytes): read as bytes, never unpickled", mode)
            if filename is None:
                return _as_bytes(value)
            mode = diskcache.core.MODE_BINARY
        if mode == diskcache.core.MODE_BINARY and filename is not None:
            # Never through a symlink, never blocking on a FIFO, only a
            # regular file (UnreadableEntry otherwise: not an OSError, so
            # diskcache does not take it for a deleted key).
            path = os.path.join(self._directory, filename)
            if read:
                return open_value(path)
            with open_value(path) as reader:
                return read_value(reader, os.fstat(reader.fileno()).st_size, path)
        return b""

    def get(self, key: Any, raw: bool) -> Any:
        if raw:
            return bytes(key) if type(key) is sqlite3.Binary else key
        # A pickled key: never a graphcache key (those are text); its bytes
        # are not loaded, and DiskStore.keys() skips anything not text.
        return bytes(key)

    def __init__(self, directory: str, **kwargs: Any) -> None:
        super().__init__(directory, **kwargs)
        # The value file this thread's last store() wrote: removed by
        # DiskStore.put when the index then fails to take the entry.
        self.written = threading.local()

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if isinstance(value, Spooled):
            stored = self._adopt(value, key)
        elif not read and not isinstance(value, (bytes, str)):
            raise TypeError(f"DiskStore stores bytes or text, not {type(value).__name__} (it never pickles)")
        else:
            stored = super().store(value, read, key=key)
        self.written.name = stored[2]
        return stored

    def _adopt(self, value: Spooled, key: Any) -> tuple[int, int, str | None, Any]:
        """A Spooled value's row: a small one read into the index (the file
        stays, for its owner to remove), any other renamed into place.
        Where the writer's open file is given, what is stored is that file's
        bytes: read from it, or renamed and then checked to be it (a file put
        in its place by path is removed, and the writer's bytes copied)."""
        if value.size < self.min_file_size:
            with value.reader() as fh:
                return 0, diskcache.core.MODE_RAW, None, sqlite3.Binary(read_value(fh, value.size))
        filename, full_path = self.filename(key, value)
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        os.rename(value.path, full_path)
        if value.fd is not None and not _same_file(full_path, value.fd):
            log.error("the upload file %s was replaced before it was stored: storing the verified bytes", value.path)
            remove_file(full_path)
            with value.reader() as fh:
                return super().store(fh, True, key=key)  # type: ignore[no-any-return]
        return value.size, diskcache.core.MODE_BINARY, filename, None

    def _write(self, full_path: str, iterator: Any, mode: str, encoding: str | None = None) -> Any:
        # diskcache leaves what it wrote of a value when the write fails (an
        # empty or partial file per failed upload on a full disk).
        try:
            return super()._write(full_path, iterator, mode, encoding)
        except OSError:
            remove_file(full_path)
            raise


@dataclass(frozen=True)
class Spooled:
    """A value already written whole to a file on the store's filesystem
    (an upload streamed to ``incoming``): the codec renames it into place
    instead of copying it. ``fd``: the writer's own open descriptor of it
    (readable), from which its bytes are read, never from the path again."""

    path: Path
    size: int
    fd: int | None = None

    def reader(self) -> Any:
        """A binary file at the value's first byte: a new handle on ``fd``
        (closing it leaves ``fd`` open), else the file at ``path``."""
        if self.fd is None:
            return open_value(self.path)
        handle = os.fdopen(os.dup(self.fd), "rb", buffering=0)
        handle.seek(0)
        return handle


def _same_file(path: str, fd: int) -> bool:
    mine, there = os.fstat(fd), os.lstat(path)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def same_bytes(current: Any, value: bytes | Spooled) -> bool:
    """Whether a stored value (bytes, or an open file that is closed here)
    holds exactly ``value``'s bytes, read a chunk at a time."""
    if isinstance(current, (bytes, bytearray, memoryview)):
        if isinstance(value, Spooled):
            if value.size != len(current):
                return False
            with value.reader() as fh:
                return read_value(fh, value.size) == current
        return bytes(current) == value
    with current:
        size = os.fstat(current.fileno()).st_size
        if size != (value.size if isinstance(value, Spooled) else len(value)):
            return False
        if not isinstance(value, Spooled):
            return read_all(current, size) == value
        with value.reader() as other:
            while chunk := current.read(1 << 20):
                if other.read(len(chunk)) != chunk:
                    return False
        return True


class DiskLeases:
    """Leases as diskcache entries with an expiry, changed in transactions."""

    def __init__(self, cache: diskcache.Cache) -> None:
        self._cache = cache

    def try_acquire(self, key: str, owner: str, ttl: float) -> bool:
        try:
            return bool(self._cache.add(f"lease:{key}", owner, expire=ttl, retry=True))
        except (sqlite3.OperationalError, StoreFull) as exc:
            # A full disk has no room for the lease: build without one (the
            # other processes of this machine may build the same key too).
            log.warning("no build lease for %s (%s): building without one", key[:12], exc)
            return True

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        with self._cache.transact(retry=True):
            if self._cache.get(f"lease:{key}") != owner:
                return False
            self._cache.set(f"lease:{key}", owner, expire=ttl)
            return True

    def release(self, key: str, owner: str) -> None:
        with self._cache.transact(retry=True):
            if self._cache.get(f"lease:{key}") == owner:
                self._cache.delete(f"lease:{key}")


def _as_bytes(value: Any) -> bytes:
    """An inline row's value as bytes, whatever SQLite holds there (a blob,
    text, a number, NULL)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return str(value).encode()


def read_all(handle: Any, size: int) -> bytes:
    fileno = handle.fileno()
    data = os.read(fileno, size) if size else b""
    while len(data) < size:  # short read
        more = os.read(fileno, size - len(data))
        if not more:
            break
        data += more
    return data


def open_index(path: Path, size_limit: int) -> diskcache.Cache:
    """The diskcache index of a DiskStore folder, as DiskStore configures it."""
    return diskcache.Cache(
        str(path),
        size_limit=size_limit,
        # diskcache's own LRU writes access_time in a transaction on every
        # get, which made a get 3x slower than reading the file. Reads
        # take its lock-free path; _touch records uses at most once per
        # touch_interval per key, and _evict orders by that time.
        eviction_policy="least-recently-stored",
        # Large values go to files; reading one through its open handle
        # is what keeps the GET path close to a static file server.
        disk_min_file_size=32 * 1024,
        statistics=False,
        # diskcache culls ten entries at a time on set, hot ones included;
        # we evict one least-recently-used entry at a time instead (_evict).
        cull_limit=0,
        disk=NoPickleDisk,
    )
