"""Causal calls the SDPA drop-in cannot express, through dense graphs of
graphcache.torch's runtime (its cache, length classes, loaded graphs and
counters; the memo entry of a call shape is made once):

- a right-padded prompt: ``padding``, each sequence's tokens its first
  ``length`` rows, cuDNN's padding mask (``seq_len_q`` / ``seq_len_kv``)
  ending it there;
- an unpadded prompt with a sliding window in reach: mask
  ``sliding_window`` (queries and keys aligned, s_q == s_kv).
"""

from __future__ import annotations

from typing import Any

import torch

import graphcache.torch as gt
from graphcache.errors import UnsupportedCall
from graphcache.spec import GraphSpec
from graphcache.torch.derive import Derived, derive
from graphcache.torch.runtime import Plan

_MEMO_TAG = "hf-dense"  # shares the runtime's memo (configure/reset clear it), never its keys


def dense_spec(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, window: int | None, dtype: str | None
) -> Derived:
    """The causal dense spec of a call: padded without ``window``, else a
    sliding window of ``window`` positions (UnsupportedCall says why not)."""
    found = derive(q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1], dtype=dtype)
    if window is None:
        return Derived(found.spec.replace(padding=True), found.copy_q)
    return Derived(found.spec.replace(mask="sliding_window", window_left=window - 1, window_right=0), found.copy_q)


def run_dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, window: int | None, lengths: Any = None
) -> torch.Tensor | None:
    """(b, s, h_q, d_v) from the graph, counted as a hit; or None (the call
    counted under its reason) for the caller to run transformers' sdpa.
    ``lengths`` (b,) int32 on the device: each sequence's tokens (with no
    ``window``), ``window`` the positions a query sees (without lengths)."""
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
        q.device,
        scale,
        window,
    )
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        plan = Plan(None, None, "autograd", "an input requires grad: cuDNN graphs here are forward-only")
    else:
        plan = runtime._memo.get(memo_key) or _plan(memo_key, q, k, v, scale, window)
    _note(q, k, v, scale, window)
    runtime.count(plan)
    if plan.graph is None or plan.spec is None:
        return None
    if lengths is None:
        return plan.run(q, k, v).transpose(1, 2).contiguous()
    spec = plan.spec
    b = q.shape[0]
    lens = lengths.view(b, 1, 1, 1)
    if spec.layout == "bshd":
        qs = q.transpose(1, 2)
        qs = qs.contiguous() if plan.copy_q else qs
        out = plan.graph.execute(qs, k.transpose(1, 2), v.transpose(1, 2), seq_len_q=lens, seq_len_kv=lens)
        return out
    qs = q.contiguous() if plan.copy_q else q
    out = plan.graph.execute(qs, k, v, seq_len_q=lens, seq_len_kv=lens)
    return out.transpose(1, 2).contiguous()


def _plan(
    memo_key: tuple[Any, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None,
    window: int | None,
) -> Plan:
    runtime = gt.RUNTIME
    with runtime._lock:
        plan = runtime._memo.get(memo_key)
        if plan is not None:
            return plan
        try:
            derived = dense_spec(q, k, v, scale, window, None)
        except UnsupportedCall as exc:
            plan = Plan(None, None, exc.reason, str(exc))
        else:
            plan = runtime._plan_for(derived, q.device)
        runtime._memo[memo_key] = plan
        return plan


def _note(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None, window: int | None) -> None:
    """Count the call in each recorder (graphcache.torch.record) as its spec
    in the recorder's dtype, or as why it cannot be one."""
    for recorder in list(gt.RUNTIME.recorders):
        found: GraphSpec | tuple[str, str]
        try:
            found = dense_spec(q, k, v, scale, window, recorder.dtype).spec
        except UnsupportedCall as exc:
            found = (exc.reason, str(exc))
        recorder.count(found)
