"""Stores: bytes by key. ``open_store`` turns a location into one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from graphcache.artifact import read_header
from graphcache.errors import CorruptArtifact, StoreLocationError
from graphcache.settings import Settings
from graphcache.stores.base import Store
from graphcache.stores.disk import DiskStore
from graphcache.stores.http import HttpStore
from graphcache.stores.tiered import TieredStore

__all__ = [
    "SCHEMES",
    "DiskStore",
    "HttpStore",
    "Store",
    "TieredStore",
    "check_location",
    "disk_folder",
    "open_store",
    "service_store",
    "stored_header",
    "stored_headers",
    "worker_store",
]

HEADER_PREFIX = 64 * 1024


def open_store(settings: Settings, location: str | None = None) -> Store:
    """The store a location names: '' or a path -> DiskStore; redis://... ->
    RedisStore; http(s)://... -> HttpStore."""
    where = settings.store if location is None else location
    check_location(where)
    if where.startswith(("redis://", "rediss://", "unix://")):
        from graphcache.stores.redis import RedisStore

        return RedisStore(where, timeout=settings.timeout)
    if where.startswith(("http://", "https://")):
        return service_store(settings, where)
    return DiskStore(where or settings.cache_dir, size_limit=settings.size_limit)


def service_store(settings: Settings, url: str) -> HttpStore:
    """The service at ``url`` as an HttpStore, with the token, timeout and
    largest artifact ``settings`` give."""
    return HttpStore(url, token=settings.token, timeout=settings.timeout, max_artifact=settings.max_artifact)


SCHEMES = ("redis://", "rediss://", "unix://", "http://", "https://")


def check_location(where: str) -> None:
    """Refuse a URL of a scheme no store speaks (ftp://x would otherwise be
    taken as the folder ``ftp:/x``)."""
    scheme, sep, _ = where.partition("://")
    if sep and not where.startswith(SCHEMES):
        raise StoreLocationError(
            f"store location {where!r}: unknown scheme {scheme + '://'!r}; "
            f"give a folder path or a URL starting with {', '.join(SCHEMES)}"
        )


def disk_folder(settings: Settings, location: str | None = None) -> Path | None:
    """The folder a location names when it names a DiskStore, else None."""
    where = settings.store if location is None else location
    check_location(where)
    if where.startswith(SCHEMES):
        return None
    return Path(where) if where else settings.cache_dir


def worker_store(settings: Settings) -> Store:
    """What a worker reads through: with GRAPHCACHE_SERVER, the local store in
    front of the service (filled on remote hits, answering when the service is
    down); otherwise the store ``settings`` names."""
    local = open_store(settings)
    if not settings.server:
        return local
    return TieredStore(local, service_store(settings, settings.server))


def stored_header(store: Store, key: str) -> dict[str, Any] | None:
    """An entry's header, or None when absent. Reads only the first bytes of
    the entry where the store can (DiskStore, RedisStore), so listing a store
    of 4 MiB plans does not read 4 MiB each.

    Raises CorruptArtifact when the framing or the header is bad (the payload
    is not checked here: listings are not loads).
    """
    head = getattr(store, "head", None)
    data = head(key, HEADER_PREFIX) if head is not None else None
    if data is not None:
        try:
            return read_header(data)
        except CorruptArtifact as exc:
            if exc.reason != "truncated":
                raise
            # a header longer than the prefix: read the entry whole
    data = store.get(key)
    return None if data is None else read_header(data)


def stored_headers(store: Store, corrupt: Callable[[str], object] | None = None) -> Iterator[dict[str, Any]]:
    """Every stored entry's header: the store's own listing where it has one
    (HttpStore: the listing route, no artifact downloaded), else key by key
    (``stored_header``), entries whose header is corrupt left out (their keys
    given to ``corrupt``, when the scan is key by key)."""
    headers = getattr(store, "headers", None)
    if headers is not None:
        yield from headers()
        return
    for key in store.keys():
        try:
            header = stored_header(store, key)
        except CorruptArtifact:
            if corrupt is not None:
                corrupt(key)
            continue
        if header is not None:
            yield header
