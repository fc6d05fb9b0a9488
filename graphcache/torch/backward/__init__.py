"""The backward door: SDPA's backward served from cached graphs,
``sdpa_backward``.

    from graphcache.torch.backward import sdpa_backward

    dq, dk, dv = sdpa_backward(grad_out, query, key, value, out, logsumexp, is_causal=True)

The call is what ``aten::_scaled_dot_product_cudnn_attention_backward`` is
asked for in a training step: the output gradient, the forward's inputs,
its output and its log-sum-exp. It maps to the backward spec
(``kind="backward"``) of the forward call's spec (``derive``: shapes,
strides, dtype, GQA, causal, scale) and is served from the process's
GraphCache, through the same runtime as the forward drop-in
(``graphcache.torch.core.runtime.RUNTIME``: its cache and device, its loaded
graphs, its length classes, its on-miss policy, GRAPHCACHE_SDPA_ON_MISS).
A call shape's plan is made once and memoized. What it cannot serve raises
``UnsupportedCall`` with a named ``reason`` (``miss``, ``device``,
``autograd``, ``layout``, ``dtype``, ``invalid``, ``execute_failed``, ...),
so that the caller runs its own backward and counts the reason; under
on_miss=error a miss raises NotFound. ``graphcache.torch.stats()["backward"]``
counts these calls apart from the forward's.

What enters: direct calls, and the aten door's backward kernel
(``graphcache.torch.aten``), which asks here first. The shared core it goes
through (graphcache.torch.core): ``derive`` (the forward call's spec),
``runtime`` (cache, loaded graphs, classes; its own memo and counters,
``plan.BackwardCalls``, bounded by ``memo.MEMO_LIMIT``), ``onmiss`` and
``guard`` (a graph that raises at execute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from graphcache.cache import GraphCache
from graphcache.compilers.classgraph import bind
from graphcache.errors import GraphCacheError, NoGpu, NotFound, UnsupportedCall, UnsupportedGpu, UnsupportedSpec
from graphcache.spec import GraphSpec
from graphcache.spec.backward import backward_of
from graphcache.torch.core.derive import derive, packed
from graphcache.torch.core.guard import exact_graph
from graphcache.torch.core.memo import MEMO_LIMIT, drop_bound
from graphcache.torch.core.onmiss import ON_MISS_VAR
from graphcache.torch.core.runtime import _PLAIN, RUNTIME

__all__ = ["sdpa_backward"]


@dataclass(frozen=True)
class BackwardPlan:
    """What backward calls of one shape do: run ``graph`` or refuse for ``reason``."""

    spec: GraphSpec | None
    graph: Any
    reason: str = ""
    message: str = ""
    built: bool = False  # the graph was built by this process, not found in the store (graphcache.torch.counts)

    def run(self, grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any) -> tuple[Any, Any, Any]:
        """The graph on the call's (b, h, s, d) tensors (copied into the spec's
        layout where they are not in it); each gradient with the strides
        ``torch.empty_like`` gives its input (copied where the graph's differ)."""
        assert self.spec is not None
        layout = self.spec.layout

        def storage(t: Any) -> Any:
            t = packed(t, layout)
            return t.transpose(1, 2) if layout == "bshd" else t

        stats = (lse if lse.dim() == 4 else lse.unsqueeze(-1)).contiguous()
        grads = self.graph.execute(
            storage(q), storage(k), storage(v), o=storage(out), d_o=storage(grad_out), stats=stats
        )
        dq, dk, dv = (g.transpose(1, 2) if layout == "bshd" else g for g in grads)
        return _like(dq, q), _like(dk, k), _like(dv, v)


def _like(grad: Any, primal: Any) -> Any:
    if grad.stride() == primal.stride():
        return grad
    return torch.empty_like(primal).copy_(grad)


def sdpa_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of SDPA, each in the dtype, shape and strides
    (``torch.empty_like``) of ``query``, ``key`` and ``value``, from a cached
    backward graph. ``grad_out`` and ``out`` are (b, h_q, s_q, d_v) like the
    forward's output; ``logsumexp`` the forward's (b, h_q, s_q, 1) or
    (b, h_q, s_q) float32 log-sum-exp of the scaled scores (natural log), as
    ``aten::_scaled_dot_product_cudnn_attention`` returns it.

    Raises UnsupportedCall (``reason`` names why: the caller runs its own
    backward) for a call no graph serves, and NotFound on a miss under
    GRAPHCACHE_SDPA_ON_MISS=error.
    """
    state = RUNTIME.backward
    tensors = (grad_out, query, key, value, out, logsumexp)
    try:
        memo_key: tuple[Any, ...] | None = (
            *((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
            is_causal,
            scale,
            enable_gqa,
        )
    except (AttributeError, RuntimeError):  # not tensors, nested tensors
        memo_key = None
    if memo_key is None or not all(type(t) in _PLAIN for t in tensors):
        with RUNTIME._lock:  # a subclass never shares a plain call's memo entry
            plan = _plan_of(tensors, is_causal, scale, enable_gqa)
    elif torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        plan = _DOUBLE
    else:
        plan = state.memo.get(memo_key) or _memoized(memo_key, tensors, is_causal, scale, enable_gqa)
    while plan.graph is not None:
        try:
            grads = plan.run(*tensors)
        except Exception as exc:  # noqa: BLE001 - never into the training step: the exact graph, else the caller's
            plan = _execute_failed(memo_key, plan, exc, query.device)
            continue
        state.count(built=plan.built)
        return grads
    state.count(plan.reason)
    raise UnsupportedCall(plan.message or f"no cached backward graph ({plan.reason})", plan.reason)


_DOUBLE = BackwardPlan(
    None, None, "autograd", "an input requires grad (a double backward): backward graphs here are not differentiable"
)


def _memoized(memo_key: tuple[Any, ...], tensors: tuple[Any, ...], *flags: Any) -> BackwardPlan:
    with RUNTIME._lock:
        state = RUNTIME.backward
        plan = state.memo.get(memo_key)
        if plan is None:
            plan = _plan_of(tensors, *flags)
            if len(state.memo) >= MEMO_LIMIT:  # class-bound and refused entries are one derive to make again
                drop_bound(state.memo)
            state.memo[memo_key] = plan
        return plan


def _plan_of(tensors: tuple[Any, ...], is_causal: bool, scale: float | None, enable_gqa: bool) -> BackwardPlan:
    try:
        spec = _spec_of(tensors, is_causal, scale, enable_gqa)
    except UnsupportedCall as exc:
        return BackwardPlan(None, None, exc.reason, str(exc))
    return _plan_for(spec, tensors[1].device)


def _spec_of(tensors: tuple[Any, ...], is_causal: bool, scale: float | None, enable_gqa: bool) -> GraphSpec:
    """The backward spec of a call; UnsupportedCall with the reason where none fits."""
    grad_out, query, key, value, out, lse = tensors
    derived = derive(query, key, value, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    b, h, s, _ = query.shape
    want = (b, h, s, value.shape[-1])
    for name, t in (("grad_out", grad_out), ("out", out)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != want or t.dtype != query.dtype:
            raise UnsupportedCall(
                f"{name} must be a {query.dtype} tensor of shape {want} (the forward's output)", "invalid"
            )
        if t.device != query.device:
            raise UnsupportedCall(f"{name} is on {t.device}, query on {query.device}", "invalid")
    if (
        not isinstance(lse, torch.Tensor)
        or tuple(lse.shape) not in ((b, h, s, 1), (b, h, s))
        or lse.dtype != torch.float32
    ):
        raise UnsupportedCall(
            f"logsumexp must be float32 ({b}, {h}, {s}, 1) or ({b}, {h}, {s}), the forward's log-sum-exp; "
            f"got {getattr(lse, 'dtype', type(lse).__name__)} {tuple(getattr(lse, 'shape', ()))}",
            "invalid",
        )
    try:
        return backward_of(derived.spec)
    except GraphCacheError as exc:  # a field the backward does not take (SpecError names it)
        raise UnsupportedCall(str(exc), getattr(exc, "field", None) or "unsupported") from exc


def _plan_for(spec: GraphSpec, device: torch.device) -> BackwardPlan:
    """The plan of a backward call shape (under RUNTIME's lock): its class's
    graph, or its own, loaded once into the runtime's graphs, bound to it."""
    cache = RUNTIME._cache_for(device)
    if cache is None:
        where = f"{RUNTIME._device}" if RUNTIME._device is not None else "a CUDA GPU"
        return BackwardPlan(spec, None, "device", f"tensors are on {device}; the graphs run on {where}")
    graph, reason, message = RUNTIME.graph_for(cache, spec, _load)
    if graph is None:
        return BackwardPlan(spec, None, reason, message)
    if RUNTIME.failures.failed(graph.spec, spec):  # it raised at execute for this shape (graphcache.torch.guard)
        build = RUNTIME.on_miss() == "build"
        found = exact_graph(RUNTIME.failures, RUNTIME._graphs, cache, graph.spec, spec, build, RUNTIME.counts)
        if found is None:
            return BackwardPlan(spec, None, "execute_failed", f"the cached graph {graph.spec.summary()} raised here")
        graph = found
    RUNTIME._served.add(hash(spec))
    return BackwardPlan(spec, bind(graph, spec), built=graph.spec in RUNTIME.counts.built)


def _load(cache: GraphCache, spec: GraphSpec) -> tuple[Any, str, str]:
    """``spec``'s graph, or why not (the forward's policy: ``Runtime._load``)."""
    on_miss = RUNTIME.on_miss()
    try:
        graph, built = cache.ensure_loaded(spec, build=on_miss == "build")
    except NotFound:
        if on_miss == "error":
            RUNTIME.backward.count("raised")
            raise NotFound(
                f"no cached cuDNN graph for {spec.summary()} (key {cache.key(spec)[:12]}): warm it (graphcache "
                f"record --backward, then graphcache warm), or set {ON_MISS_VAR}=torch to run torch's backward"
            ) from None
        return None, "miss", f"no cached backward graph for {spec.summary()}"
    except (NoGpu, UnsupportedGpu) as exc:
        return None, "no_gpu", str(exc)
    except UnsupportedSpec as exc:  # a known-bad window of the release table is named so (docs/two-doors.md)
        return None, "known_bad" if exc.step == "known_bad" else "unsupported", str(exc)
    except GraphCacheError as exc:
        return None, "load_failed", f"{type(exc).__name__}: {exc}"
    if getattr(graph, "backend", "") == "torch":  # a cache made with torch_fallback=True
        return None, "unsupported", getattr(graph, "reason", "") or "served by torch"
    if built:  # on the spot: its calls are no hits (graphcache.torch.counts)
        RUNTIME.counts.note_built(graph.spec)
    return graph, "", ""


def _execute_failed(
    memo_key: tuple[Any, ...] | None, plan: BackwardPlan, exc: Exception, device: torch.device
) -> BackwardPlan:
    """Record that ``plan``'s graph raised (``graphcache.torch.guard``) and
    the plan that replaces it: the call's exact graph, else a refusal."""
    assert plan.spec is not None
    graph: GraphSpec = getattr(plan.graph, "class_spec", None) or plan.graph.spec
    with RUNTIME._lock:
        failures = RUNTIME.failures
        if not failures.failed(graph, plan.spec) and not failures.record(graph, plan.spec, exc):
            return BackwardPlan(plan.spec, None, "execute_failed", f"out of memory: {exc}")  # this call only
        new = _plan_for(plan.spec, device)
        if new.graph is not None and failures.failed(
            getattr(new.graph, "class_spec", None) or new.graph.spec, plan.spec
        ):
            new = BackwardPlan(plan.spec, None, "execute_failed", f"the cached graph {graph.summary()} raised here")
        if memo_key is not None:
            RUNTIME.backward.memo[memo_key] = new
        return new
