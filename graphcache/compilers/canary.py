"""The numerical canary: a plan's output on one fixed, seeded input.

cudnn-frontend has shipped deserialized SDPA plans whose numbers differed
from the plan that was built (fixed in 1.6.1) and a ``serialize()`` that
dropped ``softmax_precision`` (issue #1024). So at build the output of the
round-tripped plan on a fixed input is described in the artifact header, and
every load runs the deserialized plan once on the same input and compares:
bit for bit where the plan gave the same bits twice at build
(``deterministic``), within the dtype's tolerance otherwise.

It runs at every worker start, so it must cost little next to a load even
for prefill shapes of hundreds of MB: the input is drawn on the GPU, and the
output is summarised there. The digest covers the output's shape and the
bytes of a strided sample of at most ``DIGEST_VALUES`` of its values (all of
them for a small output); its float64 sum and norm cover the rest. Only that
much crosses to the host. Those two are compared within ``REDUCTION_RTOL``,
not bit for bit: equal values summed by another worker's torch may differ in
the last bits, and that must not reject a plan for the whole fleet. The input
is recorded by a digest of such samples: a worker whose torch draws another
input skips the comparison instead of failing it.

Padded query rows, and rows the mask leaves without a key, are zeroed before
anything is recorded: cuDNN promises nothing there. Dropout specs have no
canary (their output is random). A backward graph's output is its three
gradients, dQ, dK and dV, recorded as one (``reference.backward.defined``
of each, flattened and joined), on the backward's own seeded input, and
is never bit-compared: cuDNN's backward is not deterministic by default
(``compilers.cudnn.backward.BIT_EXACT_CANARY``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from graphcache.compilers.varlen_check import defined_output
from graphcache.compilers.varlen_check import inputs as varlen_inputs
from graphcache.reference.backward import backward_inputs
from graphcache.reference.backward import defined as defined_gradients
from graphcache.reference.dense import random_inputs, valid_rows
from graphcache.reference.measure import TOLERANCE, relative_error
from graphcache.spec import GraphSpec

SEED = 20261130
SAMPLES = 64  # values kept in the header for the within-tolerance comparison
DIGEST_VALUES = 65536  # values of the output the digest reads
INPUT_VALUES = 4096  # values of each input the input digest reads
# Float64 sums of the same values in another order differ by far less; one
# changed value among 1e8 moves the norm by about 1e-8.
REDUCTION_RTOL = 1e-9


def inputs(spec: GraphSpec, device: str) -> dict[str, Any]:
    """The canary's input for a spec, drawn on ``device`` from a generator
    seeded with ``SEED`` (its stream may differ across torch releases:
    ``input_digest`` tells). A thd (ragged / paged) spec's is the build-time
    check's call (``varlen_check.inputs``), as ``run_varlen`` takes it."""
    if spec.layout == "thd":
        return varlen_inputs(spec, device, seed=SEED)
    if spec.kind == "backward":  # q, k, v, the forward's o and stats, and d_o
        return backward_inputs(spec, device, seed=SEED)
    return random_inputs(spec, device, seed=SEED)


def _strided(tensor: Any, count: int) -> Any:
    flat = tensor.detach().contiguous().reshape(-1)
    step = max(1, -(-flat.numel() // count))
    return flat[::step][:count]


def _raw(tensor: Any) -> bytes:
    import torch

    return bytes(tensor.contiguous().view(torch.uint8).cpu().numpy().tobytes())


def input_digest(feed: dict[str, Any]) -> str:
    """sha256 over each input's role, shape, dtype and a strided sample of
    its values: a worker whose torch draws another input skips the canary
    instead of failing it."""
    h = hashlib.sha256()
    for role in sorted(feed):
        t = feed[role]
        if t is None:  # a thd call's absent cu_seq_k / seqused_k / block_table
            continue
        h.update(f"{role}:{tuple(t.shape)}:{t.dtype};".encode())
        h.update(_raw(_strided(t, INPUT_VALUES)))
    return h.hexdigest()


def _prepared(spec: GraphSpec, out: Any, feed: dict[str, Any]) -> Any:
    if spec.kind == "backward":  # (dq, dk, dv): the defined entries of each, as one flat tensor
        import torch

        return torch.cat([g.reshape(-1) for g in defined_gradients(spec, out, feed)])
    if spec.layout == "thd":
        return defined_output(spec, out, feed)
    return valid_rows(spec, out, feed.get("seq_len_q"), feed.get("seq_len_kv"), feed.get("bias")).contiguous()


def digest(tensor: Any) -> str:
    """sha256 over a tensor's shape and dtype and the bytes of a strided
    sample of at most DIGEST_VALUES of its values (every value of a small
    tensor), read where the tensor lives."""
    h = hashlib.sha256(f"{tuple(tensor.shape)}:{tensor.dtype};".encode())
    h.update(_raw(_strided(tensor, DIGEST_VALUES)))
    return h.hexdigest()


def _reductions(kept: Any) -> tuple[float, float]:
    """The float64 2-norm and sum, computed where ``kept`` lives."""
    import torch

    return (
        float(torch.linalg.vector_norm(kept, dtype=torch.float64).item()),
        float(kept.sum(dtype=torch.float64).item()),
    )


def _summary(kept: Any) -> tuple[float, float, float, int, list[float]]:
    """l2, sum, abs max, sample stride and sample, computed where ``kept`` lives."""
    flat = kept.reshape(-1)
    step = max(1, flat.numel() // SAMPLES)
    l2, total = _reductions(flat)
    return (
        l2,
        total,
        float(flat.abs().max().item()) if flat.numel() else 0.0,
        step,
        [float(x) for x in flat[::step][:SAMPLES].float().tolist()],
    )


def describe(spec: GraphSpec, out: Any, feed: dict[str, Any], *, deterministic: bool) -> dict[str, Any]:
    """The header record for ``out`` (the plan's output on ``inputs(spec)``)."""
    kept = _prepared(spec, out, feed)
    l2, total, abs_max, step, sample = _summary(kept)
    return {
        "seed": SEED,
        "input_sha256": input_digest(feed),
        "sha256": digest(kept),
        "deterministic": bool(deterministic),
        "l2": l2,
        "sum": total,
        "abs_max": abs_max,
        "sample_stride": step,
        "sample": sample,
    }


def same_bits(spec: GraphSpec, record: dict[str, Any], out: Any, feed: dict[str, Any]) -> bool:
    """Whether ``out``, a second run on the host that made ``record``, has
    its sampled bits and exactly its float64 sum and norm (``deterministic``)."""
    kept = _prepared(spec, out, feed)
    return digest(kept) == record["sha256"] and _reductions(kept) == (record["l2"], record["sum"])


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

    kept = _prepared(spec, out, feed)
    l2, total = _reductions(kept)
    want_l2, want_sum = float(record["l2"]), float(record["sum"])
    if (
        digest(kept) == record["sha256"]
        and abs(l2 - want_l2) <= REDUCTION_RTOL * want_l2
        and abs(total - want_sum) <= REDUCTION_RTOL * max(abs(want_sum), want_l2)
    ):
        return None
    if record["deterministic"]:
        return "output bits differ from the build's, and the plan was deterministic at build"
    tolerance = TOLERANCE[spec.dtype]
    step = record["sample_stride"]
    sample = kept.reshape(-1)[::step][:SAMPLES].float()
    want = torch.tensor(record["sample"], dtype=torch.float32, device=sample.device)
    if sample.shape != want.shape:
        return f"the canary sample has {tuple(sample.shape)} values, the build recorded {tuple(want.shape)}"
    error = relative_error(sample, want)
    if not error <= tolerance:
        return f"sampled outputs differ from the build's by {error:.2e} (> {tolerance:.0e})"
    if not abs(l2 - want_l2) <= tolerance * max(abs(want_l2), 1e-12):
        return f"output norm {l2:.6g} differs from the build's {want_l2:.6g}"
    return None
