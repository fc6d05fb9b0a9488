"""Causal calls the SDPA drop-in cannot express, through dense graphs of
graphcache.torch's runtime (its cache, length classes, loaded graphs and
counters; the memo entry of a call shape is made once):

- a right-padded prompt: ``padding``, each sequence's tokens its first
  ``length`` keys, cuDNN's padding mask ending them there (``seq_len_kv``)
  while every query row is computed (``seq_len_q`` is s_q): with the causal
  mask (top-left) a padded query row, past every token of its sequence,
  attends over all of them, as transformers' sdpa answers it (its 4-D mask
  is causal and the padding, nothing more); one (b,) fill on the device per
  call, no host read;
- an unpadded prompt with a sliding window in reach: mask
  ``sliding_window`` (queries and keys aligned, s_q == s_kv);
- attention sinks (gpt-oss's ``s_aux``): ``sinks``, the per-head logits a
  graph input, on an unpadded prompt (causal, windowed or not) or a decode
  step (one query, every key).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

import graphcache.torch as gt
from graphcache.compilers.classgraph import run_views
from graphcache.errors import UnsupportedCall
from graphcache.spec import GraphSpec
from graphcache.torch.core.derive import Derived, derive
from graphcache.torch.core.plan import Plan, needs_grad

_MEMO_TAG = "hf-dense"  # shares the runtime's memo (configure/reset clear it), never its keys


def dense_spec(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    window: int | None,
    dtype: str | None,
    sinks: bool = False,
    static: bool = False,
) -> Derived:
    """The causal dense spec of a call: padded without ``window``, else a
    sliding window of ``window`` positions (UnsupportedCall says why not).
    With ``sinks``: never padded, and a decode step (one query) sees every key.
    With ``static`` (a static cache's call): padded, causal bottom-right (the
    queries the last of each row's tokens), a decode step no mask."""
    causal = q.shape[2] > 1 or not sinks
    found = derive(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1], dtype=dtype)
    changes: dict[str, Any] = {"sinks": True} if sinks else {"padding": window is None}
    if static:
        changes["mask"] = "causal_bottom_right" if q.shape[2] > 1 else "none"
    if window is not None:
        changes.update(mask="sliding_window", window_left=window - 1, window_right=0)
    return Derived(found.spec.replace(**changes), found.copies, found.bias, found.expanded, found.wide)


def run_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    window: int | None,
    lengths: Any = None,
    sink: torch.Tensor | None = None,
    static: bool = False,
) -> torch.Tensor | None:
    """(b, s, h_q, d_v) from the graph, counted as a hit; or None (the call
    counted under its reason) for the caller to run transformers' sdpa.
    ``lengths`` (b,) int32 on the device: each sequence's tokens, the keys
    it has (with no ``window``; every query row is computed, a padded one
    over its sequence's tokens), ``window`` the positions a query sees (without lengths);
    ``sink`` (h_q,): the sink logits of a sink spec (without lengths);
    ``static``: a static cache's call (``dense_spec``), with ``lengths``."""
    runtime = gt.RUNTIME
    memo_key = (
        _MEMO_TAG,
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        q.dtype,
        k.dtype,
        v.dtype,
        q.device,
        k.device,
        v.device,
        type(q),
        type(k),
        type(v),
        scale,
        window,
        sink is not None,
        static,
    )
    if torch.is_grad_enabled() and needs_grad(q, k, v, sink):  # read per call (graphcache.torch.plan)
        plan = Plan(None, None, "autograd", "an input requires grad: cuDNN graphs here are forward-only")
    else:
        plan = runtime._memo.get(memo_key) or _plan(memo_key, q, k, v, scale, window, sink is not None, static)
    if runtime.recorders:  # a hit with none recording makes no list
        _note(q, k, v, scale, window, sink is not None, static)
    while plan.graph is not None and plan.spec is not None:
        try:
            out = _run(plan, q, k, v, lengths, sink)
        except Exception as exc:  # noqa: BLE001 - never into the model: the exact graph, else transformers' sdpa
            replan = partial(runtime._plan_for, Derived(plan.spec, plan.copies, None, plan.expanded), q.device)
            plan = runtime.execute_failed(memo_key, plan, exc, plan.spec, replan)  # graphcache.torch.guard
            continue
        runtime.count(plan, "hf")
        return out
    runtime.count(plan, "hf")
    return None


def _run(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Any, sink: Any) -> torch.Tensor:
    """(b, s, h_q, d_v) from ``plan``'s graph (``run_dense`` says what the
    arguments are); raises what the graph's execute raises."""
    assert plan.graph is not None and plan.spec is not None
    if lengths is None and sink is None:
        return plan.run(q, k, v).transpose(1, 2).contiguous()
    extra: dict[str, Any] = {}
    if lengths is not None:  # every query row (s_q each), each sequence's keys its tokens: see the module's docs
        lens = lengths.view(q.shape[0], 1, 1, 1)
        extra.update(seq_len_q=torch.full_like(lens, q.shape[2]), seq_len_kv=lens)
    if sink is not None:  # float32 (1, h_q, 1, 1), a device cast (no host read)
        extra["sink"] = sink.to(torch.float32).reshape(1, -1, 1, 1).contiguous()
    q, k, v = plan.reads(q, k, v)  # copies and expanded heads (graphcache.torch.derive)
    return run_views(plan.graph, q, k, v, **extra).transpose(1, 2).contiguous()


def _plan(
    memo_key: tuple[Any, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    window: int | None,
    sinks: bool = False,
    static: bool = False,
) -> Plan:
    runtime = gt.RUNTIME
    with runtime._lock:
        plan = runtime._memo.get(memo_key)
        if plan is not None:
            return plan
        try:
            derived = dense_spec(q, k, v, scale, window, None, sinks, static)
        except UnsupportedCall as exc:
            plan = Plan(None, None, exc.reason, str(exc))
        else:
            plan = runtime._plan_for(derived, q.device)
        runtime.memoize(memo_key, plan)  # bounded as the drop-in's (MEMO_LIMIT)
        return plan


def _note(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    window: int | None,
    sinks: bool = False,
    static: bool = False,
) -> None:
    """Count the call in each recorder (graphcache.torch.record) as its spec
    in the recorder's dtype, or as why it cannot be one."""
    for recorder in list(gt.RUNTIME.recorders):
        found: GraphSpec | tuple[str, str]
        wide = None
        try:
            derived = dense_spec(q, k, v, scale, window, recorder.dtype, sinks, static)
            found, wide = derived.spec, derived.wide
        except UnsupportedCall as exc:
            found = (exc.reason, str(exc))
        recorder.count(found, wide)
