"""``graphcache doctor``: what this machine has and what graphcache can do here."""

from __future__ import annotations

import platform
from typing import Any

from graphcache.spec import GraphSpec

TYPICAL = GraphSpec(batch=1, heads_q=32, seq_q=1024, head_dim=128, dtype="float16", mask="causal")
# What a missing cuDNN runtime means, for the cuDNN row.
NO_RUNTIME = (
    "cudnn-frontend is only the Python side; the cuDNN library (libcudnn) it calls did not load. "
    "Only building and running cuDNN graphs need it, on a CUDA GPU: pip install nvidia-cudnn-cu12 "
    "(nvidia-cudnn-cu13 for CUDA 13), or use a CUDA build of torch, which ships one. Serving, "
    "warm --check, prefetch and --compiler reference work without it"
)
# torch's SDPBackend names, as the backend rows name them.
SHORT = {"flash_attention": "flash", "efficient_attention": "efficient", "cudnn_attention": "cudnn", "math": "math"}


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
            backend = f"runtime not found ({str(exc).splitlines()[0][:80]}): see below"
            verdict.append(f"cuDNN runtime not found: {NO_RUNTIME}.")
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
        seen = (
            "no CUDA device visible to torch"
            if torch is not None
            else "torch is not installed: pip install 'graphcache[gpu]'"
        )
        rows.append(("GPU", f"none ({seen})"))
        # A cuDNN target is a GPU's (its name, SMs, cuDNN): none to print here.
        rows.append(
            ("target", f"none here: {'no CUDA device visible to torch' if torch else 'torch is not installed'}")
        )
    rows.append(("reference target", _reference_target(torch is not None)))
    rows.extend(_sdpa_backends(torch, spec, gpu))
    if gpu and cudnn is not None:
        verdict.append("This machine can build, serve and load cuDNN graphs (graphcache warm / build).")
    elif gpu:
        verdict.append("GPU found but no cudnn-frontend: pip install 'graphcache[gpu]' to build graphs.")
    else:
        verdict.append(
            "No GPU: this machine can serve the cache, check coverage (warm --check --target T) "
            "and fetch artifacts for another target, but cannot build or run cuDNN graphs."
        )
        verdict.append(
            "No cuDNN target here: a target (GPU-smXY-mpN-cudnnX.Y.Z-feX.Y.Z) names a GPU, its multiprocessor "
            "count and its cuDNN; run graphcache doctor on a serving GPU host and pass what it prints as --target. "
            "The reference target above is the one --compiler reference builds for and checks on this machine."
        )
    if torch is not None and not gpu:
        verdict.append(
            "torch SDPA runs here on the CPU, as the fallback and as the reference compiler's plans "
            "(graphcache warm --compiler reference: README, 'Try it without a GPU'); its choice is in the rows above."
        )
    return {"rows": rows, "verdict": verdict}


def _reference_target(torch: bool) -> str:
    """The reference compiler's target row: what --compiler reference builds for on any machine."""
    from graphcache.compilers.reference import TARGET, ReferenceCompiler

    target = ReferenceCompiler().target()
    standing = "" if target == TARGET else ", standing in for that cuDNN (GRAPHCACHE_REFERENCE_CUDNN / _FRONTEND)"
    if torch:
        return f"{target} (what --compiler reference builds for, here on the CPU{standing}; no GPU has it)"
    return (
        f"{target} (--compiler reference{standing}: warm --check, prefetch and explain need nothing more; "
        "its builds need torch)"
    )


def _sdpa_backends(torch: Any, spec: GraphSpec, gpu: bool) -> list[tuple[str, str]]:
    """One row per torch SDPA backend: can it serve ``spec`` here, and if not,
    why, in torch's own words (its ``can_use_*`` checks with debug=True)."""
    if torch is None:
        return [("torch SDPA backends", "none: torch is not installed")]
    import warnings

    from graphcache.reference.dense import allowed_mask, torch_dtype

    device = "cuda" if gpu else "cpu"
    small = spec.replace(batch=1, seq_q=min(spec.seq_q, 256), seq_kv=min(spec.seq_kv or spec.seq_q, 256))
    dtype = torch_dtype(spec)
    q, k, v = (torch.randn(small.dims(role), device=device, dtype=dtype) for role in ("q", "k", "v"))
    causal = small.mask == "causal"
    mask = None if small.mask in ("none", "causal") else allowed_mask(small, device=device)
    gqa = small.heads_q != small.heads_kv
    cuda = torch.backends.cuda
    checks = (
        ("flash", "can_use_flash_attention", "flash_sdp_enabled"),
        ("efficient", "can_use_efficient_attention", "mem_efficient_sdp_enabled"),
        ("cudnn", "can_use_cudnn_attention", "cudnn_sdp_enabled"),
    )
    picked = _picked(torch, q, k, v, mask, small.dropout, causal, gqa)
    rows: list[tuple[str, str]] = []
    verdicts: list[str] = []
    for name, check, enabled in checks:
        cpu_kernel = not gpu and name == "flash"  # torch has a CPU flash-attention kernel, under the same name
        if not getattr(cuda, enabled)():
            finding = f"no: turned off (torch.backends.cuda.{enabled}() is False)"
        elif cpu_kernel and picked == "flash":
            finding = "yes: torch's CPU flash-attention kernel (the CUDA one needs a GPU)"
        elif not gpu:
            build = "a CPU build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            on_cpu = f"torch's CPU kernel does not take this call, torch picks {picked}; " if cpu_kernel else ""
            finding = f"no: {on_cpu}CUDA only, torch.cuda.is_available() is False (torch {torch.__version__}, {build})"
        else:
            finding = _torch_check(torch, getattr(cuda, check), q, k, v, mask, small.dropout, causal, gqa, warnings)
        rows.append((f"SDPA {name}", finding))
        verdicts.append(
            f"{name} {'yes' if finding.startswith('yes') else 'no'}{' (CPU kernel)' if cpu_kernel and finding.startswith('yes') else ''}"
        )
    math_on = cuda.math_sdp_enabled()
    rows.append(("SDPA math", "yes" if math_on else "no: turned off (torch.backends.cuda.math_sdp_enabled() is False)"))
    verdicts.append(f"math {'yes' if math_on else 'no'}")
    verdicts.append(f"torch picks {picked} on {device}" if picked else "torch's choice unknown")
    return [("torch SDPA backends", ", ".join(verdicts)), *rows]


def _picked(torch: Any, q: Any, k: Any, v: Any, mask: Any, dropout: float, causal: bool, gqa: bool) -> str:
    """The backend torch's dispatcher picks for the call, as the rows name
    it (flash, efficient, cudnn, math); '' where torch does not say."""
    try:
        choice = torch._fused_sdp_choice(q, k, v, mask, dropout, causal, enable_gqa=gqa)
        from torch.nn.attention import SDPBackend
    except Exception:  # noqa: BLE001 - a private helper: the summary says it is unknown
        return ""
    names = {int(member.value): name.lower() for name, member in SDPBackend.__members__.items()}
    picked = names.get(int(choice), str(choice))
    return SHORT.get(picked, picked)


def _torch_check(
    torch: Any, check: Any, q: Any, k: Any, v: Any, mask: Any, dropout: float, causal: bool, gqa: bool, warnings: Any
) -> str:
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout, causal, gqa)
    except TypeError:  # torch < 2.5 has no enable_gqa in SDPAParams
        params = torch.backends.cuda.SDPAParams(q, k, v, mask, dropout, causal)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ok = bool(check(params, True))
    if ok:
        return "yes"
    said = "; ".join(dict.fromkeys(str(w.message).strip() for w in caught)) or "torch gave no reason"
    return f"no: {said}"
