"""The input checks: whether the tensors of a call are what a spec's graph
takes (shape, dtype, device, packed layout), with an ExecutionError naming
the argument, what it is and what the spec needs. ``check_inputs`` is a
dense graph's ``execute`` (cuDNN's and the torch fallback's alike),
``check_call`` a thd graph's call with ``varlen_attn``'s arguments.

Only shapes, strides, dtypes and devices are read, never a tensor's values
on the host: a call on a GPU never waits for the GPU here
(tests/test_varlen_args.py makes ``.item()``/``.tolist()``/``bool()`` raise).
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import ExecutionError
from graphcache.reference.dense import bias_dtype, torch_dtype
from graphcache.spec import GraphSpec
from graphcache.spec import layouts as spec_layouts


def check_inputs(
    spec: GraphSpec,
    tensors: dict[str, Any],
    device_type: str | None = None,
) -> None:
    """Raise ExecutionError unless every tensor has the spec's shape, dtype,
    device and a packed layout. ``tensors`` maps roles to tensors (None = absent)."""
    import torch

    if spec.layout == "thd":
        raise ExecutionError(
            f"{spec.summary()} is a ragged/paged graph: run it with run_varlen(q, k, v, cu_seq_q, cu_seq_k, "
            "seqused_k, block_table), as graphcache.torch.varlen_attn does, not execute()"
        )
    want_dtype = torch_dtype(spec)
    device = None
    for role in ("q", "k", "v", "o"):
        t = tensors.get(role)
        if t is None:
            if role == "o":
                continue
            raise ExecutionError(f"{role} is missing")
        _check_tensor(spec, role, t, spec.storage_shape(role), want_dtype, spec_layouts.storage_strides(spec, role))
        if device is None:
            device = t.device
        elif t.device != device:
            raise ExecutionError(f"{role} is on {t.device} but q is on {device}: put all on one device")
    assert device is not None
    if device_type is not None and device.type != device_type:
        raise ExecutionError(f"q is on {device}; this graph runs on {device_type}: move the tensors")
    for role in ("seq_len_q", "seq_len_kv"):
        t = tensors.get(role)
        if spec.padding and t is None:
            raise ExecutionError(
                f"{role} is missing: the spec has padding=true, pass {role} (int32, ({spec.batch}, 1, 1, 1))"
            )
        if not spec.padding and t is not None:
            raise ExecutionError(f"{role} was given but the spec has padding=false")
        if t is not None:
            _check_tensor(spec, role, t, (spec.batch, 1, 1, 1), torch.int32)
            if t.device != device:
                raise ExecutionError(f"{role} is on {t.device} but q is on {device}")
    bias = tensors.get("bias")
    if (bias is None) != (spec.bias is None):
        raise ExecutionError(
            f"bias is missing: the spec has bias={spec.bias}, pass its {spec.dims('bias')} tensor ({bias_dtype(spec)})"
            if bias is None
            else "bias was given but the spec has no bias"
        )
    if bias is not None:
        _check_tensor(spec, "bias", bias, spec.dims("bias"), bias_dtype(spec))
        if bias.device != device:
            raise ExecutionError(f"bias is on {bias.device} but q is on {device}")


def check_sink(spec: GraphSpec, sink: Any, q: Any) -> None:
    """Raise ExecutionError unless ``sink`` is what the spec takes: a sink
    spec's contiguous float32 (1, h_q, 1, 1) logits on q's device, else None."""
    import torch

    if (sink is None) != (not spec.sinks):
        raise ExecutionError(
            f"sink is missing: the spec has sinks=true, pass its float32 {spec.dims('sink')} logits"
            if sink is None
            else "sink was given but the spec has sinks=false"
        )
    if sink is not None:
        _check_tensor(spec, "sink", sink, spec.dims("sink"), torch.float32)
        if sink.device != q.device:
            raise ExecutionError(f"sink is on {sink.device} but q is on {q.device}")


def _check_tensor(
    spec: GraphSpec, role: str, t: Any, shape: tuple[int, ...], dtype: Any, strides: tuple[int, ...] | None = None
) -> None:
    """``strides``: those of q, k, v or o in its layout (dims of size 1 aside,
    as torch's contiguity ignores them); None: contiguous."""
    if tuple(t.shape) != tuple(shape):
        raise ExecutionError(f"{role} has shape {tuple(t.shape)}; the spec ({spec.summary()}) needs {tuple(shape)}")
    if t.dtype != dtype:
        raise ExecutionError(f"{role} is {t.dtype}; the spec needs {dtype}")
    if strides is None:
        packed = t.is_contiguous()
    else:
        packed = all(n == 1 or s == want for n, s, want in zip(t.shape, t.stride(), strides, strict=True))
    if not packed:
        layout = spec_layouts.of(spec, role) if role in spec_layouts.ROLES else "packed"
        raise ExecutionError(
            f"{role} has strides {tuple(t.stride())}; pass it in the spec's layout {layout}, storage shape "
            f"{tuple(shape)}"
            + ("" if strides is None else f" and strides {tuple(strides)}")
            + " (.contiguous() where packed)"
        )


check_tensor = _check_tensor  # one tensor's shape, dtype and packing (the class graphs' checks)

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
    if n < 1 or n > spec.batch:
        raise ExecutionError(f"cu_seq_q holds {n} sequences; {spec.summary()} serves 1 to {spec.batch}")
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
