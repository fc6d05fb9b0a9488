"""The drop-in's miss policy, GRAPHCACHE_SDPA_ON_MISS: what a call whose
graph is not cached does (``torch``, the default: run torch's SDPA, count
and remember the miss; ``build``: build, store and use the graph;
``error``: raise NotFound)."""

from __future__ import annotations

import os

from graphcache.settings import SettingsError

ON_MISS_VAR = "GRAPHCACHE_SDPA_ON_MISS"
ON_MISS = ("torch", "build", "error")


def on_miss_from_env() -> str:
    """GRAPHCACHE_SDPA_ON_MISS's value (default ``torch``); raises
    SettingsError naming the variable and the choices for any other."""
    value = os.environ.get(ON_MISS_VAR, "").strip().lower() or "torch"
    if value not in ON_MISS:
        raise SettingsError(
            f"{ON_MISS_VAR}={os.environ.get(ON_MISS_VAR)!r} is not one of {', '.join(ON_MISS)}: "
            "torch runs torch's SDPA on a miss, build builds and stores the graph, error raises"
        )
    return value
