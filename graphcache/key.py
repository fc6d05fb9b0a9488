"""The cache key: the only thing stores and the HTTP API index by."""

from __future__ import annotations

import hashlib
import json
import re

from graphcache.recipe import RECIPE_VERSION
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap
from graphcache.target import Target

# Bump when the envelope or the key encoding changes: old entries then miss
# instead of being misread. 2: the key covers the graph recipe and the GPU's
# multiprocessor count; headers record the engine and the numerical canary.
FORMAT_VERSION = 2
KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")


def key_for(spec: GraphSpec, target: Target, uids: UidMap | None = None) -> str:
    """Lowercase hex sha256 over format version, graph recipe version,
    canonical spec, UID map and target.

    Stable across processes, machines and Python versions (canonical JSON with
    sorted keys and shortest round-trip floats); any field change changes it.
    A class spec is keyed with the mechanism that serves it on ``target``
    written in (``releases.resolved``: ``mechanism: padded`` where the target
    has no execute-time override), so a manifest's class names the graph each
    target builds, and one store holds both kinds for different targets.
    """
    if spec.is_class and spec.mechanism is None:
        # Imported here: the compiler package imports this module (through artifact).
        from graphcache.compilers.cudnn.releases import resolved

        spec = resolved(spec, target)
    uids = (uids or UidMap.default()).for_spec(spec)
    document = {
        "format": FORMAT_VERSION,
        "recipe": RECIPE_VERSION,
        "spec": spec.to_dict(),
        "target": target.to_dict(),
        "uids": uids.to_dict(),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def is_key(text: str) -> bool:
    """True for 64 lowercase hex characters."""
    return isinstance(text, str) and KEY_PATTERN.fullmatch(text) is not None
