"""Stores: bytes by key. ``open_store`` turns a location into one."""

from __future__ import annotations

from graphcache.settings import Settings
from graphcache.stores.base import Store
from graphcache.stores.disk import DiskStore
from graphcache.stores.http import HttpStore
from graphcache.stores.tiered import TieredStore

__all__ = ["DiskStore", "HttpStore", "Store", "TieredStore", "open_store", "worker_store"]


def open_store(settings: Settings, location: str | None = None) -> Store:
    """The store a location names: '' or a path -> DiskStore; redis://... ->
    RedisStore; http(s)://... -> HttpStore."""
    where = settings.store if location is None else location
    if where.startswith(("redis://", "rediss://", "unix://")):
        from graphcache.stores.redis import RedisStore

        return RedisStore(where, timeout=settings.timeout)
    if where.startswith(("http://", "https://")):
        return HttpStore(where, token=settings.token, timeout=settings.timeout)
    return DiskStore(where or settings.cache_dir, size_limit=settings.size_limit)


def worker_store(settings: Settings) -> Store:
    """What a worker reads through: with GRAPHCACHE_SERVER, the local store in
    front of the service (filled on remote hits, answering when the service is
    down); otherwise the store ``settings`` names."""
    local = open_store(settings)
    if not settings.server:
        return local
    return TieredStore(local, HttpStore(settings.server, token=settings.token, timeout=settings.timeout))
