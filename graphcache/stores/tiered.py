"""TieredStore: a fast local store in front of a shared remote one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator

from graphcache.errors import StoreError, UnreadableEntry
from graphcache.stores.base import Store, get_many

log = logging.getLogger(__name__)


class TieredStore:
    """Local first, then remote (filling local on a remote hit); puts go to
    both. When the remote fails, the local tier still answers: reads fall
    back to it and a failed remote put is counted and logged, never raised,
    so a worker keeps starting while the service is down. Likewise a local
    tier that cannot take a write (a full disk) is counted and logged: what
    the remote answered is still returned, and puts still reach the remote.
    """

    def __init__(self, local: Store, remote: Store) -> None:
        self.local = local
        self.remote = remote
        self.remote_errors = 0
        # The last failure of the remote tier: a worker carries on with the
        # local one, a command line that was asked to fetch reports it.
        self.remote_error: Exception | None = None
        self.local_errors = 0

    def get(self, key: str) -> bytes | None:
        data = self._local_get(key)
        if data is not None:
            return data
        try:
            data = self.remote.get(key)
        except StoreError as exc:
            self._remote_failed("get", key, exc)
            return None
        if data is not None:
            self._fill_local(key, data)
        return data

    def get_many(self, keys: Iterable[str], *, progress: Callable[[str], None] | None = None) -> dict[str, bytes]:
        """Local hits first, then the rest from the remote in one request
        (HttpStore.get_many verifies each), written back to the local tier.
        When the remote fails, the local hits are still returned."""
        found: dict[str, bytes] = {}
        rest: list[str] = []
        for key in dict.fromkeys(keys):
            data = self._local_get(key)
            if data is None:
                rest.append(key)
                continue
            found[key] = data
            if progress is not None:
                progress(key)
        if not rest:
            return found
        try:
            fetched = get_many(self.remote, rest, progress)
        except StoreError as exc:
            self._remote_failed("get_many", f"{len(rest)} keys", exc)
            return found
        for key, data in fetched.items():
            self._fill_local(key, data)
            found[key] = data
        return found

    def _local_get(self, key: str) -> bytes | None:
        """The local tier's bytes; an entry it cannot read (UnreadableEntry)
        is removed there, reported, and asked of the remote instead."""
        try:
            return self.local.get(key)
        except UnreadableEntry as exc:
            self.local_errors += 1
            log.warning("local entry %s cannot be read, removed here and fetched again: %s", key[:12], exc)
            with contextlib.suppress(StoreError):
                self.local.delete(key)
            return None

    def _fill_local(self, key: str, data: bytes) -> bool:
        try:
            return self.local.put(key, data)
        except StoreError as exc:
            self.local_errors += 1
            log.warning("local %r did not take %s, serving it from the remote: %s", self.local, key[:12], exc)
            return False

    def put(self, key: str, data: bytes) -> bool:
        created = self._fill_local(key, data)
        try:
            created = self.remote.put(key, data) or created
        except StoreError as exc:
            self._remote_failed("put", key, exc)
        return created

    def exists(self, key: str) -> bool:
        if self.local.exists(key):
            return True
        try:
            return self.remote.exists(key)
        except StoreError as exc:
            self._remote_failed("exists", key, exc)
            return False

    def delete(self, key: str) -> bool:
        removed = self.local.delete(key)
        try:
            removed = self.remote.delete(key) or removed
        except StoreError as exc:
            self._remote_failed("delete", key, exc)
        return removed

    def discard(self, key: str) -> bool:
        """Drop this machine's copy of an entry it could not verify; the
        remote's copy is left alone (HttpStore/RedisStore.discard): this
        client's keys may be the wrong ones, and the server verifies its own."""
        removed = self.local.delete(key)
        drop = getattr(self.remote, "discard", None)
        if drop is not None:
            removed = drop(key) or removed
        return removed

    def keys(self) -> Iterator[str]:
        seen = set()
        for key in self.local.keys():
            seen.add(key)
            yield key
        try:
            for key in self.remote.keys():
                if key not in seen:
                    yield key
        except StoreError as exc:
            self._remote_failed("keys", "*", exc)

    def leases(self) -> object | None:
        """The local tier's leases (one build per key on this machine)."""
        make = getattr(self.local, "leases", None)
        return make() if make is not None else None

    def close(self) -> None:
        self.local.close()
        self.remote.close()

    def _remote_failed(self, op: str, key: str, exc: Exception) -> None:
        self.remote_errors += 1
        self.remote_error = exc
        log.warning("remote %s %s failed, using the local tier: %s", op, key[:12], exc)

    def __repr__(self) -> str:
        return f"TieredStore({self.local!r}, {self.remote!r})"
