"""The stored blob: what ``serialize()`` gives, the call forms each
frontend's ``serialize``/``deserialize`` take, which plans may be stored, and
what a failed serialize or deserialize means.

Which form a frontend takes is the release table's answer (releases.py).

May import: failures (failure words), releases, graphcache.artifact/spec/errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers.cudnn.failures import ENVIRONMENT, _first_line
from graphcache.compilers.cudnn.releases import (
    BYTES_PAYLOAD,
    DESERIALIZE_HANDLE,
    ENFORCE_PRECOMPILED,
    PYTHON_ENGINE_BLOBS,
    available,
)
from graphcache.errors import BuildError, NotSerializable, PlanRejected
from graphcache.spec import GraphSpec


def payload_bytes(serialized: Any) -> bytes:
    """Normalise what ``serialize()`` returned (list of ints, bytes, bytearray)."""
    if isinstance(serialized, bytes):
        return serialized
    if isinstance(serialized, (bytearray, memoryview)):
        return bytes(serialized)
    if isinstance(serialized, (list, tuple)):
        return bytes(serialized)
    raise NotSerializable(f"serialize() returned {type(serialized).__name__}, not bytes or a list of ints")


def payload_for_frontend(payload: bytes, frontend: str) -> Any:
    """What this frontend's ``deserialize`` takes: bytes from 1.32 (where it
    avoids building a list), a list of ints before (1.23 refuses bytes)."""
    payload = bytes(payload)
    return payload if available(BYTES_PAYLOAD, frontend) else list(payload)


def deserialize_into(graph: Any, handle: Any, payload: bytes, frontend: str) -> None:
    """``graph.deserialize`` in the form this frontend takes: the handle from
    1.14, ``enforce_precompiled=True`` from 1.26.

    What ``enforce_precompiled`` does is narrow. In 1.32 (read from its
    compiled module and ``_plan_serdes.py``) a backend blob is refused only
    when it holds no backend data at all (``enforce_precompiled &&
    !j.contains("cudnn_backend_data")``: "serialized graph has no precompiled
    execution plan"); a Python-engine blob, when a kernel is neither in it
    nor in the compiled cache. It does not stop cuDNN from doing NVRTC work
    while it deserializes a blob that has backend data: a plan that compiles
    at load is not refused by it. The canary (and the build's round trip) is
    what checks that the loaded plan runs as built."""
    data = payload_for_frontend(payload, frontend)
    if available(ENFORCE_PRECOMPILED, frontend):
        graph.deserialize(handle, data, enforce_precompiled=True)
    elif available(DESERIALIZE_HANDLE, frontend):
        graph.deserialize(handle, data)
    else:
        graph.deserialize(data)


def engine_name(graph: Any) -> str:
    """The engine of the selected plan: a Python (CuTe DSL) engine's name on
    frontends 1.31+, else 'cudnn-backend'."""
    try:
        engine = graph.selected_engine  # 1.31+: None when the backend serves the plan
    except Exception:  # noqa: BLE001 - older frontends lack it
        engine = None
    if engine is None:
        return "cudnn-backend"
    return str(getattr(engine, "name", type(engine).__name__))


def serialization_refusal(engine: str, frontend: str) -> str | None:
    """Why a plan of ``engine`` is not cached, or None.

    Python (CuTe DSL) engines appear in 1.31 and are deselected before
    planning (``_exclude_python_engines``); this is the guard behind that,
    for a plan that got one anyway (a release whose engine list cannot be
    read). 1.31's ``serialize()`` writes the backend graph without the
    selected Python plan, a blob that would rebuild (or fail) at every load;
    1.32's writes kernels that load only under the builder's exact CUDA
    driver, which the key does not cover.
    """
    if engine == "cudnn-backend":
        return None
    if not available(PYTHON_ENGINE_BLOBS, frontend):
        return (
            f"cuDNN chose the Python engine {engine}, whose plans cudnn-frontend {frontend} cannot serialize: "
            "not cacheable with this frontend"
        )
    return (
        f"cuDNN chose the Python engine {engine}, whose serialized kernels load only under the builder's "
        "exact CUDA driver, which the key does not cover: not cacheable"
    )


def serialize_failure(
    spec: GraphSpec, engine: str, notes: list[str], frontend: str, exc: BaseException
) -> BuildError | NotSerializable:
    """What a failed ``serialize()`` of a built plan means: this host's
    BuildError where its words say so (memory, driver, CUDA errors), else
    NotSerializable (a negative entry): the plan cuDNN picks for the spec on
    this target cannot be written (1.32 raises _plan_serdes._Unserializable,
    a TypeError, for a plan it cannot represent)."""
    text = _first_line(exc)
    if ENVIRONMENT.search(str(exc)):
        return BuildError(f"serializing {spec.summary()} failed because of this host: {type(exc).__name__}: {text}")
    return NotSerializable(
        f"the plan cuDNN chose for {spec.summary()} (engine {engine}, behavior notes {notes}) "
        f"cannot be serialized by cudnn-frontend {frontend}: {text}",
        step="serialize",
    )


def load_failure(artifact: Artifact, exc: BaseException) -> BuildError | PlanRejected:
    """What a failed ``deserialize`` means. A call form this frontend does
    not take (TypeError), a failing device or a missing library is this
    host's BuildError: the stored plan serves other hosts, so it is neither
    dropped nor refused. Anything else is the blob's: PlanRejected,
    ``needs_recompile`` where ``enforce_precompiled`` refused it (1.26+:
    "enforce_precompiled requested, but serialized graph has no precompiled
    execution plan"), else ``deserialize_failed``."""
    text = _first_line(exc)
    if isinstance(exc, TypeError) or ENVIRONMENT.search(str(exc)):
        return BuildError(
            f"could not load {artifact.key[:12]} for {artifact.spec.summary()} on this host: "
            f"{type(exc).__name__}: {text}"
        )
    if "PRECOMPILED" in str(exc).upper():
        return PlanRejected(
            f"the stored plan {artifact.key[:12]} for {artifact.spec.summary()} would need a recompile "
            f"on this machine: {text}",
            "needs_recompile",
        )
    return PlanRejected(
        f"the stored plan {artifact.key[:12]} for {artifact.spec.summary()} does not deserialize: {text}",
        "deserialize_failed",
    )


def _serialize(graph: Any, frontend: str) -> Any:
    # 1.32 adds as_bytes; before it serialize() takes no argument. Decided by
    # version, not by catching TypeError: 1.32's serializer raises a
    # TypeError subclass for a plan it cannot represent.
    if available(BYTES_PAYLOAD, frontend):
        return graph.serialize(as_bytes=True)
    return graph.serialize()


def _behavior_notes(graph: Any) -> list[str]:
    try:
        return [str(n) for n in graph.get_behavior_notes()]
    except Exception:  # noqa: BLE001 - older frontends lack the call
        return []
