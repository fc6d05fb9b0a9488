#!/usr/bin/env python3
"""Issue 43, question 3: what does graphcache save a plain PyTorch user?

A tiny Llama (2 layers, hidden 512, 8 query / 2 KV heads of 64, random
weights: no download) generates --new-tokens tokens (default 256, greedy,
bf16) from a 32-token prompt with transformers' defaults (DynamicCache: the
KV length grows by one at every decode step), timed, in one process:

1. plain torch: ``F.scaled_dot_product_attention`` picks its backend; its
   cuDNN attention keeps a per-process graph cache keyed by the exact shape,
   so every decode step's new KV length is a new cuDNN graph built;
2. under ``graphcache.torch.patch()`` over a store warmed beforehand;
3. under ``graphcache.torch.install()`` (aten's door) over the same store,
   where this graphcache has it (each graphcache run starts from a fresh
   runtime: its graphs are loaded from the store again).

The store is warmed first by another process (this script with --warm:
the same generate under patch() and then install(), with on_miss=build, as
``graphcache warm`` would before a worker starts); its build time is the
cold cost, paid once.
Before the timed runs a warm-up loads cuBLAS, cuDNN and the frontend on
shapes generate never uses, so no timed run pays a library's first load.

Printed, per run: new tokens per second, and graphs built in this process
(plain torch: the distinct call shapes it sent to its cuDNN attention,
``torch._fused_sdp_choice``, counted on a second untimed pass; graphcache:
its cache's builds, 0 where the warmed store held every graph), graphs
loaded, hits and fallbacks, and how many tokens agree with plain torch's.

    python scripts/gpu/gpu_generate.py [--new-tokens 256] [--cache-dir DIR] [--json OUT]
    python scripts/gpu/gpu_generate.py --cpu-dry-run     # this CPU, graphcache's reference compiler

--cpu-dry-run walks the same steps on the CPU with the reference compiler
(32 new tokens unless given): it checks the script, not a GPU figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PROMPT = 32


def model_and_prompt(device: str) -> tuple[Any, Any]:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).to(device, torch.bfloat16).eval()
    model.generation_config.eos_token_id = None  # exactly --new-tokens tokens
    model.generation_config.pad_token_id = 0
    ids = torch.randint(3, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    return model, ids


def generate(model: Any, ids: Any, new: int) -> Any:
    import torch

    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)[0, ids.shape[1] :]


def timed(model: Any, ids: Any, new: int, device: str) -> tuple[float, Any]:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    tokens = generate(model, ids, new)
    sync()
    return time.perf_counter() - start, tokens


def graphcache_for(store: Path, device: str, on_miss: str) -> Any:
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore

    compiler = "reference" if device == "cpu" else "cudnn"
    cache = GraphCache(DiskStore(store), compiler, shape_classes="pow2")
    gt.reset()
    gt.configure(cache, device=device, on_miss=on_miss)
    return cache


def warm(args: argparse.Namespace) -> int:
    """--warm: fill the store (a process of its own, as graphcache warm is)."""
    import graphcache.torch as gt

    model, ids = model_and_prompt(args.device)
    cache = graphcache_for(Path(args.warm), args.device, "build")
    start = time.perf_counter()
    with gt.patch():
        generate(model, ids, args.new_tokens)
    if hasattr(gt, "install"):  # aten's door: the calls torch's SDPA hands its cuDNN attention (other specs, maybe)
        with gt.install():
            generate(model, ids, args.new_tokens)
    print(json.dumps({"seconds": time.perf_counter() - start, "builds": cache.stats()["builds"],
                      "unsupported": cache.stats()["unsupported"], "graphs": gt.stats()["graphs_loaded"]}))  # fmt: skip
    return 0


def torchs_cudnn_shapes(model: Any, ids: Any, new: int) -> Counter[str]:
    """The backends torch's SDPA picks over one generate, by distinct call
    shape (its cuDNN attention builds one graph per distinct shape)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend

    real, shapes = F.scaled_dot_product_attention, {}

    def counting(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
                 scale: Any = None, enable_gqa: bool = False) -> Any:  # fmt: skip
        choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)
        shapes[(tuple(q.shape), tuple(k.shape), q.stride(), k.stride(), mask, is_causal)] = SDPBackend(choice).name
        return real(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = counting
    try:
        generate(model, ids, new)
    finally:
        F.scaled_dot_product_attention = real
    return Counter(shapes.values())


def warm_up_libraries(device: str) -> None:
    """cuBLAS, torch's cuDNN attention and the cuDNN frontend loaded on
    shapes generate never makes (head dim 128, 7 tokens)."""
    import torch

    if device != "cuda":
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    x = torch.randn(1, 4, 7, 128, device=device, dtype=torch.bfloat16)
    (x @ x.transpose(-1, -2)).sum().item()
    try:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(x, x, x)
    except RuntimeError as exc:  # torch's cuDNN attention refused here: what plain torch then picks says so
        print(f"warm-up: torch's cuDNN attention refused a call: {str(exc)[:120]}")
    from graphcache.compilers.cudnn import CudnnCompiler

    CudnnCompiler().handle()
    torch.cuda.synchronize()


def agree(a: Any, b: Any) -> int:
    """How many leading tokens two generations share."""
    same = (a == b).int().cumprod(0)
    return int(same.sum())


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import graphcache.torch as gt

    root = Path(args.cache_dir or tempfile.mkdtemp(prefix="gpu-generate-"))
    store = root / "store"
    cmd = [sys.executable, __file__, "--warm", str(store), "--new-tokens", str(args.new_tokens)]
    warmed = subprocess.run(cmd + (["--cpu-dry-run"] if args.cpu_dry_run else []), capture_output=True, text=True)
    if warmed.returncode != 0:
        raise SystemExit(f"warming the store failed:\n{warmed.stderr[-3000:]}")
    report: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "new_tokens": args.new_tokens,
                              "warm": json.loads(warmed.stdout.strip().splitlines()[-1]), "runs": []}  # fmt: skip
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    print(f"warmed the store: {report['warm']}", flush=True)  # each result as it comes: a run cut short keeps them
    model, ids = model_and_prompt(args.device)
    warm_up_libraries(args.device)
    seconds, plain = timed(model, ids, args.new_tokens, args.device)
    picked = torchs_cudnn_shapes(model, ids, args.new_tokens)
    report["runs"].append({"run": "plain torch", "seconds": seconds, "graphs_built": picked.get("CUDNN_ATTENTION", 0),
                           "backends_by_shape": dict(picked), "agree": args.new_tokens})  # fmt: skip
    print(f"measured: {report['runs'][-1]}", flush=True)
    doors = [("patch()", gt.patch)]
    if hasattr(gt, "install"):
        doors.append(("install()", gt.install))
    else:
        report["install"] = "graphcache.torch has no install() in this tree"
    for name, door in doors:
        cache = graphcache_for(store, args.device, "torch")  # a fresh runtime: graphs loaded from the store
        with door():
            seconds, tokens = timed(model, ids, args.new_tokens, args.device)
        stats = gt.stats()
        report["runs"].append({
            "run": name, "seconds": seconds, "graphs_built": cache.stats()["builds"],
            "graphs_loaded": stats["graphs_loaded"], "calls": stats["calls"], "hits": stats["hits"],
            "fallbacks": stats["fallbacks"], "agree": agree(tokens, plain), "doors": stats.get("doors"),
        })  # fmt: skip
        print(f"measured: {report['runs'][-1]}", flush=True)
    gt.reset()
    return report


def table(report: dict[str, Any]) -> str:
    w = report["warm"]
    lines = [
        f"{report.get('gpu', 'CPU dry run (reference compiler: not a GPU figure)')}, torch {report['torch']}: "
        f"{report['new_tokens']} new tokens after a {PROMPT}-token prompt, batch 1, bf16",
        f"warming the store (another process): {w['builds']} graphs built ({w['unsupported']} refused), "
        f"{w['seconds']:.1f}s",
        f"{'run':12} {'tokens/s':>9} {'seconds':>8} {'built':>6} {'loaded':>7} {'hits':>6} {'agree':>6}  torch's backends by call shape / graphcache's fallbacks",
    ]
    for r in report["runs"]:
        extra = r.get("backends_by_shape") or r.get("fallbacks") or {}
        lines.append(
            f"{r['run']:12} {report['new_tokens'] / r['seconds']:>9.1f} {r['seconds']:>8.3f} {r['graphs_built']:>6} "
            f"{r.get('graphs_loaded', '-'):>7} {r.get('hits', '-'):>6} {r['agree']:>6}  {extra}"
        )
    if "install" in report:
        lines.append(report["install"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens to generate (default 256; dry run 32)")
    parser.add_argument("--cache-dir", default=None, help="where the warmed store goes (default: a temporary folder)")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--cpu-dry-run", action="store_true", help="this CPU, graphcache's reference compiler")
    parser.add_argument("--warm", default=None, help=argparse.SUPPRESS)  # the warming process's store
    args = parser.parse_args(argv)
    args.device = "cpu" if args.cpu_dry_run else "cuda"
    args.new_tokens = args.new_tokens or (32 if args.cpu_dry_run else 256)
    if args.warm:
        return warm(args)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("no CUDA GPU here: run with --cpu-dry-run to check the script on this CPU")
            return 2
    report = measure(args)
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
