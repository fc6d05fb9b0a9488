"""PyTorch's math for the aten door on a CPU, where torch has no kernel for
``aten::_scaled_dot_product_cudnn_attention`` or its backward: what a call
the door does not serve runs there (on CUDA, the C++ worker ops do).

In float32, as torch's math SDPA computes: the scaled scores, a top-left
causal mask, an additive ``attn_bias``, logsumexp over the keys (natural
log, (b, h, s_q, 1): cuDNN's stats, the op's logsumexp) and the softmax's
gradient. Key and value heads repeat over their query-head groups (GQA) and
their gradients are summed back. Dropout has no such kernel here: its random
stream would have to be the backward's too, so it raises.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _group(q: torch.Tensor, kv: torch.Tensor) -> int:
    """Query heads per key/value head (1 for a call with no heads: an empty one)."""
    return q.shape[1] // kv.shape[1] if kv.shape[1] else 1


def _scores(q: torch.Tensor, k: torch.Tensor, bias: Any, causal: bool, scale: Any) -> tuple[torch.Tensor, float]:
    group = _group(q, k)
    kf = k.float().repeat_interleave(group, dim=1) if group > 1 else k.float()
    # torch's default scale in double: a head dim of 0 (an empty call) scales by inf, not ZeroDivisionError
    factor = scale if scale is not None else (1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else math.inf)
    scores = (q.float() @ kf.transpose(-2, -1)) * factor
    if causal:
        s_q, s_kv = q.shape[2], k.shape[2]
        allowed = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    if bias is not None:
        scores = scores + bias.float()
    return scores, factor


def _no_dropout(dropout_p: float) -> None:
    if dropout_p:
        raise NotImplementedError(
            "aten::_scaled_dot_product_cudnn_attention with dropout_p > 0 on a CPU: torch has no CPU kernel for it, "
            "and graphcache's math cannot replay the forward's dropout in the backward; call it with dropout_p=0"
        )


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: Any, dropout_p: float, causal: bool, scale: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out in q's dtype (b, h, s_q, d_v), logsumexp float32 (b, h, s_q, 1))``."""
    _no_dropout(dropout_p)
    scores, _ = _scores(q, k, bias, causal, scale)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)
    group = _group(q, v)
    vf = v.float().repeat_interleave(group, dim=1) if group > 1 else v.float()
    out = torch.exp(scores - lse) @ vf
    return out.to(q.dtype), lse


def backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: Any,
    dropout_p: float,
    causal: bool,
    scale: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` in the inputs' dtypes, recomputing the softmax."""
    _no_dropout(dropout_p)
    scores, factor = _scores(q, k, bias, causal, scale)
    p = torch.softmax(scores, dim=-1)
    b, h_q, _, _ = q.shape
    h_kv = k.shape[1]
    group = _group(q, k)
    vf = v.float().repeat_interleave(group, dim=1) if group > 1 else v.float()
    kf = k.float().repeat_interleave(group, dim=1) if group > 1 else k.float()
    do = grad_out.float()
    dv = p.transpose(-2, -1) @ do
    dp = do @ vf.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = (ds @ kf) * factor
    dk = (ds.transpose(-2, -1) @ q.float()) * factor
    if group > 1:  # each key/value head's gradient is its query heads' sum
        dk = dk.view(b, h_kv, group, *dk.shape[2:]).sum(dim=2)
        dv = dv.view(b, h_kv, group, *dv.shape[2:]).sum(dim=2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
