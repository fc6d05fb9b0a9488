"""PyTorch's own door: ``aten::_scaled_dot_product_cudnn_attention`` and
its backward, served by graphcache's kernels (here), which
``graphcache.torch.install()`` registers at a dispatch key.

PyTorch's SDPA dispatcher calls the forward op when it picks cuDNN (H100,
H200, B200 with cuDNN > 9.15), and so do xDiT, diffusers' context-parallel
attention, nn.MultiheadAttention's fused path and compiled graphs; the op's
own autograd kernel (left as it is) saves the outputs and calls the backward
op. The forward serves a call from the process's GraphCache (the runtime's
memo, graphs and counters: one per process, shared by threads and by every
door), with ``generate_stats`` where the call asks for logsumexp or an input
needs grad, and returns the op's nine outputs as its meta kernel gives them
(shapes, dtypes, strides), so torch.compile's fake tensors agree. The
backward asks ``graphcache.torch.backward.sdpa_backward`` (backward
graphs, docs/backward.md). What neither can serve goes to PyTorch's own
kernel (the C++ worker ops ``aten::_cudnn_attention_forward`` / ``_backward``
on CUDA, which installing never shadows; on a CPU, where torch has no such
kernel, the math in ``cpu_math``), counted under a named reason in
``stats()`` (``doors``: ``aten`` and ``aten_backward``).

The door's own modules: this one (the kernels: what enters), ``install``
(``install()``, ``uninstall()``, which kernel serves a key now:
``kernels()``), ``plan`` (a hit's nine outputs, planned once per call
shape: ``AtenPlan``) and ``cpu_math`` (torch's math for the op on a CPU).
The shared core it goes through (graphcache.torch.core): ``derive`` (call
to spec), ``runtime`` (the memo, loaded graphs, miss policy and counts every
door shares), ``plan`` and ``doors`` (a call the sdpa door relayed is
counted once; nothing built while a CUDA stream captures). Its backward
kernel asks the backward door, ``graphcache.torch.backward``.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Any

import torch

from graphcache.errors import NotFound, UnsupportedCall
from graphcache.torch.aten import cpu_math as aten_math
from graphcache.torch.aten.plan import aten_plan, meta_outputs, restrided, template
from graphcache.torch.backward import sdpa_backward
from graphcache.torch.core.derive import Derived, derive
from graphcache.torch.core.doors import RELAY, capturing
from graphcache.torch.core.plan import Plan
from graphcache.torch.core.runtime import RUNTIME

log = logging.getLogger(__name__)

FORWARD = "_scaled_dot_product_cudnn_attention"
BACKWARD = "_scaled_dot_product_cudnn_attention_backward"


def forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    """The forward kernel: ``(output, logsumexp, None, None, s_q, s_kv,
    philox_seed, philox_offset, None)``, as the op's meta kernel gives them.
    A hit pays the memo key, one dict lookup, the graph's run and three
    empty tensors the op's contract asks for (``AtenPlan.serve``), and its count."""
    # Stats where asked, and where an input needs grad (the backward reads them).
    stats = compute_log_sumexp or query.requires_grad or key.requires_grad or value.requires_grad
    if attn_bias is not None or dropout_p or return_debug_mask:
        plan = _REFUSED["attn_bias" if attn_bias is not None else "dropout" if dropout_p else "debug_mask"]
        return _torch_forward(plan, query, key, value, attn_bias, stats, dropout_p, is_causal, return_debug_mask, scale)
    memo_key = (
        FORWARD,
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
        stats,
        is_causal,
        scale,
    )
    plan = RUNTIME._memo.get(memo_key) or _plan(memo_key, query, key, value, stats, is_causal, scale)
    while plan.graph is not None:
        try:
            outputs = plan.serve(query, key, value)  # type: ignore[attr-defined]  # with a graph: an AtenPlan
        except Exception as exc:  # noqa: BLE001 - never into the model: the exact graph, else torch (guard.py)
            assert plan.spec is not None
            replan = partial(_replan, plan, query, key, value, stats, is_causal, scale)
            plan = RUNTIME.execute_failed(memo_key, plan, exc, plan.spec, replan)
            continue
        if RELAY.depth:  # a call the sdpa door gave to torch is decided here (doors.py)
            RELAY.taken = True
        RUNTIME.count(plan, "aten")
        if RUNTIME.recorders:
            _note(plan, query, key, value, is_causal, scale, stats)
        return outputs
    return _torch_forward(plan, query, key, value, None, stats, 0.0, is_causal, False, scale)


def backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    attn_bias: torch.Tensor | None,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward kernel: ``(dq, dk, dv)`` with the strides of q, k and v
    (the op's meta kernel: ``empty_like``), from backward graphs where
    ``graphcache.torch.backward`` serves the call, else from PyTorch's kernel."""
    reason, message = _backward_refusal(attn_bias, dropout_p, cum_seq_q)
    if not reason:
        try:
            with _autograd_dispatch():
                grads = sdpa_backward(
                    grad_out,
                    query,
                    key,
                    value,
                    out,
                    logsumexp,
                    is_causal=is_causal,
                    scale=scale,
                    enable_gqa=key.shape[1] != query.shape[1],
                )
        except UnsupportedCall as exc:
            reason, message = exc.reason, str(exc)
        except NotFound:  # a miss under GRAPHCACHE_SDPA_ON_MISS=error: raised, as the forward's is
            raise
        except Exception as exc:  # noqa: BLE001 - never into the training step: torch's kernel serves
            log.warning("graphcache's SDPA backward raised, running torch's: %s: %s", type(exc).__name__, exc)
            reason, message = "backward_failed", f"{type(exc).__name__}: {exc}"
        else:
            RUNTIME.doors.counted("aten_backward", True)
            return _like(grads[0], query), _like(grads[1], key), _like(grads[2], value)
    RUNTIME.doors.counted("aten_backward", False, reason)
    log.debug("aten backward runs torch's kernel (%s): %s", reason, message)
    if query.device.type == "cuda":
        result = torch.ops.aten._cudnn_attention_backward(
            grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
            cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, scale=scale,
        )  # fmt: skip
        return tuple(result)  # type: ignore[return-value]
    dq, dk, dv = aten_math.backward(grad_out, query, key, value, attn_bias, dropout_p, is_causal, scale)
    return _like(dq, query), _like(dk, key), _like(dv, value)


def torch_kernel(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """PyTorch's own CUDA kernel for ``op`` (FORWARD or BACKWARD), called
    with the op's arguments: the C++ worker op it runs, which installing never
    shadows. What graphcache's uninstalled kernels pass calls on to where
    torch cannot hand out the kernel beneath (before torch 2.9: install.py)."""
    if op == BACKWARD:
        return tuple(torch.ops.aten._cudnn_attention_backward(*args, **kwargs))
    return tuple(_cudnn_forward(*args, **kwargs))


def _cudnn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Any,
    stats: bool,
    dropout_p: float = 0.0,
    causal: bool = False,
    debug: bool = False,
    *,
    scale: float | None = None,
) -> Any:
    return torch.ops.aten._cudnn_attention_forward(
        q, k, v, bias, None, None, q.shape[2], k.shape[2], stats, dropout_p, causal, debug, scale=scale
    )


# -- the forward's plan and run --------------------------------------------------------

_REFUSED = {
    "attn_bias": Plan(None, None, "attn_bias", "an attn_bias: its gradient is the op's own (PyTorch's kernel)"),
    "dropout": Plan(None, None, "dropout", "dropout_p > 0: its random stream is PyTorch's kernel's"),
    "debug_mask": Plan(None, None, "debug_mask", "return_debug_mask=True: PyTorch's kernel writes it"),
}


def _plan(
    memo_key: tuple[Any, ...], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stats: bool, causal: bool, scale: Any
) -> Plan:
    """The plan of a call shape, made once (under the runtime's lock, so
    threads calling one shape load one graph), through the runtime's
    ``_plan_for`` as the sdpa door's are (graphs, classes, misses, capture)."""
    with RUNTIME._lock:
        plan = RUNTIME._memo.get(memo_key)
        if plan is not None:
            return plan
        try:
            # GQA is the op's when key has fewer heads; derive checks that they divide.
            derived = derive(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
        except UnsupportedCall as exc:
            plan = Plan(None, None, exc.reason, str(exc))
        else:
            if stats:
                derived = dataclasses.replace(derived, spec=derived.spec.replace(generate_stats=True))
            plan = aten_plan(RUNTIME._plan_for(derived, q.device), q, k, v, stats, causal, scale)
        RUNTIME.memoize(memo_key, plan)
        return plan


def _replan(
    plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, stats: bool, causal: bool, scale: Any
) -> Plan:
    """A plan made afresh for ``plan``'s call shape (after its graph raised)."""
    assert plan.spec is not None
    fresh = RUNTIME._plan_for(Derived(plan.spec, plan.copies, None, plan.expanded), q.device)
    return aten_plan(fresh, q, k, v, stats, causal, scale)


def _count(plan: Plan, q: Any, k: Any, v: Any, causal: bool, scale: Any, stats: bool) -> None:
    if RELAY.depth:  # a call the sdpa door gave to torch is decided here (doors.py)
        RELAY.taken = True
    RUNTIME.count(plan, "aten")
    _note(plan, q, k, v, causal, scale, stats)


def _note(plan: Plan, q: Any, k: Any, v: Any, causal: bool, scale: Any, stats: bool) -> None:
    for recorder in list(RUNTIME.recorders):
        found, wide = _recorded(plan, recorder.dtype, q, k, v, causal, scale)
        if getattr(recorder, "training", False) and not isinstance(found, tuple):
            recorder.count_training(found, stats, wide)  # record --backward: its backward spec too
        else:
            recorder.count(
                found.replace(generate_stats=True) if stats and not isinstance(found, tuple) else found, wide
            )


def _recorded(plan: Plan, dtype: str | None, q: Any, k: Any, v: Any, causal: bool, scale: Any) -> tuple[Any, Any]:
    """What a recorder notes of an aten call: the forward spec of the call
    (in the recorder's dtype, where it records one; the caller adds the
    stats the door asks for) and the layouts a larger call has (``Derived.wide``),
    or ((reason, message), None)."""
    if plan.reason in _REFUSED:
        return (plan.reason, plan.message), None
    try:
        derived = derive(q, k, v, is_causal=causal, scale=scale, enable_gqa=True, dtype=dtype)
    except UnsupportedCall as exc:
        return (exc.reason, str(exc)), None
    return derived.spec, derived.wide


def _torch_forward(
    plan: Plan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Any,
    stats: bool,
    dropout_p: float,
    causal: bool,
    debug: bool,
    scale: Any,
) -> tuple[Any, ...]:
    """PyTorch's own kernel for a call the door does not serve, counted under ``plan``'s reason."""
    if q.device.type == "cuda":
        result = _cudnn_forward(q, k, v, bias, stats, dropout_p, causal, debug, scale=scale)
        _count(plan, q, k, v, causal, scale, stats)
        return tuple(result)
    out, lse = aten_math.forward(q, k, v, bias, dropout_p, causal, scale)
    _count(plan, q, k, v, causal, scale, stats)
    # The meta kernel's strides, read per call: a call torch's math serves is no hit.
    meta = meta_outputs(q, k, v, stats, causal, scale)[0]
    if out.stride() != meta.stride():
        out = restrided(out, tuple(meta.shape), tuple(meta.stride()))
    philox = template(q.device, torch.int64)
    return (out, lse, None, None, q.shape[2], k.shape[2], torch.empty_like(philox), torch.empty_like(philox), None)


def _like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``t`` with ``ref``'s strides (the backward's meta kernel: ``empty_like``)."""
    if t.stride() == ref.stride() or t.shape != ref.shape:
        return t
    return torch.empty_like(ref).copy_(t)


# -- the backward ---------------------------------------------------------------------------


def _autograd_dispatch() -> Any:
    """A guard that gives autograd's dispatch keys back for its block. The
    backward op's autograd kernel calls this kernel with them excluded (below
    autograd), and a backward graph that computes with autograd (the
    reference compiler's, the torch fallback's) needs them; grad mode stays
    as the engine set it (off, unless create_graph)."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor, keys.ADInplaceOrView):
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _backward_refusal(attn_bias: Any, dropout_p: float, cum_seq_q: Any) -> tuple[str, str]:
    """Why a backward call goes to torch before graphcache is asked ('' where it may serve)."""
    if attn_bias is not None:
        return "attn_bias", "an attn_bias: its gradient is the op's own (PyTorch's kernel)"
    if dropout_p:
        return "dropout", "dropout_p > 0: its random stream is PyTorch's kernel's"
    if cum_seq_q is not None:
        return "ragged", "cum_seq_q: a ragged backward is PyTorch's kernel's"
    if capturing():  # the backward graphs' lookup is not known to be capture-safe: torch's kernel
        return "capture", "a CUDA stream is capturing: nothing is loaded or built now"
    return "", ""
