"""How much of a vision, audio, multimodal or diffusers model's attention the
cache serves when warmed ONLY from ``graphcache manifest`` (issue 40).

Each model of tests/media_models.MODELS is built from its tiny config
(docs/examples/configs/tiny/: 2 layers, hidden 256, bf16, random weights, no
download), its manifest written by the CLI as a user runs it (the options
are printed in the table), warmed into a store with the reference compiler
(it executes on the CPU), then served through graphcache.torch.patch() by
the model's own code: two input sizes the manifest allows and a batch of 4
(vision: 224 and 288 px, Swin 56 and 112 px; SAM: one image and two, each
prompted with two points; wav2vec2: 16000 and 40000 samples and a
right-padded batch; Qwen2.5-VL: generate() after a 224 and a 448 px image
and a left-padded batch of 4 prompts with images; diffusers: the real
pipeline, classifier-free guidance on, at 128 and 192 px, one image and
two, a video model 9 frames; Sana beside an 8x VAE at 64 and 256 px). Prints a markdown table: attention calls served by graphs, and
whether the outputs agree with unpatched torch's (hidden states and
latents within bf16 tolerance, generated tokens equal).

    python scripts/bench/bench_media_models.py              # every model
    python scripts/bench/bench_media_models.py --models vit flux

``--record-max-seq N`` / ``--record-max-batch N`` are the recording measure
instead: a model (``--record-model``, default the UNet) recorded at one size
(``--record-at``, default 128 px: a 16 x 16 latent, the guidance pair) and
one image with ``gt.record(max_seq=N, max_batch=M)`` (``graphcache record
--max-seq N --max-batch M``; M is 2 where only ``--max-seq`` is given),
that manifest alone warmed, then served at each ``--serve-at`` size (default
192 and 256 px) with ``--images`` images, beside the same recording without
``--max-seq`` (a ``--max-batch`` measure: with ``--max-batch 1``):

    python scripts/bench/bench_media_models.py --record-max-seq 1024
    python scripts/bench/bench_media_models.py --record-max-seq 1024 --record-model sana-vae8 --record-at 64x64 --serve-at 128x128 256x256
    python scripts/bench/bench_media_models.py --record-max-batch 2 --record-model swin --record-at 56x56 --serve-at 56x56 --images 2

CPU only; nothing here times anything but the whole run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache.compilers.reference import ReferenceCompiler  # noqa: E402
from graphcache.errors import ManifestError  # noqa: E402
from tests import media_models  # noqa: E402
from tests.hf_models import Case  # noqa: E402


def cell(case: Case) -> str:
    agree = "agree" if case.equal else "DIFFER"
    text = f"{case.fraction:.0%} ({case.hits}/{case.calls}), {agree}"
    if case.fallbacks:
        text += "; " + ", ".join(f"{k} {n}" for k, n in sorted(case.fallbacks.items()))
    return text


def table(models: list[str]) -> int:
    print("| model | kind | `graphcache manifest` options | graphs | case | served |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in models:
            bench = media_models.MODELS[name]
            where = Path(folder) / name
            where.mkdir()
            started = time.perf_counter()
            options = " ".join(bench.options)
            try:
                cases, builds = media_models.served(name, where, ReferenceCompiler())
            except ManifestError as exc:
                print(f"| {name} | {bench.kind} | `{options}` | refused: {exc} | | |", flush=True)
                continue
            from graphcache import manifest

            graphs = len(manifest.load(where / f"{name}.yaml"))
            took = time.perf_counter() - started
            for i, case in enumerate(cases):
                first = f"| {name} | {bench.kind} | `{options}` | {graphs} ({took:.0f} s with serving) |"
                print((first if i == 0 else "| | | | |") + f" {case.name} | {cell(case)} |", flush=True)
            if builds:
                print(f"# {name}: {builds} graph(s) built while serving", file=sys.stderr)
    return 0


def recording(name: str, at: tuple[int, int], serve: list[tuple[int, int]], images: int, widen: dict) -> int:
    """``name`` recorded at size ``at`` (one image; a diffusion model's
    guidance pair), widened as ``widen`` says (``max_seq``, ``max_batch``),
    then served at each size of ``serve`` with ``images`` images, beside the
    same recording without ``max_seq`` (where ``widen`` has one), else
    without batches widened (``max_batch`` 1)."""
    pair = ", guidance pair" if media_models.MODELS[name].kind == "diffusion" else ""
    sizes = {f"{w}x{h}, {images} image(s){pair}": [((w, h), images)] for w, h in serve}
    media_models.MODELS[name].cases.update(sizes)
    flags = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in widen.items())
    plain = {"max_batch": 1 if widen["max_batch"] > 1 and "max_seq" not in widen else widen["max_batch"]}
    print(f"| recording ({name} at {at[0]}x{at[1]}, one image{pair}) | graphs | " + " | ".join(sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    with tempfile.TemporaryDirectory() as folder:
        baseline = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in plain.items())
        for index, (label, options) in enumerate(((f"`{flags}`", widen), (f"`{baseline}`", plain))):
            where = Path(folder) / str(index)  # a store each: the second recording warms its own
            max_seq, max_batch = options.get("max_seq"), options.get("max_batch", 2)
            model, cache = media_models.recorded(name, where, ReferenceCompiler(), [(at, 1)], max_seq, max_batch)
            from graphcache import manifest

            graphs = len(manifest.load(where / f"{name}-recorded.yaml"))
            cases = media_models.serve(name, model, cache, only=list(sizes))
            print(f"| {label} | {graphs} | " + " | ".join(cell(c) for c in cases) + " |", flush=True)
    return 0


def _size(text: str) -> tuple[int, int]:
    width, _, height = text.lower().partition("x")
    return int(width), int(height)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(media_models.MODELS), default=None)
    parser.add_argument("--record-max-seq", type=int, metavar="N", help="a recording widened with --max-seq N")
    parser.add_argument("--record-max-batch", type=int, metavar="N", help="a recording widened with --max-batch N")
    parser.add_argument("--record-model", default="sd-unet", choices=sorted(media_models.MODELS))
    parser.add_argument("--record-at", type=_size, default=(128, 128), metavar="WxH", help="the recorded size")
    parser.add_argument("--serve-at", type=_size, nargs="+", default=[(192, 192), (256, 256)], metavar="WxH")
    parser.add_argument("--images", type=int, default=1, help="images a served case runs")
    args = parser.parse_args(argv)
    if args.record_max_seq or args.record_max_batch:
        widen = {"max_seq": args.record_max_seq, "max_batch": args.record_max_batch or 2}
        widen = {key: value for key, value in widen.items() if value}
        return recording(args.record_model, args.record_at, args.serve_at, args.images, widen)
    return table(args.models or list(media_models.MODELS))


if __name__ == "__main__":
    raise SystemExit(main())
