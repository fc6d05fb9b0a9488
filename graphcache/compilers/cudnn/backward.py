"""SDPA backward graphs (``kind="backward"``) in cuDNN: the version gate,
the loaded plan's execute, and the build-time check against the float32
reference's gradients.

``graph.py`` declares the graph (``sdpa_backward`` with q, k, v, the
forward's o and stats and the output gradient dO as inputs; dQ, dK, dV as
outputs, each in the dims and layout of q, k and v); ``build.py`` runs the
dialect chain and the build steps over it as over a forward graph, the
serialized plan round-trips the same way, and ``CudnnCompiler`` stores it the
same way. What differs is here: ``CudnnBackwardGraph.execute`` takes the
backward's tensors, and ``checked`` compares the round-tripped plan's dQ, dK
and dV with autograd of the float32 reference (``reference.backward``) and
records the canary over the three. A class spec's graph is declared with the
override flag and the padding mask as a forward class is, and is checked at
``override.check_shapes``'s real shapes, each tensor a view into a
NaN-filled buffer: no source shows cuDNN's backward engines honouring an
execute-time override, so the check decides (a refusal or a wrong gradient
is an UnsupportedSpec: exact specs serve). Built and checked on this CPU
against stand-ins and frontend 1.32's ``validate()``; exact graphs also on an
H200 (cuDNN 9.19, frontend 1.28: scripts/gpu/gpu_backward.py); class graphs not
yet on a GPU (that one's cuDNN had no execute-time override).

May import: releases, loaded, override; graphcache.reference, canary.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers import canary
from graphcache.compilers.classgraph import BoundGraph, check_covered, real_spec
from graphcache.compilers.cudnn.loaded import CudnnGraph
from graphcache.compilers.cudnn.override import (
    OVERRIDDEN,
    _poisoned,
    bound_lengths,
    canary_spec,
    check_shapes,
    workspace,
    workspace_size,
)
from graphcache.compilers.cudnn.planapi import on
from graphcache.compilers.cudnn.releases import BACKWARD_MASKS, SDPA_BACKWARD, missing
from graphcache.errors import BuildError, ExecutionError, UnsupportedSpec
from graphcache.reference.backward import GRADIENTS, backward_inputs, check_backward, defined, gradient_errors
from graphcache.reference.dense import bias_dtype, to_bhsd, torch_dtype
from graphcache.reference.measure import TOLERANCE, relative_error, within_tolerance
from graphcache.spec import GraphSpec

# A backward graph's tensors whose extent involves b or s (besides the forward's, OVERRIDDEN).
GRADIENT_ROLES = ("dO", "dQ", "dK", "dV")
_STORAGE = ("q", "k", "v", "o", "dO", "dQ", "dK", "dV")  # in the spec's layout; stats are packed (b, h, s, 1)


def check_target(spec: GraphSpec, frontend: str, cudnn: str | int, cc: str | None = None) -> None:
    """Raise UnsupportedSpec naming the field (a negative entry: the torch
    fallback serves) where this stack has no ``sdpa_backward`` for the spec:
    the release table's SDPA_BACKWARD, BACKWARD_MASKS for a bottom-right or
    sliding-window mask, and s_q = s_kv = 1 on any stack (``SINGLE_ROW``)."""
    problem = missing(SDPA_BACKWARD, frontend, cudnn, cc)
    field = "kind"
    if problem is None and spec.mask in ("causal_bottom_right", "sliding_window"):
        problem, field = missing(BACKWARD_MASKS, frontend, cudnn), "mask"
    if problem is None and (spec.seq_q, spec.seq_kv) == (1, 1):
        problem, field = SINGLE_ROW, "seq_q"
    if problem:
        raise UnsupportedSpec(f"{spec.summary()}: {field} {getattr(spec, field)!r}: {problem}", step="preflight")


# cuDNN's sdpa_backward at s_q = s_kv = 1: refused by every frontend from
# 1.16.0 ("Stop s_q = S_kv = 1 from running", CompositeSDPABackwardNode::
# pre_validate_node; seen refused on an H200, cuDNN 9.19 / frontend 1.28),
# never checked by 1.0-1.15, so refused here whatever the frontend.
SINGLE_ROW = "sdpa_backward does not run s_q = s_kv = 1 (cudnn-frontend 1.16.0+ refuses it; older ones do not check)"


class CudnnBackwardGraph(CudnnGraph):
    """A deserialized backward plan: ``execute`` takes q, k, v, the forward's
    ``o`` and ``stats`` and the output gradient ``d_o``, and returns
    ``(dq, dk, dv)`` in the spec's layout (allocated where not given)."""

    def execute(  # type: ignore[override]
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        o: Any = None,
        d_o: Any = None,
        stats: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        dq: Any = None,
        dk: Any = None,
        dv: Any = None,
    ) -> tuple[Any, Any, Any]:
        """Run the plan. An exact graph takes packed tensors of its spec
        (``reference.backward.check_backward``); a class graph real tensors
        of any shape its class covers, any strides with a packed last dim
        (each passed to cuDNN as an override). Raises ExecutionError for
        tensors that do not fit or are not on this graph's GPU."""
        import torch

        spec = real_spec(self.spec, q, k) if self.spec.is_class else self.spec
        given = {"q": q, "k": k, "v": v, "o": o, "d_o": d_o, "stats": stats}
        extra = {"seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "bias": bias, "dq": dq, "dk": dk, "dv": dv}
        if self.spec.is_class:
            _check_real(spec, given, extra, self.device)
        else:
            check_backward(spec, {**given, **extra}, device_type=self.device.type)
        if q.device != self.device:
            raise ExecutionError(f"q is on {q.device}; this graph was loaded on {self.device}: move the tensors")
        graph: Any = self  # override's helpers read what they read of a forward class graph (ClassGraph)
        with on(self.device), self._compiler._lock:
            made = [
                t if t is not None else torch.empty(spec.storage_shape(r), dtype=q.dtype, device=q.device)
                for r, t in (("dQ", dq), ("dK", dk), ("dV", dv))
            ]
            tensors = {"q": q, "k": k, "v": v, "o": o, "dO": d_o, "dQ": made[0], "dK": made[1], "dV": made[2]}
            views = {r: to_bhsd(spec, t) for r, t in tensors.items()}
            views["stats"] = stats
            if seq_len_q is None and self.spec.is_class:  # the padding mask at the real lengths
                seq_len_q, seq_len_kv = bound_lengths(graph, spec)
            if seq_len_q is not None:
                views.update(seq_len_q=seq_len_q, seq_len_kv=seq_len_kv)
            if bias is not None:
                views["bias"] = bias
            pack = {self.uids[r]: t for r, t in views.items()}
            if self.spec.is_class:
                names = [r for r in (*OVERRIDDEN, *GRADIENT_ROLES) if r in views]
                lists: dict[str, list[Any]] = {
                    "override_uids": [self.uids[r] for r in names],
                    "override_shapes": [list(views[r].shape) for r in names],
                    "override_strides": [list(views[r].stride()) for r in names],
                }
                space = workspace(graph, workspace_size(graph, lists))
                self._graph.execute(pack, space, handle=self._compiler.handle(), **lists)
            else:
                self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return made[0], made[1], made[2]

    def bind(self, spec: GraphSpec) -> Any:
        """This class graph at one exact spec of its class (its ``execute``
        takes the real tensors). Raises ExecutionError for a spec the class
        does not cover."""
        check_covered(self.spec, spec)
        return BoundGraph(self, spec)

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        raise ExecutionError("a backward graph runs through execute(q, k, v, o=, d_o=, stats=)")


def _check_real(spec: GraphSpec, given: dict[str, Any], extra: dict[str, Any], device: Any) -> None:
    """A class graph's tensors at the real shape ``spec``: shapes, dtypes,
    the graph's device and a packed last dim (strides are passed as
    overrides), the gradient buffers (``dq``, ``dk``, ``dv``) where given."""
    import torch

    want = {r: (spec.storage_shape(r), torch_dtype(spec)) for r in ("q", "k", "v", "o")}
    want.update(d_o=(spec.storage_shape("dO"), torch_dtype(spec)), stats=(spec.dims("stats"), torch.float32))
    for role, primal in (("dq", "q"), ("dk", "k"), ("dv", "v")):  # written through their (override) strides
        if extra[role] is not None:
            want[role] = want[primal]
            given = {**given, role: extra[role]}
    if (extra["seq_len_q"] is None) != (not spec.padding) or (extra["seq_len_kv"] is None) != (not spec.padding):
        raise ExecutionError(f"seq_len_q and seq_len_kv are {'needed' if spec.padding else 'not taken'} here")
    bias = extra["bias"]
    if (bias is None) != (spec.bias is None) or (
        bias is not None
        and (tuple(bias.shape), bias.dtype, bias.stride(-1)) != (spec.dims("bias"), bias_dtype(spec), 1)
    ):
        raise ExecutionError(f"bias must be {spec.dims('bias') if spec.bias else 'absent'} in {bias_dtype(spec)} here")
    for role, t in given.items():
        shape, dtype = want[role]
        if t is None:
            raise ExecutionError(f"{role} is missing: a backward graph takes q, k, v, o, d_o and stats")
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != device or t.stride(-1) != 1:
            raise ExecutionError(
                f"{role} must be {dtype} {tuple(shape)} on {device} with a packed last dim for {spec.summary()} "
                f"(got {t.dtype} {tuple(t.shape)} on {t.device}, strides {tuple(t.stride())})"
            )


# -- the build-time check ------------------------------------------------------------


def check_class(graph: CudnnBackwardGraph) -> float:
    """Run the (round-tripped) class graph at ``override.check_shapes``'s
    real shapes (less s_q = s_kv = 1, which sdpa_backward refuses), every
    tensor a view into a NaN-filled buffer, against the float32 reference's
    gradients. Returns the largest error; raises UnsupportedSpec naming the
    shapes whose gradients disagreed (exact specs then serve)."""
    klass = graph.spec
    pad = (1, 64, 0, 0) if klass.layout == "bshd" else (1, 0, 64, 0)
    worst, failed = 0.0, []
    for n, real in enumerate(s for s in check_shapes(klass) if (s.seq_q, s.seq_kv) != (1, 1)):
        feed = backward_inputs(real, str(graph.device), seed=200 + n)
        views = {r: _poisoned(t, pad) if r in ("q", "k", "v", "o", "d_o") else t for r, t in feed.items()}
        views["stats"] = _poisoned(feed["stats"], (1, 0, 64, 0))
        if "bias" in feed:
            views["bias"] = _poisoned(feed["bias"], (0, 0, 64, 64))
        grads = [_poisoned(feed["q"].new_zeros(real.storage_shape(r)), pad) for r in ("dQ", "dK", "dV")]
        graph.execute(**views, dq=grads[0], dk=grads[1], dv=grads[2])
        errors = gradient_errors(real, (grads[0], grads[1], grads[2]), feed)
        worst = max(worst, *errors.values())
        bad = [f"{name} {error:.2e}" for name, error in errors.items() if not within_tolerance(real, error)]
        if bad:
            failed.append(f"b{real.batch} q{real.seq_q} kv{real.seq_kv} ({', '.join(bad)})")
    if failed:
        raise UnsupportedSpec(
            f"the backward class graph {klass.summary()} disagrees with the float32 reference's gradients at real "
            f"shapes {', '.join(failed)} (tolerance {TOLERANCE[klass.dtype]:.0e}, inputs in NaN-filled buffers): "
            "exact specs serve this target",
            step="check",
        )
    return worst


def checked(artifact: Artifact, loaded: CudnnBackwardGraph) -> Artifact:
    """The build-time check of a backward plan (the round-tripped one): a
    class graph at its check shapes (``check_class``), then the canary's
    shape, whose dQ, dK and dV must each be within the dtype's tolerance of
    the float32 reference's gradients, and a second run on the same input
    within the tolerance of the first (else BuildError: not cached, tried
    again). The canary records the three gradients, compared within the
    tolerance at every load, never bit for bit: see ``BIT_EXACT_CANARY``."""
    spec = artifact.spec
    worst = check_class(loaded) if spec.is_class else 0.0
    real = canary_spec(spec)
    feed = canary.inputs(real, str(loaded.device))
    first = tuple(g.clone() for g in loaded.execute(**feed))
    second = loaded.execute(**feed)
    errors = gradient_errors(real, first, feed)
    error = max(worst, *errors.values())
    bad = {name: e for name, e in errors.items() if not within_tolerance(real, e)}
    if bad:
        engine = artifact.runtime.get("engine")
        raise BuildError(
            f"cuDNN gradients for {spec.summary()} (engine {engine}) differ from the float32 reference's: "
            + ", ".join(f"{name} {e:.2e}" for name, e in bad.items())
            + f" (tolerance {TOLERANCE[spec.dtype]:.0e}); not caching this plan"
        )
    pairs = zip(GRADIENTS, defined(real, first, feed), defined(real, second, feed), strict=True)
    drift = {name: relative_error(b, a) for name, a, b in pairs}
    moved = {name: e for name, e in drift.items() if not within_tolerance(real, e)}
    if moved:  # e.g. a float32 dQ accumulator that a deserialized plan no longer clears between runs
        raise BuildError(
            f"a second run of the cuDNN backward plan for {spec.summary()} on the same input gave other gradients: "
            + ", ".join(f"{name} moved by {e:.2e}" for name, e in moved.items())
            + " (the plan keeps state between runs); not caching this plan"
        )
    record = canary.describe(real, first, feed, deterministic=BIT_EXACT_CANARY)
    runtime = {**artifact.runtime, "gradient_errors": errors}
    return dataclasses.replace(artifact, validation_error=error, canary=record, runtime=runtime)


# cuDNN's SDPA backward is not bit-deterministic unless the graph sets
# use_deterministic_algorithm (graphcache's graphs do not, as ATen's do not):
# without it the frontend lowers dQ through a float32 accumulator in the
# workspace that key tiles add into (cudnn-frontend v1.23.0
# include/cudnn_frontend/node/scaled_dot_product_flash_attention.h,
# CompositeSDPABackwardNode: dQ_accum unless use_dp_workspace, which only
# dBias or is_deterministic_algorithm force). Seen on an H200 with cuDNN 9.19
# (scripts/gpu/gpu_backward.py, 20 runs on one input): dK and dV always the same
# bits, dQ in 5, 16 and 20 patterns for three plans, one of which had given
# the same bits on 12 runs before. Equal runs at build prove nothing about a
# later one: with a bit-compared canary, that plan (equal bits at each of 3
# builds) failed 1 of 60 loads there, and GraphCache._reject deletes a plan
# that fails its canary from the shared store.
BIT_EXACT_CANARY = False
