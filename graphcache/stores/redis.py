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
from graphcache.stores.base import shown_url

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
    StoreUnavailable. Eviction: the fleet's Redis must run with ``maxmemory``
    and ``maxmemory-policy volatile-lru``, so that pinned entries (no TTL)
    survive and the rest are evicted least-recently-used; an upload that
    could not fit is refused before it is sent (``room_for``), so a refused
    upload evicts nothing.
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
        # Never print a password that is part of the URL (userinfo or query).
        return shown_url(self.url)

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
        if (why := self.room_for(len(data))) is not None:
            # Refused before the value enters Redis: sent, it would evict
            # everything evictable and be refused all the same. (Smaller
            # uploads still fit: the store is not marked unwritable.)
            raise StoreFull(why, needed=len(data))
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

    def room_for(self, size: int) -> str | None:
        """Why an upload of ``size`` bytes cannot fit in this Redis, or None
        (no maxmemory, or room once what may be evicted is).

        Redis takes a large value in through its query buffer and, once the
        value is whole, allocates a fresh buffer of the same size: while it
        stores an upload it holds about twice its size (each rounded up to
        jemalloc's size class), on top of what it cannot evict (its own
        overhead; pinned entries, which have no TTL, under a ``volatile-*``
        policy; everything under ``noeviction``). An upload that cannot fit
        so is refused here, before it is sent: given to Redis it made Redis
        evict every entry it could, then refuse the write anyway."""
        memory = self._call(self._redis.info, "memory")
        limit = int(memory.get("maxmemory") or 0)
        if not limit:
            return None
        policy = str(memory.get("maxmemory_policy") or "noeviction")
        overhead = int(memory.get("used_memory_overhead") or 0)
        dataset = int(memory.get("used_memory_dataset") or 0)
        if policy == "noeviction":
            kept = int(memory.get("used_memory") or 0)
        elif policy.startswith("volatile-"):
            kept = overhead + self._pinned_share(dataset)
        else:
            kept = overhead
        need = 2 * _allocated(size) + kept
        if need <= limit:
            return None
        why = (
            f"redis at {self._safe_url()} is out of memory for an upload of {size} bytes: it needs about {need} "
            f"bytes (twice the upload while it takes it in, plus {kept} it cannot evict under maxmemory-policy "
            f"{policy}) and its maxmemory is {limit}"
        )
        if 2 * _allocated(size) + overhead > limit:  # too large for this Redis, however empty
            return f"{why}; raise maxmemory, or lower GRAPHCACHE_MAX_UPLOAD"
        # Full of what it may not evict: unwritable (healthz says so) until room is made.
        self._refused, self._refused_need = why, size
        return f"{why}; raise its maxmemory, unpin entries (graphcache pin KEY --off) or purge a retired target"

    def _pinned_share(self, dataset: int) -> int:
        """The dataset bytes of keys without a TTL (pinned), estimated from
        the share of keys that have none (INFO keyspace)."""
        db = self._redis.connection_pool.connection_kwargs.get("db", 0)
        space = self._call(self._redis.info, "keyspace").get(f"db{db}") or {}
        keys, expiring = int(space.get("keys") or 0), int(space.get("expires") or 0)
        return dataset * (keys - expiring) // keys if keys else 0

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
        if limit == 0 or int(memory.get("used_memory") or 0) + 2 * _allocated(self._refused_need) <= limit:
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


def _allocated(size: int) -> int:
    """``size`` bytes as jemalloc allocates them (Redis's allocator): past
    16 KiB, four size classes per power of two."""
    if size <= 16 * 1024:
        return size
    step = 1 << max(size.bit_length() - 3, 0)
    return -(-size // step) * step
