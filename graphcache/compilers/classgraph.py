"""What every class graph shares: reading the real shape off the tensors,
checking it against the class, and binding a class graph to one exact shape;
and ``run_views``, the drop-in's (b, h, s, d) path for any graph whose
``execute`` takes the spec's storage layout.

A class graph (a loaded graph whose spec has ``shapes="class"``) takes real
tensors of any shape its class covers. ``bind(graph, spec)`` gives a graph for
one exact spec in the class, whose per-shape work (cuDNN's override lists,
seq-len tensors) is done once, so the drop-in pays it once per call shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphcache.errors import ExecutionError
from graphcache.spec import GraphSpec
from graphcache.spec import layouts as spec_layouts


def real_spec(klass: GraphSpec, q: Any, k: Any) -> GraphSpec:
    """The exact spec of the real tensors ``q`` and ``k`` (in the class's
    storage layout), which the class must cover.

    Raises ExecutionError naming the tensor's shape and what the class serves.
    """
    for role, t in (("q", q), ("k", k)):
        if getattr(t, "dim", None) is None or t.dim() != 4:
            raise ExecutionError(
                f"{role} must be a 4-D tensor in the class's layout {spec_layouts.of(klass, role)} (its storage order)"
            )
    q_order, k_order = spec_layouts.layout(klass, "q").order, spec_layouts.layout(klass, "k").order
    b, sq, skv = q.shape[q_order.index("b")], q.shape[q_order.index("s")], k.shape[k_order.index("s")]
    try:
        spec = klass.at(int(b), int(sq), int(skv))
    except ValueError as exc:  # a zero length: SpecError
        raise ExecutionError(
            f"q {tuple(q.shape)} / k {tuple(k.shape)} is no shape of {klass.summary()}: {exc}"
        ) from None
    check_covered(klass, spec)
    return spec


def check_covered(klass: GraphSpec, spec: GraphSpec) -> None:
    """Raise ExecutionError unless the class spec ``klass`` covers ``spec``,
    saying which limit the real shape breaks."""
    if klass.covers(spec):
        return
    if (spec.seq_q == 1) != (klass.seq_q == 1):
        why = "seq_q == 1 (decode) and seq_q > 1 need graphs of their own: cuDNN cannot override across it"
    elif spec.batch > klass.batch or spec.seq_q > klass.seq_q or (spec.seq_kv or 0) > (klass.seq_kv or 0):
        why = f"the class serves batch <= {klass.batch}, seq_q <= {klass.seq_q}, seq_kv <= {klass.seq_kv}"
    else:
        why = "heads, head dims, dtype, layout, mask, scale and flags must equal the class's"
    raise ExecutionError(
        f"a {spec.summary()} call is outside the class {klass.summary()}: {why}; "
        "load the graph of this shape's class (graphcache.spec.classes.class_of)"
    )


class BoundGraph:
    """A class graph at one exact spec of its class: ``execute`` and
    ``run_views`` go to the class graph, which takes real tensors."""

    def __init__(self, graph: Any, spec: GraphSpec) -> None:
        self.graph = graph
        self.spec = spec
        self.backend = graph.backend
        self.class_spec: GraphSpec = graph.spec
        # The class graph's own methods, not wrappers: a hit pays no extra call.
        self.execute: Callable[..., Any] = graph.execute
        own_views = getattr(graph, "run_views", None)
        self.run_views: Callable[..., Any] = own_views if callable(own_views) else self._views

    def _views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        return run_views(self, q, k, v, bias)


def run_views(graph: Any, q: Any, k: Any, v: Any, bias: Any = None, **extra: Any) -> Any:
    """``run_views`` for a graph whose ``execute`` takes tensors in the spec's
    storage layout (the torch fallback graph, a bound class graph without a
    ``run_views`` of its own): the (b, h, s, d) views torch's SDPA takes, in
    and out; a bias spec's ``bias`` (packed whatever the layout) and any other
    keyword of ``execute`` (seq lens, sink) passed on."""
    spec = graph.spec
    if bias is not None:
        extra["bias"] = bias
    stored = (storage_view(spec, r, t) for r, t in (("q", q), ("k", k), ("v", v)))
    return bhsd_view(spec, "o", graph.execute(*stored, **extra))


def storage_view(spec: GraphSpec, role: str, t: Any) -> Any:
    """A (b, h, s, d) view of q, k, v or o as its layout stores it (no copy)."""
    perm = spec_layouts.layout(spec, role).to_storage
    return t if perm == (0, 1, 2, 3) else t.permute(perm)


def bhsd_view(spec: GraphSpec, role: str, t: Any) -> Any:
    """The inverse of ``storage_view``."""
    perm = spec_layouts.layout(spec, role).to_bhsd
    return t if perm == (0, 1, 2, 3) else t.permute(perm)


def bind(graph: Any, spec: GraphSpec) -> Any:
    """A graph that runs ``spec``: ``graph`` itself when it is that spec's
    exact graph, else the class graph bound to it (its ``bind`` when it has
    one). Raises ExecutionError when ``graph`` cannot serve ``spec``."""
    if graph.spec == spec:
        return graph
    check_covered(graph.spec, spec)
    own = getattr(graph, "bind", None)
    return own(spec) if callable(own) else BoundGraph(graph, spec)
