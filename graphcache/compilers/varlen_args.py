"""A ragged / paged graph's per-call inputs, computed on the device from
``varlen_attn``'s arguments, and the checks of those arguments against a
spec.

Nothing here reads a tensor's values on the host (no ``.item()``, no
``.tolist()``, no comparison turned into a Python bool): only shapes,
strides, dtypes and devices, which torch keeps on the host. So a call on a
GPU never waits for the GPU here; tests/test_varlen_args.py checks that by
making ``.item()``/``.tolist()``/``bool()`` raise.

A graph declared for ``batch`` sequences serves a call of ``n <= batch``
(a length class): the offsets repeat their last value and the sequence
lengths are 0 for the ``batch - n`` missing sequences, which the padding
mask then skips (cudnn-frontend's test_sdpa_with_caching pads batches so).
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import ExecutionError
from graphcache.spec import GraphSpec

_INDEX_DTYPES = ("torch.int32", "torch.int64")


def check_call(
    spec: GraphSpec,
    q: Any,
    k: Any,
    v: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    seqused_k: Any = None,
    block_table: Any = None,
) -> int:
    """The number of sequences ``n`` of a call the thd spec's graph serves.

    Raises ExecutionError naming the argument, what it is and what the spec
    (its summary) needs: shapes, dtypes, devices, the table width, the pool.
    """
    from graphcache.compilers.torch_sdpa import torch_dtype

    want = torch_dtype(spec)
    assert spec.heads_kv is not None and spec.head_dim_v is not None
    paged = spec.page_size is not None
    shapes: dict[str, tuple[Any, ...]] = {"query": (None, spec.heads_q, spec.head_dim)}
    if paged:
        shapes["key"] = (spec.num_pages, spec.page_size, spec.heads_kv, spec.head_dim)
        shapes["value"] = (spec.num_pages, spec.page_size, spec.heads_kv, spec.head_dim_v)
    else:
        shapes["key"] = (None, spec.heads_kv, spec.head_dim)
        shapes["value"] = (None, spec.heads_kv, spec.head_dim_v)
    device = q.device
    for name, t in (("query", q), ("key", k), ("value", v)):
        need = shapes[name]
        if t.dim() != len(need) or any(w is not None and w != s for w, s in zip(need, t.shape, strict=True)):
            form = tuple("T" if w is None else w for w in need)
            raise ExecutionError(f"{name} has shape {tuple(t.shape)}; {spec.summary()} takes {form}")
        if t.dtype != want:
            raise ExecutionError(f"{name} is {t.dtype}; {spec.summary()} takes {want}")
        if t.stride(-1) != 1 or t.stride(-2) != t.shape[-1] or t.stride(-3) != t.shape[-1] * t.shape[-2]:
            raise ExecutionError(
                f"{name} has strides {tuple(t.stride())}: ragged graphs take token-major tensors with packed "
                "heads (call .contiguous())"
            )
        if paged and name != "query" and t.stride(0) != t.shape[1] * t.shape[2] * t.shape[3]:
            raise ExecutionError(f"{name} has strides {tuple(t.stride())}: the page pool must be contiguous")
        if t.device != device:
            raise ExecutionError(f"{name} is on {t.device} but query is on {device}: put all on one device")
    n = _check_index("cu_seq_q", cu_seq_q, device) - 1
    if n < 1 or n > spec.batch or (not spec.is_class and n != spec.batch):
        limit = f"at most {spec.batch}" if spec.is_class else f"exactly {spec.batch}"
        raise ExecutionError(f"cu_seq_q holds {n} sequences; {spec.summary()} serves {limit}")
    if paged:
        if block_table is None or seqused_k is None:
            raise ExecutionError(f"{spec.summary()} is paged: pass block_table and seqused_k")
        if block_table.dim() != 2 or tuple(block_table.shape) != (n, spec.pages_per_seq):
            raise ExecutionError(
                f"block_table has shape {tuple(block_table.shape)}; {spec.summary()} takes ({n}, "
                f"{spec.pages_per_seq}): the table width is part of the graph"
            )
        if str(block_table.dtype) != "torch.int32" or block_table.device != device:
            raise ExecutionError(
                f"block_table must be int32 on {device}, not {block_table.dtype} on {block_table.device}"
            )
    else:
        if block_table is not None:
            raise ExecutionError(f"block_table was given but {spec.summary()} is not paged")
        if cu_seq_k is None or _check_index("cu_seq_k", cu_seq_k, device) != n + 1:
            raise ExecutionError(f"cu_seq_k must hold {n + 1} offsets, as cu_seq_q does")
    if seqused_k is not None and _check_index("seqused_k", seqused_k, device) != n:
        raise ExecutionError(f"seqused_k must hold {n} lengths, one per sequence")
    return n


def _check_index(name: str, t: Any, device: Any) -> int:
    if t.dim() != 1 or str(t.dtype) not in _INDEX_DTYPES or t.device != device:
        raise ExecutionError(f"{name} must be a 1-D int32 or int64 tensor on {device}, not {tuple(t.shape)} {t.dtype}")
    return int(t.shape[0])


def graph_inputs(
    spec: GraphSpec,
    cu_seq_q: Any,
    cu_seq_k: Any,
    seqused_k: Any = None,
    block_table: Any = None,
) -> dict[str, Any]:
    """The graph's index tensors by role, on the arguments' device, with
    the dims, strides and dtypes ``spec_ragged.descriptors`` declares:
    ``seq_len_q``/``seq_len_kv`` (int32), ``ragged_*`` element offsets
    (int64) and, for a paged spec, ``page_table_k``/``page_table_v`` (the
    same int32 buffer). Device arithmetic only: no host synchronisation."""
    import torch

    assert spec.heads_kv is not None and spec.head_dim_v is not None
    b = spec.batch
    n = int(cu_seq_q.shape[0]) - 1
    pad = b - n
    cq = _padded_offsets(cu_seq_q, pad)
    out: dict[str, Any] = {
        "seq_len_q": (cq[1:] - cq[:-1]).to(torch.int32).view(b, 1, 1, 1),
        "ragged_q": (cq * (spec.heads_q * spec.head_dim)).view(b + 1, 1, 1, 1),
        "ragged_o": (cq * (spec.heads_q * spec.head_dim_v)).view(b + 1, 1, 1, 1),
    }
    if spec.generate_stats:
        out["ragged_stats"] = (cq * spec.heads_q).view(b + 1, 1, 1, 1)
    if spec.page_size is not None:
        assert spec.pages_per_seq is not None
        table = block_table
        if pad:
            table = torch.cat([table, table.new_zeros((pad, spec.pages_per_seq))])
        table = table.contiguous().view(b, 1, spec.pages_per_seq, 1)
        out["page_table_k"] = out["page_table_v"] = table
        used = seqused_k.to(torch.int32)
    else:
        ck = _padded_offsets(cu_seq_k, pad)
        out["ragged_k"] = (ck * (spec.heads_kv * spec.head_dim)).view(b + 1, 1, 1, 1)
        out["ragged_v"] = (ck * (spec.heads_kv * spec.head_dim_v)).view(b + 1, 1, 1, 1)
        used = (ck[1:] - ck[:-1]).to(torch.int32)[:n] if seqused_k is None else seqused_k.to(torch.int32)
    if pad:
        used = torch.cat([used, used.new_zeros(pad)])
    out["seq_len_kv"] = used.contiguous().view(b, 1, 1, 1)
    return out


def _padded_offsets(cu: Any, pad: int) -> Any:
    """``cu`` as int64, its last offset repeated ``pad`` more times."""
    import torch

    c = cu.to(torch.int64)
    if pad:
        c = torch.cat([c, c[-1:].expand(pad)])
    return c
