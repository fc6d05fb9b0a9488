"""The paths users take for speed: torch.compile'd models and static KV
caches, served from the manifest traced from the model's config alone.

A tiny Llama (tests/hf_models.py: 2 layers, hidden 256, GQA 8/2, bf16,
random weights, no download), and Mistral (a 64-token sliding window) for
transformers' sliding-window static cache, each warmed ONLY from
``graphcache manifest CONFIG --max-batch 4 --max-seq 256 --route R`` (the
CLI as a user runs it, its default: both cache kinds, eager and compiled
code) into a store with the reference compiler, which executes on the CPU.
Each case then runs in a process of its own (a fresh torch.compile state),
once on plain torch (attn_implementation="sdpa", no graphcache) and once
served (route ``sdpa``: under graphcache.torch.patch(); route
``graphcache``: the transformers attention backend), compiled the same way
both times. Prints a markdown table: attention calls served from the store
over all calls, graphs built while serving, the largest difference of the
logits from plain torch's, and whether the greedy tokens are equal.

    python scripts/bench/bench_speed_paths.py                         # every case, both routes
    python scripts/bench/bench_speed_paths.py --cases static "compiled decode" --routes sdpa

Cases (``--cases`` takes any words of their names):

- forward: ``torch.compile(model)`` (the mode, ``dynamic`` and ``fullgraph``
  the name says; default otherwise), prompts of 20 and 100 tokens with a
  padding mask of ones (what a tokenizer hands over), or none;
- generate, static cache: ``generate(cache_implementation="static")``,
  4 new tokens, after a prompt of 20 tokens, one of 100, and for a
  left-padded batch of 3 (100, 60, 17); eager, with generate's own compiled
  decode steps (``compile_config``, what generate does on a GPU), or with
  ``model.forward`` compiled (the prompt compiled too);
- generate, sliding-window static cache (Mistral): prompts of 40 and 100
  tokens (the window's either side) and the batch of 3, eager;
- ``graphcache run`` of a compiled program: the forward and compiled decode
  cases in a script, unchanged, from the manifest's store
  (``graphcache run --stats``); and ``graphcache record`` of that script,
  warmed alone into a fresh store, then the script run again from it.

torch.compile on a CPU: ``reduce-overhead``'s CUDA graphs do not apply (no
CUDA tensors), so that row says what the mode's graph hands SDPA, not what
a CUDA graph replays. Each process raises dynamo's recompile limit (8 per
code object) to 64: the plain and the served runs, at several shapes, are
one process's. CPU only; nothing here times anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]
MANIFEST_ARGS = ("--max-batch", "4", "--max-seq", "256")
PROMPTS = (20, 100)
STATIC_RUNS = ((20,), (100,), (100, 60, 17))
WINDOW_RUNS = ((40,), (100,), (100, 60, 17))
NEW_TOKENS = 4

# name -> (model, what it runs, torch.compile keywords)
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "forward, torch.compile(model)": ("llama", "forward", {}),
    "forward, no padding mask": ("llama", "forward-unmasked", {}),
    "forward, fullgraph=True": ("llama", "forward", {"fullgraph": True}),
    "forward, dynamic=True": ("llama", "forward", {"dynamic": True}),
    "forward, dynamic=False": ("llama", "forward", {"dynamic": False}),
    "forward, mode=reduce-overhead": ("llama", "forward", {"mode": "reduce-overhead"}),
    "forward, mode=max-autotune-no-cudagraphs": ("llama", "forward", {"mode": "max-autotune-no-cudagraphs"}),
    "generate, static cache": ("llama", "static", {}),
    "generate, static cache, compiled decode (compile_config)": ("llama", "static-auto", {}),
    "generate, static cache, fullgraph compiled decode": ("llama", "static-auto", {"fullgraph": True}),
    "generate, static cache, torch.compile(model.forward)": ("llama", "static-forward", {}),
    "generate, sliding-window static cache (Mistral)": ("mistral", "window", {}),
    "graphcache run of a compiled program": ("llama", "run", {}),
    "graphcache record under compile, then run from it": ("llama", "record", {}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=None, help="Words of the case names to run (default: all).")
    parser.add_argument("--routes", nargs="+", default=["sdpa", "graphcache"], choices=["sdpa", "graphcache"])
    parser.add_argument("--work", default=None, help="Folder for manifests and stores (default: a temporary one).")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a case, in this process: its JSON line
    parser.add_argument("--route", default="sdpa", help=argparse.SUPPRESS)
    parser.add_argument("--program", default=None, help=argparse.SUPPRESS)  # the run/record cases' script: outputs
    args = parser.parse_args()
    if args.program:
        program(args.route, Path(args.program))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-speed-"))
    if args.one:
        print(json.dumps(one(args.one, args.route, work)))
        return
    names = [n for n in CASES if not args.cases or any(word in n for word in args.cases)]
    print("| case | route | served from the store | built here | largest logit difference | tokens equal |")
    print("|---|---|---|---|---|---|")
    for name in names:
        for route in args.routes:
            model = CASES[name][0]
            prepare(model, route, work)
            found = subprocess.run(
                [sys.executable, __file__, "--one", name, "--route", route, "--work", str(work)],
                capture_output=True,
                text=True,
            )
            if found.returncode != 0:
                tail = " ".join(found.stderr.strip().splitlines()[-1:])[:160]
                print(f"| {name} | {route} | failed: {tail} | | | |", flush=True)
                continue
            r = json.loads(found.stdout.strip().splitlines()[-1])
            share = f"{r['hits']} / {r['calls']} ({100 * r['hits'] / r['calls']:.0f} %)" if r["calls"] else "0 / 0"
            fell = f"; fallbacks {r['fallbacks']}" if r["fallbacks"] else ""
            diff = "-" if r["diff"] is None else f"{r['diff']:.4f}"
            tokens = "-" if r["tokens"] is None else ("yes" if r["tokens"] else "no")
            print(f"| {name} | {route} | {share}{fell} | {r['built']} | {diff} | {tokens} |", flush=True)


# -- the warmed store -----------------------------------------------------------------------


def prepare(model: str, route: str, work: Path) -> Path:
    """The store warmed from ``graphcache manifest CONFIG`` alone (made once per model and route)."""
    from graphcache import GraphCache, manifest, ops
    from graphcache.stores import DiskStore
    from tests import hf_models

    store = work / f"{model}-{route}-store"
    done = work / f"{model}-{route}.warmed"
    if done.exists():
        return store
    folder = work / f"{model}-config"
    hf_models.config(model).save_pretrained(folder)
    out = work / f"{model}-{route}.yaml"
    cli = [sys.executable, "-m", "graphcache.cli", "manifest", str(folder), *MANIFEST_ARGS, "--route", route]
    subprocess.run([*cli, "-o", str(out)], check=True, capture_output=True, text=True)
    ops.warm(manifest.load(out), GraphCache(DiskStore(store), "reference", shape_classes="pow2"))
    done.write_text("")
    return store


# -- one case ---------------------------------------------------------------------------------


def one(name: str, route: str, work: Path) -> dict[str, Any]:
    model_name, what, options = CASES[name]
    if what in ("run", "record"):
        return launched(what, route, work)
    import torch

    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore
    from tests import hf_models

    torch._dynamo.config.recompile_limit = 64  # the plain and the served runs, several shapes: one process
    model = hf_models.build(model_name, "sdpa")
    run = runner(model, what, options)
    want = run()
    cache = GraphCache(DiskStore(work / f"{model_name}-{route}-store"), "reference", shape_classes="pow2")
    model.set_attn_implementation("sdpa" if route == "sdpa" else "graphcache")
    gt.reset()
    gt.configure(cache, device="cpu", on_miss="torch")
    with gt.patch() if route == "sdpa" else contextlib.nullcontext():
        got = run()
    stats = gt.stats()
    return {**compare(want, got), **counted(stats)}


def runner(model: Any, what: str, options: dict[str, Any]) -> Any:
    """A function running ``what`` on ``model`` (compiled as ``options`` say) and returning its outputs."""
    import torch
    from transformers import CompileConfig

    from tests import hf_models

    if what.startswith("forward"):
        compiled = torch.compile(model, **options)

        def forward() -> list[Any]:
            outs = []
            for n in PROMPTS:
                ids, mask = hf_models.batch((n,), left=True)
                with torch.no_grad():
                    outs.append(compiled(ids, attention_mask=None if what == "forward-unmasked" else mask).logits)
            return outs

        return forward
    extra: dict[str, Any] = {"cache_implementation": "static", "output_logits": True, "return_dict_in_generate": True}
    if what == "static-auto":
        auto = CompileConfig(**options)
        auto._compile_all_devices = True  # generate compiles its decode steps on CUDA only, unless told
        extra["compile_config"] = auto
    else:
        extra["disable_compile"] = True
    if what == "static-forward":
        model.forward = torch.compile(model.forward, **options)
    runs = WINDOW_RUNS if what == "window" else STATIC_RUNS

    def generate() -> list[Any]:
        return [hf_models.generate(model, p, NEW_TOKENS, **extra) for p in runs]

    return generate


def compare(want: list[Any], got: list[Any]) -> dict[str, Any]:
    """The largest logit difference, and whether the tokens (where there are) are equal."""
    import torch

    diff, tokens = 0.0, None
    for w, g in zip(want, got, strict=True):
        if isinstance(w, torch.Tensor):
            diff = max(diff, float((w.float() - g.float()).abs().max()))
            continue
        for a, b in zip(w.logits, g.logits, strict=True):
            diff = max(diff, float((a.float() - b.float()).abs().max()))
        tokens = (tokens is not False) and torch.equal(w.sequences, g.sequences)
    return {"diff": diff, "tokens": tokens}


def counted(stats: dict[str, Any]) -> dict[str, Any]:
    return {
        "calls": stats["calls"],
        "hits": stats["hits"],
        "built": stats["built_here"],
        "fallbacks": stats["fallbacks"],
    }


# -- graphcache run / record of a compiled program -----------------------------------------------


def program(route: str, out: Path) -> None:
    """The run and record cases' script: a compiled forward at two prompt
    lengths and generate's compiled decode on a static cache, through
    ``route`` (its outputs saved to ``out``). Unchanged under graphcache run."""
    import torch

    from tests import hf_models

    torch._dynamo.config.recompile_limit = 64
    model = hf_models.build("llama", "sdpa" if route == "sdpa" else "graphcache")
    outs = runner(model, "forward", {})() + runner(model, "static-auto", {})()
    torch.save([o if isinstance(o, torch.Tensor) else {"seq": o.sequences, "logits": o.logits} for o in outs], out)


def launched(what: str, route: str, work: Path) -> dict[str, Any]:
    """``graphcache run`` of the program from the manifest's store (``run``),
    or from a fresh store warmed from ``graphcache record`` of it alone
    (``record``): counters from ``--stats``, outputs against the program on
    plain torch (transformers' sdpa, no graphcache)."""
    import torch

    here = Path(__file__).resolve()
    plain, served, stats = work / f"{what}-{route}-plain.pt", work / f"{what}-{route}-served.pt", work / "s.json"
    # The plain run: transformers' sdpa, no graphcache (whatever the route served).
    subprocess.run([sys.executable, str(here), "--program", str(plain), "--route", "sdpa"], check=True, env=_env())
    store = work / f"llama-{route}-store"
    if what == "record":
        recording, store = work / f"recorded-{route}.yaml", work / f"recorded-{route}-store"
        record = [sys.executable, "-m", "graphcache.cli", "record", "-o", str(recording), str(here)]
        subprocess.run([*record, "--program", str(work / "r.pt"), "--route", route], check=True, env=_env())
        warm = [sys.executable, "-m", "graphcache.cli", "--cache-dir", str(store), "warm", str(recording)]
        subprocess.run([*warm, "--compiler", "reference"], check=True, capture_output=True, env=_env())
    cmd = [sys.executable, "-m", "graphcache.cli", "run", "--compiler", "reference", "--stats", str(stats), "--"]
    program_cmd = [sys.executable, str(here), "--program", str(served), "--route", route]
    subprocess.run([*cmd, *program_cmd], check=True, env={**_env(), "GRAPHCACHE_DIR": str(store)})
    total = json.loads(stats.read_text())["total"]
    want, got = torch.load(plain), torch.load(served)
    diff = max(
        float(((w if isinstance(w, torch.Tensor) else w["logits"][i]).float() - x.float()).abs().max())
        for w, g in zip(want, got, strict=True)
        for i, x in enumerate([g] if isinstance(g, torch.Tensor) else g["logits"])
    )
    tokens = all(torch.equal(w["seq"], g["seq"]) for w, g in zip(want, got, strict=True) if isinstance(w, dict))
    return {
        "diff": diff,
        "tokens": tokens,
        **{k: total[k] for k in ("calls", "hits", "fallbacks")},
        "built": total["built_here"],
    }


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


if __name__ == "__main__":
    main()
