"""The float32 reference for ragged (THD) and paged-KV attention, with
flash-attention's semantics, as ``torch.nn.attention.varlen.varlen_attn``
means them.

Per sequence ``b`` with ``lq`` query and ``lk`` key tokens, query ``i`` sees
key ``j < lk`` when ``i + lk - lq - left <= j <= i + lk - lq + right``: the
window is aligned to the bottom right of each sequence (a chunk of new
queries over a cached prefix sees the prefix); a negative bound is
unbounded, so ``(-1, -1)`` is full attention, ``(-1, 0)`` causal and
``(W, 0)`` causal within W keys to the left. ``lk`` is ``seqused_k[b]``
where given, else ``cu_seq_k[b+1] - cu_seq_k[b]``. With ``block_table`` the
keys and values are a pool of pages (``(num_pages, page_size, heads_kv,
head_dim)``) and sequence ``b``'s key ``j`` is
``pool[block_table[b, j // page_size], j % page_size]``.

A row that sees no key (a sequence of 0 keys, a window past the keys) has
output 0 and log-sum-exp +inf, as flash-attention writes them.

This is the reference: it reads lengths on the host, a sequence at a time.
It is never the hot path of a cached graph on a GPU.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import ExecutionError
from graphcache.reference.checks import check_call
from graphcache.spec.ragged import window as spec_window  # the window a thd spec's mask means

# Bytes of float32 scores held at once (per sequence, a group of heads).
REFERENCE_BUDGET = 1 << 28


def allowed(lq: int, lk: int, window: tuple[int, int], device: Any = None) -> Any:
    """Boolean (lq, lk): True where query i of one sequence may attend key j."""
    import torch

    left, right = window
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    diagonal = i + (lk - lq)
    keep = torch.ones((lq, lk), dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= diagonal - left
    if right >= 0:
        keep &= j <= diagonal + right
    return keep


def lengths(cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None) -> tuple[list[int], list[int], list[int], list[int]]:
    """Host lists: query starts, query lengths, key starts (0 where
    ``cu_seq_k`` is None) and key lengths per sequence."""
    cq = [int(x) for x in cu_seq_q.reshape(-1).tolist()]
    n = len(cq) - 1
    starts_q = cq[:-1]
    lens_q = [cq[b + 1] - cq[b] for b in range(n)]
    if cu_seq_k is not None:
        ck = [int(x) for x in cu_seq_k.reshape(-1).tolist()]
        starts_k = ck[:-1]
        lens_k = [ck[b + 1] - ck[b] for b in range(n)]
    else:
        starts_k = [0] * n
        lens_k = [0] * n
    if seqused_k is not None:
        lens_k = [int(x) for x in seqused_k.reshape(-1).tolist()]
    return starts_q, lens_q, starts_k, lens_k


def sequence_kv(k: Any, v: Any, b: int, start: int, lk: int, block_table: Any = None) -> tuple[Any, Any]:
    """Sequence ``b``'s (lk, heads_kv, d) keys and values, gathered from the
    pages its block table names when ``block_table`` is given."""
    if block_table is None:
        return k[start : start + lk], v[start : start + lk]
    page = k.shape[1]
    pages = block_table[b, : -(-lk // page)].long()
    kk = k.index_select(0, pages).reshape(-1, k.shape[2], k.shape[3])[:lk]
    vv = v.index_select(0, pages).reshape(-1, v.shape[2], v.shape[3])[:lk]
    return kk, vv


def varlen_reference(
    query: Any,
    key: Any,
    value: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    *,
    scale: float,
    window: tuple[int, int] = (-1, -1),
    seqused_k: Any = None,
    block_table: Any = None,
    budget: int = REFERENCE_BUDGET,
) -> tuple[Any, Any]:
    """Ragged / paged attention in float32 by plain matrix products, a
    sequence and a group of heads at a time.

    Returns ``(out, lse)``: out (T_q, H_q, D_v) float32, lse (H_q, T_q)
    float32 (torch's varlen layout). Query tokens past ``cu_seq_q[-1]`` are
    0 in out and +inf in lse; so are rows that see no key.
    """
    import torch

    heads_q = query.shape[1]
    heads_kv = key.shape[2] if block_table is not None else key.shape[1]
    group = heads_q // heads_kv if heads_kv else 1  # no heads: an empty call, nothing to compute
    total_q = query.shape[0]
    out = torch.zeros((total_q, heads_q, value.shape[-1]), dtype=torch.float32, device=query.device)
    lse = torch.full((heads_q, total_q), float("inf"), dtype=torch.float32, device=query.device)
    starts_q, lens_q, starts_k, lens_k = lengths(cu_seq_q, cu_seq_k, seqused_k)
    for b, (sq, lq, sk, lk) in enumerate(zip(starts_q, lens_q, starts_k, lens_k, strict=True)):
        if lq == 0 or lk == 0:
            continue  # out stays 0, lse +inf
        kk, vv = sequence_kv(key, value, b, sk, lk, block_table)
        keep = allowed(lq, lk, window, device=query.device)
        chunk = max(1, budget // (3 * 4 * lq * lk))
        qf = query[sq : sq + lq].float().transpose(0, 1)  # (H_q, lq, d)
        kf = kk.float().transpose(0, 1)  # (H_kv, lk, d)
        vf = vv.float().transpose(0, 1)
        for h0 in range(0, heads_q, chunk):
            heads = torch.arange(h0, min(heads_q, h0 + chunk), device=query.device)
            kv = heads // group  # the key/value head each query head reads (GQA)
            scores = torch.matmul(qf.index_select(0, heads), kf.index_select(0, kv).transpose(-1, -2)) * scale
            scores.masked_fill_(~keep, float("-inf"))
            row_lse = torch.logsumexp(scores, dim=-1)  # -inf where a row sees nothing
            # 0 where a row sees no key; a NaN or inf of the inputs stays what it makes (torch's answer)
            probs = torch.softmax(scores, dim=-1).masked_fill_(torch.isneginf(row_lse).unsqueeze(-1), 0.0)
            del scores
            out[sq : sq + lq, h0 : h0 + len(heads)] = torch.matmul(probs, vf.index_select(0, kv)).transpose(0, 1)
            lse[h0 : h0 + len(heads), sq : sq + lq] = torch.where(
                torch.isneginf(row_lse), torch.full_like(row_lse, float("inf")), row_lse
            )
    return out, lse


def defined_rows(cu_seq_q: Any, cu_seq_k: Any, window: tuple[int, int], seqused_k: Any = None, total_q: int = 0) -> Any:
    """Boolean (T_q,): the query tokens whose output is defined (inside a
    sequence and seeing at least one key). Where a row sees nothing, cuDNN
    and flash-attention need not agree; comparisons look only at these."""
    import torch

    starts_q, lens_q, _, lens_k = lengths(cu_seq_q, cu_seq_k, seqused_k)
    keep = torch.zeros(max(total_q, sum(lens_q)), dtype=torch.bool)
    for sq, lq, lk in zip(starts_q, lens_q, lens_k, strict=True):
        if lq and lk:
            keep[sq : sq + lq] = allowed(lq, lk, window).any(dim=1)
    return keep


def run_spec(
    spec: Any,
    q: Any,
    k: Any,
    v: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    seqused_k: Any = None,
    block_table: Any = None,
) -> tuple[Any, Any]:
    """A thd spec's graph run by this reference (``TorchSdpaGraph.run_varlen``, the reference
    compiler's):
    the call checked against the spec as a cuDNN graph checks it, then
    ``(out in q's dtype, lse (H_q, T_q) float32 or None without generate_stats)``.

    Raises ExecutionError for a call the spec does not serve, including a
    sequence longer than the spec's ``seq_q`` / ``seq_kv``.
    """
    check_call(spec, q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table)
    _, lens_q, _, lens_k = lengths(cu_seq_q, cu_seq_k, seqused_k)
    if max(lens_q) > spec.seq_q or max(lens_k) > spec.seq_kv or min(lens_q + lens_k) < 0:
        raise ExecutionError(
            f"sequence lengths up to {max(lens_q)} queries / {max(lens_k)} keys; {spec.summary()} serves "
            f"at most {spec.seq_q} / {spec.seq_kv}"
        )
    out, lse = varlen_reference(
        q, k, v, cu_seq_q, cu_seq_k, scale=spec.attn_scale, window=spec_window(spec),
        seqused_k=seqused_k, block_table=block_table,
    )  # fmt: skip
    return out.to(q.dtype), (lse if spec.generate_stats else None)
