"""The manifest a recording writes (graphcache.torch.recording's
``Recorder``), which ``graphcache warm`` reads unchanged: ``defaults:`` (the
fields every spec shares) and one ``graphs:`` entry per spec (per class
under a class policy), named readably and written as a hand-written one
would be (fields the others imply left out), with comments saying the call
counts, the exact shapes each class serves, what the recording widened and
dropped, the tensors it copied and the calls that cannot be graphs.

May import: graphcache.errors, graphcache.spec, graphcache.torch.core.counts.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any, Protocol

from graphcache.errors import ManifestError
from graphcache.spec import GraphSpec
from graphcache.torch.core.counts import Recent


class Recording(Protocol):
    """What the manifest is written from: a Recorder's records and settings."""

    dtype: str | None
    shape_classes: str
    max_batch: int | None
    max_seq: int | None
    training: bool
    specs: Recent[GraphSpec, int]
    backwards: Recent[GraphSpec, int]
    ineligible: Recent[tuple[str, str], int]
    no_backward: Recent[tuple[str, str], int]
    copied: dict[tuple[str, str], int]

    def graphs(self) -> dict[GraphSpec, dict[GraphSpec, int]]: ...

    def calls(self) -> int: ...

    def dropped(self) -> dict[str, int]: ...


def manifest_text(recorder: Recording, source: str = "") -> str:
    """The manifest: ``defaults:`` (fields every spec shares) and one
    ``graphs:`` entry per spec (per class under a class policy), with the
    call counts, the exact shapes each class serves, and the calls that
    cannot be graphs in comments."""
    import yaml

    if not recorder.specs:
        raise ManifestError(nothing_message(recorder))
    groups = recorder.graphs()
    rows = [_fields(spec) for spec in groups]
    shared = {name: value for name, value in rows[0].items() if all(name in r and r[name] == value for r in rows[1:])}
    if len(rows) == 1:  # one graph: keep its fields in the entry, defaults just the dtype
        shared = {"dtype": rows[0]["dtype"]}
    names: set[str] = set()
    graphs = []
    classes = sum(spec.is_class for spec in groups)
    lines = [
        f"# Recorded by graphcache.torch.record{' from ' + source if source else ''} on "
        f"{_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}:",
        f"# {recorder.calls()} SDPA call(s); {len(recorder.specs)} distinct cuDNN graph spec(s)"
        + (f", served by {len(groups)} graph(s) under shape classes {recorder.shape_classes}." if classes else "."),
    ]
    if recorder.dtype:
        lines.append(f"# Specs are recorded as {recorder.dtype}, whatever dtype the recording run used.")
    dropped = recorder.dropped()
    if dropped:
        lines.append(
            "# The recording keeps the most recent "
            f"{recorder.specs.limit} distinct specs and {recorder.ineligible.limit} reasons; it dropped the oldest: "
            + ", ".join(f"{n} {name}" for name, n in dropped.items())
            + " (their graphs are not in this manifest: record a shorter run, or merge recordings)."
        )
    if recorder.training:
        lines.append(
            f"# A training step (graphcache record --backward): {len(recorder.backwards)} backward spec(s) "
            "(kind: backward) of the calls, and the forward of a call that needs gradients with the stats "
            "its backward reads (generate_stats: true)."
        )
    if recorder.max_batch:
        lines.append(
            f"# Widened to batches up to {recorder.max_batch} (graphcache record --max-batch): each call's shape "
            "in every batch class, unpadded and padded, by inputs (a call of several rows per input, an "
            "image's windows, at that many rows for each number of inputs); entries of 0 calls were not seen."
        )
    if recorder.max_seq:
        lines.append(
            f"# Widened to lengths up to {recorder.max_seq} (graphcache record --max-seq): each call's shape in "
            "every length class (queries and keys together where the call had as many of each, else each "
            "side to every class); entries of 0 calls were not seen."
        )
    for spec, served in groups.items():
        name = _name(spec, names)
        lines.append(f"#   {name}: {sum(served.values())} call(s)")
        if spec.is_class:
            runs = _runs(served)
            lines.append(f"#     serves {len(served)} exact shape(s) (calls each):")
            lines += ["#       " + ", ".join(runs[i : i + 6]) for i in range(0, len(runs), 6)]
        graphs.append({"name": name, **{k: v for k, v in _fields(spec).items() if k not in shared}})
    if recorder.copied:
        lines.append("# Tensors copied per call into a layout a graph reads (graphcache.torch.derive), by reason:")
        for (role, reason), count in sorted(recorder.copied.items()):
            lines.append(f"#   {role} {reason}: {count} call(s)")
    if recorder.ineligible:
        lines.append("# Calls that cannot be cuDNN graphs (they run torch's SDPA), by reason:")
        for (code, message), count in sorted(recorder.ineligible.items()):
            lines.append(f"#   {code}: {count} call(s): {message}")
    if recorder.no_backward:
        lines.append("# Calls with no backward graph (their backward runs torch's), by field:")
        for (code, message), count in sorted(recorder.no_backward.items()):
            lines.append(f"#   {code}: {count} call(s): {message}")
    body = yaml.safe_dump({"defaults": shared, "graphs": graphs}, sort_keys=False, default_flow_style=False)
    return "\n".join(lines) + "\n" + body


def nothing_message(recorder: Recording) -> str:
    """Why a recording names no graph: no SDPA call was made, or why none could be one."""
    if not recorder.ineligible:
        return (
            "no scaled_dot_product_attention call was made while recording: is the model's attention "
            'implementation "sdpa" (Hugging Face: attn_implementation="sdpa")?'
        )
    reasons = "; ".join(f"{code} ({n} call(s)): {msg}" for (code, msg), n in sorted(recorder.ineligible.items()))
    return f"none of the {recorder.calls()} SDPA call(s) can be a cuDNN graph: {reasons}"


_IMPLIED = {"generate_stats": False, "padding": False, "dropout": 0.0, "window_left": None, "window_right": None}


def _fields(spec: GraphSpec) -> dict[str, Any]:
    """The spec's fields, less those its other fields imply (so the manifest
    reads like a hand-written one and expands back to the same spec)."""
    data = spec.to_dict()
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in _IMPLIED and value == _IMPLIED[name]:
            continue
        if (name, value) in (("heads_kv", spec.heads_q), ("seq_kv", spec.seq_q), ("head_dim_v", spec.head_dim)):
            continue
        if name == "attn_scale" and value == 1.0 / math.sqrt(spec.head_dim):
            continue
        out[name] = value
    return out


def _runs(served: dict[GraphSpec, int]) -> list[str]:
    """Exact shapes as text, consecutive seq_kv of one (batch, seq_q, calls)
    folded into a range: a decode run reads ``b1 q1 kv38-100 x2``."""
    rows = sorted((s.batch, s.seq_q, s.seq_kv or 0, n) for s, n in served.items())
    runs: list[list[int]] = []
    for b, q, kv, n in rows:
        last = runs[-1] if runs else None
        if last is not None and (last[0], last[1], last[4]) == (b, q, n) and last[3] == kv - 1:
            last[3] = kv
        else:
            runs.append([b, q, kv, kv, n])
    return [f"b{b} q{q} kv{lo}" + (f"-{hi}" if hi != lo else "") + f" x{n}" for b, q, lo, hi, n in runs]


def _name(spec: GraphSpec, taken: set[str]) -> str:
    """A readable unique name: ``b1-h8kv2-q1kv21-d32-bf16-bhsd-none``."""
    parts = [
        f"b{spec.batch}",
        f"h{spec.heads_q}" + (f"kv{spec.heads_kv}" if spec.heads_kv != spec.heads_q else ""),
        f"q{spec.seq_q}" + (f"kv{spec.seq_kv}" if spec.seq_kv != spec.seq_q else ""),
        f"d{spec.head_dim}" + (f"v{spec.head_dim_v}" if spec.head_dim_v != spec.head_dim else ""),
        *spec.summary().split()[4:],  # dtype, layout, mask and flags as summary() writes them
    ]
    base = re.sub(r"[^A-Za-z0-9_.]+", "-", "-".join(parts)).strip("-")
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name
