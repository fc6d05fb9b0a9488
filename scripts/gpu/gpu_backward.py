#!/usr/bin/env python3
"""SDPA backward graphs on this GPU: what only a GPU answers (issue 42 item 2's review).

1. ``build``: each backward spec of a spread (fp16 / bf16, GQA, MHA, bshd / bhsd,
   causal up to 8192, bottom-right, window, bias, padding, class) through a fresh
   GraphCache: built (dialect chain, plans, serialize, round trip, the check
   against the float32 reference's gradients), refused (cuDNN's verdict), or
   failed; its engine, gradient errors against the tolerance, whether two runs
   at build gave the same bits; then a warm load (deserialize, canary).
2. ``determinism``: a few loaded exact plans, each run 20 times on one input:
   how many distinct dQ / dK / dV bit patterns (cuDNN's backward is not
   deterministic unless ``use_deterministic_algorithm``: dQ accumulates in
   float32 workspace across key tiles, v1.23.0 scaled_dot_product_flash_attention.h).
3. ``stats``: what ``aten::_scaled_dot_product_cudnn_attention`` returns as
   logsumexp against the natural-log log-sum-exp of the scaled scores in
   float32 (and against the base-2 one), and graphcache's own cuDNN forward's
   stats against its reference's.
4. ``door``: the aten forward's (out, logsumexp) fed to graphcache's backward
   plan (``graphcache.torch.backward.sdpa_backward``) against aten's own cuDNN
   backward and float64 autograd.
5. ``padded_inf``: a padded backward plan fed stats of -inf on the padded rows
   (what cuDNN >= 9.14's forward writes there) instead of the reference's 0.

    python scripts/gpu/gpu_backward.py [--json OUT] [--only build,stats,...]

Each part prints one line per case and never stops the others. Without a GPU
it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import GraphCache, GraphSpec  # noqa: E402
from graphcache.errors import GraphCacheError, NotSerializable, UnsupportedSpec  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

BASE = dict(batch=2, heads_q=8, heads_kv=2, seq_q=256, head_dim=64, kind="backward")
CASES: dict[str, dict[str, Any]] = {
    "fp16-gqa-causal": dict(dtype="float16", mask="causal"),
    "bf16-gqa-causal": dict(dtype="bfloat16", mask="causal"),
    "bf16-mha-bhsd": dict(dtype="bfloat16", heads_kv=8, layout="bhsd"),
    "bf16-mqa-d128": dict(dtype="bfloat16", heads_kv=1, head_dim=128, seq_q=200),
    "bf16-long-causal": dict(dtype="bfloat16", mask="causal", seq_q=2048, head_dim=128),
    "bf16-8k-causal": dict(dtype="bfloat16", mask="causal", seq_q=8192, head_dim=128, batch=1),
    "fp16-8k-causal": dict(dtype="float16", mask="causal", seq_q=8192, head_dim=128, batch=1),
    "fp16-bottom-right": dict(dtype="float16", mask="causal_bottom_right", seq_q=128, seq_kv=320),
    "bf16-window": dict(dtype="bfloat16", mask="sliding_window", window_left=63),
    "bf16-bias": dict(dtype="bfloat16", bias="b1ss"),
    "bf16-padded-causal": dict(dtype="bfloat16", mask="causal", padding=True),
    "bf16-class-causal": dict(dtype="bfloat16", mask="causal", shapes="class"),
    "fp16-class": dict(dtype="float16", shapes="class", batch=4, seq_q=512),
    "bf16-s1": dict(dtype="bfloat16", seq_q=1, seq_kv=1),
}


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"


DEVICE = "cuda"
COMPILER: Any = None  # --cpu-dry-run: "reference", to walk this script's code on a CPU


def _compiler() -> Any:
    if COMPILER is not None:
        return COMPILER
    from graphcache.compilers.cudnn import CudnnCompiler

    return CudnnCompiler()


def build(root: Path) -> list[dict[str, Any]]:
    rows = []
    compiler = _compiler()
    for name, fields in CASES.items():
        row: dict[str, Any] = {"case": name}
        try:
            spec = GraphSpec(**{**BASE, **fields})
            row["spec"] = spec.summary()
            cold = GraphCache(DiskStore(root / name), compiler, shape_classes="exact")
            start = time.perf_counter()
            artifact = cold.get(spec)
            row.update(
                status="built",
                cold_s=round(time.perf_counter() - start, 3),
                engine=artifact.runtime.get("engine"),
                errors=artifact.runtime.get("gradient_errors"),
                validation_error=artifact.validation_error,
                workspace=artifact.workspace_size,
            )
            warm = GraphCache(DiskStore(root / name), compiler, shape_classes="exact")
            start = time.perf_counter()
            warm.load(spec)
            row.update(status="served", warm_s=round(time.perf_counter() - start, 3))
        except UnsupportedSpec as exc:
            kind = "not serializable" if isinstance(exc, NotSerializable) else "unsupported"
            row.update(status="refused", why=f"{kind} at {getattr(exc, 'step', '?')}: {_why(exc)}")
        except GraphCacheError as exc:
            row.update(status=row.get("status", "failed") + "/failed", why=_why(exc))
        except Exception as exc:  # noqa: BLE001 - a probe: say what happened, go on
            row.update(status="crashed", why=_why(exc), trace=traceback.format_exc()[-1500:])
        print("build", json.dumps(row, default=str), flush=True)
        rows.append(row)
    return rows


def _digest(t: Any) -> str:
    import hashlib

    import torch

    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()).hexdigest()[:16]


DETERMINISM = {
    "bf16-long-causal": dict(dtype="bfloat16", mask="causal", seq_q=2048, head_dim=128, batch=4),
    "fp16-bottom-right": dict(dtype="float16", mask="causal_bottom_right", seq_q=128, seq_kv=320),
    "bf16-gqa-causal": dict(dtype="bfloat16", mask="causal"),
    "bf16-mqa-1k": dict(dtype="bfloat16", heads_kv=1, seq_q=1024, head_dim=128),
}


def determinism(root: Path, runs: int = 20) -> dict[str, Any]:
    from graphcache.reference.backward import backward_inputs

    rows: dict[str, Any] = {}
    for name, fields in DETERMINISM.items():
        try:
            spec = GraphSpec(**{**BASE, **fields})
            cache = GraphCache(DiskStore(root / f"det-{name}"), _compiler(), shape_classes="exact")
            graph = cache.load(spec)
            feed = backward_inputs(spec, DEVICE, seed=3)
            seen: dict[str, set[str]] = {"dq": set(), "dk": set(), "dv": set()}
            for _ in range(runs):
                for grad, g in zip(("dq", "dk", "dv"), graph.execute(**feed), strict=True):
                    seen[grad].add(_digest(g))
            rows[name] = {"spec": spec.summary(), "runs": runs, **{f"distinct_{k}": len(v) for k, v in seen.items()}}
        except Exception as exc:  # noqa: BLE001
            rows[name] = {"error": _why(exc)}
        print("determinism", name, json.dumps(rows[name]), flush=True)
    return rows


def stats() -> dict[str, Any]:
    import math

    import torch

    row: dict[str, Any] = {}
    torch.manual_seed(0)
    b, h, s, d = 2, 8, 300, 64
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    for causal in (False, True):
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        lse = out[1]
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
        if causal:
            scores = scores.masked_fill(torch.ones(s, s, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        ln = torch.logsumexp(scores, dim=-1, keepdim=True)
        row[f"causal={causal}"] = {
            "lse_shape": list(lse.shape),
            "lse_stride": list(lse.stride()),
            "lse_dtype": str(lse.dtype),
            "max_abs_vs_natural_log": float((lse.reshape(ln.shape) - ln).abs().max()),
            "max_abs_vs_log2": float((lse.reshape(ln.shape) - ln / math.log(2)).abs().max()),
        }
    try:  # graphcache's own cuDNN forward with stats against its reference's
        from graphcache.reference.dense import random_inputs, reference

        spec = GraphSpec(batch=2, heads_q=8, heads_kv=2, seq_q=300, head_dim=64, dtype="bfloat16", mask="causal")
        spec = spec.replace(generate_stats=True)
        graph = GraphCache(DiskStore(Path(tempfile.mkdtemp()) / "fwd"), _compiler(), shape_classes="exact").load(spec)
        feed = random_inputs(spec, "cuda", seed=5)
        result = graph.execute(**feed)
        ours = result[1] if isinstance(result, tuple) else None
        _, ref = reference(spec, **feed)
        row["graphcache_forward_stats_max_abs"] = None if ours is None else float((ours.float() - ref).abs().max())
    except Exception as exc:  # noqa: BLE001
        row["graphcache_forward_stats"] = _why(exc)
    print("stats", json.dumps(row), flush=True)
    return row


def door(root: Path) -> dict[str, Any]:
    import torch

    import graphcache.torch as gt
    from graphcache.torch.backward import sdpa_backward

    row: dict[str, Any] = {}
    gt.reset()
    try:
        gt.configure(GraphCache(DiskStore(root / "door"), _compiler()), on_miss="build")
        for causal in (False, True):
            torch.manual_seed(1)
            q, k, v = (
                torch.randn(2, 200, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)
            )
            prims = [t.detach().requires_grad_() for t in (q, k, v)]  # aten's own cuDNN backward, through autograd
            res = torch.ops.aten._scaled_dot_product_cudnn_attention(*prims, None, True, 0.0, causal, False)
            out, lse = res[0], res[1]
            grad_out = torch.randn_like(out)
            aten = torch.autograd.grad(out, prims, grad_out)
            ours = sdpa_backward(grad_out, q, k, v, out.detach(), lse.detach(), is_causal=causal)
            leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
            torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal).backward(grad_out.double())

            def rel(a: Any, b: Any) -> float:
                return float((a.double() - b.double()).norm() / b.double().norm())

            row[f"causal={causal}"] = {
                "ours_vs_f64": [rel(o, leaf.grad) for o, leaf in zip(ours, leaves, strict=True)],
                "aten_vs_f64": [rel(a, leaf.grad) for a, leaf in zip(aten, leaves, strict=True)],
                "ours_vs_aten": [rel(o, a) for o, a in zip(ours, aten, strict=True)],
                "strides_match": [o.stride() == t.stride() for o, t in zip(ours, (q, k, v), strict=True)],
            }
        row["stats"] = gt.stats()["backward"]
    except Exception as exc:  # noqa: BLE001
        row["error"] = _why(exc)
        row["trace"] = traceback.format_exc()[-1500:]
    finally:
        gt.reset()
    print("door", json.dumps(row, default=str), flush=True)
    return row


def padded_inf(root: Path) -> dict[str, Any]:
    import torch

    from graphcache.reference.backward import backward_inputs, gradient_errors

    spec = GraphSpec(**{**BASE, "dtype": "bfloat16", "mask": "causal", "padding": True})
    row: dict[str, Any] = {"spec": spec.summary()}
    try:
        graph = GraphCache(DiskStore(root / "padded"), _compiler(), shape_classes="exact").load(spec)
        feed = backward_inputs(spec, DEVICE, seed=7)
        lengths = feed["seq_len_q"].reshape(-1).tolist()
        row["seq_len_q"] = lengths
        stats = feed["stats"].clone()
        for n, length in enumerate(lengths):
            stats[n, :, int(length) :] = float("-inf")
        zero = gradient_errors(spec, graph.execute(**feed), feed)
        grads = graph.execute(**{**feed, "stats": stats})
        row["errors_stats_zero"] = zero
        row["errors_stats_neginf"] = gradient_errors(spec, grads, feed)
        row["finite_neginf"] = [bool(torch.isfinite(g).all()) for g in grads]
    except Exception as exc:  # noqa: BLE001
        row["error"] = _why(exc)
    print("padded_inf", json.dumps(row, default=str), flush=True)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", default="build,determinism,stats,door,padded_inf")
    parser.add_argument(
        "--cpu-dry-run", action="store_true", help="build, determinism, padded_inf on the reference compiler"
    )
    args = parser.parse_args()
    if args.cpu_dry_run:
        global DEVICE, COMPILER
        DEVICE, COMPILER = "cpu", "reference"
    try:
        import torch

        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu and not args.cpu_dry_run:
        print("no GPU here: scripts/gpu/gpu_backward.py answers what only a GPU can; nothing run")
        return 0
    import torch

    env = {
        "torch": torch.__version__,
        "cudnn_torch": torch.backends.cudnn.version(),
        "gpu": gpu and torch.cuda.get_device_name(),
    }
    try:
        import cudnn

        env.update(frontend=cudnn.__version__, cudnn_backend=cudnn.backend_version())
    except Exception as exc:  # noqa: BLE001
        env["cudnn"] = _why(exc)
    print("env", json.dumps(env), flush=True)
    root = Path(tempfile.mkdtemp(prefix="gc-bw-"))
    parts = {"build": build, "determinism": determinism, "stats": stats, "door": door, "padded_inf": padded_inf}
    results: dict[str, Any] = {"env": env}
    for name in args.only.split(","):
        try:
            fn = parts[name]
            results[name] = fn() if name == "stats" else fn(root)
        except Exception as exc:  # noqa: BLE001
            results[name] = {"error": _why(exc), "trace": traceback.format_exc()[-1500:]}
            print(name, json.dumps(results[name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
