"""What a failure means for the cache: cuDNN's verdict on the spec
(UnsupportedSpec, stored as a negative entry) or anything else (BuildError,
never stored), at a build step (``classify_failure``) or when a built plan
runs in a build check or the canary (``execute_failure``).

May import: graphcache.spec/errors.
"""

from __future__ import annotations

import re
from typing import Any

from graphcache.errors import BuildError, UnsupportedSpec
from graphcache.spec import GraphSpec

TRANSIENT = ("OUT OF MEMORY", "ALLOC_FAILED")
# Words of failures that belong to this host, not to the spec: a missing
# driver, NVRTC or sub-library, a driver too old, a CUDA or launch error, an
# internal error. They win over the exception's type: frontend 1.32 on a host
# with no driver reports its backend's failure as cudnnGraphNotSupportedError
# ("no engine proposed a plan ... the backend declined: "cuda" is an NVIDIA
# driver library ...").
ENVIRONMENT = re.compile(
    r"driver|nvrtc|sublibrary_loading_failed|runtime_prerequisite_missing|unable to find symbol"
    r"|can only be found via system search|cuda_get_device|internal_error|execution_failed|mapping_error"
    r"|cuda ?error|cudaerror|cuda_error_|invalid resource handle|illegal (memory )?address|launch failure"
    r"|no cuda|no gpu|device is none|out of memory|alloc_failed",
    re.IGNORECASE,
)
# Steps whose "not supported" is a verdict on the graph. Up to 1.23 (and in
# the pybind releases after it) the bindings raise cudnnGraphNotSupportedError
# also for HEURISTIC_QUERY_FAILED and GRAPH_EXECUTION_PLAN_CREATION_FAILED
# (python/pycudnn.cpp, v1.14.0), and build_plans fails with "No valid execution
# plans built" when every plan failed to compile (NVRTC, libcuda, memory):
# those cannot be told apart from a failing host, so they are never recorded.
# Frontends 1.31+ say at create_execution_plans why the backend declined
# (pygraph._backend_declined), which is trusted instead.
VERDICT_STEPS = ("validate", "build_operation_graph", "check_support")


def _backend_version(cudnn: Any) -> str:
    try:
        return str(cudnn.backend_version_string())
    except Exception:  # noqa: BLE001 - no runtime (CPU) or an old frontend
        return "(version unknown)"


def frontend_version(cudnn: Any) -> str:
    return str(getattr(cudnn, "__version__", "unknown"))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _is_not_supported(cudnn: Any, exc: BaseException) -> bool:
    kind = getattr(cudnn, "cudnnGraphNotSupportedError", None)
    if isinstance(kind, type) and isinstance(exc, kind):
        return True
    return "NOT_SUPPORTED" in str(exc).upper()


def classify_failure(
    cudnn: Any, spec: GraphSpec, step: str, exc: BaseException, graph: Any = None
) -> BuildError | UnsupportedSpec:
    """What a failure at a build step means for the cache.

    UnsupportedSpec (stored as a negative entry for the whole target) only
    when cuDNN gave its verdict that the graph is not supported: the
    not-supported error, at a step whose refusal is a verdict (validate,
    build_operation_graph, check_support; create_execution_plans on 1.31+
    when the backend itself declined with that error), and no word of a
    failing host. Everything else is a BuildError, reported and never stored.
    """
    text = _first_line(exc)
    # The whole message, not its first line: the backend's reason comes last.
    words = str(exc)
    versions = f"cuDNN {_backend_version(cudnn)}, cudnn-frontend {frontend_version(cudnn)}"
    if any(word in words.upper() for word in TRANSIENT):
        # Out of memory is about this moment, not this spec.
        return BuildError(f"cuDNN ran out of memory building {spec.summary()} at {step}: {text}")
    host = BuildError(
        f"building {spec.summary()} failed at {step} because of this host ({versions}): {text}. "
        "Not recorded as unsupported: check the driver, NVRTC and cuDNN libraries here (graphcache doctor)."
    )
    if ENVIRONMENT.search(words):
        return host
    declined = getattr(graph, "_backend_declined", None) if graph is not None else None
    if declined is not None and not _is_not_supported(cudnn, declined):
        # 1.31+ fold any backend failure (a RuntimeError from a failing
        # device included) into "no engine proposed a plan".
        return host
    verdict = step in VERDICT_STEPS or (step == "create_execution_plans" and declined is not None)
    if _is_not_supported(cudnn, exc) and verdict:
        return UnsupportedSpec(f"{versions} does not support {spec.summary()}: refused at {step}: {text}", step=step)
    return BuildError(
        f"building {spec.summary()} failed at {step} ({versions}): {type(exc).__name__}: {text}. "
        "Not recorded as unsupported (cuDNN's answer at this step cannot be told apart from a failing "
        "host); report it if it repeats."
    )


STATUS = re.compile(r"CUDNN_STATUS_[A-Z0-9_]+")


def execute_failure(cudnn: Any, spec: GraphSpec, exc: BaseException, during: str) -> BuildError | UnsupportedSpec:
    """What a failed ``execute`` of a built plan means, in a build check
    (``during``: dense, class, ragged or paged check, or the canary), sorted
    as ``classify_failure`` sorts a build step's: cuDNN's "not supported"
    (``cudnnGraphNotSupportedError``, or a ``CUDNN_STATUS_NOT_SUPPORTED...``
    status such as ``NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE`` for an override
    the plan refuses, cudnn-frontend#1087), with no word of a failing host,
    is UnsupportedSpec at step "check", naming the status (a negative entry
    where it comes from a build); anything else (``BAD_PARAM``, a CUDA or
    execution failure, memory, a ValueError of the frontend) a BuildError.
    The backend's status comes as a RuntimeError: "execute(...) failed with
    message: ..., and code: CUDNN_STATUS_..." (python/pycudnn.cpp throw_if,
    graph_helpers.h _CUDNN_CHECK_CUDNN_ERROR)."""
    text = _first_line(exc)
    words = str(exc)
    versions = f"cuDNN {_backend_version(cudnn)}, cudnn-frontend {frontend_version(cudnn)}"
    status = STATUS.search(words)
    named = status.group(0) if status else type(exc).__name__
    if any(word in words.upper() for word in TRANSIENT):
        return BuildError(f"cuDNN ran out of memory running {spec.summary()} in {during}: {text}")
    if not ENVIRONMENT.search(words) and _is_not_supported(cudnn, exc):
        return UnsupportedSpec(
            f"{versions} refuses to execute {spec.summary()} in {during}: {named}: {text}", step="check"
        )
    return BuildError(
        f"executing {spec.summary()} failed in {during} ({versions}): {named}: {text}. Not recorded as "
        "unsupported (not cuDNN's 'not supported'); report it if it repeats."
    )
