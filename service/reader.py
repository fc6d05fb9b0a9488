"""The raw artifact read path: stored bytes are verified before they are served.

Kept apart from HTTP: ``State.artifact`` and the batch route call it, and the
ASGI fast path sends what it returns.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphcache.artifact import Artifact
from graphcache.errors import CorruptArtifact, SignatureError, StoreError, UnreadableEntry
from graphcache.stores import Store
from graphcache.stores.valuefile import private_folder, read_value, write_private
from service.metrics import Metrics

log = logging.getLogger("graphcache.service")

VERIFIED_MEMO = 100_000
HOT_ITEM_MAX = 1024 * 1024
STREAM_MIN = 1024 * 1024  # verified entries from this size stream from the open file
STREAM_CHUNK = 512 * 1024  # 4 MiB GETs: 0.93x and 1.06x nginx vs 0.83x and 0.95x at 256 KiB (docs/benchmarks.md)
# Files the quarantine folder keeps, beside its size cap (GRAPHCACHE_QUARANTINE_SIZE):
# entries set aside whole may be empty (a FIFO, a link), which no size counts.
QUARANTINE_FILES = 1000


def file_chunks(fh: Any, size: int) -> Iterator[bytes]:
    """The ``size`` bytes of an open verified file, ``STREAM_CHUNK`` at a
    time; OSError if the file ends early."""
    left = size
    while left:
        chunk = os.read(fh.fileno(), min(STREAM_CHUNK, left))
        if not chunk:
            raise OSError(f"file ended at {size - left} of {size} bytes")
        left -= len(chunk)
        yield chunk


@dataclass(frozen=True)
class Served:
    """A verified entry: its bytes, or an open file to stream them from."""

    data: bytes | None
    etag: str
    size: int
    handle: Any = None
    build_seconds: float = 0.0  # what the artifact took to build: what serving it saves


@dataclass(frozen=True)
class Unverified:
    data: bytes
    identity: tuple[int, ...] | None


class ArtifactReader:
    """Reads entries and verifies them before they are served.

    Verification hashes the payload (about 3 ms per 4 MiB here). For
    DiskStore entries kept in files, the reader remembers the file identity
    (inode, size, mtime, ctime) it verified: any rewrite of the file changes
    it, so a flipped or truncated file is verified again and never served.
    Verified large entries are streamed from the open file in chunks, so 64
    concurrent 4 MiB downloads do not hold 256 MiB; small ones are kept in
    memory (``hot_bytes``) while their file is unchanged. Corrupt entries are
    moved to a quarantine folder and counted.
    """

    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        quarantine: Path | None,
        hot_bytes: int = 0,
        verify_keys: tuple[bytes, ...] = (),
        quarantine_bytes: int | None = None,
    ) -> None:
        self.store = store
        self.quarantine_bytes = quarantine_bytes  # the folder's cap (None: none), oldest dropped first
        self.verify_keys = verify_keys
        self.metrics = metrics
        self.quarantine = quarantine
        self._open = getattr(store, "open", None)
        self._stat = getattr(store, "stat", None)
        self.aget = getattr(store, "aget", None)  # an asyncio read (RedisStore): alookup
        self._memo: OrderedDict[str, tuple[tuple[int, ...], str, float]] = OrderedDict()
        self.hot_bytes = hot_bytes
        self._hot: OrderedDict[str, tuple[tuple[int, ...] | None, Served]] = OrderedDict()
        self._hot_size = 0

    def lookup(self, key: str) -> Served | Unverified | None:
        """Fast part, safe on the event loop: a Served entry when these exact
        bytes were verified before, else the bytes still to verify. An entry
        whose value file cannot be read (never followed, never blocking:
        graphcache.stores.valuefile) is set aside and its UnreadableEntry
        raised."""
        try:
            return self._lookup(key)
        except UnreadableEntry as exc:
            self.set_aside(key, exc)
            raise

    def _lookup(self, key: str) -> Served | Unverified | None:
        hot = self._hot.get(key)
        if hot is not None and self._stat is not None:
            if self._stat(key) == hot[0]:
                return hot[1]
            self._drop_hot(key)
            hot = None
        if self._open is None:
            return self._fetched(key, self.store.get(key))
        opened = self._open(key)
        if opened is None:
            return None
        value, identity = opened
        if identity is None:
            return Unverified(value, None)
        memo = self._memo.get(key)
        size = identity[1]
        if memo is not None and memo[0] == identity and size >= STREAM_MIN:
            return Served(None, memo[1], size, handle=value, build_seconds=memo[2])
        with value:
            data = read_value(value, size)
        if memo is not None and memo[0] == identity:
            served = Served(data, memo[1], size, build_seconds=memo[2])
            self._keep_hot(key, identity, served)
            return served
        return Unverified(data, identity)

    async def alookup(self, key: str) -> Served | Unverified | None:
        """``lookup`` for a store with an asyncio ``aget`` (Redis): the bytes
        are fetched on the event loop without blocking it."""
        assert self.aget is not None
        return self._fetched(key, await self.aget(key))

    def _fetched(self, key: str, data: bytes | None) -> Served | Unverified | None:
        # Redis and other byte stores: no file identity, so the bytes are
        # fetched every time; a hot copy lets an equal fetch skip the hash
        # (comparing is ~10x cheaper than SHA-256).
        if data is None:
            self._drop_hot(key)
            return None
        hot = self._hot.get(key)
        if hot is not None and hot[1].data == data:
            return hot[1]
        return Unverified(data, None)

    def verify(self, key: str, entry: Unverified) -> Served | str:
        """Slow part (hashing): the verified entry, or why it is not served:
        ``quarantined: REASON`` after quarantining a corrupt entry, ``not
        served: REASON`` for one whose signature ``verify_keys`` refuse (left
        in the store: a client's upload signed with the current key replaces
        it, and a server given the wrong keys must not delete its store)."""
        try:
            artifact = Artifact.decode(entry.data, expected_key=key)
        except CorruptArtifact as exc:
            self._quarantine(key, entry.data, exc)
            return f"quarantined: {exc.reason}"
        if self.verify_keys:
            try:
                artifact.verify_signature(self.verify_keys)
            except SignatureError as exc:
                log.warning("stored entry %s not served: %s", key, exc)
                self.metrics.refused.labels(exc.reason).inc()
                self.forget(key)
                return f"not served: {exc.reason}"
        served = Served(entry.data, artifact.payload_sha256, len(entry.data), build_seconds=artifact.build_seconds)
        if entry.identity is not None:
            self._memo[key] = (entry.identity, served.etag, served.build_seconds)
            self._memo.move_to_end(key)
            while len(self._memo) > VERIFIED_MEMO:
                self._memo.popitem(last=False)
            self.metrics.verified_cache.set(len(self._memo))
        if entry.identity is not None or self._open is None:
            self._keep_hot(key, entry.identity, served)
        return served

    def forget(self, key: str) -> None:
        self._memo.pop(key, None)
        self._drop_hot(key)

    def _keep_hot(self, key: str, identity: tuple[int, ...] | None, served: Served) -> None:
        """Keep a small verified entry; it is served again only while its file
        identity (DiskStore) or its bytes (other stores) are unchanged."""
        size = served.size
        if served.data is None or size > min(HOT_ITEM_MAX, self.hot_bytes):
            return
        if identity is None and self._open is not None:
            return  # an entry inline in DiskStore's index: no identity to check, verify each time
        self._drop_hot(key)
        self._hot[key] = (identity, served)
        self._hot_size += size
        while self._hot_size > self.hot_bytes:
            _, (_, old) = self._hot.popitem(last=False)
            self._hot_size -= old.size

    def _drop_hot(self, key: str) -> None:
        old = self._hot.pop(key, None)
        if old is not None:
            self._hot_size -= old[1].size

    def _quarantine(self, key: str, data: bytes, exc: CorruptArtifact) -> None:
        log.error("stored entry %s failed verification (%s): quarantined", key, exc)
        self.metrics.quarantined.labels(exc.reason).inc()
        self.forget(key)
        if self.quarantine is not None:
            try:
                # A private copy (0600, in a 0700 folder of the server's own):
                # what a planted entry held is no one else's to read.
                write_private(private_folder(self.quarantine, "quarantine"), _aside_name(key, exc.reason), data)
            except (OSError, StoreError) as err:
                log.error("could not write quarantine copy of %s: %s", key, err)
            self.trim_quarantine()
        try:
            self.store.delete(key)
        except StoreError as err:
            log.error("could not remove corrupt entry %s: %s", key, err)

    def set_aside(self, key: str, exc: UnreadableEntry) -> None:
        """An entry whose value cannot be read: its file (whatever is there,
        never followed) moved into quarantine where the store can, and the
        entry removed, counted as quarantined (``unreadable``)."""
        log.error("stored entry %s cannot be read (%s): set aside", key, exc)
        self.metrics.quarantined.labels(exc.reason).inc()
        self.forget(key)
        aside = getattr(self.store, "set_aside", None)
        try:
            if aside is not None and self.quarantine is not None:
                # Not trimmed here: this runs on the event loop for a local store; the
                # caller (State.read_entry) trims the folder in a thread.
                aside(key, private_folder(self.quarantine, "quarantine"), _aside_name(key, exc.reason))
                return
        except (OSError, StoreError) as err:
            log.error("could not move unreadable entry %s into quarantine, removing it: %s", key, err)
        try:
            self.store.delete(key)
        except (OSError, StoreError) as err:
            log.error("could not remove unreadable entry %s: %s", key, err)

    def trim_quarantine(self) -> int:
        """Keep the quarantine folder within ``quarantine_bytes`` and
        ``QUARANTINE_FILES``: what was set aside longest ago goes first (by
        the time it was set aside: its name's, then its ctime), the newest
        is always kept. Each copy removed counts in
        ``graphcache_quarantine_dropped_total``; returns how many."""
        if self.quarantine is None or self.quarantine_bytes is None:
            return 0
        found = []
        try:
            with os.scandir(self.quarantine) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    found.append((_aside_time(entry.name, st.st_ctime), entry.name, st.st_size, entry.path))
        except OSError:
            return 0
        found.sort()
        total = sum(size for _, _, size, _ in found)
        dropped = 0
        for _, name, size, path in found[:-1]:  # the newest stays, whatever its size
            if total <= self.quarantine_bytes and len(found) - dropped <= QUARANTINE_FILES:
                break
            try:
                os.remove(path)  # a link is removed as itself, never followed; a folder is not ours to empty
            except FileNotFoundError:
                pass  # another worker trimmed it
            except OSError as err:
                log.error("could not drop %s from quarantine: %s", name, err)
                continue
            total -= size
            dropped += 1
        if dropped:
            self.metrics.quarantine_dropped.inc(dropped)
            log.warning(
                "dropped %d quarantined cop%s, oldest first: the folder keeps at most %d bytes "
                "(GRAPHCACHE_QUARANTINE_SIZE) and %d files",
                dropped,
                "y" if dropped == 1 else "ies",
                self.quarantine_bytes,
                QUARANTINE_FILES,
            )
        return dropped


def _aside_time(name: str, ctime: float) -> float:
    """When a quarantined file was set aside: the time its name holds
    (``_aside_name``), else its ctime (a rename sets it)."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[1].isdigit():
        return float(parts[1])
    return ctime


def _aside_name(key: str, reason: str) -> str:
    # The time in nanoseconds: the quarantine is trimmed oldest first, in the order entries were set aside.
    return f"{key}.{time.time_ns()}.{secrets.token_hex(4)}.{reason}"
