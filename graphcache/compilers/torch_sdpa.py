"""torch's side of SDPA: the fallback graph, ``TorchSdpaGraph``, for
machines where cuDNN cannot serve a spec (and the reference compiler's graph).

The float32 reference, the input checks and the error measures it uses live
in ``graphcache.reference`` (which imports no compiler); the fallback shares
the reference's one definition of every mask, so a causal spec can never
come back unmasked from either. The names that lived here before are
re-exported, so ``from graphcache.compilers.torch_sdpa import reference``
keeps working; new code imports them from ``graphcache.reference``.
"""

from __future__ import annotations

import logging
from typing import Any

from graphcache.compilers.classgraph import real_spec, run_views
from graphcache.errors import NoGpu
from graphcache.reference.checks import check_inputs, check_sink
from graphcache.reference.dense import (
    REFERENCE_BUDGET,
    allowed_mask,
    compared_rows,
    from_bhsd,
    random_inputs,
    reference,
    reference_error,
    reference_errors,
    score_matrix_bytes,
    to_bhsd,
    torch_dtype,
    valid_rows,
)
from graphcache.reference.measure import TOLERANCE, relative_error, within_tolerance
from graphcache.reference.varlen import run_spec
from graphcache.spec import GraphSpec

__all__ = [
    "REFERENCE_BUDGET",
    "TOLERANCE",
    "TorchSdpaGraph",
    "allowed_mask",
    "check_inputs",
    "compared_rows",
    "from_bhsd",
    "random_inputs",
    "reference",
    "reference_error",
    "reference_errors",
    "relative_error",
    "score_matrix_bytes",
    "to_bhsd",
    "torch_dtype",
    "valid_rows",
    "within_tolerance",
]

log = logging.getLogger(__name__)


class TorchSdpaGraph:
    """The fallback: torch's scaled_dot_product_attention with the spec's
    exact semantics, for machines where cuDNN cannot serve a spec.

    Causal top-left goes through ``is_causal``; every other mask, and padding,
    through an explicit boolean mask; a bias spec's bias is the float
    ``attn_mask`` (with -inf where the spec's mask hides a key). Stats come from the float32 reference.
    For a class spec, ``execute`` takes real tensors of any shape the class
    covers (ExecutionError for one outside it), as a cuDNN class graph does.
    """

    backend = "torch"

    def __init__(self, spec: GraphSpec, reason: str = "") -> None:
        try:
            import torch  # noqa: F401 - here, so that a host without torch fails at load, not at execute
        except ImportError:
            why = f" ({reason})" if reason else ""
            raise NoGpu(
                f"cuDNN cannot serve {spec.summary()} here{why}, and the torch fallback needs torch, "
                "which is not installed: pip install 'graphcache[gpu]'"
            ) from None
        self.spec = spec
        self.reason = reason
        self.workspace_size = 0
        if reason:
            log.warning("serving %s with torch SDPA instead of cuDNN: %s", spec.summary(), reason)

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        sink: Any = None,
    ) -> Any:
        # A class graph runs at the real tensors' shape (any its class covers).
        spec = real_spec(self.spec, q, k) if self.spec.is_class else self.spec
        given = {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "bias": bias}
        check_inputs(spec, given)
        return compute(spec, q, k, v, out, seq_len_q, seq_len_kv, bias, sink)

    def run_varlen(
        self, q: Any, k: Any, v: Any, cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None, block_table: Any = None
    ) -> tuple[Any, Any]:
        """A thd (ragged / paged) spec's call with ``varlen_attn``'s tensors:
        ``(out, lse or None)`` from the float32 reference
        (``graphcache.reference.varlen.run_spec``, which says what it raises)."""
        return run_spec(self.spec, q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table)

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        """(b, h, s, d) views of tensors in the spec's layout, as torch's SDPA
        takes them (and a bias spec's packed bias); returns the output the
        same way. For specs without padding, stats or dropout; inputs are
        checked as ``execute`` checks them."""
        return run_views(self, q, k, v, bias)


def compute(
    spec: GraphSpec,
    q: Any,
    k: Any,
    v: Any,
    out: Any = None,
    seq_len_q: Any = None,
    seq_len_kv: Any = None,
    bias: Any = None,
    sink: Any = None,
) -> Any:
    """The fallback's answer for the exact ``spec`` on tensors in its
    layout's storage order (any strides: nothing is checked here; ``execute``
    is the checked path, and a padded class's stand-in hands views into its
    declared buffers)."""
    import torch

    if spec.sinks or sink is not None:  # torch's SDPA has no sinks: the float32 reference serves them
        return _with_sinks(spec, q, k, v, out, seq_len_q, seq_len_kv, bias, sink)
    qb, kb, vb = (to_bhsd(spec, t, r) for r, t in (("q", q), ("k", k), ("v", v)))
    group = spec.heads_q // (spec.heads_kv or spec.heads_q)
    if group > 1:
        kb = kb.repeat_interleave(group, dim=1)
        vb = vb.repeat_interleave(group, dim=1)
    kwargs: dict[str, Any] = {"scale": spec.attn_scale, "dropout_p": spec.dropout}
    if spec.mask == "causal" and not spec.padding and bias is None:
        kwargs["is_causal"] = True
    elif spec.mask != "none" or spec.padding:
        masks = [
            allowed_mask(
                spec,
                None if seq_len_q is None else int(seq_len_q.reshape(-1)[b]),
                None if seq_len_kv is None else int(seq_len_kv.reshape(-1)[b]),
                device=q.device,
            )
            for b in range(spec.batch)
        ]
        allowed = torch.stack(masks).unsqueeze(1)
        kwargs["attn_mask"] = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
    elif bias is not None:  # additive, in the io dtype or float32 (bias_dtype): torch adds it to the scaled scores
        kwargs["attn_mask"] = bias
    # torch's own op, not the module attribute: graphcache.torch.patch()
    # routes F.scaled_dot_product_attention back through graphcache; on a
    # GPU, not its cuDNN kernel either: install() serves that one, and a
    # call would come back here until Python's recursion limit (seen on
    # an H200, 2026-12-04: execute_failed under install()).
    with not_cudnn(q):
        result = torch._C._nn.scaled_dot_product_attention(qb, kb, vb, **kwargs)
    # Rows that see no key are 0 (the reference's answer, and torch's where its kernel writes
    # NaN there), and padded rows 0: a fill of those rows only, never nan_to_num over the output,
    # so a NaN or inf of the inputs gives what torch's SDPA gives (a model that blows up is seen to).
    blank = None if kwargs.get("attn_mask") is None else _no_key(kwargs["attn_mask"])
    if seq_len_q is not None:
        rows = torch.arange(spec.seq_q, device=q.device).view(1, 1, -1, 1)
        padded = rows >= seq_len_q.reshape(-1, 1, 1, 1)
        blank = padded if blank is None else blank | padded
    if blank is not None:
        result = result.masked_fill(blank, 0.0)
    o = from_bhsd(spec, result)
    if out is not None:
        out.copy_(o)
        o = out
    if spec.generate_stats:
        _, stats = reference(spec, q, k, v, seq_len_q, seq_len_kv, bias)
        return o, stats
    return o


def _no_key(mask: Any) -> Any:
    """(b|1, h|1, s_q, 1) True where a mask (boolean: allowed; float: an
    additive bias, -inf hiding a key) leaves a query row no key at all."""
    import torch

    seen = mask if mask.dtype == torch.bool else mask != float("-inf")
    return ~seen.any(dim=-1, keepdim=True)


def not_cudnn(q: Any) -> Any:
    """A context where torch's SDPA picks any kernel but cuDNN's, for CUDA
    inputs (a CPU call never reaches that kernel: nothing to do)."""
    import contextlib

    if not q.is_cuda:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _with_sinks(
    spec: GraphSpec, q: Any, k: Any, v: Any, out: Any, len_q: Any, len_kv: Any, bias: Any, sink: Any
) -> Any:
    """A sink spec's call through the float32 reference (cast to q's dtype)."""

    check_sink(spec, sink, q)
    ref, _ = reference(spec, q, k, v, len_q, len_kv, bias, sink=sink)
    o = ref.to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    return o
