"""DiskStore's index changes that must work on a full disk (pin, unpin,
and the retry every such change takes, ``_index_write``) and setting an
unreadable entry aside, kept apart from the store's reads and puts
(``graphcache.stores.disk``)."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

from graphcache.errors import StoreFull
from graphcache.stores.space import RESERVE_BYTES, Reserve, free_bytes, human, is_full

PINNED = "pinned"
log = logging.getLogger("graphcache.stores.disk")


class IndexChanges:
    """Mixed into DiskStore (which sets these attributes and ``_reopen``)."""

    path: Path
    read_only: str | None
    _reserve: Reserve
    _cache: Any

    def _reopen(self) -> None:  # pragma: no cover - DiskStore's
        raise NotImplementedError

    def delete(self, key: str) -> bool:  # pragma: no cover - DiskStore's
        raise NotImplementedError

    def _index_write(self, write: Any, what: str) -> Any:
        """An index change that must work on a full disk (delete, pin): tried
        again with the reserve given up; StoreFull saying what to do when even
        that has no room."""
        self._reopen()
        if self.read_only is not None:
            raise StoreFull(
                f"{self.read_only}: its index is open read-only and cannot {what}; "
                f"free at least {human(RESERVE_BYTES)} on that filesystem, then retry",
                free=free_bytes(self.path),
            )
        error: sqlite3.OperationalError | None = None
        # Once as things are, once more after giving the reserve's room back.
        for retry in (False, True):
            if retry and not self._reserve.release():
                break
            try:
                return write()
            except sqlite3.OperationalError as exc:
                if not is_full(exc, self.path):
                    raise
                error = exc
        raise StoreFull(
            f"the disk holding {self.path} is full and its index has no room to {what} ({error}): "
            f"free at least {human(RESERVE_BYTES)} on that filesystem (outside the store), then retry",
            free=free_bytes(self.path),
        ) from error

    def pin(self, key: str) -> bool:
        """Exempt a stored entry from eviction; False when absent."""
        return self._set_tag(key, PINNED)

    def unpin(self, key: str) -> bool:
        return self._set_tag(key, None)

    def pinned(self, key: str) -> bool:
        # The tag only: diskcache's get(tag=True) would read the value too.
        query = "SELECT tag FROM Cache WHERE key = ? AND raw = 1"
        rows = self._cache._sql(query, (key,)).fetchall()  # noqa: SLF001
        return bool(rows) and rows[0][0] == PINNED

    def pinned_keys(self) -> set[str]:
        """Every pinned key, in one query (a listing asks it once, not per entry)."""
        rows = self._cache._sql("SELECT key FROM Cache WHERE tag = ? AND raw = 1", (PINNED,)).fetchall()  # noqa: SLF001
        return {row[0] for row in rows}

    def _set_tag(self, key: str, tag: str | None) -> bool:
        # The tag alone: rewriting the value would need its size in free
        # space again (a pin on a full disk).
        query = "UPDATE Cache SET tag = ? WHERE key = ? AND raw = 1"
        cursor = self._index_write(lambda: self._cache._sql(query, (tag, key)), f"pin or unpin {key[:12]}")  # noqa: SLF001
        return bool(cursor.rowcount)

    def set_aside(self, key: str, folder: Path, name: str) -> Path | None:
        """Move the value file of ``key`` (whatever is there, never followed:
        a link is moved as a link) into ``folder`` as ``name``, and remove the
        entry; the moved path, or None when the value has no file of its own
        (it is removed all the same)."""
        rows = self._cache._sql("SELECT filename FROM Cache WHERE key = ? AND raw = 1", (key,)).fetchall()  # noqa: SLF001
        moved = None
        for (filename,) in rows:
            if filename:
                try:
                    os.rename(self.path / filename, folder / name)
                    moved = folder / name
                except OSError as exc:
                    log.error("could not move the value file of %s aside: %s", key[:12], exc)
        self.delete(key)
        return moved
