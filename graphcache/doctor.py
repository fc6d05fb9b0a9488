"""``graphcache doctor``: what this machine has and what graphcache can do here."""

from __future__ import annotations

import platform
from typing import Any

from graphcache.spec import GraphSpec

TYPICAL = GraphSpec(batch=1, heads_q=32, seq_q=1024, head_dim=128, dtype="float16", mask="causal")


def diagnose(spec: GraphSpec | None = None) -> dict[str, Any]:
    """Rows of (check, finding) and verdict lines. Never raises for a missing piece."""
    spec = spec or TYPICAL
    rows: list[tuple[str, str]] = [("python", platform.python_version()), ("spec", spec.summary())]
    verdict: list[str] = []
    torch: Any
    try:
        import torch
    except ImportError:
        torch = None
    rows.append(("torch", torch.__version__ if torch else "not installed"))
    try:
        import cudnn  # type: ignore[import-not-found]

        fe = cudnn.__version__
    except ImportError:
        cudnn, fe = None, "not installed"
    rows.append(("cudnn-frontend", fe))
    backend = "unknown"
    if cudnn is not None:
        try:
            backend = cudnn.backend_version_string()
        except Exception as exc:  # noqa: BLE001 - runtime missing raises RuntimeError
            backend = f"runtime not found ({str(exc).splitlines()[0][:80]})"
    rows.append(("cuDNN", backend))
    gpu = torch is not None and torch.cuda.is_available()
    if gpu:
        major, minor = torch.cuda.get_device_capability(0)
        rows.append(("GPU", f"{torch.cuda.get_device_name(0)} (compute capability {major}.{minor})"))
        from graphcache.target import Target

        try:
            rows.append(("target", str(Target.detect())))
        except Exception as exc:  # noqa: BLE001 - say why, keep going
            rows.append(("target", f"unknown: {exc}"))
    else:
        rows.append(("GPU", "none (no CUDA device visible to torch)"))
    rows.append(("torch SDPA backends", ", ".join(_sdpa_backends(torch, spec, gpu)) or "none"))
    if gpu and cudnn is not None:
        verdict.append("This machine can build, serve and load cuDNN graphs (graphcache warm / build).")
    elif gpu:
        verdict.append("GPU found but no cudnn-frontend: pip install 'graphcache[gpu]' to build graphs.")
    else:
        verdict.append(
            "No GPU: this machine can serve the cache, check coverage (warm --check --target T) "
            "and fetch artifacts for another target, but cannot build or run cuDNN graphs."
        )
    if torch is not None and not gpu:
        verdict.append("torch SDPA runs here on the CPU (math backend) as a fallback.")
    return {"rows": rows, "verdict": verdict}


def _sdpa_backends(torch: Any, spec: GraphSpec, gpu: bool) -> list[str]:
    if torch is None:
        return []
    if not gpu:
        return ["math (CPU)"]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from graphcache.compilers.torch_sdpa import torch_dtype

    found = []
    small = spec.replace(batch=1, seq_q=min(spec.seq_q, 256), seq_kv=min(spec.seq_kv or spec.seq_q, 256))
    dtype = torch_dtype(spec)
    q = torch.randn(small.dims("q"), device="cuda", dtype=dtype)
    k = torch.randn(small.dims("k"), device="cuda", dtype=dtype)
    v = torch.randn(small.dims("v"), device="cuda", dtype=dtype)
    causal = spec.mask == "causal"
    for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("mem-efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("math", SDPBackend.MATH),
    ):
        try:
            with sdpa_kernel(backend):
                torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=causal, enable_gqa=spec.heads_q != spec.heads_kv
                )
            found.append(name)
        except Exception:  # noqa: BLE001 - "cannot serve" is the answer we want
            continue
    return found
