"""Length classes on cuDNN without execute-time override (``mechanism:
padded``): a class graph declared at its maxima with the padding mask and
no override flag (``graph.py``), run at real shapes by handing it tensors of
the declared sizes and the real lengths as its seq-len tensors.

Where each tensor is read from (in place, or a reused buffer it is copied
into), the seq-len tensors and the output's view are
``graphcache.compilers.padded``'s, shared with the reference compiler's
stand-in. Here: the checked ``execute``, ``PaddedRun`` (a padded class
graph bound to one exact spec: the drop-in's per-call path) and the pack
cuDNN runs. The build-time check is ``override.check_class`` with this
module's ``execute_padded``: the same real shapes, every tensor a view into a
NaN-filled buffer and every buffer it is copied into NaN first, against the
float32 reference (``check_padded``).

May import: override (the call's checks, the build-time check), planapi
(the loaded plan's Protocol, the device context),
graphcache.compilers.padded/classgraph, graphcache.reference (input checks),
graphcache.spec/errors; torch lazily.
"""

from __future__ import annotations

from typing import Any

from graphcache.compilers.classgraph import check_covered, storage_view
from graphcache.compilers.cudnn.override import check_class, checked_call
from graphcache.compilers.cudnn.planapi import ClassGraph, on
from graphcache.compilers.padded import PaddedShape, poisoned
from graphcache.reference.dense import to_bhsd
from graphcache.spec import GraphSpec


def execute_padded(
    graph: ClassGraph,
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    seq_len_q: Any,
    seq_len_kv: Any,
    stats: Any = None,
    bias: Any = None,
    sink: Any = None,
    *,
    shape: PaddedShape | None = None,
) -> Any:
    """``CudnnGraph.execute`` of a padded class graph: real tensors in the
    class's layout, of any shape it covers, any strides with a packed last
    dim (``override.checked_call``; ExecutionError otherwise). ``out`` and
    ``stats``, where given, receive the real rows (the check's NaN-poisoned
    views); else the call gets views of the declared output. ``shape``: a
    bound run's, used where it is this call's spec (else made here)."""
    spec = checked_call(graph, q, k, v, out, seq_len_q, seq_len_kv, bias, sink)  # as an override class checks
    if shape is None or shape.spec != spec:
        shape = PaddedShape(graph.spec, spec, graph.device)
    views = [to_bhsd(spec, t, r) for r, t in (("q", q), ("k", k), ("v", v))]
    result = run(graph, shape, *views, bias=bias, seq_len_q=seq_len_q, seq_len_kv=seq_len_kv, sink=sink)
    o, written = result if spec.generate_stats else (result, None)
    o = storage_view(spec, "o", o)
    if out is not None:
        out.copy_(o)
        o = out
    if spec.generate_stats:
        if stats is not None:
            stats.copy_(written)
            written = stats
        return o, written
    return o


def run(
    graph: ClassGraph,
    shape: PaddedShape,
    q: Any,
    k: Any,
    v: Any,
    *,
    bias: Any = None,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    sink: Any = None,
) -> Any:
    """One call at ``shape``'s exact spec: (b, h, s, d) views in (and a
    bias spec's packed bias), placed as the declared graph reads them; the
    real rows of the declared output (a (b, h, s, d) view) out, and its
    stats where the spec asks. Runs on the current stream, the lock held."""
    uids = graph.uids
    with on(graph.device), graph._compiler._lock:
        placed = shape.place(q, k, v, bias, seq_len_q, seq_len_kv)
        pack = {uids[r]: t for r, t in placed.tensors.items()}
        if sink is not None:
            pack[uids["sink"]] = sink
        graph._graph.execute(pack, graph.workspace, handle=graph._compiler.handle())
    return shape.output(placed)


def check_padded(graph: ClassGraph) -> float:
    """The build-time check of a padded class graph: ``override.check_class``
    (every check shape, each tensor a view into a NaN-filled buffer, against
    the float32 reference) through ``execute_padded``, with every buffer a
    tensor is copied into NaN first. Returns the largest error; raises
    UnsupportedSpec naming the shapes that disagreed."""
    with poisoned():
        return check_class(graph, execute_padded)


class PaddedRun:
    """A padded class graph bound to one exact spec of its class: the
    declared shapes and seq-len tensors made once, so a drop-in hit pays a
    dict lookup, the copies its tensors need, and the launch."""

    backend = "cudnn"

    def __init__(self, graph: ClassGraph, spec: GraphSpec) -> None:
        check_covered(graph.spec, spec)
        self.graph = graph
        self.spec = spec
        self.class_spec = graph.spec
        self.shape = PaddedShape(graph.spec, spec, graph.device)

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        sink: Any = None,
    ) -> Any:
        """The checked path (``CudnnGraph.execute`` of the class graph), with
        this run's declared shapes and seq-len tensors where the call is its spec."""
        return execute_padded(self.graph, q, k, v, out, seq_len_q, seq_len_kv, bias=bias, sink=sink, shape=self.shape)

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        """The drop-in's per-call path (as ``CudnnGraph.run_views``): torch's
        (b, h, s, d) views of this exact shape in (and a bias spec's packed
        bias), the view of the output's real rows out. For specs without
        padding or stats."""
        return run(self.graph, self.shape, q, k, v, bias=bias)
