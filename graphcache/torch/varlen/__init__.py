"""A drop-in for ``torch.nn.attention.varlen.varlen_attn``: ragged (THD)
and paged-KV attention served by cached graphs.

Same signature, semantics and results as torch's (flash-attention's
bottom-right masks per sequence, GQA, ``seqused_k``, ``block_table``, the
log-sum-exp in (H_q, T_q)). A call pays one memo lookup (a key of shapes,
strides, dtypes, devices and the call's ints and flags) and, in the cached
graph, the offset arithmetic on the device: nothing reads a tensor's values
on the host.

A call no graph serves (``num_splits`` other than None/1, autograd, a dtype
or head dim cuDNN does not take, a miss under GRAPHCACHE_SDPA_ON_MISS=torch,
...) runs torch's own varlen kernel, counted under its reason in
``graphcache.torch.stats()``, called the way the installed torch takes it
(``torch_op``: torch 2.11's op takes 10 arguments, 2.13's
14, 2.15's 15, the last the ``backend`` torch's own ``varlen_attn`` would
choose for the call, cuDNN where it qualifies). Where torch has none for the call (a CPU: ``aten::_flash_attention_forward``
is CUDA-only; a torch without ``torch.nn.attention.varlen``; paged KV or
``seqused_k`` on a torch whose op takes neither, said once in a warning) it
runs graphcache's float32 reference (``graphcache.reference.varlen``)
instead, with the same semantics.

The door's own modules: this one (``varlen_attn``: what enters),
``thd_spec`` (call to thd spec: sizes from shapes and the call's ints) and
``torch_op`` (torch's own op, called as the installed torch takes it). The
shared core it goes through (graphcache.torch.core): ``runtime`` (its memo,
tagged, bounded here by ``MEMO_LIMIT`` too; loaded graphs; miss policy;
counts under the ``varlen`` door), ``plan``, ``guard`` (a graph that raises
at execute) and ``derive``'s dtype names and scale. ``patch()`` (the sdpa
door) puts ``varlen_attn`` in ``torch.nn.attention.varlen``.
"""

from __future__ import annotations

import logging
import math
from functools import partial
from typing import Any

import torch

from graphcache.errors import UnsupportedCall
from graphcache.reference.varlen import varlen_reference
from graphcache.spec import GraphSpec
from graphcache.spec.classes import declared
from graphcache.torch.core.guard import exact_graph, failed_plan
from graphcache.torch.core.memo import MEMO_LIMIT
from graphcache.torch.core.plan import Plan
from graphcache.torch.core.runtime import RUNTIME
from graphcache.torch.varlen.thd_spec import effective_window, varlen_spec
from graphcache.torch.varlen.torch_op import MODULE, TorchVarlen

log = logging.getLogger(__name__)

# torch's own op, captured at import: the fallback never calls a patched
# torch.nn.attention.varlen.varlen_attn (ours, or another library's).
TORCH_VARLEN = TorchVarlen.installed()
TORCH_VARLEN_ATTN: Any = getattr(MODULE, "varlen_attn", None)  # the public function patch() swaps (None: no such)
_SAID: set[str] = set()  # what torch's op lacks, warned once each

_AUTOGRAD = Plan(None, None, "autograd", "an input requires grad: varlen graphs are inference-only")
_MEMO_TAG = "varlen"  # varlen memo keys share the runtime's memo (configure/reset clear them), never its keys
# Memo keys hold the call's exact max_q and max_k, so a server's prefills
# make new ones for as long as it runs; past the runtime's MEMO_LIMIT the
# varlen entries are dropped (each is one derive and one dict lookup to make again).


def varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    *,
    return_aux: Any = None,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``torch.nn.attention.varlen.varlen_attn`` through graphcache: returns
    ``out`` (T_q, H_q, D_v), or ``(out, lse)`` with ``return_aux.lse``
    (lse (H_q, T_q) float32). Raises ValueError for mismatched heads and for
    a ``scale`` that is not greater than 0 (NaN included), as torch 2.15
    does, on every torch; query tokens past ``cu_seq_q[-1]`` are undefined,
    as in torch."""
    heads_q = query.size(1)
    heads_k = key.size(2) if block_table is not None else key.size(1)
    if not enable_gqa and heads_q != heads_k:
        raise ValueError(
            f"Expect query and key/value to have the same number of heads but got Hq={heads_q} and "
            f"Hkv={heads_k}. Try setting enable_gqa=True for GQA."
        )
    if enable_gqa and heads_q % heads_k != 0:
        raise ValueError(
            f"Expect number of query heads to be a multiple of kv heads for GQA but got Hq={heads_q} and Hkv={heads_k}."
        )
    # torch 2.15's check (its fused kernels take no other), in its words and order: after the heads'.
    # `not scale > 0` also refuses NaN, which `scale <= 0` lets through.
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be greater than 0, got {scale}: pass a positive scale, or None for 1/sqrt(D)")
    want_lse = return_aux is not None and bool(return_aux.lse)
    args = (query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, want_lse, scale, window_size, enable_gqa)
    extra = (seqused_k, block_table, num_splits)
    out, lse = call(args, extra)
    return (out, lse) if want_lse else out


def call(args: tuple[Any, ...], extra: tuple[Any, ...]) -> tuple[Any, Any]:
    """One call: the cached graph where its plan has one, else the fallback."""
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, want_lse, scale, window_size, enable_gqa = args
    seqused_k, block_table, num_splits = extra
    try:
        memo_key: tuple[Any, ...] | None = (
            _MEMO_TAG,
            query.shape[1:],
            query.stride(),
            key.shape if block_table is not None else key.shape[1:],
            key.stride(),
            value.shape if block_table is not None else value.shape[1:],
            value.stride(),
            query.dtype,
            key.dtype,
            value.dtype,
            query.device,
            key.device,
            cu_seq_q.shape,
            cu_seq_q.dtype,
            None if cu_seq_k is None else cu_seq_k.dtype,
            max_q,
            # A paged spec's seq_kv is its table's reach: max_k changes nothing
            # but a bounded window's normalisation, so decode steps whose
            # longest sequence grew by a token share one memo entry.
            max_k if block_table is None or window_size[0] >= 0 or window_size[1] > 0 or max_k < 1 else None,
            want_lse,
            scale,
            tuple(window_size),
            enable_gqa,
            None if seqused_k is None else seqused_k.dtype,
            None if block_table is None else (block_table.shape, block_table.stride(), block_table.dtype),
            num_splits,
            type(query),
            type(key),
            type(value),
        )
    except (AttributeError, RuntimeError, TypeError):  # not tensors: derive says why
        memo_key = None
    if (  # read per call, never memoized (plan.needs_grad, inlined: the hot path; the index tensors are ints)
        memo_key is not None
        and torch.is_grad_enabled()
        and (query.requires_grad or key.requires_grad or value.requires_grad)
    ):
        plan = _AUTOGRAD
    elif memo_key is None:
        plan = _plan(None, args, extra)
    else:
        plan = RUNTIME._memo.get(memo_key) or _plan(memo_key, args, extra)
    while plan.graph is not None:
        graph: Any = plan.graph  # a thd graph: TorchSdpaGraph or CudnnGraph, both have run_varlen
        try:
            out, lse = graph.run_varlen(query, key, value, cu_seq_q, cu_seq_k, seqused_k, block_table)
            break
        except Exception as exc:  # noqa: BLE001 - never into the model: the exact thd graph, else torch (guard.py)
            exact = derive(args, extra)
            plan = RUNTIME.execute_failed(memo_key, plan, exc, exact, partial(_plan_for, exact, query.device))
    else:
        out, lse = fallback(args, extra)  # counted after it ran: a call torch refused leaves no trace
    RUNTIME.count(plan, "varlen")
    for recorder in list(RUNTIME.recorders):
        note(recorder, args, extra)
    return out, lse


def _plan(memo_key: tuple[Any, ...] | None, args: tuple[Any, ...], extra: tuple[Any, ...]) -> Plan:
    with RUNTIME._lock:
        plan = RUNTIME._memo.get(memo_key) if memo_key is not None else None
        if plan is not None:
            return plan
        try:
            spec = derive(args, extra)
        except UnsupportedCall as exc:
            plan = Plan(None, None, exc.reason, str(exc))
        else:
            plan = _plan_for(spec, args[0].device)
        if memo_key is not None:
            memo = RUNTIME._memo
            if len(memo) >= MEMO_LIMIT:
                for stale in [k for k in memo if k[0] == _MEMO_TAG]:
                    del memo[stale]
            RUNTIME.memoize(memo_key, plan)  # and the runtime's own bound over every door's entries
        return plan


def _plan_for(exact: GraphSpec, device: torch.device) -> Plan:
    """The graph of the thd spec that serves the call's ``exact`` spec
    (``graphcache.spec.classes.declared`` under the cache's length policy), from the
    runtime's cache and loaded graphs. A thd graph takes every call within its
    sizes as it is: its offsets and lengths say each call's shape."""
    cache = RUNTIME._cache_for(device)
    if cache is None:
        where = f"{RUNTIME._device}" if RUNTIME._device is not None else "a CUDA GPU"
        return Plan(exact, None, "device", f"tensors are on {device}; the graphs run on {where}")
    spec = declared(exact, cache.shape_classes)
    graph = RUNTIME._graphs.get(spec)
    if graph is None:
        graph, reason, message = RUNTIME._load(cache, spec)
        if graph is None:
            return Plan(spec, None, reason, message)
        RUNTIME._graphs[graph.spec] = graph
    if RUNTIME.failures.failed(spec, exact):  # it raised at execute for this call shape (graphcache.torch.guard)
        build = RUNTIME.on_miss() == "build"
        graph = exact_graph(RUNTIME.failures, RUNTIME._graphs, cache, spec, exact, build, RUNTIME.counts)
        if graph is None:
            return failed_plan(exact, spec)
    return Plan(graph.spec, graph, "", built=graph.spec in RUNTIME.counts.built)


def derive(args: tuple[Any, ...], extra: tuple[Any, ...], dtype: str | None = None) -> GraphSpec:
    """The exact spec of a call (``varlen_spec``); raises UnsupportedCall."""
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, want_lse, scale, window_size, enable_gqa = args
    seqused_k, block_table, num_splits = extra
    return varlen_spec(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, want_lse=want_lse, scale=scale,
        window_size=window_size, enable_gqa=enable_gqa, seqused_k=seqused_k, block_table=block_table,
        num_splits=num_splits, dtype=dtype,
    )  # fmt: skip


def fallback(args: tuple[Any, ...], extra: tuple[Any, ...]) -> tuple[Any, Any]:
    """torch's own varlen kernel on a GPU, as the installed torch takes it;
    graphcache's float32 reference (cast to the query's dtype) where torch
    has none for the call (a CPU; no op; paged KV or seqused_k on an op that
    takes neither, warned once); on the meta device (a trace: shapes, no
    values) empty tensors of the right shapes."""
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, want_lse, scale, window_size, enable_gqa = args
    seqused_k, block_table, num_splits = extra
    if query.is_cuda:
        lacks = TORCH_VARLEN.lacks(seqused_k, block_table)
        if lacks is None:
            return TORCH_VARLEN(
                query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size,
                enable_gqa=enable_gqa, seqused_k=seqused_k, block_table=block_table, num_splits=num_splits,
            )  # fmt: skip
        if lacks not in _SAID:
            _SAID.add(lacks)
            log.warning("varlen_attn: %s; graphcache's float32 reference runs these calls (slow)", lacks)
    if query.device.type == "meta":  # shapes only (graphcache.models.trace): nothing to compute
        t, h = query.shape[0], query.shape[1]
        out = torch.empty((t, h, value.shape[-1]), dtype=query.dtype, device="meta")
        return out, torch.empty((h, t), dtype=torch.float32, device="meta")
    out, lse = varlen_reference(
        query, key, value, cu_seq_q, cu_seq_k,
        scale=_default_scale(query.shape[-1]) if scale is None else float(scale),
        window=effective_window(window_size, max_k), seqused_k=seqused_k, block_table=block_table,
    )  # fmt: skip
    return out.to(query.dtype), lse


def _default_scale(head_dim: int) -> float:
    """torch's default scale, 1/sqrt(head_dim), in double: inf for a head dim of 0 (an empty call)."""
    return 1.0 / math.sqrt(head_dim) if head_dim else math.inf


def note(recorder: Any, args: tuple[Any, ...], extra: tuple[Any, ...]) -> None:
    """Count a call in ``recorder`` (graphcache.torch.record) as its spec, or
    as the reason it cannot be one."""
    query, key, value = args[:3]
    found: GraphSpec | tuple[str, str]
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (query, key, value)):
        found = ("autograd", "an input requires grad: varlen graphs are inference-only")
    else:
        try:
            found = declared(derive(args, extra, recorder.dtype), recorder.shape_classes)
        except UnsupportedCall as exc:
            found = (exc.reason, str(exc))
    recorder.count(found)
