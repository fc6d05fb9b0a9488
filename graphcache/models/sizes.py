"""What a trace covers (``Sizes``) and the batches and lengths it walks:
the pow2 class policy's (graphcache.spec.classes): batches 1, 2, 4 ... up to
``max_batch`` times ``beams``, lengths at each length class's longest (128,
256, ... up to ``max_seq``) and on either side of every window or chunk size
the config names (where a call changes kind), since a class's calls are alike
between those.

May import: nothing of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphcache.spec.classes import MIN_LENGTH

_THRESHOLD_WORDS = ("window", "chunk")


def lengths(longest: int) -> list[int]:
    """Each length class's longest up to ``longest`` (itself the last)."""
    out, size = [], MIN_LENGTH
    while size < longest:
        out.append(size)
        size *= 2
    return out + [longest]


def batches(largest: int) -> list[int]:
    out, size = [], 1
    while size < largest:
        out.append(size)
        size *= 2
    return out + [largest]


def thresholds(config: Any) -> set[int]:
    """Lengths where a call may change kind: the config's window and chunk sizes."""
    found = set()
    for name, value in vars(config).items():
        if any(w in name for w in _THRESHOLD_WORDS) and isinstance(value, int) and not isinstance(value, bool):
            if value > 1:
                found.add(value)
    return found


def samples(longest: int, config: Any) -> list[int]:
    """The lengths traced up to ``longest``: each class's longest, and each
    threshold with its neighbours (transformers masks a window from
    ``kv >= window``, graphcache.hf from ``kv > window``)."""
    near = {n for t in thresholds(config) for n in (t - 1, t, t + 1) if n <= longest}
    return sorted(set(lengths(longest)) | near)


@dataclass(frozen=True)
class Sizes:
    """What the trace covers."""

    max_batch: int
    max_seq: int
    chunk: int | None = None
    decode: bool = True
    beams: int = 1
    image_sizes: tuple[tuple[int, int], ...] = ()  # (H, W); none: each vision config's own image_size
    caches: tuple[str, ...] = ("dynamic", "static")  # a decoder's cache kinds: DynamicCache, StaticCache
    max_cache_len: int | None = None  # a static cache's slots (none: each length class's longest up to max_seq)
    compiled: bool = True  # each forward also as torch.compile'd code runs it (graphcache.models.compiled)

    @property
    def rows(self) -> int:
        return self.max_batch * self.beams


def padded_words(pad: str, what: str = "") -> str:
    """How a phase names its padding: '' unpadded, ', left-padded', ..."""
    if pad == "none":
        return ""
    if pad == "unmasked":
        return ", no padding mask"
    return f", {what} {pad}-padded" if what else f", {pad}-padded"
