"""Recording manifests from a real run: every distinct SDPA spec a model
makes, written as a manifest ``graphcache warm`` reads unchanged. Under a
class policy (GRAPHCACHE_SHAPE_CLASSES, default pow2) the manifest names
the class specs that serve the calls, each with the exact shapes it served
and their call counts in comments; ``exact`` writes the exact specs. With
``backward`` (``graphcache record --backward``: a training step) every call
also writes its backward spec (``kind: backward``), and a call that needs
gradients its forward as a training step calls it, writing the stats the
backward reads (``generate_stats: true``). The manifest's text is
``text``'s.

``record()`` sits beside the doors, not in one: every door hands the calls
it ran to the recorders the runtime holds (``RUNTIME.recorders``: the sdpa
door's ``Runtime.call``, ``varlen_attn``, the aten door, graphcache.hf), and
``record()`` itself patches torch's SDPA through the sdpa door's
``patch()``. From the shared core it reads ``derive`` (a call's spec and
its widened layout) and ``counts.Recent`` (its bounded tables)."""

from __future__ import annotations

import math
import os
import runpy
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from graphcache.errors import ManifestError, SpecError, UnsupportedCall
from graphcache.models.specs import lengthened, widened
from graphcache.spec import DTYPES, GraphSpec
from graphcache.spec.backward import backward_of
from graphcache.spec.classes import check_policy, class_of, policy_from_env
from graphcache.spec.layout_fits import settled
from graphcache.torch.core.counts import Recent
from graphcache.torch.core.derive import _DTYPE_NAMES, derive_args
from graphcache.torch.core.runtime import RUNTIME
from graphcache.torch.recording.text import manifest_text
from graphcache.torch.sdpa import patch

# Distinct specs (and backward specs) a recording keeps, the most recent; reasons a call is no graph.
RECORD_LIMIT = 65536
REASONS_LIMIT = 1024


class Recorder:
    """Counts the calls of each distinct spec, and of each reason a call could
    not be a cuDNN graph. Thread-safe."""

    def __init__(
        self,
        dtype: str | None = None,
        shape_classes: str | None = None,
        max_batch: int | None = None,
        backward: bool = False,
        max_seq: int | None = None,
    ) -> None:
        self.dtype = dtype
        self.shape_classes = (
            policy_from_env() if shape_classes is None else check_policy(shape_classes, "shape_classes")
        )
        for name, value, what in (("max_batch", max_batch, "batch"), ("max_seq", max_seq, "length")):
            if value is not None and (self.shape_classes == "exact" or value < 1):
                raise ManifestError(
                    f"{name}={value}: widening to {what} classes needs a {what} >= 1 and shape classes pow2 "
                    f"(they are {self.shape_classes}): pass --shape-classes pow2"
                )
        self.max_batch = max_batch  # widen every call seen to the batch classes up to this (record --max-batch)
        self.max_seq = max_seq  # ... and to the length classes up to this (record --max-seq)
        self.backend = False  # a call came through graphcache.hf's backend: its route is graphcache
        # Every record below keeps its most recent entries (RECORD_LIMIT, REASONS_LIMIT) and counts
        # those it dropped: a recording as long as a server's life stays bounded, and says what it left out.
        self.specs: Recent[GraphSpec, int] = Recent(RECORD_LIMIT)  # exact call specs and their call counts
        self.ineligible: Recent[tuple[str, str], int] = Recent(REASONS_LIMIT)
        self.training = backward  # every call's backward too (record --backward)
        self.backwards: Recent[GraphSpec, int] = Recent(RECORD_LIMIT)  # their backward specs and call counts
        self.no_backward: Recent[tuple[str, str], int] = Recent(REASONS_LIMIT)  # no backward spec: field and why
        self.copied: dict[tuple[str, str], int] = {}  # (tensor, reason): calls whose tensor is copied (derive)
        # Per spec, the layouts a larger call of its producer has where its size-1 strides say other than
        # the spec's (graphcache.torch.derive's Derived.wide): what max_batch / max_seq widen it to.
        self.wide: Recent[GraphSpec, dict[str, str]] = Recent(RECORD_LIMIT)
        self._memo: dict[
            tuple[Any, ...], tuple[GraphSpec | tuple[str, str], tuple[tuple[str, str, str], ...], Any]
        ] = {}
        self._lock = threading.Lock()

    def note(self, memo_key: tuple[Any, ...] | None, args: tuple[Any, ...]) -> None:
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa = args
        copies: tuple[tuple[str, str, str], ...] = ()
        wide = None
        grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (query, key, value))
        if grad and not self.training:
            found: GraphSpec | tuple[str, str] = ("autograd", "an input requires grad: cuDNN graphs are forward-only")
        else:
            cached = self._memo.get(memo_key) if memo_key is not None and attn_mask is None else None
            if cached is None:
                try:
                    derived = derive_args(args, self.dtype)
                    found, copies, wide = derived.spec, derived.copies, derived.wide
                except UnsupportedCall as exc:
                    found = (exc.reason, str(exc))
                if memo_key is not None and attn_mask is None:
                    if len(self._memo) >= RECORD_LIMIT:  # a cache of derive: emptied, never grown past the limit
                        self._memo.clear()
                    self._memo[memo_key] = (found, copies, wide)
            else:
                found, copies, wide = cached
        if self.training and isinstance(found, GraphSpec):
            self.count_training(found, grad, wide)
        else:
            self.count(found, wide)
        if copies:
            with self._lock:
                for role, _, reason in copies:
                    self.copied[(role, reason)] = self.copied.get((role, reason), 0) + 1

    def count_training(self, spec: GraphSpec, grad: bool = True, wide: dict[str, str] | None = None) -> None:
        """Count one forward call of spec ``spec`` in a training step: the
        forward (with ``generate_stats`` where the call needs gradients: the
        stats the backward reads) and its backward spec, or, where it has
        none here, the reason (``no_backward``). ``wide`` as for ``count``."""
        self.count(_with_stats(spec) if grad else spec, wide)
        try:
            back = backward_of(spec)
        except SpecError as exc:
            with self._lock:
                why = (exc.field or "spec", str(exc))
                self.no_backward[why] = self.no_backward.get(why, 0) + 1
            return
        with self._lock:
            self.backwards[back] = self.backwards.get(back, 0) + 1

    def count(self, found: GraphSpec | tuple[str, str], wide: dict[str, str] | None = None) -> None:
        """Count one call as the spec it makes, or as ``(reason, message)``
        when it cannot be a graph (graphcache.torch.varlen_attn notes its calls so).
        ``wide``: the layouts a larger call of its producer has, where its
        size-1 strides say other than the spec's (``Derived.wide``)."""
        with self._lock:
            if isinstance(found, GraphSpec):
                self.specs[found] = self.specs.get(found, 0) + 1
                if wide:
                    self.wide[found] = wide
            else:
                self.ineligible[found] = self.ineligible.get(found, 0) + 1

    def calls(self) -> int:
        """The calls the record still names (``dropped`` says how many specs and reasons it left out)."""
        return sum(self.specs.values()) + sum(self.ineligible.values())

    def dropped(self) -> dict[str, int]:
        """Entries dropped from each bounded record (the oldest, past its limit): ``specs``,
        ``backwards``, ``ineligible``, ``no_backward``; only those that dropped any."""
        found = {
            "specs": self.specs.dropped,
            "backwards": self.backwards.dropped,
            "ineligible": self.ineligible.dropped,
            "no_backward": self.no_backward.dropped,
        }
        return {name: n for name, n in found.items() if n}

    def graphs(self) -> dict[GraphSpec, dict[GraphSpec, int]]:
        """The specs the manifest names (the calls' classes under the
        policy, else the exact specs), each with the exact specs it serves
        and their call counts."""
        groups: dict[GraphSpec, dict[GraphSpec, int]] = {}
        for spec, count in (*self.specs.items(), *self.backwards.items()):
            groups.setdefault(class_of(spec, self.shape_classes), {})[spec] = count
        if self.max_batch or self.max_seq:
            route = "graphcache" if self.backend or any(s.layout == "thd" for s in self.specs) else "sdpa"
            inputs = self.inputs()
            for spec in list(self.specs):
                rows = max(1, spec.batch // inputs)
                # From the layouts a larger call of the producer has; each widened spec then named as the
                # calls of its sizes name it (a batch-1 one is the call's own spec again).
                base = spec.replace(**self.wide[spec]) if spec in self.wide else spec
                for long in lengthened(base, self.max_seq) if self.max_seq else [base]:
                    wides = (
                        widened(long, route, self.max_batch, self._windows(spec), rows) if self.max_batch else [long]
                    )
                    for found in wides:
                        wide = found.replace(**settled(_as_called(found, spec)))
                        groups.setdefault(wide, {})
                        if self.training:  # the widened call's training forward and backward too
                            groups.setdefault(_with_stats(wide), {})
                            try:
                                groups.setdefault(backward_of(wide), {})
                            except SpecError:
                                pass  # no backward here: no_backward names the calls
        return groups

    def inputs(self) -> int:
        """The inputs the recording ran, as its calls say: the largest number
        dividing every call's batch. A call's batch is its inputs' rows (one
        prompt a row, a guidance pair two, an image's windows one a window:
        Swin's and SAM's windowed layers run images x windows rows, their
        global or last layers one row an image), so a call of more rows than
        that runs several per input, and ``--max-batch`` widens it by inputs."""
        return math.gcd(*(spec.batch for spec in self.specs)) or 1

    def _windows(self, spec: GraphSpec) -> frozenset[int]:
        """The sliding windows seen on calls of ``spec``'s heads and head dims."""
        like = (spec.heads_q, spec.heads_kv, spec.head_dim, spec.dtype)
        return frozenset(
            s.window_left + 1
            for s in self.specs
            if s.window_left is not None
            and s.window_right == 0
            and (s.heads_q, s.heads_kv, s.head_dim, s.dtype) == like
        )

    def manifest_text(self, source: str = "") -> str:
        """The manifest: ``defaults:`` (fields every spec shares) and one
        ``graphs:`` entry per spec (per class under a class policy), with the
        call counts, the exact shapes each class serves, and the calls that
        cannot be graphs in comments."""
        return manifest_text(self, source)

    def write(self, path: str | Path, source: str = "") -> None:
        text = self.manifest_text(source)
        Path(path).write_text(text)


def _as_called(found: GraphSpec, call: GraphSpec) -> GraphSpec:
    """A widened spec ``found`` at the lengths the recorded ``call`` had,
    where its class takes them: the sizes whose layouts its calls get (a
    call's layouts come from its dims larger than 1, so a first decode step
    of one key names its own layout, which its class at 128 keys would not)."""
    if found.layout == "thd" or not found.is_class:
        return found
    kv, call_kv = found.seq_kv or found.seq_q, call.seq_kv or call.seq_q
    if call.seq_q > found.seq_q or call_kv > kv:
        return found  # lengthened past the call (record --max-seq): its class's own sizes
    return found.replace(shapes="exact", seq_q=call.seq_q, seq_kv=call_kv)


def _with_stats(spec: GraphSpec) -> GraphSpec:
    """The forward a training step calls: writing the stats its backward
    reads (the spec itself where it takes no stats: a sink spec)."""
    try:
        return spec.replace(generate_stats=True)
    except SpecError:
        return spec


def _dtype_name(dtype: Any) -> str | None:
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        name = _DTYPE_NAMES.get(dtype)
        if name is None:
            raise SpecError(f"dtype={dtype} is not supported; allowed: {', '.join(DTYPES)}", "dtype")
        return name
    if dtype not in DTYPES:
        raise SpecError(f"dtype={dtype!r} is not supported; allowed: {', '.join(DTYPES)}", "dtype")
    return str(dtype)


@contextmanager
def record(
    path: str | os.PathLike[str],
    dtype: Any = None,
    shape_classes: str | None = None,
    max_batch: int | None = None,
    backward: bool = False,
    max_seq: int | None = None,
) -> Iterator[Recorder]:
    """Patch torch's SDPA (see patch()), note every call's spec and, when the
    block ends without an exception, write the manifest to ``path``.

    ``dtype`` ("float16" / "bfloat16") records every spec in that dtype: a
    float32 run on a CPU records what the GPU will run. ``shape_classes``
    (``pow2`` / ``exact``; default GRAPHCACHE_SHAPE_CLASSES) decides whether
    the manifest names the calls' classes or their exact specs. ``max_batch``
    widens every call seen to each batch class up to it, unpadded and padded
    (graphcache.models.specs.widened), so a batch-1 recording serves a padded
    batch. ``backward`` records a training step: each call's backward spec
    too, and a call that needs gradients as the stats-writing forward a
    training step calls. ``max_seq`` widens every call seen to each length
    class up to it (graphcache.models.specs.lengthened), so a run at one
    resolution or prompt length serves longer ones. Raises ManifestError
    (and writes nothing) when no call could be a cuDNN graph, or for
    max_batch / max_seq under the exact policy; SettingsError for an unknown
    policy.
    """
    name = _dtype_name(dtype)
    policy = policy_from_env() if shape_classes is None else check_policy(shape_classes, "shape_classes")
    target = Path(path)
    if not target.parent.is_dir():
        raise ManifestError(f"{target}: the folder {target.parent} does not exist; create it or pick another path")
    recorder = Recorder(name, policy, max_batch, backward, max_seq)
    with patch():
        RUNTIME.recorders.append(recorder)
        try:
            yield recorder
        finally:
            if recorder in RUNTIME.recorders:  # reset() inside the block drops it
                RUNTIME.recorders.remove(recorder)
    recorder.write(target)


def run_script(
    script: str,
    args: Sequence[str],
    output: str,
    dtype: str | None = None,
    shape_classes: str | None = None,
    max_batch: int | None = None,
    backward: bool = False,
    max_seq: int | None = None,
) -> Recorder:
    """Run ``script`` as ``python SCRIPT ARGS`` would, under record(output).

    A script that exits non-zero (or raises) writes no manifest: its exit
    status (or exception) passes through.
    """
    path = Path(script)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]  # argv[0] as given, as python SCRIPT leaves it
    sys.path.insert(0, str(path.resolve().parent))  # as python SCRIPT puts the script's folder first
    try:
        with record(output, dtype, shape_classes, max_batch, backward, max_seq) as recorder:
            try:
                # __file__ absolute, as python 3.9+ sets it for a script.
                runpy.run_path(str(path.resolve()), run_name="__main__")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    raise
            except Exception:  # noqa: BLE001 - any error of the script is the script's
                # The script's own error, shown as python would show it (its
                # traceback, exit 1), not as an internal error of graphcache.
                traceback.print_exc()
                raise SystemExit(1) from None
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
    return recorder
