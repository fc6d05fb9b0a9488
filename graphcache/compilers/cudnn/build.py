"""The build steps.

``build_graph`` runs the dialect chain (``dialects.py``) over a graph
declared by ``graph.py`` and lowers it step by step; ``failures.py``'s
``classify_failure`` decides whether a failure is cuDNN's verdict on the spec
(UnsupportedSpec, stored as a negative entry) or anything else (BuildError,
never stored). Frontends from 1.27 accept unknown keywords at ``sdpa()`` and
fail only when the graph is lowered, so one attempt covers the whole build,
not one call.

May import: dialects, failures, graph, graphcache.spec/uids/errors.
"""

from __future__ import annotations

import logging
import time
import types
from dataclasses import dataclass, field
from typing import Any

from graphcache.compilers.cudnn.dialects import DIALECTS, Dialect, refuses_keywords
from graphcache.compilers.cudnn.failures import _backend_version, _first_line, classify_failure, frontend_version
from graphcache.compilers.cudnn.graph import declare
from graphcache.errors import BuildError, NotSerializable, UnsupportedSpec
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap

log = logging.getLogger(__name__)

BUILD_STEPS = (
    "validate",
    "build_operation_graph",
    "create_execution_plans",
    "check_support",
    "build_plans",
)


@dataclass
class BuiltGraph:
    """A frontend graph after the dialect chain, with its tensors and timings."""

    graph: Any
    tensors: dict[str, Any]
    dialect: str
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def build_graph(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap | None = None,
    handle: Any = None,
    *,
    lower: bool = True,
    dialects: tuple[Dialect, ...] = DIALECTS,
) -> BuiltGraph:
    """Construct (and with ``lower``, build plans for) the spec's SDPA graph.

    Without ``lower`` only ``validate()`` runs: what a machine with no GPU can
    check. Raises UnsupportedSpec when no dialect of this frontend can
    express the spec's mask (or cuDNN says not supported), and BuildError
    for a failure that is no verdict on the spec (this host, or a bug).
    """
    uids = uids or UidMap.default()
    tried: list[str] = []
    skipped: list[str] = []
    for dialect in dialects:
        missing = dialect.missing(cudnn)
        if missing:
            names = ", ".join(f"cudnn.{attr}" for attr in missing)
            skipped.append(f"{dialect.name} (cudnn-frontend {frontend_version(cudnn)} has no {names})")
            continue
        try:
            kwargs = dialect.kwargs(cudnn, spec)
        except AttributeError as exc:
            if not _frontend_lacks(cudnn, exc):
                # graphcache's own mistake: never a verdict on the spec.
                raise BuildError(f"dialect {dialect.name} failed on {spec.summary()}: {exc!r}") from exc
            # A name the dialect reads that ``requires`` did not list: still a
            # frontend that does not speak this dialect, never a crash of the chain.
            skipped.append(f"{dialect.name} (cudnn-frontend {frontend_version(cudnn)} lacks a name it needs: {exc})")
            continue
        if kwargs is None:
            skipped.append(f"{dialect.name} (cannot express mask {spec.mask!r} exactly)")
            continue
        try:
            graph, tensors, timings = _construct(cudnn, spec, uids, handle, kwargs, lower)
        except TypeError as exc:
            if not refuses_keywords(exc):
                raise BuildError(
                    f"cudnn-frontend {frontend_version(cudnn)} raised a TypeError building {spec.summary()} "
                    f"with dialect {dialect.name} that is not a refused sdpa() keyword, so the spec is not "
                    f"recorded as unsupported: {_first_line(exc)}"
                ) from exc
            tried.append(f"{dialect.name}: {str(exc).splitlines()[0][:200]}")
            log.info("dialect %s refused by frontend %s: %s", dialect.name, frontend_version(cudnn), exc)
            continue
        return BuiltGraph(graph, tensors, dialect.name, timings, skipped + tried)
    raise UnsupportedSpec(
        f"cudnn-frontend {frontend_version(cudnn)} cannot express mask {spec.mask!r} "
        f"for {spec.summary()}; tried: {'; '.join(tried) or 'none'}"
        + (f"; skipped: {'; '.join(skipped)}" if skipped else "")
        + ". Upgrade nvidia-cudnn-frontend or use the torch fallback."
    )


def _construct(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap,
    handle: Any,
    mask_kwargs: dict[str, Any],
    lower: bool,
) -> tuple[Any, dict[str, Any], dict[str, float]]:
    graph, tensors = declare(cudnn, spec, uids, handle, mask_kwargs)
    timings: dict[str, float] = {}
    steps = BUILD_STEPS if lower else BUILD_STEPS[:1]
    seen: list[PlanSeen] | None = None
    for step in steps:
        start = time.perf_counter()
        try:
            if step == "create_execution_plans":
                _exclude_python_engines(graph)
                graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
                seen = plans_seen(graph)
                _keep_runtime_compiled(cudnn, graph)
            else:
                getattr(graph, step)()
        except TypeError as exc:
            if refuses_keywords(exc):
                raise  # an unknown keyword at lowering: the dialect chain tries the next one
            raise classify_failure(cudnn, spec, step, exc, graph) from exc
        except Exception as exc:  # noqa: BLE001 - cuDNN's errors have many types; classify_failure sorts them
            failure = classify_failure(cudnn, spec, step, exc, graph)
            if step == "check_support" and isinstance(failure, UnsupportedSpec):
                failure = _filtered_out(cudnn, spec, uids, handle, mask_kwargs, failure, seen)
            raise failure from exc
        timings[step] = time.perf_counter() - start
    return graph, tensors, timings


@dataclass(frozen=True)
class PlanSeen:
    """One plan cuDNN proposed, before the runtime-compiled filter."""

    name: str
    notes: tuple[str, ...] | None  # None: this frontend did not say

    def __str__(self) -> str:
        notes = "notes unknown" if self.notes is None else f"behavior notes [{', '.join(self.notes)}]"
        return f"{self.name} ({notes})"


def plans_seen(graph: Any) -> list[PlanSeen] | None:
    """The plans ``create_execution_plans`` proposed, with their behaviour
    notes (get_execution_plan_count, get_plan_name_at_index,
    get_behavior_notes_for_plan_at_index: bound in the releases checked from
    1.12); None where this frontend cannot list them."""
    try:
        count = int(graph.get_execution_plan_count())
    except Exception:  # noqa: BLE001 - an old frontend, or a graph with no plan list to read
        return None
    seen = []
    for index in range(count):
        try:
            name = str(graph.get_plan_name_at_index(index))
        except Exception:  # noqa: BLE001 - a plan without a name (1.32's delegating entry)
            name = f"plan {index}"
        try:
            notes: tuple[str, ...] | None = tuple(
                str(n).rsplit(".", 1)[-1] for n in graph.get_behavior_notes_for_plan_at_index(index)
            )
        except Exception:  # noqa: BLE001 - notes this frontend cannot give for this plan
            notes = None
        seen.append(PlanSeen(name, notes))
    return seen


def _runtime_compiled_seen(seen: list[PlanSeen] | None) -> bool:
    return bool(seen) and any(p.notes is not None and "RUNTIME_COMPILATION" in p.notes for p in seen or ())


def _filtered_out(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap,
    handle: Any,
    mask_kwargs: dict[str, Any],
    verdict: UnsupportedSpec,
    seen: list[PlanSeen] | None,
) -> UnsupportedSpec:
    """What check_support's "not supported" means when the runtime-compiled
    filter may have barred every plan ("No execution plans support the
    graph" reads the same either way): a fresh graph without the filter runs
    up to check_support once more. If it passes, cuDNN supports the spec and
    cannot serialize its plans here: NotSerializable naming the plans seen
    and their behaviour notes. Otherwise the verdict stands, the plans seen
    added to it. No second try when a runtime-compiled plan was seen (the
    filter emptied nothing)."""
    listed = "; ".join(map(str, seen)) if seen else "none listed by this frontend"
    if _runtime_compiled_seen(seen) or not _filters(cudnn):
        return UnsupportedSpec(f"{verdict}; plans seen: {listed}", step=verdict.step)
    try:
        graph, _ = declare(cudnn, spec, uids, handle, mask_kwargs)
        graph.validate()
        graph.build_operation_graph()
        _exclude_python_engines(graph)
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        seen = seen or plans_seen(graph)
        graph.check_support()
    except Exception as exc:  # noqa: BLE001 - refused without the filter too: the first verdict stands
        return UnsupportedSpec(
            f"{verdict}; plans seen: {listed}; without the runtime-compiled filter too: {_first_line(exc)}",
            step=verdict.step,
        )
    listed = "; ".join(map(str, seen)) if seen else "none listed by this frontend"
    return NotSerializable(
        f"cuDNN {_backend_version(cudnn)} supports {spec.summary()} only with plans it cannot serialize: "
        f"check_support passes without the runtime-compiled filter and refuses with it; plans seen: {listed}",
        step=verdict.step,
    )


def _filters(cudnn: Any) -> bool:
    """Whether ``_keep_runtime_compiled`` filters on this frontend."""
    notes = getattr(cudnn, "behavior_note", None)
    return (
        notes is not None and hasattr(notes, "RUNTIME_COMPILATION") and hasattr(cudnn.pygraph, "select_behavior_notes")
    )


def _frontend_lacks(cudnn: Any, exc: AttributeError) -> bool:
    """Whether ``exc`` is the frontend missing a name (on the module or on one
    of its types), rather than a mistake in graphcache's own code."""
    owner = getattr(exc, "obj", None)
    if owner is cudnn:
        return True
    module = owner.__name__ if isinstance(owner, types.ModuleType) else getattr(owner, "__module__", None)
    return isinstance(module, str) and module.split(".")[0] == "cudnn"


def python_engines(graph: Any) -> list[str]:
    """Names of the Python (CuTe DSL) engines frontends 1.31+ may pick for
    this graph; [] where there are none or they cannot be listed."""
    if not hasattr(graph, "deselect_engines") or not hasattr(type(graph), "selected_engine"):
        return []  # before 1.31: no Python engines
    try:
        from cudnn.engines import manifest  # type: ignore[import-not-found]

        return sorted({str(engine.name) for engine in manifest.engines_for(graph)})
    except Exception:  # noqa: BLE001 - a release without the manifest: serialization_refusal still guards
        return []


def _exclude_python_engines(graph: Any) -> None:
    """Keep Python-engine plans out of the cache. Their 1.32 blobs carry
    kernels that load only where the CUDA driver is exactly the builder's
    (frost/compiled_cache.py compares an environment manifest that includes
    cuda_driver), which the key does not cover, and 1.31 cannot serialize
    them at all; whether one is picked also depends on CuTe DSL importing on
    the builder. Backend (runtime-compiled) plans have none of these ties."""
    names = python_engines(graph)
    if names:
        graph.deselect_engines(names)


def _keep_runtime_compiled(cudnn: Any, graph: Any) -> None:
    """Keep only plans of runtime-compiled engines: the ones cuDNN can
    serialize. Needs plans to exist (a filter set on an empty plan list marks
    nothing), so it runs right after create_execution_plans, before
    check_support. A frontend without behavior notes keeps every plan (each
    release checked has them: releases.BEHAVIOR_NOTE_FILTER, from 1.3)."""
    notes = getattr(cudnn, "behavior_note", None)
    select = getattr(graph, "select_behavior_notes", None)
    if notes is not None and select is not None and hasattr(notes, "RUNTIME_COMPILATION"):
        select([notes.RUNTIME_COMPILATION])
