"""What a GraphCache reports: its counters (``GraphCache.stats()``) and
what a prefetch found."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from graphcache.spec import GraphSpec
from graphcache.target import Target


@dataclass
class Stats:
    """A GraphCache's counters (``GraphCache.stats()``); each lookup, get
    or load is counted once:

    - ``hits`` (also ``served_from_store``): the store held a verified
      artifact, put there by ``warm``, a prefetch or another process;
    - ``misses``: it did not; then ``builds`` (also ``built_here``) where
      this cache built it, or another caller or replica did (``lease_waits``);
    - ``fallbacks``: torch's SDPA served a load (``torch_fallback``);
    - corrupt, unsupported (negative entries), store_errors, rejected
      (stored plans dropped at load), canary_failures (of those, the ones
      whose numerical canary disagreed), build_seconds_saved (the build
      seconds of every artifact a hit returned: GPU time not spent
      building), served_by_larger (loads a stored class larger than the
      call's own served) and declared_to_real (over the loads a class
      served: the work the classes declare over the calls', batch x seq_q x
      seq_kv).

    A counter is a field here (``bump(name)`` counts it, ``as_dict`` reports it).
    """

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
    served_by_larger: int = 0
    declared_work: int = 0  # batch x seq_q x seq_kv the classes that served declare ...
    real_work: int = 0  # ... and that of the calls they served
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def bump(self, name: str, amount: float = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def served(self, declared: int, real: int, *, larger: bool) -> None:
        """A class declaring ``declared`` work served a call of ``real``
        work; ``larger``: a stored class larger than the call's own."""
        with self._lock:
            self.declared_work += declared
            self.real_work += real
            self.served_by_larger += larger

    def as_dict(self) -> dict[str, float]:
        data = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        data["served_from_store"], data["built_here"] = self.hits, self.builds  # the words the drop-in's stats use
        data["declared_to_real"] = round(self.declared_work / self.real_work, 3) if self.real_work else 0.0
        return data


@dataclass(frozen=True)
class PrefetchReport:
    """What ``GraphCache.prefetch`` found: verified artifacts now in the
    store (``present``, negative entries among them), the specs with none
    (``missing``), the bytes they hold, and the seconds the prefetch took.
    ``served_by`` names, for each exact spec counted present through its
    class, that class spec."""

    present: int
    missing: tuple[GraphSpec, ...]
    bytes: int
    seconds: float
    target: Target
    corrupt: int = 0
    served_by: dict[GraphSpec, GraphSpec] = field(default_factory=dict)  # exact spec -> the stored class serving it
