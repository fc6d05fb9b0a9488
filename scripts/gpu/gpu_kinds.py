#!/usr/bin/env python3
"""Each kind of graph on this machine: built, served or refused and why,
with the cold build against the warm load, as one table. Run by
scripts/gpu/gpu_check.sh; not yet run on a GPU.

For each kind (dense, class, bias, softcap, ragged, paged, issue 40's
tensor layouts: sequence-first, a fused projection's views, a prompt's q
beside the cache, gpt_bigcode's row, a sequence-first class; issue 43's
float32 bias and bias with seq_q > seq_kv) one spec (--only picks some):
- a kind this tree cannot express (the spec field is not there yet, or is
  refused) reads "not supported by this tree" with the spec's own error;
- on a GPU, a fresh GraphCache over an empty DiskStore builds it (the cold
  build: dialect chain, plans, serialize, round trip, reference check) and
  says built, or refused (a negative entry: UnsupportedSpec or
  NotSerializable, with cuDNN's reason), or failed (BuildError: this host);
  then a new GraphCache over the same store loads it --repeat times (the
  warm load: fetch, verify, deserialize, canary) and says served when the
  cuDNN graph came back;
- without a GPU, whether the real frontend declares the kind's graph
  (``validate()``, what a CPU can run), and "not built: no GPU".

    python scripts/gpu/gpu_kinds.py [--cache-dir DIR] [--json OUT] [--repeat 3] [--kind NAME=field=v,field=v]
                                    [--only NAME,NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import GraphCache, GraphSpec  # noqa: E402
from graphcache.errors import GraphCacheError, NoGpu, NotSerializable, UnsupportedSpec  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

_LLAMA = dict(heads_q=32, heads_kv=8, head_dim=128, dtype="bfloat16")
# One spec per kind of graph, the shapes a Llama-style decoder serves.
KINDS: dict[str, dict[str, Any]] = {
    "dense": dict(_LLAMA, batch=2, seq_q=512, mask="causal"),
    "class": dict(_LLAMA, batch=4, seq_q=1, seq_kv=1024, shapes="class"),
    "bias": dict(_LLAMA, batch=2, seq_q=256, bias="b1ss"),  # a padded batch's mask as a bias (issue 25)
    "softcap": dict(_LLAMA, batch=2, seq_q=256, mask="causal", softcap=30.0),  # Gemma 2's tanh capping (issue 25)
    "ragged": dict(_LLAMA, batch=4, seq_q=512, layout="thd", mask="causal_bottom_right"),
    "paged": dict(_LLAMA, batch=4, seq_q=1, layout="thd", page_size=64, num_pages=64, pages_per_seq=16),
    # Issue 40: each tensor in the layout real code hands torch (graphcache/spec/layouts.py).
    "mha-sbhd": dict(batch=4, heads_q=8, seq_q=256, head_dim=64, dtype="bfloat16", layout="sbhd"),
    "vit-fused": dict(batch=4, heads_q=3, seq_q=197, head_dim=64, dtype="bfloat16", layout="bs[3]hd"),
    "hf-prefill": dict(_LLAMA, batch=2, seq_q=512, mask="causal", layout="bhsd", layout_q="bshd"),
    "bigcode-mqa": dict(_LLAMA, heads_kv=1, batch=4, seq_q=256, bias="b1ss", layout_q="bs[+2]hd"),
    "class-sbhd": dict(batch=4, heads_q=8, seq_q=256, head_dim=64, dtype="bfloat16", layout="sbhd", shapes="class"),
    # Issue 43, question 4: what CPU checks cannot settle. A float32 bias beside bf16 q/k/v (a float32 mask,
    # kept in its precision), and a bias graph with more queries than keys (a chunk of prompt over a shorter cache).
    "bias-fp32": dict(_LLAMA, batch=2, seq_q=256, bias="b1ss", bias_dtype="float32"),
    "bias-q>kv": dict(_LLAMA, batch=2, seq_q=512, seq_kv=128, bias="1hss"),
}


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def spec_of(fields: dict[str, Any]) -> GraphSpec | str:
    """The kind's spec, or why this tree cannot express it."""
    try:
        return GraphSpec.from_dict(dict(fields))
    except (GraphCacheError, TypeError, ValueError) as exc:
        return _why(exc)


def on_gpu(name: str, spec: GraphSpec, root: Path, repeat: int, compiler: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": name, "spec": spec.summary()}
    store = DiskStore(root / name)
    cold = GraphCache(store, compiler, shape_classes="exact")
    start = time.perf_counter()
    try:
        artifact, _ = cold.ensure(spec)
    except UnsupportedSpec as exc:  # NotSerializable is one: a negative entry, stored
        kind = "not serializable" if isinstance(exc, NotSerializable) else "unsupported"
        return {**row, "status": "refused", "why": f"{kind} at {exc.step}: {_why(exc)}"}
    except GraphCacheError as exc:  # BuildError and the rest: this host, never stored
        return {**row, "status": "failed", "why": _why(exc)}
    row.update(
        status="built",
        cold_s=time.perf_counter() - start,
        build_s=artifact.build_seconds,
        engine=artifact.runtime.get("engine"),
        behavior_notes=artifact.runtime.get("behavior_notes"),
        validation_error=artifact.validation_error,
        lse_error=artifact.runtime.get("lse_error"),
    )
    warm = []
    for _ in range(repeat):
        cache = GraphCache(store, compiler, shape_classes="exact")
        start = time.perf_counter()
        try:
            graph = cache.load(spec, build=False)
        except GraphCacheError as exc:
            return {**row, "status": "built, not served", "why": _why(exc)}
        warm.append(time.perf_counter() - start)
    row.update(status="served", backend=getattr(graph, "backend", "?"), warm_s=statistics.median(warm))
    return row


def on_cpu(name: str, spec: GraphSpec, why_no_gpu: str) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": name, "spec": spec.summary(), "status": "not built: no GPU", "no_gpu": why_no_gpu}
    try:
        import cudnn  # type: ignore[import-not-found]

        from graphcache.compilers.cudnn import build_graph

        build_graph(cudnn, spec, lower=False)
    except ImportError as exc:
        row["declared"] = f"not checked: {_why(exc)}"
    except (GraphCacheError, RuntimeError, TypeError, ValueError) as exc:
        row["declared"] = f"refused on this CPU: {_why(exc)}"
    else:
        row["declared"] = f"validate() passes (cudnn-frontend {cudnn.__version__}, on this CPU)"
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'kind':11} {'status':22} {'cold build':>11} {'warm load':>10} {'ratio':>7}  spec / why"]
    for r in rows:
        cold, warm = r.get("cold_s"), r.get("warm_s")
        times = (
            f"{cold * 1e3:>9.1f}ms {warm * 1e3:>8.2f}ms {cold / warm:>6.0f}x"
            if cold and warm
            else f"{'-':>11} {'-':>10} {'-':>7}"
        )
        detail = r.get("spec", "")
        extra = r.get("why") or (
            f"engine {r.get('engine')}, error {r.get('validation_error')}" if "engine" in r else ""
        )
        lines.append(f"{r['kind']:11} {r['status']:22} {times}  {detail}")
        if extra:
            lines.append(f"{'':11} {extra}")
        if r.get("declared"):
            lines.append(f"{'':11} declared: {r['declared']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", default=None, help="where the per-kind stores go (default: a temporary folder)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeat", type=int, default=3, help="warm loads per kind (the median is shown)")
    parser.add_argument(
        "--kind", action="append", default=[], metavar="NAME=field=v,...", help="replace or add a kind's spec"
    )
    parser.add_argument("--only", default=None, metavar="NAME,...", help="these kinds only (after --kind)")
    args = parser.parse_args(argv)
    kinds = dict(KINDS)
    for item in args.kind:
        name, _, fields = item.partition("=")
        kinds[name] = _fields(fields)
    if args.only:
        wanted = [n for n in args.only.split(",") if n]
        unknown = [n for n in wanted if n not in kinds]
        if unknown:
            parser.error(f"--only: no kind {', '.join(unknown)} (kinds: {', '.join(kinds)})")
        kinds = {n: kinds[n] for n in wanted}
    root = Path(args.cache_dir or tempfile.mkdtemp(prefix="gpu-kinds-"))
    compiler: Any = None
    why_no_gpu = ""
    try:
        from graphcache.compilers.cudnn import CudnnCompiler

        compiler = CudnnCompiler()
        print(f"target {compiler.target()}", flush=True)
    except (GraphCacheError, ImportError, RuntimeError) as exc:
        compiler, why_no_gpu = None, _why(exc if isinstance(exc, GraphCacheError) else NoGpu(str(exc)))
        print(f"no GPU here ({why_no_gpu}): what each kind declares on this CPU", flush=True)
    rows = []
    for name, fields in kinds.items():
        spec = spec_of(fields)
        if isinstance(spec, str):
            rows.append({"kind": name, "status": "not supported by this tree", "why": spec})
        elif compiler is None:
            rows.append(on_cpu(name, spec, why_no_gpu))
        else:
            rows.append(on_gpu(name, spec, root, args.repeat, compiler))
        print(f"{name}: {rows[-1]['status']}", flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": compiler is not None, "kinds": rows}, indent=2, default=str))
    return 0


def _fields(text: str) -> dict[str, Any]:
    """``batch=2,seq_q=512,mask=causal`` as a dict, numbers and booleans read as such."""
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false", "null") else value
    return out


if __name__ == "__main__":
    sys.exit(main())
