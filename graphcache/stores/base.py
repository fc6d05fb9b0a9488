"""The Store protocol: bytes by key, nothing more."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit


@runtime_checkable
class Store(Protocol):
    """A bytes backend. Keys are 64-hex cache keys; values are artifact bytes.

    Stores do not interpret the bytes: verification happens above them
    (``Artifact.decode``), so every backend is interchangeable.
    """

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None when absent."""
        ...

    def put(self, key: str, data: bytes) -> bool:
        """Store atomically; True when written, False when identical bytes were there."""
        ...

    def exists(self, key: str) -> bool:
        """True when the key is stored (does not count as a use for LRU)."""
        ...

    def delete(self, key: str) -> bool:
        """Remove; True when something was removed."""
        ...

    def keys(self) -> Iterator[str]:
        """Every stored key, in no particular order."""
        ...

    def close(self) -> None:
        """Release connections and handles."""
        ...


def get_many(store: Store, keys: Iterable[str], progress: Callable[[str], None] | None = None) -> dict[str, bytes]:
    """The stored bytes of each key present (absent keys left out): in one
    request where the store can fetch many at once (HttpStore, TieredStore),
    else one ``get`` per key."""
    many = getattr(store, "get_many", None)
    if many is not None:
        return dict(many(keys, progress=progress))
    found: dict[str, bytes] = {}
    for key in dict.fromkeys(keys):
        data = store.get(key)
        if data is not None:
            found[key] = data
        if progress is not None:
            progress(key)
    return found


def shown_url(url: str) -> str:
    """A store URL as it may be shown (logs, errors, ``repr``, and so
    /healthz, /v1/stats and the status page, which need no token): its
    userinfo and every query parameter's value masked (``redis://***@host/0?password=***``):
    redis-py takes a password in either place."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<a store URL that does not parse>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        f"{name}=***" if sep else name
        for name, sep, _ in (part.partition("=") for part in parts.query.split("&") if part)
    )
    head = f"{parts.scheme}://{netloc}" if "://" in url else urlunsplit((parts.scheme, netloc, "", "", ""))
    return head + parts.path + (f"?{query}" if query else "") + ("#***" if parts.fragment else "")
