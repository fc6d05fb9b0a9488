"""The numerical canary: a plan's output on one fixed, seeded input.

cudnn-frontend has shipped deserialized SDPA plans whose numbers differed
from the plan that was built (fixed in 1.6.1) and a ``serialize()`` that
dropped ``softmax_precision`` (issue #1024). So at build the output of the
round-tripped plan on a fixed input is described in the artifact header, and
every load runs the deserialized plan once on the same input and compares:
bit for bit where the plan gave the same bits twice at build
(``deterministic``), within the dtype's tolerance otherwise.

Padded query rows are zeroed before anything is recorded: cuDNN promises
nothing about them. Dropout specs have no canary (their output is random).
"""

from __future__ import annotations

import hashlib
from typing import Any

from graphcache.spec import GraphSpec

SEED = 20261130
SAMPLES = 64


def inputs(spec: GraphSpec, device: str) -> dict[str, Any]:
    """The canary's input for a spec, drawn on the CPU (a CUDA generator's
    stream depends on the launch layout) and moved to ``device``."""
    from graphcache.compilers.torch_sdpa import random_inputs

    return {role: t.to(device) for role, t in random_inputs(spec, "cpu", seed=SEED).items()}


def input_digest(feed: dict[str, Any]) -> str:
    """sha256 over the input tensors' bytes, in role order: a worker whose
    torch draws another input skips the canary instead of failing it."""
    h = hashlib.sha256()
    for role in sorted(feed):
        h.update(role.encode())
        h.update(digest(feed[role]).encode())
    return h.hexdigest()


def _prepared(spec: GraphSpec, out: Any, feed: dict[str, Any]) -> Any:
    from graphcache.compilers.torch_sdpa import valid_rows

    return valid_rows(spec, out, feed.get("seq_len_q"), feed.get("seq_len_kv")).contiguous()


def digest(tensor: Any) -> str:
    """sha256 of a tensor's bytes (its dtype's own representation)."""
    import torch

    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()


def same_bits(spec: GraphSpec, a: Any, b: Any, feed: dict[str, Any]) -> bool:
    """True when two outputs on the canary input agree bit for bit (valid rows)."""
    return digest(_prepared(spec, a, feed)) == digest(_prepared(spec, b, feed))


def describe(spec: GraphSpec, out: Any, feed: dict[str, Any], *, deterministic: bool) -> dict[str, Any]:
    """The header record for ``out`` (the plan's output on ``inputs(spec)``)."""
    import torch

    kept = _prepared(spec, out, feed)
    flat = kept.float().reshape(-1)
    step = max(1, flat.numel() // SAMPLES)
    return {
        "seed": SEED,
        "input_sha256": input_digest(feed),
        "sha256": digest(kept),
        "deterministic": bool(deterministic),
        "l2": float(torch.linalg.vector_norm(flat).item()),
        "sum": float(flat.sum().item()),
        "abs_max": float(flat.abs().max().item()),
        "sample_stride": step,
        "sample": [float(x) for x in flat[::step][:SAMPLES].tolist()],
    }


def comparable(record: dict[str, Any], feed: dict[str, Any]) -> bool:
    """Whether ``feed`` is the input ``record`` was made from (same seed, and
    the same bytes where the record has their digest)."""
    if record.get("seed") != SEED:
        return False
    want = record.get("input_sha256")
    return want is None or want == input_digest(feed)


def mismatch(spec: GraphSpec, record: dict[str, Any], out: Any, feed: dict[str, Any]) -> str | None:
    """None when ``out`` (on ``feed``, for which ``comparable`` holds) agrees
    with ``record``; else what differs, in words."""
    import torch

    from graphcache.compilers.torch_sdpa import TOLERANCE, relative_error

    kept = _prepared(spec, out, feed)
    if digest(kept) == record.get("sha256"):
        return None
    if record.get("deterministic"):
        return "output bits differ from the build's, and the plan was deterministic at build"
    flat = kept.float().reshape(-1)
    tolerance = TOLERANCE[spec.dtype]
    step = int(record.get("sample_stride") or 1)
    sample = flat[::step][:SAMPLES]
    want = torch.tensor(record.get("sample") or [], dtype=torch.float32, device=sample.device)
    if sample.shape != want.shape:
        return f"the canary sample has {tuple(sample.shape)} values, the build recorded {tuple(want.shape)}"
    error = relative_error(sample, want)
    if not error <= tolerance:
        return f"sampled outputs differ from the build's by {error:.2e} (> {tolerance:.0e})"
    l2 = float(torch.linalg.vector_norm(flat).item())
    want_l2 = float(record.get("l2", float("nan")))
    if not abs(l2 - want_l2) <= tolerance * max(abs(want_l2), 1e-12):
        return f"output norm {l2:.6g} differs from the build's {want_l2:.6g}"
    return None
