"""UidMap: the fixed tensor-role -> UID table shared by builder and executor."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphcache.errors import CorruptArtifact

# Never renumber: UIDs are baked into every serialized plan and into every key.
_DEFAULT = {
    "q": 1,
    "k": 2,
    "v": 3,
    "o": 4,
    "stats": 5,
    "seq_len_q": 6,
    "seq_len_kv": 7,
    "dropout_seed": 8,
    "dropout_offset": 9,
}
REQUIRED_ROLES = ("q", "k", "v", "o")
# Ragged offsets and page tables: only ragged / paged specs' maps hold them,
# so a dense spec's map (and so its key) is the one it always had.
_RAGGED = {
    "ragged_q": 10,
    "ragged_k": 11,
    "ragged_v": 12,
    "ragged_o": 13,
    "ragged_stats": 14,
    "page_table_k": 15,
    "page_table_v": 16,
}
# The additive score bias: only bias specs' maps hold it (same reason).
_BIAS = {"bias": 17}
# The per-head attention sink logits: only sink specs' maps hold them (same reason).
_SINK = {"sink": 18}
# A backward graph's gradient of o (an input) and dQ, dK, dV (its outputs); it
# reads the forward's stats at "stats": only backward specs' maps hold them.
_BACKWARD = {"dO": 19, "dQ": 20, "dK": 21, "dV": 22}


@dataclass(frozen=True)
class UidMap:
    """Role name -> tensor UID. The builder sets these UIDs on every tensor and
    ``execute`` keys its variant pack by them, so a plan and its executor can
    never disagree. Part of the cache key and stored in every artifact."""

    uids: Mapping[str, int] = field(default_factory=lambda: dict(_DEFAULT))

    def __post_init__(self) -> None:
        missing = [r for r in REQUIRED_ROLES if r not in self.uids]
        if missing:
            raise ValueError(f"UidMap lacks roles {missing}; every map needs q, k, v, o")
        values = list(self.uids.values())
        if any(not isinstance(v, int) or isinstance(v, bool) or v <= 0 for v in values):
            raise ValueError(f"UidMap values must be integers > 0, got {dict(self.uids)}")
        if len(set(values)) != len(values):
            raise ValueError(f"UidMap has duplicate UIDs: {dict(self.uids)}")
        object.__setattr__(self, "uids", dict(sorted(self.uids.items())))

    @classmethod
    def default(cls) -> UidMap:
        return cls(dict(_DEFAULT))

    @classmethod
    def from_dict(cls, data: Any) -> UidMap:
        """Raises CorruptArtifact: the map comes from a stored header."""
        if not isinstance(data, dict):
            raise CorruptArtifact("uid map in header is not a mapping", "bad_header")
        try:
            return cls(dict(data))
        except ValueError as exc:
            raise CorruptArtifact(f"uid map in header is invalid: {exc}", "bad_header") from exc

    def for_spec(self, spec: Any) -> UidMap:
        """This map, with the ragged-offset and page-table roles added (at
        their default UIDs, where this map lacks them) for a thd spec, and
        the bias role for a spec with a ``bias``, the sink role for a spec
        with ``sinks``, the gradient roles for a backward spec; unchanged
        for any other. Idempotent."""
        extra: dict[str, int] = {}
        if getattr(spec, "layout", None) == "thd":
            extra.update(_RAGGED)
        if getattr(spec, "bias", None) is not None:
            extra.update(_BIAS)
        if getattr(spec, "sinks", False):
            extra.update(_SINK)
        if getattr(spec, "kind", "forward") == "backward":
            extra.update(_BACKWARD)
        if all(role in self.uids for role in extra):
            return self
        return UidMap({**extra, **self.uids})

    def to_dict(self) -> dict[str, int]:
        return dict(self.uids)

    def __getitem__(self, role: str) -> int:
        return self.uids[role]

    def __hash__(self) -> int:
        return hash(tuple(self.uids.items()))
