"""Declaring a spec's SDPA graph in the frontend: tensors, mask keywords,
additive bias, sink logits, padding, dropout, outputs; for a backward spec
(``kind="backward"``) ``sdpa_backward`` with the forward's o and stats and
the output gradient dO as inputs, dQ, dK and dV as outputs.

This is where execute-time shape overrides, ragged offsets and page tables
are declared. Nothing here lowers the graph: ``build.py`` runs the steps.

May import: graphcache.spec, graphcache.spec.uids, graphcache.errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import UnsupportedSpec
from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap

_IO_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16"}
# The dialects' stats keywords: sdpa()'s, which sdpa_backward() does not take (it reads the stats).
_STATS_KEYWORDS = ("generate_stats", "is_inference")


def declare(
    cudnn: Any,
    spec: GraphSpec,
    uids: UidMap,
    handle: Any,
    mask_kwargs: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """A fresh ``pygraph`` holding the spec's SDPA node, and its tensors by
    role (inputs, ``o`` and, with ``generate_stats``, ``stats``; a backward
    spec's ``dQ``, ``dK`` and ``dV``), each with the UID ``uids`` gives it. Raises UnsupportedSpec when the frontend returns no
    stats tensor for a spec that asks for one; whatever the frontend raises
    (a refused keyword's TypeError included) passes through."""
    if spec.layout == "thd":  # ragged offsets and page tables: their own declaration
        from graphcache.compilers.cudnn import ragged

        return ragged.declare(cudnn, spec, uids, handle, mask_kwargs)
    uids = uids.for_spec(spec)  # a bias spec's map holds the bias role, a sink spec's the sink role
    dt = cudnn.data_type
    io_type = getattr(dt, _IO_TYPES[spec.dtype])
    graph_kwargs: dict[str, Any] = {
        "io_data_type": io_type,
        "intermediate_data_type": dt.FLOAT,
        "compute_data_type": dt.FLOAT,
    }
    if handle is not None:
        graph_kwargs["handle"] = handle
    if spec.is_class and spec.mechanism is None:  # declared at the class's maxima, run at real shapes (override.py)
        graph_kwargs["is_override_shape_enabled"] = True  # a padded class (padded.py): the maxima, no override
    graph = cudnn.pygraph(**graph_kwargs)
    tensors: dict[str, Any] = {}

    def add(role: str, dims: tuple[int, ...], strides: tuple[int, ...], data_type: Any) -> Any:
        t = graph.tensor(name=role, dim=list(dims), stride=list(strides), data_type=data_type)
        t.set_uid(uids[role])
        tensors[role] = t
        return t

    for role in ("q", "k", "v"):
        add(role, spec.dims(role), spec.strides(role), io_type)
    if spec.kind == "backward":  # what the forward left, and the gradient of its output
        for role in ("o", "dO"):
            add(role, spec.dims(role), spec.strides(role), io_type)
        add("stats", spec.dims("stats"), spec.strides("stats"), dt.FLOAT)
        mask_kwargs = {k: v for k, v in mask_kwargs.items() if k not in _STATS_KEYWORDS}
    kwargs: dict[str, Any] = {"attn_scale": spec.attn_scale, **mask_kwargs}
    if spec.bias is not None:  # additive, packed, in the io dtype or float32; broadcast dims are 1 (spec_bias)
        bias_type = dt.FLOAT if spec.bias_dtype == "float32" else io_type
        kwargs["bias"] = add("bias", spec.dims("bias"), spec.strides("bias"), bias_type)
    if spec.sinks:  # per-head sink logits: float32 (1, h_q, 1, 1), what the frontend's analyzer asks
        kwargs["sink_token"] = add("sink", spec.dims("sink"), spec.strides("sink"), dt.FLOAT)
    # A class graph always masks past the real lengths: overrides off the
    # 64-row tile without a padding mask gave wrong output (cudnn-frontend#1148).
    if spec.padding or spec.is_class:
        kwargs["use_padding_mask"] = True
        for role in ("seq_len_q", "seq_len_kv"):
            kwargs[role] = add(role, spec.dims(role), spec.strides(role), dt.INT32)
    if spec.dropout:
        seed = add("dropout_seed", (1, 1, 1, 1), (1, 1, 1, 1), dt.INT64)
        offset = add("dropout_offset", (1, 1, 1, 1), (1, 1, 1, 1), dt.INT64)
        kwargs["dropout"] = (spec.dropout, seed, offset)
    if spec.kind == "backward":
        inputs = {"q": tensors["q"], "k": tensors["k"], "v": tensors["v"], "o": tensors["o"], "dO": tensors["dO"]}
        grads = graph.sdpa_backward(name="sdpa_backward", stats=tensors["stats"], **inputs, **kwargs)
        for role, t in zip(("dQ", "dK", "dV"), grads, strict=True):
            t.set_output(True).set_dim(list(spec.dims(role))).set_stride(list(spec.strides(role)))
            t.set_data_type(io_type)
            t.set_uid(uids[role])
            tensors[role] = t
        return graph, tensors
    o, stats = graph.sdpa(name="sdpa", q=tensors["q"], k=tensors["k"], v=tensors["v"], **kwargs)
    o.set_output(True).set_dim(list(spec.dims("o"))).set_stride(list(spec.strides("o")))
    o.set_uid(uids["o"])
    tensors["o"] = o
    if spec.generate_stats:
        if stats is None:
            raise UnsupportedSpec("the frontend returned no stats tensor for generate_stats=true")
        stats.set_output(True).set_data_type(dt.FLOAT)
        stats.set_dim(list(spec.dims("stats"))).set_stride(list(spec.strides("stats")))
        stats.set_uid(uids["stats"])
        tensors["stats"] = stats
    return graph, tensors
