"""How much of a Hugging Face model's attention the cache serves (issue 25).

For each model built from a config (tests/hf_models.py: 2 layers, hidden
256, bf16, random weights, no download): generate() is recorded on prompts
of 37, 200 and 513 tokens (and one padded batch of 4 and one 2-beam
search), the manifest warmed into a store with the reference compiler (it
executes on the CPU), then served on other prompt lengths (50, 300, 700),
a padded batch of 4 (700, 300, 90, 160) and 2-beam search (120). Prints a
markdown table: attention calls served by graphs, and whether the greedy
tokens equal unpatched torch's ("tie": they differ only where torch's own
top two logits were within a bf16 rounding, see tests/hf_models.py).

    python scripts/bench/bench_hf_models.py                 # all models, both routes
    python scripts/bench/bench_hf_models.py --models llama bart --attn graphcache

``--attn graphcache`` is the backend (attn_implementation="graphcache");
``--attn sdpa`` is attn_implementation="sdpa" under graphcache.torch.patch().
``--manifest B`` also warms what ``graphcache manifest --method config``
lists for the model's config (--max-batch B --max-seq 1024, on the same
route) beside the recording, where a recording falls short (a model it
refuses, T5, keeps the recording alone). CPU only; nothing here times anything.

``--record-max-batch N`` records the b=1 prompts alone (no batch, no beams)
widened as ``graphcache record --max-batch N`` widens them, and serves the
same cases: how far a batch-1 recording carries (issue 32, item 4).

``--from-config`` is issue 32's measure instead: no recording; each model is
warmed ONLY from ``graphcache manifest CONFIG --max-batch 8 --max-seq 1024
--route R`` (the model traced from its config, as the CLI runs it), then
serves prompts of 50/300/700 tokens at b=1, a left-padded batch of 4
(50/300/700/300) and 2-beam search (decoders); an encoder's hidden states
are compared with unpatched torch's within bf16 tolerance
(tests/hf_models.ENCODER_TOLERANCE). ``--models`` then names any of
tests/hf_models.SMALL_CONFIGS (default: the architectures outside the
families, and Llama, BART, Mistral, T5).

    python scripts/bench/bench_hf_models.py --from-config
    python scripts/bench/bench_hf_models.py --from-config --models bert falcon --attn sdpa
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from graphcache import GraphSpec  # noqa: E402
from graphcache.compilers.reference import ReferenceCompiler  # noqa: E402
from graphcache.errors import ManifestError  # noqa: E402
from graphcache.models.config import describe  # noqa: E402
from graphcache.models.specs import specs_for  # noqa: E402
from tests.hf_models import (  # noqa: E402
    ARCHITECTURES,
    MANIFEST_SERVE,
    SMALL_CONFIGS,
    Case,
    Lengths,
    config,
    kind,
    measure,
    served,
)

MODELS = ("llama", "bart", "mistral", "gemma3", "t5")


def cell(case: Case) -> str:
    tokens = "equal" if case.equal else (f"tie (gap {case.gap:.3f})" if case.tie and case.gap is not None else "DIFFER")
    text = f"{case.fraction:.0%} ({case.hits}/{case.calls}), {tokens}"
    if case.fallbacks:
        text += "; " + ", ".join(f"{k} {n}" for k, n in sorted(case.fallbacks.items()))
    copies = [f"{role} {why} {n}" for role, reasons in sorted(case.copied.items()) for why, n in reasons.items()]
    if copies:  # tensors copied into a layout a graph reads (stats()["copied"]); none where none is listed
        text += "; copied: " + ", ".join(copies)
    return text


def config_specs(name: str, attn: str, max_batch: int | None) -> list[GraphSpec]:
    """What ``graphcache manifest`` lists for ``name``'s config on ``attn``'s route."""
    if not max_batch:
        return []
    try:
        model = describe(config(name).to_dict())
    except ManifestError:
        return []
    return list(specs_for(model, max_batch=max_batch, max_seq=1024, route=attn).users)


def from_config(models: list[str], routes: list[str], new_tokens: int) -> int:
    """Issue 32's table: each model warmed only from its traced manifest."""
    from graphcache.errors import ManifestError
    from graphcache.ops import manifest

    print("| model | kind | attention | graphs (trace) | " + " | ".join(_CASES) + " |")
    print("|---|---|---|---|" + "---|" * len(_CASES))
    with tempfile.TemporaryDirectory() as folder:
        for name in models:
            for attn in routes:
                where = Path(folder) / f"{name}-{attn}"
                where.mkdir()
                route = 'attn_implementation="graphcache"' if attn == "graphcache" else '"sdpa" + patch()'
                started = time.perf_counter()
                try:
                    cases, _ = served(name, attn, where, ReferenceCompiler(), MANIFEST_SERVE, new_tokens)
                except ManifestError as exc:
                    refusal = str(exc).split("error: ", 1)[-1]
                    print(f"| {name} | {kind(name)} | {route} | refused: {refusal} |" + " |" * len(_CASES), flush=True)
                    continue
                graphs = len(manifest.load(where / f"{name}-{attn}.yaml"))
                by_name = {c.name: cell(c) for c in cases}
                cells = [by_name.get(c, "n/a (an encoder)") for c in _CASES]
                took = time.perf_counter() - started
                print(
                    f"| {name} | {kind(name)} | {route} | {graphs} ({took:.0f} s with serving) | "
                    + " | ".join(cells)
                    + " |",
                    flush=True,
                )
                print(f"# {name} / {attn}: done", file=sys.stderr, flush=True)
    return 0


_CASES = ("other prompt lengths, b=1", "padded batch of 4", "2-beam search")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted({*MODELS, *SMALL_CONFIGS}), default=None)
    parser.add_argument("--attn", nargs="+", choices=("graphcache", "sdpa"), default=["graphcache", "sdpa"])
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--manifest", type=int, metavar="B", help="also warm the config's manifest up to batch B")
    parser.add_argument("--from-config", action="store_true", help="warm only from the traced manifest (issue 32)")
    parser.add_argument(
        "--record-max-batch",
        type=int,
        metavar="N",
        help="record batch-1 prompts only, widened to batch classes up to N (graphcache record --max-batch N)",
    )
    args = parser.parse_args(argv)
    if args.from_config:
        models = args.models or [*ARCHITECTURES, "llama", "bart", "mistral", "t5"]
        return from_config(models, args.attn, args.new_tokens)
    args.models = args.models or list(MODELS)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for attn in args.attn:
            for name in args.models:
                where = Path(folder) / f"{name}-{attn}"
                where.mkdir()
                also = config_specs(name, attn, args.manifest)
                cases = measure(
                    name,
                    ReferenceCompiler(),
                    where,
                    Lengths(),
                    args.new_tokens,
                    attn,
                    also,
                    max_batch=args.record_max_batch,
                )
                label = name + (" + manifest" if also else "")
                if args.record_max_batch:
                    label += f" (b=1 recording, --max-batch {args.record_max_batch})"
                rows.append((label, attn, cases))
                print(f"# {name} / {attn}: done", file=sys.stderr, flush=True)
    names = [c.name for c in rows[0][2]]
    print("| model | attention | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for name, attn, cases in rows:
        route = 'attn_implementation="graphcache"' if attn == "graphcache" else '"sdpa" + patch()'
        print(f"| {name} | {route} | " + " | ".join(cell(c) for c in cases) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
