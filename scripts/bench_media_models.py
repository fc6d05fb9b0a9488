"""How much of a vision, audio, multimodal or diffusers model's attention the
cache serves when warmed ONLY from ``graphcache manifest`` (issue 40).

Each model of tests/media_models.MODELS is built from its tiny config
(docs/examples/configs/tiny/: 2 layers, hidden 256, bf16, random weights, no
download), its manifest written by the CLI as a user runs it (the options
are printed in the table), warmed into a store with the reference compiler
(it executes on the CPU), then served through graphcache.torch.patch() by
the model's own code: two input sizes the manifest allows and a batch of 4
(vision: 224 and 288 px; wav2vec2: 16000 and 40000 samples and a
right-padded batch; Qwen2.5-VL: generate() after a 224 and a 448 px image
and a left-padded batch of 4 prompts with images; diffusers: the real
pipeline, classifier-free guidance on, at 128 and 192 px, one image and
two). Prints a markdown table: attention calls served by graphs, and
whether the outputs agree with unpatched torch's (hidden states and
latents within bf16 tolerance, generated tokens equal).

    python scripts/bench_media_models.py                    # every model
    python scripts/bench_media_models.py --models vit flux

``--record-max-seq N`` is the recording measure instead: the UNet's pipeline
recorded at 128 px (a 16 x 16 latent, the guidance pair) with ``gt.record(
max_seq=N, max_batch=2)`` (``graphcache record --max-seq N --max-batch 2``),
that manifest alone warmed, then served at 192 and 256 px (24 x 24 and 32 x
32 latents), beside the same recording without ``max_seq``. CPU only;
nothing here times anything but the whole run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

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


def recording(max_seq: int) -> int:
    """The UNet recorded at 128 px with and without max_seq, served at 192 and 256 px."""
    sizes = {"192x192, guidance pair": [((192, 192), 1)], "256x256, guidance pair": [((256, 256), 1)]}
    media_models.MODELS["sd-unet"].cases.update(sizes)
    print(
        "| recording (sd-unet at 128x128, guidance pair) | graphs | 192x192, guidance pair | 256x256, guidance pair |"
    )
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for label, seq in ((f"`--max-seq {max_seq} --max-batch 2`", max_seq), ("`--max-batch 2` alone", None)):
            where = Path(folder) / str(seq)
            model, cache = media_models.recorded("sd-unet", where, ReferenceCompiler(), [((128, 128), 1)], seq)
            from graphcache import manifest

            graphs = len(manifest.load(where / "sd-unet-recorded.yaml"))
            cases = media_models.serve("sd-unet", model, cache, only=list(sizes))
            print(f"| {label} | {graphs} | " + " | ".join(cell(c) for c in cases) + " |", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(media_models.MODELS), default=None)
    parser.add_argument("--record-max-seq", type=int, metavar="N", help="the UNet recorded with --max-seq N")
    args = parser.parse_args(argv)
    if args.record_max_seq:
        return recording(args.record_max_seq)
    return table(args.models or list(media_models.MODELS))


if __name__ == "__main__":
    raise SystemExit(main())
