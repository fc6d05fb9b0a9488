"""A DiskStore index opened read-only, for a disk too full for SQLite to open
it the ordinary way (diskcache writes its settings on every open).

It answers the reads DiskStore makes of a ``diskcache.Cache`` (get, tags,
membership, keys, volume, queries) from SQLite opened without writing: in
read-only mode where the WAL's shared-memory file exists, else (or when
that file is the stub a failed open left, with the WAL empty) as an
immutable file (what a clean shutdown left: its WAL checkpointed into the
database). Every write raises StoreFull saying what to free; DiskStore tries
the ordinary open again before each write. ``open_checked`` is how DiskStore
opens its index: the ordinary way, else with the reserve's room given up,
else read-only.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from graphcache.errors import StoreError, StoreFull
from graphcache.stores.diskcodec import NoPickleDisk
from graphcache.stores.space import RESERVE_BYTES, Reserve, free_bytes, human, is_full

log = logging.getLogger("graphcache.stores.disk")


def open_checked(path: Path, size_limit: int, reserve: Reserve, opener: Callable[[int], Any]) -> tuple[Any, str | None]:
    """A DiskStore folder's index (``opener(size_limit)``, the ordinary open),
    and why it is open read-only (None: it is not).

    Raises StoreError when ``cache.db`` is not a diskcache index, StoreFull
    when the disk is too full to open it even read-only.
    """
    try:
        return opener(size_limit), None
    except sqlite3.DatabaseError as exc:
        if not is_full(exc, path):
            raise StoreError(
                f"{path / 'cache.db'} is not a diskcache index ({exc}): "
                "move the folder aside, or point --cache-dir / GRAPHCACHE_DIR at another one"
            ) from exc
        error = exc
    # A full disk: SQLite needs room for its journal even to open.
    if reserve.release():
        try:
            return opener(size_limit), None
        except sqlite3.DatabaseError as exc:
            error = exc
    why = f"the disk holding {path} is full ({error})"
    try:
        index = ReadOnlyIndex(path, why)
    except (OSError, sqlite3.Error):
        pass
    else:
        # Reads are served from what is stored; writes wait for room.
        log.warning("%s: its index is open read-only", why)
        return index, why
    raise StoreFull(
        f"the disk holding {path} is full: its index cannot be opened ({error}); "
        f"free at least {human(RESERVE_BYTES)} on that filesystem, then retry",
        free=free_bytes(path),
    ) from error


def _connect(db: Path, mode: str) -> sqlite3.Connection:
    con = sqlite3.connect(f"file:{db}?{mode}", uri=True, isolation_level=None, check_same_thread=False)
    try:
        con.execute("SELECT count(*) FROM Cache").fetchone()  # fails here, not later, if unreadable
    except sqlite3.Error:
        con.close()
        raise
    return con


class ReadOnlyIndex:
    """The read side of ``diskcache.Cache`` over an existing ``cache.db``."""

    def __init__(self, folder: Path, why: str) -> None:
        self.folder = folder
        self.why = why
        db = folder / "cache.db"
        if not db.is_file():
            raise FileNotFoundError(db)
        try:
            self._con = _connect(db, "mode=ro" if (folder / "cache.db-shm").exists() else "immutable=1")
        except sqlite3.Error:
            # The ordinary open that failed first (no room) leaves the
            # shared-memory file a few bytes long, and a read-only open
            # through it is a disk I/O error. With the WAL empty everything
            # is in cache.db itself, which immutable mode reads exactly.
            wal = folder / "cache.db-wal"
            if wal.exists() and wal.stat().st_size > 0:
                raise
            self._con = _connect(db, "immutable=1")
        self.disk = NoPickleDisk(str(folder))

    def _sql(self, query: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        return self._con.execute(query, params)

    def _row(self, key: str) -> tuple[Any, ...] | None:
        rows = self._sql(
            "SELECT mode, filename, value, tag FROM Cache WHERE key = ? AND raw = 1"
            " AND (expire_time IS NULL OR expire_time > ?)",
            (key, time.time()),
        ).fetchall()
        return rows[0] if rows else None

    def get(self, key: str, default: Any = None, read: bool = False, tag: bool = False, retry: bool = False) -> Any:
        row = self._row(key)
        if row is None:
            return (default, None) if tag else default
        mode, filename, value, tag_value = row
        try:
            found = self.disk.fetch(mode, filename, value, read)
        except OSError:  # its file is gone: as diskcache, a deleted key
            return (default, None) if tag else default
        return (found, tag_value) if tag else found

    def __contains__(self, key: str) -> bool:
        return self._row(key) is not None

    def __len__(self) -> int:
        return int(self._sql("SELECT count(*) FROM Cache").fetchone()[0])

    def iterkeys(self) -> Iterator[Any]:
        yield from (row[0] for row in self._sql("SELECT key FROM Cache WHERE raw = 1 ORDER BY key").fetchall())

    def volume(self) -> int:
        page_size = self._sql("PRAGMA page_size").fetchone()[0]
        pages = self._sql("PRAGMA page_count").fetchone()[0]
        stored = self._sql("SELECT coalesce(sum(size), 0) FROM Cache").fetchone()[0]
        return int(page_size * pages + stored)

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreFull(f"{self.why}: the store only reads until there is room; free space on that filesystem")

    set = delete = add = _refuse

    def transact(self, retry: bool = False) -> Any:
        self._refuse()

    def close(self) -> None:
        self._con.close()
