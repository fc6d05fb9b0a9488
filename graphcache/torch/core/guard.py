"""What the drop-in does when a cached graph raises at execute on a hit.

A graph that loaded, and passed its build check, can still be refused by
cuDNN when it runs: a class graph checked at some override shapes and
refused at another (cudnn-frontend#1087, ``INVALID_DYNAMIC_SHAPE``), a plan
a driver or library update no longer takes. The model's forward never sees
that exception. Every door catches it around the graph's execute (a
``try`` costs nothing in CPython while nothing raises): the SDPA drop-in
(``Runtime.call``), ``varlen_attn`` and graphcache.hf's dense path. The
call falls back, to the call's exact graph where the graph that raised was
another (a class graph, a larger thd graph), else to torch (torch's SDPA,
its varlen op, transformers' sdpa), counted under ``execute_failed``.

``Failures`` remembers each (graph, call shape) pair that raised, so that
no later call of that shape tries that graph again in the process: the
runtime replaces the call shape's memo entry, and a plan made afresh (after
the memo dropped its entries) reads the record too. A failure of the moment
(out of memory: torch's OutOfMemoryError, cuDNN's ALLOC_FAILED) is no
verdict on the graph: that call falls back (torch's SDPA then allocates, and
raises torch's own error if memory is still short) and the next call of the
shape tries the graph again. The first failure of a graph is logged as a
warning, later ones at debug level.
"""

from __future__ import annotations

import logging

import torch

from graphcache.cache import GraphCache
from graphcache.compilers.base import LoadedGraph
from graphcache.errors import GraphCacheError
from graphcache.spec import GraphSpec
from graphcache.torch.core.counts import Counts, Recent
from graphcache.torch.core.plan import Plan

log = logging.getLogger(__name__)

# The (graph, call shape) pairs and the graphs that raised kept per process, the most recent.
PAIRS_LIMIT = 65536
GRAPHS_LIMIT = 1024
# Words of a failure of the moment (graphcache.compilers.cudnn.failures.TRANSIENT's).
_TRANSIENT = ("OUT OF MEMORY", "ALLOC_FAILED")


class Failures:
    """The (graph, call shape) pairs whose execute raised in this process.
    Not locked: the runtime records and reads under its own lock."""

    def __init__(self) -> None:
        # By hash, as the runtime's served shapes: one int per failed call shape, the most recent
        # (a pair dropped is tried again at its next call, and recorded again if it raises again).
        self._pairs: Recent[int, bool] = Recent(PAIRS_LIMIT)
        self._graphs: Recent[GraphSpec, bool] = Recent(GRAPHS_LIMIT)  # the graphs that raised at least once (logged)
        self.count = 0

    def record(self, graph: GraphSpec, call: GraphSpec, error: BaseException) -> bool:
        """Note that the graph of spec ``graph`` raised ``error`` at execute
        on a call of exact spec ``call``, and log it (once per graph as a
        warning). Returns False, and notes nothing, for a failure of the
        moment (out of memory): the graph is tried again at the next call."""
        moment = isinstance(error, torch.cuda.OutOfMemoryError) or any(w in str(error).upper() for w in _TRANSIENT)
        if not moment:
            self._pairs.add(hash((graph, call)))
            self.count += 1
        first = graph not in self._graphs
        self._graphs.add(graph)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "graphcache: the cached graph %s raised at execute for %s (%s: %s); %s",
            graph.summary(),
            call.summary(),
            type(error).__name__,
            error,
            "running torch's SDPA for this call (out of memory: the graph is tried again at the next call)"
            if moment
            else "falling back to the call's exact graph, else torch, and not trying this graph at this shape "
            "again in this process",
        )
        return not moment

    def failed(self, graph: GraphSpec, call: GraphSpec) -> bool:
        """True when the graph of spec ``graph`` raised at execute for ``call``."""
        return hash((graph, call)) in self._pairs

    def exact_may_serve(self, graph: GraphSpec, call: GraphSpec) -> bool:
        """True where the call's own exact graph may serve it instead of
        ``graph``, which raised for it: ``graph`` is another graph (a class,
        a larger thd graph) and the exact one has not raised for it too."""
        return graph != call and not self.failed(call, call)


def graph_of(plan: Plan) -> GraphSpec:
    """The spec of the graph ``plan`` runs: a class graph's own, not that
    of the call shape it is bound to."""
    assert plan.graph is not None
    return getattr(plan.graph, "class_spec", None) or plan.graph.spec


def failed_plan(spec: GraphSpec | None, graph: GraphSpec) -> Plan:
    """The fallback plan of a call shape (``spec``) that ``graph`` raised for."""
    return Plan(spec, None, "execute_failed", f"the cached graph {graph.summary()} raised at execute for this shape")


def exact_graph(
    failures: Failures,
    graphs: dict[GraphSpec, LoadedGraph],
    cache: GraphCache,
    graph: GraphSpec,
    spec: GraphSpec,
    build: bool,
    counts: Counts | None = None,
) -> LoadedGraph | None:
    """The graph that serves ``spec`` where the graph of spec ``graph``
    raised at execute for it: the exact graph of ``spec`` from ``graphs``
    (the runtime's loaded graphs, which it joins), else the cache's (built
    when ``build``: on_miss=build, and then noted in ``counts``); None where
    ``graph`` was that graph, the exact one raised too, or there is none.
    Never raises: a graph that failed is no miss, and on_miss=error does not
    raise for it."""
    if not failures.exact_may_serve(graph, spec):
        return None
    found = graphs.get(spec)
    if found is None and cache.compiler is not None:
        try:  # the exact graph itself: cache.load would hand the class graph back
            artifact, built = cache.ensure(spec, build=build)
            found = cache.compiler.load(artifact)
        except GraphCacheError:
            return None
        graphs[spec] = found
        if built and counts is not None:
            counts.note_built(spec)
    return found
