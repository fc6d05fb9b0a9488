"""DiskStore: the embedded default store, on diskcache."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache

from graphcache.errors import StoreError
from graphcache.key import is_key

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT = 10 * 1024**3
PINNED = "pinned"
_PATH_MEMO = 100_000


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
            path = os.path.join(self._directory, filename)
            if read:
                return open(path, "rb")  # noqa: SIM115 - handed to the caller
            with open(path, "rb") as reader:
                return reader.read()
        return b""

    def get(self, key: Any, raw: bool) -> Any:
        if raw:
            return bytes(key) if type(key) is sqlite3.Binary else key
        # A pickled key: never a graphcache key (those are text); its bytes
        # are not loaded, and DiskStore.keys() skips anything not text.
        return bytes(key)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if not read and not isinstance(value, (bytes, str)):
            raise TypeError(f"DiskStore stores bytes or text, not {type(value).__name__} (it never pickles)")
        return super().store(value, read, key=key)


class DiskStore:
    """Artifacts in a local folder, shared safely by threads and processes.

    diskcache writes each large value to its own file and publishes it with
    one SQLite transaction, so a put is atomic: readers see the old entry or
    the whole new one. Eviction is least-recently-used once the folder
    exceeds ``size_limit`` bytes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        size_limit: int = DEFAULT_SIZE_LIMIT,
        *,
        touch_interval: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.size_limit = size_limit
        self.touch_interval = touch_interval
        self._touched: dict[str, float] = {}
        self._paths: dict[str, str] = {}
        try:
            self._cache = self._open_index(size_limit)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"{self.path / 'cache.db'} is not a diskcache index ({exc}): "
                "move the folder aside, or point --cache-dir / GRAPHCACHE_DIR at another one"
            ) from exc

    def _open_index(self, size_limit: int) -> diskcache.Cache:
        return diskcache.Cache(
            str(self.path),
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

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None. Counts as a use for LRU."""
        found = self.read(key)
        return None if found is None else found[0]

    def read(self, key: str) -> tuple[bytes, tuple[int, ...] | None] | None:
        """The stored bytes and the identity of the file they came from
        (inode, size, mtime_ns, ctime_ns), or None for values kept inline in
        the index. Any rewrite of the file changes its identity, so a reader
        may remember that it verified these exact bytes.
        """
        opened = self.open(key)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return value, None
        with value:
            return read_all(value, identity[1]), identity

    def open(self, key: str) -> tuple[Any, tuple[int, ...] | None] | None:
        """An open binary file of the value and its identity, or the bytes of
        a value kept inline in the index (identity None), or None when absent.
        The caller closes the file. Reading through the open handle is safe
        against eviction: the file may be unlinked, never changed under it.
        """
        path = self._paths.get(key)
        if path is not None:
            # Hot path: the file of a key seen before, opened without asking
            # SQLite. diskcache writes every new value to a new file and
            # deletes the old one, so an open that succeeds reads a complete
            # value of this key; one that fails falls back to the index.
            try:
                fh = open(path, "rb", buffering=0)  # noqa: SIM115 - handed to the caller
            except FileNotFoundError:
                self._paths.pop(key, None)
            else:
                self._touch(key)
                return fh, _identity(os.fstat(fh.fileno()))
        value = self._cache.get(key, default=None, read=True, retry=True)
        if value is None:
            return None
        self._touch(key)
        if isinstance(value, bytes):
            return value, None
        if not hasattr(value, "fileno"):
            # Raw text or a number in the index: not an artifact; its text
            # fails verification like any corrupt entry.
            return str(value).encode("utf-8", "surrogateescape"), None
        if len(self._paths) >= _PATH_MEMO:
            self._paths.clear()
        self._paths[key] = value.name
        return value, _identity(os.fstat(value.fileno()))

    def stat(self, key: str) -> tuple[int, ...] | None:
        """The identity ``read`` would report for a key read before, from one
        stat() call; None when unknown (not read yet, inline, or gone)."""
        path = self._paths.get(key)
        if path is None:
            return None
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._paths.pop(key, None)
            return None
        self._touch(key)
        return _identity(st)

    def _touch(self, key: str) -> None:
        now = time.time()
        if now - self._touched.get(key, 0.0) < self.touch_interval:
            return
        self._touched[key] = now
        if len(self._touched) > 100_000:
            self._touched.clear()
        self._cache._sql("UPDATE Cache SET access_time = ? WHERE key = ?", (now, key))  # noqa: SLF001

    def put(self, key: str, data: bytes, *, pin: bool = False) -> bool:
        """Atomic publish; False when identical bytes are already stored.

        ``pin`` keeps the entry out of LRU eviction (entries warmed from a
        manifest); re-putting without ``pin`` keeps an existing pin.
        """
        current = self._cache.get(key, default=None, tag=True, retry=True)
        value, tag = current
        if value is not None and value == data and (tag == PINNED or not pin):
            return False
        keep_pin = pin or tag == PINNED
        self._cache.set(key, bytes(data), tag=PINNED if keep_pin else None, retry=True)
        self._evict(keep=key)
        return True

    def pin(self, key: str) -> bool:
        """Exempt a stored entry from eviction; False when absent."""
        return self._set_tag(key, PINNED)

    def unpin(self, key: str) -> bool:
        return self._set_tag(key, None)

    def pinned(self, key: str) -> bool:
        _, tag = self._cache.get(key, default=None, tag=True, retry=True)
        return tag == PINNED

    def _set_tag(self, key: str, tag: str | None) -> bool:
        value, _ = self._cache.get(key, default=None, tag=True, retry=True)
        if value is None:
            return False
        self._cache.set(key, value, tag=tag, retry=True)
        return True

    def _evict(self, keep: str) -> None:
        """Remove least-recently-used unpinned entries until under size_limit."""
        while self._cache.volume() > self.size_limit:
            # diskcache has no public "oldest key" query; its SQLite schema
            # (Cache.key, access_time, tag) has been stable since 4.x.
            rows = self._cache._sql(  # noqa: SLF001
                "SELECT key FROM Cache WHERE (tag IS NULL OR tag != ?) AND key != ? ORDER BY access_time LIMIT 1",
                (PINNED, keep),
            ).fetchall()
            if not rows:
                return
            self._cache.delete(rows[0][0], retry=True)

    def exists(self, key: str) -> bool:
        return key in self._cache

    def delete(self, key: str) -> bool:
        self._paths.pop(key, None)
        return bool(self._cache.delete(key, retry=True))

    def keys(self) -> Iterator[str]:
        for key in self._cache.iterkeys():
            if isinstance(key, str) and is_key(key):
                yield key

    def head(self, key: str, size: int) -> bytes | None:
        """The first ``size`` bytes of a value: its header without the payload."""
        opened = self.open(key)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return value[:size]
        with value:
            return read_all(value, min(size, identity[1]))

    def leases(self) -> DiskLeases:
        """Build leases shared by every process using this folder."""
        return DiskLeases(self._cache)

    def volume(self) -> int:
        """Bytes used on disk (payload files plus the index)."""
        return int(self._cache.volume())

    def ping(self) -> None:
        """Raises when the index cannot be read."""
        self._cache.get("__ping__", default=None, retry=True)

    def close(self) -> None:
        self._cache.close()

    def __repr__(self) -> str:
        return f"DiskStore({str(self.path)!r})"


class DiskLeases:
    """Leases as diskcache entries with an expiry, changed in transactions."""

    def __init__(self, cache: diskcache.Cache) -> None:
        self._cache = cache

    def try_acquire(self, key: str, owner: str, ttl: float) -> bool:
        return bool(self._cache.add(f"lease:{key}", owner, expire=ttl, retry=True))

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


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_all(handle: Any, size: int) -> bytes:
    fileno = handle.fileno()
    data = os.read(fileno, size) if size else b""
    while len(data) < size:  # short read
        more = os.read(fileno, size - len(data))
        if not more:
            break
        data += more
    return data
