#!/usr/bin/env python3
"""How much of timm's ViT attention the cache serves (issue 40, item 1).

timm's ``Attention`` unbinds q, k and v from one fused projection,
``qkv(x).reshape(B, N, 3, H, D).permute(2, 0, 3, 1, 4)``: each is a view
with layout ``bs[3]hd`` (graphcache/spec/layouts.py), which a graph reads
where it lies. ``vit_tiny_patch16_224`` (random init, ``dynamic_img_size=True``,
bfloat16, CPU) is recorded at batch 1 and 224 px under
``graphcache.torch.record`` (pow2 classes, ``--max-batch``, and ``--max-seq``
where this tree's ``record`` takes it), warmed into a fresh DiskStore with
the reference compiler (it executes on the CPU), then served at batch 1 and
4, 224 and 288 px. Prints a markdown table: attention calls served by
graphs, the tensors copied to get there (``stats()["copied"]``; none is
the aim), and the logits' largest difference from unpatched torch relative
to their largest magnitude. CPU only; nothing here times anything.

timm imports torchvision, and PyPI's torchvision is a CUDA build that does
not import beside the project's CPU torch 2.13 ("operator torchvision::nms
does not exist"), so run this in a virtual environment of its own, outside
the repository:

    python -m venv /work/venv-timm
    /work/venv-timm/bin/pip install torch==2.14.1 torchvision==0.29.1 timm==1.0.31 -e .
    /work/venv-timm/bin/python scripts/bench/bench_timm_vit.py --max-batch 4 --max-seq 1024
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest, ops  # noqa: E402
from graphcache.compilers.reference import ReferenceCompiler  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402

CASES = ((1, 224), (4, 224), (1, 288), (4, 288))
TOLERANCE = 3e-2  # bf16 logits, relative to their largest magnitude (tests/hf_models.ENCODER_TOLERANCE)


def images(batch: int, px: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, px, px, generator=g).to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_tiny_patch16_224")
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-seq", type=int, default=None, help="passed to record where it takes max_seq")
    args = parser.parse_args()
    import timm

    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, dynamic_img_size=True).eval().to(torch.bfloat16)
    folder = Path(tempfile.mkdtemp(prefix="bench-timm-"))
    path = folder / "vit.yaml"
    extra = {}
    if args.max_seq is not None:
        if "max_seq" in inspect.signature(gt.record).parameters:
            extra["max_seq"] = args.max_seq
        else:
            print(
                f"# --max-seq {args.max_seq}: this tree's record() takes no max_seq (issue 40 item 4): "
                "288 px is served only where a recording at 224 px reaches it",
                file=sys.stderr,
            )
    with torch.no_grad(), gt.record(path, shape_classes="pow2", max_batch=args.max_batch, **extra) as recorder:
        model(images(1, 224, seed=1))
    compiler = ReferenceCompiler()
    cache = GraphCache(DiskStore(folder / "store"), compiler, shape_classes="pow2")
    graphs = manifest.load(path)
    ops.warm(graphs, cache)
    print(
        f"# {args.model}: recorded {recorder.calls()} call(s) at b1 224 px, "
        f"{len(recorder.specs)} spec(s): {', '.join(s.summary() for s in recorder.specs)}; "
        f"warmed {len(graphs)} graph(s) (--max-batch {args.max_batch})"
    )
    print("| batch | px | tokens | served | copied | logits vs torch |")
    print("|---|---|---|---|---|---|")
    for n, (batch, px) in enumerate(CASES):
        x = images(batch, px, seed=10 + n)
        with torch.no_grad():
            want = model(x).float()
        gt.reset()
        gt.configure(cache, device="cpu", on_miss="torch")
        with torch.no_grad(), gt.patch():
            got = model(x).float()
        stats = gt.stats()
        gt.reset()
        diff = float((want - got).abs().max()) / (float(want.abs().max()) or 1.0)
        served = (
            f"{stats['hits'] / stats['calls']:.0%} ({stats['hits']}/{stats['calls']})" if stats["calls"] else "no call"
        )
        if stats["fallbacks"]:
            served += "; " + ", ".join(f"{k} {v}" for k, v in sorted(stats["fallbacks"].items()))
        copied = ", ".join(f"{r} {why} {c}" for r, d in stats["copied"].items() for why, c in d.items()) or "none"
        verdict = "within bf16" if diff <= TOLERANCE else "DIFFER"
        tokens = (px // 16) ** 2 + 1
        print(f"| {batch} | {px} | {tokens} | {served} | {copied} | {diff:.1e} {verdict} |", flush=True)


if __name__ == "__main__":
    main()
