"""Ragged (thd) and paged-KV SDPA graphs: what a target needs for them,
how they are declared, and one call's variant pack.

Declared as notes/ragged-paged.md Q1-Q2 and Q6 map varlen_attn onto cuDNN:
q, k, v, o are (b, h, s_max, d) with token-major strides and a ragged offset
each ((b+1, 1, 1, 1) int64 element offsets); the padding mask with
``seq_len_q``/``seq_len_kv`` (b, 1, 1, 1) int32 says where each sequence
ends. Paged K/V are the pools (num_pages, h_kv, page_size, d) with NHD
strides, read through ``page_table_k``/``page_table_v`` (b, 1, pages, 1)
int32 and ``paged_attention_max_seq_len_kv = seq_kv``; q (and o) stay
ragged: chunked prefill and decode over the cache are one graph kind.
Stats, when asked for, are ragged too, (b, h, s, 1) token-major, which is
varlen_attn's lse transposed. Every descriptor is the one
``graphcache.spec.ragged.descriptors`` lists (the key covers them).

May import: releases; graphcache.spec/spec_ragged/uids/errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.compilers.cudnn.releases import PAGED, RAGGED, RAGGED_OVER_PAGED, ZERO_LENGTH, available, missing
from graphcache.errors import UnsupportedSpec
from graphcache.spec import GraphSpec
from graphcache.spec import ragged as spec_ragged
from graphcache.spec.uids import UidMap

_IO_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
_INDEX_TYPES = {"int32": "INT32", "int64": "INT64", "float32": "FLOAT"}


def features(spec: GraphSpec) -> tuple[str, ...]:
    """The release-table features a thd spec's graph needs."""
    if spec.page_size is not None:
        return (PAGED, RAGGED_OVER_PAGED)
    return (RAGGED,)


def check_target(spec: GraphSpec, frontend: Any, cudnn: Any, cc: Any) -> None:
    """Raise UnsupportedSpec (a negative entry for the target) naming what
    the spec needs where this frontend, cuDNN or GPU lacks it: paged needs
    cuDNN >= 9.5, ragged q over pages >= 9.7, ragged on SM80/SM89 >= 9.18.1
    (``releases``, the one table)."""
    for name in features(spec):
        why = missing(name, frontend, cudnn, cc)
        if why is not None:
            raise UnsupportedSpec(f"{spec.summary()}: {why}", step="preflight")


def declare(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap,
    handle: Any,
    mask_kwargs: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """A fresh ``pygraph`` holding the thd spec's SDPA node, and its tensors
    by role (every role of ``spec_ragged.roles``), each with its UID."""
    dt = cudnn.data_type
    io_type = getattr(dt, _IO_TYPES[spec.dtype])
    uids = uids.for_spec(spec)
    graph_kwargs: dict[str, Any] = {
        "io_data_type": io_type,
        "intermediate_data_type": dt.FLOAT,
        "compute_data_type": dt.FLOAT,
    }
    if handle is not None:
        graph_kwargs["handle"] = handle
    graph = cudnn.pygraph(**graph_kwargs)
    described = spec_ragged.descriptors(spec)
    tensors: dict[str, Any] = {}

    def add(role: str) -> Any:
        dims, strides, dtype = described[role]
        data_type = io_type if dtype == spec.dtype else getattr(dt, _INDEX_TYPES[dtype])
        t = graph.tensor(name=role, dim=list(dims), stride=list(strides), data_type=data_type)
        t.set_uid(uids[role])
        tensors[role] = t
        return t

    q, k, v = add("q"), add("k"), add("v")
    q.set_ragged_offset(add("ragged_q"))
    kwargs: dict[str, Any] = {
        "attn_scale": spec.attn_scale,
        "use_padding_mask": True,
        "seq_len_q": add("seq_len_q"),
        "seq_len_kv": add("seq_len_kv"),
        **mask_kwargs,
    }
    if spec.page_size is not None:
        kwargs["paged_attention_k_table"] = add("page_table_k")
        kwargs["paged_attention_v_table"] = add("page_table_v")
        kwargs["paged_attention_max_seq_len_kv"] = spec.seq_kv
    else:
        k.set_ragged_offset(add("ragged_k"))
        v.set_ragged_offset(add("ragged_v"))
    o, stats = graph.sdpa(name="sdpa", q=q, k=k, v=v, **kwargs)
    dims, strides, _ = described["o"]
    o.set_output(True).set_dim(list(dims)).set_stride(list(strides))
    o.set_uid(uids["o"])
    o.set_ragged_offset(add("ragged_o"))
    tensors["o"] = o
    if spec.generate_stats:
        if stats is None:
            raise UnsupportedSpec("the frontend returned no stats tensor for generate_stats=true")
        dims, strides, _ = described["stats"]
        stats.set_output(True).set_data_type(dt.FLOAT).set_dim(list(dims)).set_stride(list(strides))
        stats.set_uid(uids["stats"])
        stats.set_ragged_offset(add("ragged_stats"))
        tensors["stats"] = stats
    return graph, tensors


def variant_pack(
    spec: GraphSpec,
    uids: UidMap,
    q: Any,
    k: Any,
    v: Any,
    cu_seq_q: Any,
    cu_seq_k: Any,
    seqused_k: Any = None,
    block_table: Any = None,
    *,
    zero_length: bool = True,
) -> tuple[dict[int, Any], Any, Any]:
    """One call's UID -> tensor pack, its output (T_q, H_q, D_v) and its
    stats buffer (T_q, H_q) float32 or None. Device arithmetic only
    (``varlen_args.graph_inputs``): no host synchronisation. Without
    ``zero_length`` (cuDNN < 9.25: ``zero_length_ok``) a call of fewer
    sequences than the graph's batch is padded with 1-token dummies, whose
    output rows, past the call's, are dropped here."""
    import torch

    from graphcache.compilers.varlen_args import graph_inputs

    uids = uids.for_spec(spec)
    assert spec.head_dim_v is not None
    rows = q.shape[0]
    extra = 0 if zero_length else max(spec.batch - (int(cu_seq_q.shape[0]) - 1), 0)  # the dummies' output rows
    full = torch.empty((rows + extra, spec.heads_q, spec.head_dim_v), dtype=q.dtype, device=q.device)
    pack = {uids["q"]: q, uids["k"]: k, uids["v"]: v, uids["o"]: full}
    inputs = graph_inputs(spec, cu_seq_q, cu_seq_k, seqused_k, block_table, zero_length=zero_length, rows=rows)
    for role, t in inputs.items():
        pack[uids[role]] = t
    stats = None
    if spec.generate_stats:
        # Token-major, as the ragged stats descriptor strides it; one spare
        # row so an empty call still hands cuDNN a valid pointer.
        stats = torch.empty((rows + extra + 1, spec.heads_q), dtype=torch.float32, device=q.device)
        pack[uids["stats"]] = stats
    return pack, full[:rows], stats


def zero_length_ok(cudnn: str | int) -> bool:
    """Whether this cuDNN takes zero-length sequences (the ZERO_LENGTH row)."""
    return available(ZERO_LENGTH, cudnn=cudnn)
