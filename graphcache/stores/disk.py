"""DiskStore: the embedded default store, on diskcache."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import diskcache

from graphcache.errors import StoreFull
from graphcache.key import is_key
from graphcache.stores.diskcodec import DiskLeases, NoPickleDisk, Spooled, open_index, read_all, same_bytes
from graphcache.stores.diskindex import PINNED, IndexChanges
from graphcache.stores.readonly import open_checked
from graphcache.stores.space import (
    ORPHAN_AGE,
    RESERVE_BYTES,
    Reserve,
    free_bytes,
    human,
    is_full,
    remove_file,
    spooled_bytes,
    sweep_spool,
)
from graphcache.stores.space import sweep_orphans as _sweep
from graphcache.stores.valuefile import open_value, read_value

__all__ = ["DEFAULT_SIZE_LIMIT", "PINNED", "DiskLeases", "DiskStore", "NoPickleDisk", "read_all"]

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT = 10 * 1024**3

INCOMING = "incoming"  # uploads on their way in (DiskStore.incoming)
_PATH_MEMO = 100_000
REREADS = 3  # index reads of a key whose value file went between its row and its open


class DiskStore(IndexChanges):
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
        self._reserve = Reserve(self.path)
        self._full_need: int | None = None  # the size of the last put refused for room, until there is room
        self.bookkeeping_errors = 0  # access-time updates that failed (a full disk): reads went on
        self.bookkeeping_watchers: list[Callable[[], object]] = []  # told of each (a server's counters)
        self._swept_at = 0.0
        # Upload files in ``incoming`` older than this are left by an upload
        # that died (a server lowers it to what its own timeouts allow).
        self.spool_age = ORPHAN_AGE
        # Why the index is open read-only (a disk too full to open it the
        # ordinary way), or None; every write tries the ordinary open first.
        self.read_only: str | None = None
        self._cache, self.read_only = open_checked(self.path, size_limit, self._reserve, self._open_index)

    def _open_index(self, size_limit: int) -> diskcache.Cache:
        return open_index(self.path, size_limit)

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None. Counts as a use for LRU."""
        found = self.read(key)
        return None if found is None else found[0]

    def read(self, key: str) -> tuple[bytes, tuple[int, ...] | None] | None:
        """The stored bytes and the identity of the file they came from
        (inode, size, mtime_ns, ctime_ns), or None for values kept inline in
        the index. Any rewrite of the file changes its identity, so a reader
        may remember that it verified these exact bytes. UnreadableEntry
        (a CorruptArtifact) for a value file that cannot be read.
        """
        opened = self.open(key)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return value, None
        with value:
            return read_value(value, identity[1]), identity

    def open(self, key: str, *, touch: bool = True) -> tuple[Any, tuple[int, ...] | None] | None:
        """An open binary file of the value and its identity, or the bytes of
        a value kept inline in the index (identity None), or None when absent.
        The caller closes the file. Reading through the open handle is safe
        against eviction: the file may be unlinked, never changed under it.
        A key being replaced is read, never reported absent. Raises
        UnreadableEntry when the value's file is not a readable regular file
        (valuefile.open_value: never followed, never blocking). ``touch``:
        count it as a use for LRU (a listing does not).
        """
        path = self._paths.get(key)
        if path is not None:
            # Hot path: the file of a key seen before, opened without asking
            # SQLite. diskcache writes every new value to a new file and
            # deletes the old one, so an open that succeeds reads a complete
            # value of this key; one that fails falls back to the index.
            try:
                fh = open_value(path)
            except FileNotFoundError:
                self._paths.pop(key, None)
            else:
                if touch:
                    self._touch(key)
                return fh, _identity(os.fstat(fh.fileno()))
        for _ in range(REREADS):
            value = self._cache.get(key, default=None, read=True, retry=True)
            # diskcache reads a value file unlinked between its row and its
            # open (a put replacing the key) as a missing key: ask again.
            if value is not None or not self.exists(key):
                break
        if value is None:
            return None
        if touch:
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
        try:
            self._cache._sql("UPDATE Cache SET access_time = ? WHERE key = ?", (now, key))  # noqa: SLF001
        except sqlite3.Error as exc:
            # Bookkeeping: a read never fails because its access time could
            # not be written (a full disk, a read-only folder); LRU order is
            # a little off for this key.
            self.bookkeeping_errors += 1
            for told in self.bookkeeping_watchers:
                told()
            log.debug("access time of %s not recorded: %s", key[:12], exc)

    def put(self, key: str, data: bytes, *, pin: bool = False) -> bool:
        """Atomic publish; False when identical bytes are already stored.

        ``pin`` keeps the entry out of LRU eviction (entries warmed from a
        manifest); re-putting without ``pin`` keeps an existing pin.
        """
        return self._put(key, bytes(data), len(data), pin)

    def put_file(self, key: str, path: str | os.PathLike[str], *, pin: bool = False, fd: int | None = None) -> bool:
        """``put`` of a value written whole to ``path``, a file on this
        store's filesystem (``incoming``): renamed into place, never read
        into memory or copied (one under diskcache's 32 KiB file threshold
        is read into the index). ``fd``: the writer's open (readable)
        descriptor of that file: what is stored is its bytes, whatever a
        path may name by then (diskcodec.Spooled). False when identical
        bytes are already stored. The file may be left for the caller to
        remove (a small one always is); when this raises (StoreFull as
        ``put``) too."""
        size = os.fstat(fd).st_size if fd is not None else os.stat(path).st_size
        return self._put(key, Spooled(Path(path), size, fd), size, pin)

    def _put(self, key: str, value: bytes | Spooled, size: int, pin: bool) -> bool:
        current, tag = self._cache.get(key, default=None, read=True, tag=True, retry=True)
        if current is not None and same_bytes(current, value) and (tag == PINNED or not pin):
            return False
        keep_pin = pin or tag == PINNED
        self._reopen()
        if self.read_only is not None:
            raise self.no_room(size, self.read_only)
        # Room first: on a disk full up to the size limit, the least recently
        # used entries make room before the write, not after it failed (a
        # spooled value's bytes are counted already, in ``incoming``).
        self._evict(keep=key, room=0 if isinstance(value, Spooled) else size)
        disk = self._cache.disk
        disk.written.name = None
        try:
            self._cache.set(key, value, read=isinstance(value, Spooled), tag=PINNED if keep_pin else None, retry=True)
        except (OSError, sqlite3.OperationalError) as exc:
            written, disk.written.name = disk.written.name, None
            if written is not None:  # the file was written, the index refused the entry
                remove_file(self.path / written)
            if is_full(exc, self.path):
                raise self.no_room(size, exc) from exc
            raise
        self._full_need = None
        self._evict(keep=key)
        self._reserve.restore()
        return True

    @property
    def incoming(self) -> Path:
        """Where an upload to this store is written before ``put_file``: in
        its folder, so on its filesystem (a rename, not a copy)."""
        return self.path / INCOMING

    def make_room(self, key: str, size: int) -> None:
        """What a put does before it writes, for a writer that found the
        disk full before it could put (an upload streamed to ``incoming``):
        least recently used unpinned entries, never ``key``, are evicted
        until ``size`` more bytes fit under ``size_limit``."""
        self._reopen()
        if self.read_only is None:
            self._evict(keep=key, room=size)

    def _reopen(self) -> None:
        """Open the index the ordinary way again where it is open read-only
        (the disk has room now)."""
        if self.read_only is None:
            return
        try:
            cache = self._open_index(self.size_limit)
        except sqlite3.DatabaseError:
            return
        # The read-only index is left to the collector, not closed: a reader
        # in another thread may be in the middle of a query on it.
        self._cache, self.read_only = cache, None
        log.warning("the disk holding %s has room again: its index is writable", self.path)

    def no_room(self, needed: int, exc: BaseException | str) -> StoreFull:
        """The StoreFull of a write of ``needed`` bytes that did not fit (for
        ``exc``), saying what the store holds and what to free; the store
        reports itself unwritable until that much is free."""
        self._full_need = needed
        if time.monotonic() - self._swept_at > 60:
            # What writes that died left behind is room too; at most once a
            # minute, however often clients retry on the full disk.
            self._swept_at = time.monotonic()
            self.sweep_orphans()
        free = free_bytes(self.path)
        entries, stored = len(self._cache), self.volume()
        return StoreFull(
            f"the store is out of space: no room for {human(needed)} on the disk holding {self.path} "
            f"({human(free or 0)} free; the store holds {entries} entries, {human(stored)}): {exc}; "
            "free space with `graphcache rm` or `graphcache purge`, or set GRAPHCACHE_SIZE_LIMIT below "
            "the disk's size so that LRU eviction makes room",
            needed=needed,
            free=free,
            stored=stored,
            entries=entries,
        )

    def unwritable(self) -> str | None:
        """Why an upload would not fit now, or None: the last one was refused
        for room and the disk has not had that much free since, or the disk
        is all but full."""
        if self.read_only is not None:
            self._reopen()
            if self.read_only is not None:
                return f"out of space: {self.read_only}; the index is open read-only"
        free = free_bytes(self.path)
        if free is None:
            return None
        need = self._full_need
        if need is not None and free < need:
            return f"out of space: an upload of {human(need)} did not fit; {human(free)} free on the disk holding {self.path}"
        self._full_need = None
        # Without its reserve (used up by the index on a full disk, not yet
        # put back) the store needs room for the reserve as well.
        low = RESERVE_BYTES if self._reserve.path.exists() else 2 * RESERVE_BYTES
        if free < low:
            return f"out of space: {human(free)} free on the disk holding {self.path}"
        return None

    def sweep_orphans(self, min_age: float = ORPHAN_AGE) -> tuple[int, int]:
        """Remove value files no entry names, older than ``min_age`` seconds
        (left by a process killed mid-write), and upload files in
        ``incoming`` not written for ``spool_age`` seconds; returns (files,
        bytes)."""
        rows = self._cache._sql("SELECT filename FROM Cache WHERE filename IS NOT NULL").fetchall()  # noqa: SLF001
        files, freed = _sweep(self.path, (row[0] for row in rows), min_age)
        spooled, spool_freed = sweep_spool(self.incoming, self.spool_age)
        return files + spooled, freed + spool_freed

    def _evict(self, keep: str, room: int = 0) -> None:
        """Remove least-recently-used unpinned entries until ``room`` more
        bytes fit under size_limit, counting the uploads on their way in."""
        room += spooled_bytes(self.incoming)
        while self._cache.volume() + room > self.size_limit:
            # diskcache has no public "oldest key" query; its SQLite schema
            # (Cache.key, access_time, tag) has been stable since 4.x.
            rows = self._cache._sql(  # noqa: SLF001
                "SELECT key FROM Cache WHERE (tag IS NULL OR tag != ?) AND key != ? ORDER BY access_time LIMIT 1",
                (PINNED, keep),
            ).fetchall()
            if not rows:
                return
            self.delete(rows[0][0])

    def exists(self, key: str) -> bool:
        return key in self._cache

    def delete(self, key: str) -> bool:
        """Remove; True when something was removed. Works on a full disk
        (the value's file goes first, then the index has room to record it);
        StoreFull saying what to do when it cannot."""
        self._paths.pop(key, None)
        if self.read_only is None:
            try:
                return bool(self._cache.delete(key, retry=True))
            except sqlite3.OperationalError as exc:
                if not is_full(exc, self.path):
                    raise
        # The entry reads as absent once its file is gone (diskcache's get
        # treats a missing file as a deleted key), before the index says so.
        rows = self._cache._sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchall()  # noqa: SLF001
        for (filename,) in rows:
            if filename:
                remove_file(self.path / filename)
        return bool(self._index_write(lambda: self._cache.delete(key, retry=True), f"remove {key[:12]}"))

    def keys(self) -> Iterator[str]:
        for key in self._cache.iterkeys():
            if isinstance(key, str) and is_key(key):
                yield key

    def head(self, key: str, size: int) -> bytes | None:
        """The first ``size`` bytes of a value: its header without the
        payload (for listings: not counted as a use for LRU)."""
        opened = self.open(key, touch=False)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return value[:size]
        with value:
            return read_value(value, min(size, identity[1]))

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


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
