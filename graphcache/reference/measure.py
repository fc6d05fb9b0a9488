"""How far a result is from the float32 reference: the measures and the
tolerance every check uses (the cuDNN build checks, the class check, the
ragged check, the canary) and the one rule, ``error <= tolerance``.

Imports nothing of graphcache's but the spec (torch is imported where a
measure runs), so every check can use it without importing a compiler.
"""

from __future__ import annotations

from typing import Any

from graphcache.spec import GraphSpec

# Relative error ||out - ref|| / ||ref|| allowed against the float32 reference.
# Starting points from the issue; tighten to what GPUs show (docs/gpu-results.md).
TOLERANCE = {"float16": 5e-3, "bfloat16": 2e-2}


def relative_error(out: Any, ref: Any) -> float:
    """||out - ref|| / ||ref|| in float32 (0 when both are zero).

    ``inf`` when either side holds a NaN or an infinity: a comparison with
    NaN is false, so a check written ``error > tolerance`` would pass it.
    Check with ``within_tolerance`` (``error <= tolerance``).
    """
    import torch

    a, b = out.float(), ref.float()
    if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
        return float("inf")
    diff = torch.linalg.vector_norm((a - b).reshape(-1)).item()
    norm = torch.linalg.vector_norm(b.reshape(-1)).item()
    return diff / norm if norm else diff


def within_tolerance(spec: GraphSpec, error: float) -> bool:
    """True when ``error`` is a number no larger than the dtype's tolerance
    (False for NaN and inf)."""
    return error <= TOLERANCE[spec.dtype]


def lse_difference(lse: Any, ref: Any) -> float:
    """The largest ``|lse - ref| / (1 + |ref|)`` (inf for NaN/inf): per
    element, so that one wrong row among many is not averaged away."""
    import torch

    if lse.numel() == 0:
        return 0.0
    diff = (lse.float() - ref.float()).abs() / (1.0 + ref.float().abs())
    return float(diff.max()) if bool(torch.isfinite(diff).all()) else float("inf")
