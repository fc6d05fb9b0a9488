"""RedisStore: one cache shared by a fleet of replicas and workers."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio

from graphcache.errors import StoreFull, StoreUnavailable
from graphcache.key import FORMAT_VERSION

# Unpinned entries carry this TTL so that `maxmemory-policy volatile-lru`
# may evict them; pinned entries have none and are never evicted.
EVICTABLE_TTL = 365 * 24 * 3600
# Connections of ``aget``'s pool (one pool per event loop, i.e. per server
# worker): one per request a worker serves at once. The service sets
# ``max_connections`` to its --limit-concurrency before the first read; this
# is that option's default. Past it a read waits for a free connection,
# bounded by the timeout (GRAPHCACHE_TIMEOUT).
ASYNC_CONNECTIONS = 1024

_RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class RedisStore:
    """Artifacts in Redis under ``graphcache:v{FORMAT}:a:{key}``.

    Every call is bounded by ``timeout``; a Redis that is down or slow raises
    StoreUnavailable. Eviction: run Redis with ``maxmemory`` and
    ``maxmemory-policy volatile-lru`` so that pinned entries (no TTL) survive
    and the rest are evicted least-recently-used (``allkeys-lru`` works too
    when nothing is pinned).
    """

    def __init__(
        self, url: str, *, timeout: float = 5.0, prefix: str = "graphcache", max_connections: int = ASYNC_CONNECTIONS
    ) -> None:
        self.url = url
        self.max_connections = max_connections
        self.prefix = f"{prefix}:v{FORMAT_VERSION}"
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=min(timeout, 2.0), health_check_interval=30
        )
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._timeout = timeout
        # Why the last write was refused for memory, until a write succeeds:
        # what /healthz reports as "writable": false (no Redis call to know it).
        self._refused: str | None = None
        self._refused_need = 0  # the size of that write
        # aget's clients, one per event loop (an asyncio client belongs to the loop it runs on).
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()

    def _k(self, key: str) -> str:
        return f"{self.prefix}:a:{key}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"redis at {self._safe_url()} did not answer: {exc}") from exc
        except redis.ResponseError as exc:
            if not isinstance(exc, redis.exceptions.OutOfMemoryError) and not str(exc).startswith("OOM"):
                raise
            # maxmemory reached with nothing it may evict (noeviction, or every
            # entry pinned under volatile-lru): writes refused, reads go on.
            self._refused = f"redis at {self._safe_url()} is out of memory ({exc})"
            raise StoreFull(
                f"{self._refused}; raise its maxmemory, "
                "unpin entries (graphcache pin KEY --off) or purge a retired target"
            ) from exc

    def _safe_url(self) -> str:
        # Never print a password that is part of the URL.
        head, sep, tail = self.url.rpartition("@")
        return f"{self.url.split('://')[0]}://***@{tail}" if sep else self.url

    # -- Store -------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        value = self._call(self._redis.get, self._k(key))
        return None if value is None else bytes(value)

    async def aget(self, key: str) -> bytes | None:
        """``get`` for an asyncio caller (the service's read path): no thread,
        bounded by the same timeout; StoreUnavailable when Redis does not answer."""
        loop = asyncio.get_running_loop()
        client = self._async.get(loop)
        if client is None:
            # A request waits for a free connection (up to the timeout)
            # rather than failing: redis-py's default pool refuses the
            # 101st concurrent read with "Too many connections", which a
            # busy server answered as 503 store_unavailable from a healthy Redis.
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self.url,
                max_connections=self.max_connections,
                timeout=self._timeout,
                socket_timeout=self._timeout,
                socket_connect_timeout=min(self._timeout, 2.0),
                health_check_interval=30,
            )
            client = self._async[loop] = redis.asyncio.Redis(connection_pool=pool)
        try:
            value: Any = await client.get(self._k(key))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"redis at {self._safe_url()} did not answer: {exc}") from exc
        return None if value is None else bytes(value)

    def put(self, key: str, data: bytes, *, pin: bool = False) -> bool:
        """Atomic SET; False when identical bytes are already stored. A pinned
        entry stays pinned."""
        name = self._k(key)
        pipe = self._redis.pipeline()
        pipe.get(name)
        pipe.ttl(name)
        current, ttl = self._call(pipe.execute)
        pinned = current is not None and ttl == -1
        if current is not None and bytes(current) == bytes(data) and (pinned or not pin):
            return False
        try:
            if pin or pinned:
                self._call(self._redis.set, name, bytes(data))
            else:
                self._call(self._redis.set, name, bytes(data), ex=EVICTABLE_TTL)
        except StoreFull:
            self._refused_need = len(data)
            raise
        self._refused = None
        return True

    def unwritable(self) -> str | None:
        """Why an upload would be refused now, or None: the last write was
        refused for memory, none has succeeded since, and Redis still uses
        its maxmemory (checked again each call: deletes and evictions free
        room without a write)."""
        if self._refused is None:
            return None
        try:
            memory = self._call(self._redis.info, "memory")
        except StoreUnavailable:
            return self._refused
        limit = int(memory.get("maxmemory") or 0)
        if limit == 0 or int(memory.get("used_memory") or 0) + self._refused_need <= limit:
            self._refused = None
        return self._refused

    def head(self, key: str, size: int) -> bytes | None:
        """The first ``size`` bytes (GETRANGE): headers without the payload."""
        value = self._call(self._redis.getrange, self._k(key), 0, size - 1)
        return bytes(value) if value else None

    def exists(self, key: str) -> bool:
        return bool(self._call(self._redis.exists, self._k(key)))

    def delete(self, key: str) -> bool:
        return bool(self._call(self._redis.delete, self._k(key)))

    def discard(self, key: str) -> bool:
        """An entry one client could not verify stays in the shared Redis
        (see HttpStore.discard): that client's keys may be the wrong ones."""
        return False

    def keys(self) -> Iterator[str]:
        start = len(self.prefix) + 3
        for name in self._call(lambda: list(self._redis.scan_iter(match=f"{self.prefix}:a:*", count=1000))):
            yield name.decode()[start:]

    def pin(self, key: str) -> bool:
        return bool(self._call(self._redis.persist, self._k(key))) or self.pinned(key)

    def unpin(self, key: str) -> bool:
        return bool(self._call(self._redis.expire, self._k(key), EVICTABLE_TTL))

    def pinned(self, key: str) -> bool:
        return bool(self._call(self._redis.ttl, self._k(key)) == -1)

    def ping(self) -> None:
        self._call(self._redis.ping)

    def close(self) -> None:
        self._redis.close()

    # -- fleet-wide build leases ---------------------------------------------------

    def leases(self) -> RedisLeases:
        return RedisLeases(self)

    def __repr__(self) -> str:
        return f"RedisStore({self._safe_url()!r})"


class RedisLeases:
    """Leases as ``SET lease NX PX ttl``, renewed and released only by their owner."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def _k(self, key: str) -> str:
        return f"{self.store.prefix}:lease:{key}"

    def try_acquire(self, key: str, owner: str, ttl: float) -> bool:
        return bool(self.store._call(self.store._redis.set, self._k(key), owner, nx=True, px=int(ttl * 1000)))

    def renew(self, key: str, owner: str, ttl: float) -> bool:
        return bool(self.store._call(self.store._renew, keys=[self._k(key)], args=[owner, int(ttl * 1000)]))

    def release(self, key: str, owner: str) -> None:
        self.store._call(self.store._release, keys=[self._k(key)], args=[owner])
