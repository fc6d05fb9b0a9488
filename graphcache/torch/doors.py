"""Which door a call came through, what happened there, and the two rules
every door shares: a call PyTorch hands from one of graphcache's doors to
another is counted once, and nothing is built, canaried or fetched while a
CUDA stream captures.

The doors: ``sdpa`` (``graphcache.torch.scaled_dot_product_attention``, what
``patch()`` puts in ``torch.nn.functional``), ``aten`` and ``aten_backward``
(the kernels ``graphcache.torch.install()`` registers for
``aten::_scaled_dot_product_cudnn_attention`` and its backward), ``varlen``
(``graphcache.torch.varlen_attn``) and ``hf`` (graphcache.hf's backend).

A call the ``sdpa`` door gives to torch (a miss, an input that needs grad)
may reach the ``aten`` door: PyTorch's SDPA picks cuDNN on H100 / H200 /
B200 and calls the aten op, whose kernel is graphcache's once installed.
That door then decides (it can serve a call that needs grad: it has a
backward) and counts it; the ``sdpa`` door counts it as ``relayed`` only, so
``stats()["calls"]`` counts every call once, at the door that decided it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

# torch's own SDPA, captured at import: a fallback must never call a patched
# F.scaled_dot_product_attention (ours, or another library's).
TORCH_SDPA: Callable[..., Any] = torch._C._nn.scaled_dot_product_attention


class Relay(threading.local):
    """Per thread: whether the ``sdpa`` door is inside torch's SDPA (``depth``)
    and whether another door of graphcache took the call (``taken``)."""

    depth = 0
    taken = False


RELAY = Relay()


def relayed_sdpa(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Any, bool]:
    """torch's own SDPA for the ``sdpa`` door's fallback, and whether another
    door of graphcache (the aten door) took the call on its way down."""
    relay = RELAY
    relay.depth += 1
    relay.taken = False
    try:
        out = TORCH_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    finally:
        relay.depth -= 1
    taken, relay.taken = relay.taken, False
    return out, taken


def capturing() -> bool:
    """True while the current CUDA stream captures a graph: no build, no
    canary, no store round trip may run then (a miss goes to torch, counted
    as ``capture``). False where CUDA was never initialized (no capture can
    have begun), which is also every CPU-only build of torch."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


class Doors:
    """Calls, hits, calls built here, relayed calls and fallbacks by reason,
    per door, guarded by the runtime's count lock (``lock``, its Counts'):
    ``count`` and ``as_dict`` are called with it held (``Counts.count``,
    ``Counts.stats``: a hit pays one lock for both its counters), ``counted``
    and ``relayed`` take it."""

    def __init__(self, lock: Any) -> None:
        self.lock = lock
        self._rows: dict[str, list[Any]] = {}  # door -> [hits, relayed, fallbacks by reason, built here]

    def _row(self, door: str) -> list[Any]:
        row = self._rows.get(door)
        if row is None:
            row = self._rows[door] = [0, 0, Counter(), 0]
        return row

    def count(self, door: str, hit: bool, reason: str = "", built: bool = False) -> None:
        """One call through ``door``: served by a graph (from the store, or
        ``built`` by this process: graphcache.torch.counts), or a fallback
        for ``reason``."""
        row = self._rows.get(door) or self._row(door)
        if not hit:
            row[2][reason] += 1
        elif built:
            row[3] += 1
        else:
            row[0] += 1

    def counted(self, door: str, hit: bool, reason: str = "") -> None:
        """``count``, taking the lock: a call counted at its door only (a backward call)."""
        with self.lock:
            self.count(door, hit, reason)

    def relayed(self, door: str) -> None:
        """One call ``door`` gave to torch that another door of graphcache decided."""
        with self.lock:
            self._row(door)[1] += 1

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{door: {"calls", "hits", "built_here", "relayed", "fallbacks":
        {reason: n}}}`` for each door a call came through (``hits``: served
        from the store)."""
        return {
            door: {
                "calls": hits + built + relayed + sum(fallbacks.values()),
                "hits": hits,
                "built_here": built,
                "relayed": relayed,
                "fallbacks": dict(fallbacks),
            }
            for door, (hits, relayed, fallbacks, built) in self._rows.items()
        }
