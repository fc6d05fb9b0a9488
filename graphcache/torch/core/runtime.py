"""The drop-in's per-process state: loaded graphs by spec, a memo from call
shapes to what to do, the counters, and what happens on a miss.

A call pays a key built from its tensors' shapes, strides, dtypes and
devices and one dict lookup; everything else (deriving the spec, asking the
store, loading the graph) happens once per distinct call shape. Under a
class policy (GRAPHCACHE_SHAPE_CLASSES, the cache's ``shape_classes``) each
call shape maps to its class: the class graph is loaded once, and the memo
entry of each call shape holds it bound to that shape (for cuDNN, the
override lists and seq-len tensors made once), so a decode step whose
``seq_kv`` is new costs one derive and no store access. The memo and the
bounds on what the runtime keeps are memo.py's.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from graphcache.cache import GraphCache
from graphcache.classindex import work
from graphcache.compilers import padded
from graphcache.compilers.base import LoadedGraph
from graphcache.compilers.classgraph import bind
from graphcache.errors import GraphCacheError, NoGpu, NotFound, UnsupportedCall, UnsupportedGpu, UnsupportedSpec
from graphcache.spec import GraphSpec
from graphcache.spec.classes import class_of
from graphcache.torch.core.counts import Counts, Recent
from graphcache.torch.core.derive import Derived, derive_args
from graphcache.torch.core.doors import capturing, relayed_sdpa
from graphcache.torch.core.guard import Failures, exact_graph, failed_plan, graph_of
from graphcache.torch.core.memo import CLASSLESS_LIMIT, GRAPHS_LIMIT, SERVED_LIMIT, Memo
from graphcache.torch.core.onmiss import ON_MISS, ON_MISS_VAR, on_miss_from_env
from graphcache.torch.core.plan import COPIED, COPIED_BYTES, BackwardCalls, Plan

log = logging.getLogger(__name__)


class Runtime(Memo):
    """One per process (``graphcache.torch.RUNTIME``); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.reset()

    # configuration ------------------------------------------------------------

    def reset(self) -> None:
        """Forget loaded graphs, remembered misses, counters and configuration."""
        with self._lock:
            self._cache: GraphCache | None = None
            self._device: torch.device | None = None
            self._on_miss: str | None = None
            self._memo: dict[tuple[Any, ...], Plan] = {}
            self._fallbacks = 0  # graph-less memo entries made since the last drop (FALLBACK_LIMIT)
            # by the graph's own spec (a class or an exact one), the most recently loaded
            self._graphs: Recent[GraphSpec, LoadedGraph] = Recent(GRAPHS_LIMIT)
            # classes that did not serve here: exact graphs instead
            self._classless: Recent[GraphSpec, bool] = Recent(CLASSLESS_LIMIT)
            # The exact call specs loaded graphs served, by hash: a server's
            # lifetime of decode lengths, the most recent kept (and the older ones counted).
            self._served: Recent[int, bool] = Recent(SERVED_LIMIT)
            self.counts = Counts()  # what each call was served by, per door too (graphcache.torch.counts)
            COPIED.clear()  # (tensor, reason): tensors copied for a graph to read (plan.py counts them)
            COPIED_BYTES.clear()
            padded.reset()  # tensors copied into a padded class's buffers (graphcache.compilers.padded)
            self.failures = Failures()  # (graph, call shape) pairs whose execute raised (guard.py)
            self.recorders: list[Any] = []
            self.doors = self.counts.doors  # calls by the door they came through (doors.py)
            self.backward = BackwardCalls()  # graphcache.torch.backward's memo and counters

    def configure(self, cache: GraphCache | None = None, *, device: Any = None, on_miss: str | None = None) -> None:
        """Use ``cache`` for tensors on ``device`` (default: the cuDNN
        compiler's GPU); ``on_miss`` overrides GRAPHCACHE_SDPA_ON_MISS.
        Forgets what the memo held, so the next calls ask the new cache."""
        if on_miss is not None and on_miss not in ON_MISS:
            raise ValueError(f"on_miss={on_miss!r} is not one of {', '.join(ON_MISS)}")
        where = torch.device(device) if device is not None else None
        if cache is not None and where is None:
            index = getattr(cache.compiler, "device", None)
            if not isinstance(index, int):
                raise ValueError(
                    "configure(cache) needs device=... for a compiler that does not say which GPU it runs on"
                )
            where = torch.device("cuda", index)
        with self._lock:
            self._memo.clear()
            self._fallbacks = 0
            self._graphs.forget()
            self.failures = Failures()  # a verdict on graphs configure() forgets
            self._classless.forget()
            self._served.forget()
            self.counts.missed.forget()
            self.backward.memo.clear()
            self._cache = cache
            self._device = where
            self._on_miss = on_miss

    def on_miss(self) -> str:
        if self._on_miss is None:
            self._on_miss = on_miss_from_env()
        return self._on_miss

    def _cache_for(self, device: torch.device) -> GraphCache | None:
        """The cache serving tensors on ``device``, or None. Without
        configure(), the first CUDA device seen gets GraphCache.from_env()
        with the cuDNN compiler (GRAPHCACHE_SERVER / STORE / DIR)."""
        if self._cache is None and device.type == "cuda":
            from graphcache.compilers.cudnn import CudnnCompiler

            index = device.index if device.index is not None else torch.cuda.current_device()
            self._cache = GraphCache.from_env(CudnnCompiler(device=index))
            self._device = torch.device("cuda", index)
        if self._cache is None or self._device is None:
            return None
        same = device.type == self._device.type and (
            self._device.index is None or device.index is None or device.index == self._device.index
        )
        return self._cache if same else None

    # the call -------------------------------------------------------------------

    def call(
        self,
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Any:
        """scaled_dot_product_attention through graphcache (see the package docs)."""
        try:
            memo_key: tuple[Any, ...] | None = (
                query.shape,
                query.stride(),
                key.shape,
                key.stride(),
                value.shape,
                value.stride(),
                query.dtype,
                key.dtype,
                value.dtype,
                query.device,
                key.device,
                value.device,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                None if attn_mask is None else _mask_key(attn_mask),
            )
        except (AttributeError, RuntimeError):  # not tensors, nested tensors: torch decides
            memo_key = None
        args = (query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if memo_key is None or not (type(query) in _PLAIN and type(key) in _PLAIN and type(value) in _PLAIN):
            plan = self._ineligible_plan(args)  # a subclass never shares a plain call's memo entry
        elif torch.is_grad_enabled() and (  # read per call, never memoized (plan.needs_grad, inlined: the hot path)
            query.requires_grad
            or key.requires_grad
            or value.requires_grad
            or (attn_mask is not None and attn_mask.requires_grad)
        ):
            plan = _AUTOGRAD
        else:
            plan = self._memo.get(memo_key) or self._plan(memo_key, args)
        while plan.graph is not None:
            try:
                out = plan.run(query, key, value, attn_mask)
            except Exception as exc:  # noqa: BLE001 - never into the model: the exact graph, else torch (guard.py)
                replan = partial(self._plan_for, _derived(plan), query.device)
                plan = self.execute_failed(memo_key, plan, exc, plan.spec, replan)
                continue
            self.count(plan)
            if self.recorders:
                self._note(memo_key, args)
            return out
        out, taken = relayed_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if taken:  # torch gave the call to graphcache's aten door, which decided and counted it (doors.py)
            self.doors.relayed("sdpa")
            return out
        # Counted after torch ran: a call torch refused (bad shapes, dtypes,
        # devices) raised above and leaves no trace.
        self.count(plan)
        if self.recorders:
            self._note(memo_key, args)
        return out

    def count(self, plan: Plan, door: str = "sdpa") -> None:
        """Count one call that ran ``plan`` through ``door`` (doors.py names
        them): served from the store or by a graph built here where it has a
        graph, else a fallback under its reason (graphcache.torch.counts). The
        one place calls are counted: ``call``, graphcache.torch.varlen_attn,
        graphcache.hf's dense path and the aten door alike. A call a graph
        served takes no lock (Doors.hit)."""
        if plan.graph is not None:  # the hit's path, as Counts.count takes it, one call shorter
            self.doors.hit(door, plan)
            return
        self.counts.count(plan, door)

    def execute_failed(
        self, memo_key: tuple[Any, ...] | None, plan: Plan, error: Exception, call: Any, replan: Callable[[], Plan]
    ) -> Plan:
        """Record that ``plan``'s graph raised ``error`` at execute on a call
        of exact spec ``call`` (logged, counted in ``execute_failures``), and
        return the plan that replaces it under ``memo_key`` (None: not
        memoized): ``replan()``, made after the record, which never holds that
        (graph, call shape) pair again (graphcache.torch.guard)."""
        with self._lock:
            seen = self.failures.failed(graph_of(plan), call)  # another thread's call of the shape recorded it
            if not seen and not self.failures.record(graph_of(plan), call, error):
                return failed_plan(plan.spec, graph_of(plan))  # out of memory: this call only, the memo unchanged
            new = replan()
            if new.graph is not None and self.failures.failed(graph_of(new), call):  # never the same pair again
                new = failed_plan(new.spec, graph_of(new))
            if memo_key is not None and new.reason != "capture":
                self._memo[memo_key] = new
            return new

    def _note(self, memo_key: tuple[Any, ...] | None, args: tuple[Any, ...]) -> None:
        # After the call succeeded: a call torch refused is not recorded.
        for recorder in list(self.recorders):
            recorder.note(memo_key, args)

    def _ineligible_plan(self, args: tuple[Any, ...]) -> Plan:
        try:
            derived = _derive(args)
        except UnsupportedCall as exc:
            return Plan(None, None, exc.reason, str(exc))
        return Plan(derived.spec, None, "invalid", "not a plain tensor call")  # pragma: no cover - defensive

    def _plan(self, memo_key: tuple[Any, ...], args: tuple[Any, ...]) -> Plan:
        with self._lock:
            plan = self._memo.get(memo_key)
            if plan is not None:
                return plan
            try:
                derived = _derive(args)
            except UnsupportedCall as exc:
                plan = Plan(None, None, exc.reason, str(exc))
            else:
                plan = self._plan_for(derived, args[0].device)
            self.memoize(memo_key, plan)
            return plan

    def _plan_for(self, derived: Derived, device: torch.device) -> Plan:
        spec = derived.spec
        if capturing():  # no build, canary or store round trip in a CUDA graph: torch's kernel, this call only
            return Plan(spec, None, "capture", "a CUDA stream is capturing: nothing is loaded or built now")
        cache = self._cache_for(device)
        if cache is None:
            where = f"{self._device}" if self._device is not None else "a CUDA GPU"
            return Plan(spec, None, "device", f"tensors are on {device}; the graphs run on {where}")
        graph, reason, message = self.graph_for(cache, spec, self._load)
        if graph is None:
            return Plan(spec, None, reason, message)
        if self.failures.failed(graph.spec, spec):  # it raised at execute for this shape (guard.py)
            build = self.on_miss() == "build"
            found = exact_graph(self.failures, self._graphs, cache, graph.spec, spec, build, self.counts)
            if found is None:
                return failed_plan(spec, graph.spec)
            graph = found
        serving = graph.spec
        larger = serving.is_class and serving.as_listed() != class_of(spec, cache.shape_classes)
        graph = bind(graph, spec)
        self._served.add(hash(spec))
        views = callable(getattr(graph, "run_views", None)) and not (
            spec.dropout or spec.padding or spec.generate_stats
        )
        copies, expanded = derived.copies, derived.expanded
        return Plan(
            spec, graph, "", "", copies, views, work(serving), work(spec), larger, derived.bias, expanded,
            built=serving in self.counts.built, rows=derived.rows,
        )  # fmt: skip

    def graph_for(
        self, cache: GraphCache, spec: GraphSpec, load: Callable[[GraphCache, GraphSpec], tuple[Any, str, str]]
    ) -> tuple[Any, str, str]:
        """The graph that serves ``spec`` (the lock held): its class's or its
        own, as loaded before, else ``load``'s (a door's miss policy), kept by
        the spec the memo asks for; or None, the reason and message why not."""
        klass = cache.serving_class(spec)  # its own class, or the smallest stored one covering it
        graph = self._graphs.get(klass) if klass not in self._classless else None
        if graph is None:
            graph = self._graphs.get(spec)
        if graph is not None:
            return graph, "", ""
        graph, reason, message = load(cache, spec)
        if graph is None:
            return None, reason, message
        # By the spec as the memo asks for it: a class's graph whatever mechanism serves it (padded, override).
        listed = graph.spec.as_listed()
        self._graphs[listed] = graph
        if klass != spec and listed != klass:
            self._classless.add(klass)
        return graph, "", ""

    def _load(self, cache: GraphCache, spec: GraphSpec) -> tuple[LoadedGraph | None, str, str]:
        """Load ``spec``'s graph, or say why not. Misses follow on_miss."""
        on_miss = self.on_miss()
        try:
            graph, built = cache.ensure_loaded(spec, build=on_miss == "build")
        except NotFound:
            if on_miss == "error":
                self.counts.raised_miss()
                raise NotFound(
                    f"no cached cuDNN graph for {spec.summary()} (key {cache.key(spec)[:12]}): warm it "
                    f"(graphcache record, then graphcache warm), or set {ON_MISS_VAR}=torch to run torch's "
                    "SDPA on a miss"
                ) from None
            log.info("graphcache miss for %s: running torch SDPA (%s=torch)", spec.summary(), ON_MISS_VAR)
            return None, "miss", f"no cached graph for {spec.summary()}"
        except (NoGpu, UnsupportedGpu) as exc:
            return None, "no_gpu", str(exc)
        except UnsupportedSpec as exc:  # remembered per target: cuDNN cannot serve it here
            return None, "known_bad" if exc.step == "known_bad" else "unsupported", str(exc)  # a release table window
        except GraphCacheError as exc:
            log.warning("graphcache could not load %s, running torch SDPA: %s", spec.summary(), exc)
            return None, "load_failed", f"{type(exc).__name__}: {exc}"
        if getattr(graph, "backend", "") == "torch":  # a cache made with torch_fallback=True
            return None, "unsupported", getattr(graph, "reason", "") or "served by torch"
        if built:  # on the spot: its calls are no hits (graphcache.torch.counts)
            self.counts.note_built(graph.spec)
        return graph, "", ""

    # counters ---------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The calls' counters (graphcache.torch.counts: served from the
        store, built here, fallbacks by reason, misses, by door, ...), the
        tensors copied for a graph to read (``copies``; by tensor and reason
        in ``copied``, ``class_buffer`` for a padded class's declared
        buffers; ``copied_bytes``), execute_failures (guard.py),
        graphs loaded, the distinct call shapes (exact specs) they served,
        and sdpa_backward's calls apart (``backward``)."""
        copied, nbytes = Counter(COPIED), Counter(COPIED_BYTES)
        for role, row in padded.copies().items():  # into a padded class graph's declared buffers
            copied[(role, padded.REASON)] += row["copies"]
            nbytes[(role, padded.REASON)] += row["bytes"]
        return {
            **self.counts.stats(),
            "copies": sum(copied.values()),
            "copied": _by_tensor(copied),
            "copied_bytes": sum(nbytes.values()),
            "execute_failures": self.failures.count,
            "graphs_loaded": len(self._graphs),
            "graphs_dropped": self._graphs.dropped,
            "shapes_served": len(self._served) + self._served.dropped,
            "backward": self.backward.stats(),  # sdpa_backward's calls, apart from these
        }


# What derive() takes as a plain tensor (a Parameter is one, with its grad flag).
_PLAIN = frozenset({torch.Tensor, torch.nn.Parameter})
_AUTOGRAD = Plan(None, None, "autograd", "an input requires grad: cuDNN graphs here are forward-only")


def _by_tensor(copied: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
    return {role: {why: n for (r, why), n in sorted(copied.items()) if r == role} for role, _ in sorted(copied)}


def _mask_key(mask: Any) -> tuple[Any, ...]:
    """What a mask adds to a call's memo key: the bias graph and the
    conversion depend on its type (a subclass is refused), shape, strides,
    dtype and device, never its values (its requires_grad: ``call``)."""
    return (type(mask), mask.shape, mask.stride(), mask.dtype, mask.device)


def _derive(args: tuple[Any, ...]) -> Derived:
    return derive_args(args)


def _derived(plan: Plan) -> Derived:
    """What a call shape's plan was made from (its spec, copies, bias, expanded heads, allocation rows)."""
    assert plan.spec is not None
    return Derived(plan.spec, plan.copies, plan.bias, plan.expanded, rows=plan.rows)


# The one per process. Every door (graphcache.torch.sdpa, .aten, .varlen,
# .backward) and graphcache.hf share it, so it lives here, below them all.
RUNTIME = Runtime()
