"""Length classes in cuDNN: a class spec's graph run at real shapes through
execute-time shape override (notes/shape-classes.md).

A class graph is declared at its class's maxima with
``pygraph(is_override_shape_enabled=True)`` and always the padding mask
(``graph.py``), so rows and keys past the real lengths are masked. Each call
passes ``override_uids`` / ``override_shapes`` / ``override_strides`` for
every tensor whose extent involves b or s, in the graph's declared axis
order (b, h, s, d), with the strides of the real buffers, and seq lens equal
to the real lengths. ``ClassRun`` is a class graph bound to one exact spec,
with its lists and seq-len tensors made once (what the drop-in memo holds).
``check_class`` is the build-time guard (of padded classes too, padded.py).

May import: releases, planapi (what it reads of a loaded plan, as
Protocols: ``loaded`` imports this module), graphcache.reference (the float32
reference, the measures), graphcache.compilers.classgraph,
graphcache.spec/uids/errors; torch lazily.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from graphcache.compilers.classgraph import check_covered, real_spec
from graphcache.compilers.cudnn.planapi import ClassGraph, on
from graphcache.compilers.cudnn.releases import BIAS_OVERRIDE, OVERRIDE_WORKSPACE, SHAPE_OVERRIDE, available, missing
from graphcache.errors import ExecutionError, UnsupportedSpec
from graphcache.reference.checks import check_sink, check_tensor
from graphcache.reference.dense import bias_dtype, in_layout, random_inputs, reference_errors, to_bhsd, torch_dtype
from graphcache.reference.measure import TOLERANCE, within_tolerance
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap

# Every tensor whose extent involves b or s, in the order they are passed
# (a bias's s_q and s_kv always do, its batch where it has one).
OVERRIDDEN = ("q", "k", "v", "o", "stats", "seq_len_q", "seq_len_kv", "bias")
_LAYOUT_ROLES = ("q", "k", "v", "o")


def check_target(spec: GraphSpec, frontend: str, cudnn: str | int) -> None:
    """Raise UnsupportedSpec (a negative entry: callers use exact specs on
    this target) where this stack cannot run a class graph: cuDNN < 9.21, or
    a frontend whose Python ``execute()`` drops the override lists (< 1.24)."""
    problem = missing(SHAPE_OVERRIDE, frontend, cudnn)
    if problem is None and spec.bias is not None:  # the override engine's own floor for a bias input
        problem = missing(BIAS_OVERRIDE, frontend, cudnn)
    if problem:
        raise UnsupportedSpec(
            f"{spec.summary()} is a length class, and {problem}: exact specs serve this target "
            "(GraphCache falls back to them; GRAPHCACHE_SHAPE_CLASSES=exact records them)",
            step="preflight",
        )


def roles(spec: GraphSpec) -> tuple[str, ...]:
    """The overridden roles a class graph declares (stats only with
    generate_stats, bias only with a bias)."""
    return tuple(
        r for r in OVERRIDDEN if (r != "stats" or spec.generate_stats) and (r != "bias" or spec.bias is not None)
    )


def lists_for(spec: GraphSpec, uids: UidMap) -> dict[str, list[Any]]:
    """The override keywords for the real (exact) ``spec`` with packed
    tensors in its layout: what torch's tensors of that call shape have
    (the drop-in's memo key has matched their shapes and strides)."""
    names, uids = roles(spec), uids.for_spec(spec)
    return {
        "override_uids": [uids[r] for r in names],
        "override_shapes": [list(spec.dims(r)) for r in names],
        "override_strides": [list(spec.strides(r)) for r in names],
    }


def lists_of(uids: UidMap, views: dict[str, Any]) -> dict[str, list[Any]]:
    """The override keywords read off real tensors: ``views`` maps roles to
    (b, h, s, d)-ordered tensors (any strides)."""
    names = [r for r in OVERRIDDEN if r in views]
    return {
        "override_uids": [uids[r] for r in names],
        "override_shapes": [list(views[r].shape) for r in names],
        "override_strides": [list(views[r].stride()) for r in names],
    }


def workspace_size(graph: ClassGraph, lists: dict[str, list[Any]]) -> int:
    """The workspace a real shape needs: the override-aware query where
    cuDNN >= 9.23 and frontend >= 1.24 have it, else the declared shape's."""
    target = graph.artifact.target
    if not available(OVERRIDE_WORKSPACE, target.frontend, target.cudnn):
        return graph.workspace_size
    queried = int(graph._graph.get_workspace_size(graph._compiler.handle(), **lists))
    return max(queried, graph.workspace_size)


def workspace(graph: ClassGraph, size: int) -> Any:
    """The current stream's workspace, grown to ``size`` bytes if it is smaller."""
    import torch

    current = graph.workspace
    if current.numel() >= size:
        return current
    stream = torch.cuda.current_stream(graph.device)
    with on(graph.device):
        grown = torch.empty(size, device=graph.device, dtype=torch.uint8)
    graph._workspaces[stream.cuda_stream] = grown
    return grown


def _lengths(spec: GraphSpec, device: Any) -> tuple[Any, Any]:
    import torch

    shape = (spec.batch, 1, 1, 1)
    return (
        torch.full(shape, spec.seq_q, dtype=torch.int32, device=device),
        torch.full(shape, spec.seq_kv or spec.seq_q, dtype=torch.int32, device=device),
    )


def checked_call(
    graph: ClassGraph, q: Any, k: Any, v: Any, out: Any, seq_len_q: Any, seq_len_kv: Any, bias: Any, sink: Any
) -> GraphSpec:
    """The real spec of a class graph's call (``real_spec``), its tensors
    checked: shapes at it, dtype, device, a packed last dim (any other
    strides); seq lens and bias as the exact path takes them. Raises
    ExecutionError naming what is wrong."""
    import torch

    spec = real_spec(graph.spec, q, k)
    given = {"q": q, "k": k, "v": v, "o": out}
    for role, t in given.items():
        if t is None:
            continue
        if tuple(t.shape) != spec.storage_shape(role):
            raise ExecutionError(
                f"{role} has shape {tuple(t.shape)}; {spec.summary()} needs {spec.storage_shape(role)}"
            )
        if t.dtype != torch_dtype(spec) or t.device != graph.device or t.stride(-1) != 1:
            raise ExecutionError(
                f"{role} must be {torch_dtype(spec)} on {graph.device} with a packed last dim "
                f"(got {t.dtype} on {t.device}, strides {tuple(t.stride())})"
            )
    if spec.padding != (seq_len_q is not None) or spec.padding != (seq_len_kv is not None):
        raise ExecutionError(f"seq_len_q and seq_len_kv are {'needed' if spec.padding else 'not taken'} here")
    for role, t in (("seq_len_q", seq_len_q), ("seq_len_kv", seq_len_kv)):
        if t is not None:  # as the exact path: (b, 1, 1, 1) int32, or an override of another rank or dtype
            check_tensor(spec, role, t, (spec.batch, 1, 1, 1), torch.int32)
            if t.device != graph.device:
                raise ExecutionError(f"{role} is on {t.device}; this graph runs on {graph.device}")
    if (bias is None) != (spec.bias is None) or (
        bias is not None and (bias.shape, bias.dtype, bias.stride(-1)) != (spec.dims("bias"), bias_dtype(spec), 1)
    ):
        raise ExecutionError(f"bias must be {spec.dims('bias') if spec.bias else 'absent'} in {bias_dtype(spec)} here")
    check_sink(spec, sink, q)
    return spec


def execute_class(
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
) -> Any:
    """``CudnnGraph.execute`` of a class graph: real tensors of any shape the
    class covers, in its layout, any strides with a packed last dim (a view
    into a larger buffer included). ``stats``, where given, is the
    (b, h, s, 1) float32 buffer the log-sum-exp is written to (the check's
    NaN-poisoned view); ``bias``, a bias spec's (b|1, h|1, s_q, s_kv) tensor
    at the real shape. Raises ExecutionError otherwise (``checked_call``)."""
    import torch

    spec = checked_call(graph, q, k, v, out, seq_len_q, seq_len_kv, bias, sink)
    with on(graph.device), graph._compiler._lock:
        if out is None:
            out = torch.empty(spec.storage_shape("o"), dtype=q.dtype, device=q.device)
        if seq_len_q is None:
            seq_len_q, seq_len_kv = _lengths(spec, q.device)  # the padding mask at the real lengths
        views = {r: to_bhsd(spec, t, r) for r, t in (("q", q), ("k", k), ("v", v), ("o", out))}
        views.update(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
        if bias is not None:
            views["bias"] = bias
        views.update({} if sink is None else {"sink": sink})  # (1, h_q, 1, 1): no dim a class overrides
        if spec.generate_stats:
            if stats is None:
                stats = torch.empty(spec.dims("stats"), dtype=torch.float32, device=q.device)
            views["stats"] = stats
        lists = lists_of(graph.uids, views)
        _run(graph, {graph.uids[r]: t for r, t in views.items()}, lists, workspace_size(graph, lists))
    return (out, stats) if spec.generate_stats else out


def _run(graph: ClassGraph, pack: dict[int, Any], lists: dict[str, list[Any]], size: int) -> None:
    """One execute with the override keywords (the lock held)."""
    graph._graph.execute(pack, workspace(graph, size), handle=graph._compiler.handle(), **lists)


# Per class graph, a table whose row n holds the length n for every batch
# element: a bound shape's seq-len tensors are views of it, so a server's
# thousands of decode lengths allocate nothing on the GPU per shape.
_TABLES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def bound_lengths(graph: ClassGraph, spec: GraphSpec) -> tuple[Any, Any]:
    """The (batch, 1, 1, 1) int32 seq-len tensors of the real ``spec``: views
    into the class graph's length table (made once)."""
    import torch

    table = _TABLES.get(graph)
    if table is None:
        klass = graph.spec
        rows = max(klass.seq_q, klass.seq_kv or klass.seq_q) + 1
        table = torch.arange(rows, dtype=torch.int32, device=graph.device).unsqueeze(1).repeat(1, klass.batch)
        _TABLES[graph] = table
    b = spec.batch
    return table[spec.seq_q, :b].view(b, 1, 1, 1), table[spec.seq_kv or spec.seq_q, :b].view(b, 1, 1, 1)


class ClassRun:
    """A class graph bound to one exact spec of its class: the override
    lists, seq-len tensors and workspace size are made once, here, so a
    drop-in hit pays a dict lookup and the launch."""

    backend = "cudnn"

    def __init__(self, graph: ClassGraph, spec: GraphSpec) -> None:
        check_covered(graph.spec, spec)
        self.graph = graph
        self.spec = spec
        self.class_spec = graph.spec
        self.lists = lists_for(spec, graph.uids)
        self.seq_lens = None if spec.padding else bound_lengths(graph, spec)
        with graph._compiler._lock:
            self.workspace_size = workspace_size(graph, self.lists)
        self._out = (tuple(spec.dims("o")), tuple(spec.strides("o")))

    def execute(self, q: Any, k: Any, v: Any, **kwargs: Any) -> Any:
        """The checked path: ``CudnnGraph.execute`` of the class graph."""
        return self.graph.execute(q, k, v, **kwargs)

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        """The drop-in's per-call path (as ``CudnnGraph.run_views``): torch's
        (b, h, s, d) views of packed tensors of this exact shape in (and a
        bias spec's packed bias), such a view out. For specs without padding
        or stats."""
        import torch

        graph, uids = self.graph, self.graph.uids
        shape, strides = self._out
        assert self.seq_lens is not None
        with on(graph.device), graph._compiler._lock:
            out = torch.empty_strided(shape, strides, dtype=q.dtype, device=q.device)
            pack = {uids["q"]: q, uids["k"]: k, uids["v"]: v, uids["o"]: out}
            pack[uids["seq_len_q"]], pack[uids["seq_len_kv"]] = self.seq_lens
            if bias is not None:
                pack[uids["bias"]] = bias
            _run(graph, pack, self.lists, self.workspace_size)
        return out


# -- the build-time check ------------------------------------------------------------


def check_shapes(klass: GraphSpec) -> list[GraphSpec]:
    """The real shapes a class graph is checked at: the declared maximum, the
    smallest, lengths off the 64-row tile (1 and 33 keys; 96 and 160 rows, of
    queries or, for decode, of keys, where they fit), at full and at one batch."""
    assert klass.seq_kv is not None
    decode = klass.seq_q == 1
    big_b = klass.batch
    shapes = [(big_b, klass.seq_q, klass.seq_kv), (1, 1 if decode else 2, 1)]
    for keys in (1, 33):
        if keys <= klass.seq_kv:  # a hand-declared class may be shorter than 33 keys
            shapes.append((big_b, 1 if decode else min(klass.seq_q, max(2, keys)), keys))
    for rows in (96, 160):
        if decode and rows <= klass.seq_kv:
            shapes.append((max(1, big_b - 1), 1, rows))
        elif not decode and rows <= klass.seq_q and rows <= klass.seq_kv:
            shapes.append((max(1, big_b - 1), rows, rows))
    return [klass.at(b, q, kv) for b, q, kv in dict.fromkeys(shapes)]


def canary_spec(spec: GraphSpec) -> GraphSpec:
    """The real shape a class graph's canary runs at (not the declared one:
    that alone would not show a plan that ignores the override); an exact
    spec's own."""
    if not spec.is_class:
        return spec
    assert spec.seq_kv is not None
    # 29 short of the maximum, off the tile; a class declared that short
    # (by hand: pow2 declares at least 128) at its smallest length instead.
    seq_q = 1 if spec.seq_q == 1 else max(2, spec.seq_q - 29)  # prefill stays above 1
    return spec.at(max(1, spec.batch // 2), seq_q, max(1, spec.seq_kv - 29))


def _poisoned(real: Any, pad: tuple[int, ...]) -> Any:
    """``real``'s values as a view into a larger NaN-filled buffer (each dim
    ``pad`` longer), so a plan that reads or writes past the real extent
    shows as non-finite output."""
    import torch

    big = torch.full(
        [n + p for n, p in zip(real.shape, pad, strict=True)], float("nan"), dtype=real.dtype, device=real.device
    )
    view = big[tuple(slice(0, n) for n in real.shape)]
    view.copy_(real)
    return view


def check_class(graph: ClassGraph, execute: Callable[..., Any] | None = None) -> float:
    """Run the (round-tripped) class graph at every ``check_shapes`` shape,
    each tensor a view into a NaN-filled buffer, against the float32
    reference, the log-sum-exp too where the spec asks for stats (``execute``:
    how it runs one, ``execute_class`` by default; padded classes pass theirs). Returns
    the largest output error; raises UnsupportedSpec naming the shapes whose
    output, or else whose stats, disagreed (recorded for this target: callers
    use exact specs there)."""
    klass = graph.spec
    worst, failed, wrong_stats = 0.0, [], []
    for n, real in enumerate(check_shapes(klass)):
        feed = random_inputs(real, str(graph.device), seed=100 + n)
        poisoned = {r: in_layout(real, r, t, poisoned=True) if r in _LAYOUT_ROLES else t for r, t in feed.items()}
        out = in_layout(real, "o", feed["q"].new_zeros(real.storage_shape("o")), poisoned=True)
        stats = None
        if real.generate_stats:  # (b, h, s, 1) whatever the layout: b and s padded
            stats = _poisoned(feed["q"].new_zeros(real.dims("stats")).float(), (1, 0, 64, 0))
        lengths, bias = (feed.get("seq_len_q"), feed.get("seq_len_kv")), feed.get("bias")
        bias = None if bias is None else _poisoned(bias, (0, 0, 64, 64))  # a view into a buffer longer in s_q, s_kv
        q, k, v = (poisoned[r] for r in ("q", "k", "v"))
        (execute or execute_class)(graph, q, k, v, out, *lengths, stats=stats, bias=bias, sink=feed.get("sink"))
        error, stats_error = reference_errors(real, out, feed, stats)
        worst = max(worst, error)
        shape = f"b{real.batch} q{real.seq_q} kv{real.seq_kv}"
        if not within_tolerance(real, error):
            failed.append(f"{shape} (error {error:.2e})")
        elif stats_error is not None and not within_tolerance(real, stats_error):
            wrong_stats.append(f"{shape} (lse error {stats_error:.2e})")
    if failed:
        raise UnsupportedSpec(
            f"the class graph {klass.summary()} disagrees with the float32 reference at real shapes "
            f"{', '.join(failed)} (tolerance {TOLERANCE[klass.dtype]:.0e}, inputs in NaN-filled buffers): "
            "exact specs serve this target",
            step="check",
        )
    if wrong_stats:
        # A right output with a wrong log-sum-exp (stats ignoring the
        # override, or cudnn-frontend#1083's heads): as varlen_check, a
        # verdict on this target, so callers fall back to exact specs.
        raise UnsupportedSpec(
            f"the class graph {klass.summary()} writes a wrong log-sum-exp (stats) at real shapes "
            f"{', '.join(wrong_stats)} while its output agrees (tolerance {TOLERANCE[klass.dtype]:.0e} on "
            "|lse - ref| / (1 + |ref|), stats in NaN-filled buffers): exact specs serve this target",
            step="check",
        )
    return worst
