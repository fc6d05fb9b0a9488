"""The counters a GraphCache keeps (``GraphCache.stats()``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    builds: int = 0
    corrupt: int = 0
    unsupported: int = 0
    fallbacks: int = 0
    store_errors: int = 0
    lease_waits: int = 0
    rejected: int = 0
    canary_failures: int = 0
    build_seconds_saved: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str, amount: float = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def as_dict(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
