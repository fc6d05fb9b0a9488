"""A spec's short human form (``GraphSpec.summary``): ``b1 h32/8 s4096 d128
bf16 bshd causal``, each part from the module that owns its field.

May import: the spec's field modules (layouts, ragged, bias, sinks, backward, mechanism).
"""

from __future__ import annotations

from typing import Any

from graphcache.spec import backward as spec_backward
from graphcache.spec import bias as spec_bias
from graphcache.spec import layouts as spec_layouts
from graphcache.spec import mechanism as spec_mechanism
from graphcache.spec import ragged as spec_ragged
from graphcache.spec import sinks as spec_sinks

_SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16"}


def summary(spec: Any) -> str:
    """A short human form, e.g. ``b1 h32/8 s4096 d128 bf16 bshd causal``."""
    heads = f"h{spec.heads_q}" + (f"/{spec.heads_kv}" if spec.heads_kv != spec.heads_q else "")
    seq = f"s{spec.seq_q}" + (f"/{spec.seq_kv}" if spec.seq_kv != spec.seq_q else "")
    dim = f"d{spec.head_dim}" + (f"/{spec.head_dim_v}" if spec.head_dim_v != spec.head_dim else "")
    mask = spec.mask
    if mask == "sliding_window":
        mask = f"window({spec.window_left},{spec.window_right})"
    elif mask == "sliding_window_bottom_right":
        mask = spec_ragged.mask_text(spec)
    parts = [f"b{spec.batch}", heads, seq, dim, _SHORT_DTYPE[spec.dtype], *spec_layouts.summary_part(spec), mask]
    parts += spec_ragged.summary_parts(spec)
    parts += spec_bias.summary_part(spec) + spec_sinks.summary_part(spec) + spec_backward.summary_part(spec)
    if spec.padding:
        parts.append("padded")
    if spec.generate_stats:
        parts.append("stats")
    if spec.dropout:
        parts.append(f"dropout{spec.dropout:g}")
    if spec.is_class:
        parts.append(spec_mechanism.class_part(spec))
    return " ".join(parts)
