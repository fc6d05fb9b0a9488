"""Length classes without execute-time override: the ``padded`` mechanism.

cuDNN below 9.21 (every torch before 2.14's CUDA 13 builds) cannot run a
graph at shapes other than those it was declared with. A class graph there
is declared at its class's maxima (B, S_q, S_kv) with the padding mask, and
each call hands it tensors of the declared sizes with the call's real
lengths as the seq-len tensors: cuDNN's matmuls stop at those lengths
(cudnn-frontend's ``set_m_override``/``set_k_override`` on bmm1/bmm2, since
v1.0), and bottom-right and window masks follow them
(``causal_mask_bottom_right`` reads the seq-len tensors). So one graph
serves every shape of its class, on every cuDNN graphcache builds for.

What a call costs over an exact graph is where its tensors lie. The graph
reads each tensor through the strides it was declared with, up to the
declared sizes:

- a tensor whose memory already has those strides, and whose storage holds
  the whole declared extent (a static KV cache as large as the class, a
  preallocated pool, a batch as large as the class), is read **in place**;
- any other is **copied** into a buffer of the declared size, one per
  (device, stream, tensor role, dtype), grown when a larger class needs more
  and reused across calls and classes (a DynamicCache's k and v, whose head
  stride changes every decode step, are copied every step). Every copy is
  counted, with its bytes (``copies``).

Rows past the real lengths are never read by a correct plan: the build-time
check runs the graph with NaN in every byte past them. The output is written
into a fresh tensor of the declared size, and the call gets the view of its
real rows (nothing copied out). Rows of batch elements past the call's batch
are run at length 1 and dropped.

This module is what the cuDNN graph (``graphcache.compilers.cudnn.padded``)
and the reference compiler's stand-in share: where a tensor is read from,
what is copied, the seq-len tensors, the output. torch is imported lazily.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from graphcache.spec import GraphSpec

REASON = "class_buffer"  # the reason a copy is counted under (``copies``)

_lock = threading.Lock()
_copies: Counter[str] = Counter()  # role -> tensors copied
_copied_bytes: Counter[str] = Counter()  # role -> bytes copied
_buffers: dict[tuple[Any, ...], Any] = {}  # (device, stream, role, dtype) -> a GPU stream's flat buffer
_checking = threading.local()  # .on: this thread runs a build check (``poisoned``)
_own = threading.local()  # .buffers: a CPU thread's own, gone with the thread


def copies() -> dict[str, dict[str, int]]:
    """Tensors copied into class buffers since the last ``reset``, by role:
    ``{"k": {"copies": n, "bytes": m}, ...}``."""
    with _lock:
        return {role: {"copies": n, "bytes": _copied_bytes[role]} for role, n in sorted(_copies.items())}


def reset() -> None:
    """Forget the copy counts (graphcache.torch.reset calls it)."""
    with _lock:
        _copies.clear()
        _copied_bytes.clear()


def release_buffers() -> None:
    """Drop every reused buffer of the GPUs' streams and of this thread (their
    memory goes back to torch's allocator)."""
    with _lock:
        _buffers.clear()
    getattr(_own, "buffers", {}).clear()


def buffer_bytes() -> int:
    """Bytes the reused buffers of the GPUs' streams and of this thread hold now."""
    with _lock:
        held = list(_buffers.values())
    held += list(getattr(_own, "buffers", {}).values())
    return sum(int(b.numel()) * int(b.element_size()) for b in held)


class poisoned:  # noqa: N801 - a context manager, used as ``with poisoned():``
    """While a build check runs in this thread: every buffer a tensor is
    copied into is NaN before the copy, so a plan that reads past the real
    lengths gives non-finite output (tensors read in place are the check's
    own NaN-filled views)."""

    def __enter__(self) -> None:
        _checking.on = True

    def __exit__(self, *exc: object) -> None:
        _checking.on = False


def _count(role: str, nbytes: int) -> None:
    with _lock:
        _copies[role] += 1
        _copied_bytes[role] += nbytes


def _span(dims: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from a view's first element to one past its last."""
    return 1 + sum((n - 1) * s for n, s in zip(dims, strides, strict=True))


def _buffer(device: Any, role: str, dtype: Any, numel: int) -> Any:
    """The reused flat buffer of ``role`` on this device's current stream
    (a CPU: this thread's own), at least ``numel`` elements. Work on one
    stream runs in order, so a buffer is free again once its call is queued."""
    import torch

    if device.type != "cuda":
        own = _own.__dict__.setdefault("buffers", {})
        held = own.get((device, role, dtype))
        if held is None or held.numel() < numel:
            held = own[(device, role, dtype)] = torch.empty(numel, dtype=dtype, device=device)
        return held
    slot = (device, torch.cuda.current_stream(device).cuda_stream, role, dtype)
    with _lock:
        held = _buffers.get(slot)
        if held is None or held.numel() < numel:
            held = _buffers[slot] = torch.empty(numel, dtype=dtype, device=device)
        return held


def fits(t: Any, dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether the (b, h, s, d) view ``t`` can be read in place as a tensor of
    ``dims`` and ``strides`` starting at its first element: its strides are
    those on every dim it has more than one of, and its storage holds the
    whole declared extent (a graph reads up to the declared sizes)."""
    for n, have, want in zip(t.shape, t.stride(), strides, strict=True):
        if n > 1 and have != want:
            return False
    held = t.untyped_storage().nbytes() // t.element_size()
    return bool(t.storage_offset() + _span(dims, strides) <= held)


def place(role: str, t: Any, dims: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """``t`` (a (b, h, s, d)-ordered view, each dim at most ``dims``') as a
    tensor of the declared ``dims`` and ``strides`` holding ``t`` at its
    origin: ``t``'s own memory where it ``fits``, else a reused buffer it is
    copied into (counted)."""
    if fits(t, dims, strides):
        return t.as_strided(dims, strides, t.storage_offset())
    flat = _buffer(t.device, role, t.dtype, _span(dims, strides))
    if getattr(_checking, "on", False) and flat.is_floating_point():
        flat.fill_(float("nan"))
    declared = flat.as_strided(dims, strides, 0)
    declared[tuple(slice(0, n) for n in t.shape)].copy_(t)
    _count(role, int(t.numel()) * int(t.element_size()))
    return declared


def real(t: Any, spec: GraphSpec, role: str) -> Any:
    """The view of the real (exact) ``spec``'s rows of a declared (b, h, s, d) tensor."""
    return t[tuple(slice(0, n) for n in spec.dims(role))]


@dataclass
class Placed:
    """One call's tensors as the declared graph takes them ((b, h, s, d)
    views at the class's maxima), and the declared output and stats."""

    tensors: dict[str, Any]  # q, k, v, o, seq_len_q, seq_len_kv; bias, stats where the spec has them


class PaddedShape:
    """A padded class graph at one exact spec of its class: the declared
    dims and strides of every role and the seq-len tensors, made once, so
    a call pays its copies and the launch."""

    def __init__(self, klass: GraphSpec, spec: GraphSpec, device: Any) -> None:
        import torch

        self._torch = torch
        self.klass = klass
        self.spec = spec
        self.device = device
        roles = ["q", "k", "v", "o"]
        if klass.bias is not None:
            roles.append("bias")
        if klass.generate_stats:
            roles.append("stats")
        self.declared = {r: (tuple(klass.dims(r)), tuple(klass.strides(r))) for r in roles}
        # The real lengths, then 1 for the batch rows past the call's batch (run and dropped).
        self.lengths = None if spec.padding else (self._lengths(spec.seq_q), self._lengths(spec.seq_kv or spec.seq_q))
        extra = klass.batch - spec.batch
        # A padding spec's lengths are the caller's: these 1s widen them to the class's batch.
        self._ones = torch.ones((extra, 1, 1, 1), dtype=torch.int32, device=device) if spec.padding and extra else None

    def _lengths(self, n: int) -> Any:
        torch = self._torch
        rows = [n] * self.spec.batch + [1] * (self.klass.batch - self.spec.batch)
        return torch.tensor(rows, dtype=torch.int32, device=self.device).view(-1, 1, 1, 1)

    def widened(self, given: Any) -> Any:
        """A padding spec's caller-given (b, 1, 1, 1) seq-len tensor at the class's batch (1 past it)."""
        torch = self._torch
        if self._ones is None:
            return given
        ones = self._ones if self._ones.device == given.device else self._ones.to(given.device)
        return torch.cat([given.to(torch.int32), ones])

    def place(
        self,
        q: Any,
        k: Any,
        v: Any,
        bias: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
    ) -> Placed:
        """The call's (b, h, s, d) views (and its packed bias) as the declared
        graph reads them, a fresh declared output (and stats), and the
        seq-len tensors (the caller's, widened, for a padding spec)."""
        torch = self._torch
        declared = self.declared
        tensors = {r: place(r, t, *declared[r]) for r, t in (("q", q), ("k", k), ("v", v))}
        if bias is not None:
            tensors["bias"] = place("bias", bias, *declared["bias"])
        dims, strides = declared["o"]
        tensors["o"] = torch.empty_strided(dims, strides, dtype=q.dtype, device=q.device)
        if "stats" in declared:
            dims, strides = declared["stats"]
            tensors["stats"] = torch.empty_strided(dims, strides, dtype=torch.float32, device=q.device)
        if self.lengths is not None:
            tensors["seq_len_q"], tensors["seq_len_kv"] = self.lengths
        else:
            tensors["seq_len_q"], tensors["seq_len_kv"] = self.widened(seq_len_q), self.widened(seq_len_kv)
        return Placed(tensors)

    def output(self, placed: Placed) -> Any:
        """The call's output: the real rows of the declared output (a view),
        and its stats where asked, packed (b, h, s_q, 1) as every graph
        writes them (a copy of the real rows, counted: they are small)."""
        o = real(placed.tensors["o"], self.spec, "o")
        if "stats" in placed.tensors:
            stats = real(placed.tensors["stats"], self.spec, "stats")
            if not stats.is_contiguous():
                stats = stats.contiguous()
                _count("stats", int(stats.numel()) * 4)
            return o, stats
        return o
