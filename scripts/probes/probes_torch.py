#!/usr/bin/env python3
"""The library probes of "Trust, round five", with figures: graphcache.torch
and graphcache.hf on this machine's torch, the reference compiler, a store in
a temporary folder. ``scripts/probes/hardening_probe.py --only NAME`` runs them:

    python scripts/probes/hardening_probe.py --only zero|strides|race|misses|nan
        [--seconds 60] [--calls 2000] [--shapes 90000] [--tree PATH]

zero
    Calls with a batch, heads, seq_q, seq_kv or head_dim of 0 at each door
    (``patch()``, ``install()``'s aten door, ``varlen_attn``, the
    transformers backend): whether each answer equals torch's, and what
    ``stats()`` counted; then ``graphcache run`` and ``graphcache record`` of
    a script making such a call: their exit statuses.
strides
    ``--calls`` SDPA calls under ``patch()`` with on_miss ``build`` that differ
    only in the strides of size-1 dims (``buf.as_strided((1, 1, 1, 64), (w, w,
    w, 1))`` for w from 64): the graphs stored and built, and the memo entries.
race
    One thread loops ``install(dispatch_key="CPU"); sleep(0.001);
    uninstall()`` for ``--seconds`` (after the first install(), which
    registers the kernels once) while 8 threads call
    ``torch.ops.aten._scaled_dot_product_cudnn_attention``: the exit status,
    the install cycles, the calls graphcache served and those passed on to
    the kernel beneath (none on a CPU: NotImplementedError, torch's own
    answer there), and any other error.
misses
    ``--shapes`` calls with on_miss ``torch`` whose key/value length is each
    new (2, 3, ... keys of views into one buffer: every call a miss; one
    query, one head of 8 so that torch's SDPA costs little): the RSS before,
    after and at its peak, and how many missed specs ``stats()`` names and dropped.
nan
    A NaN (and +inf, -inf) in q, k or v at each door: whether the output's NaNs
    and values equal torch's.

Each probe runs in a child process (``python scripts/probes/probes_torch.py NAME``),
so a crash is an exit status, and RSS is the child's own. ``--tree`` runs the
child on another checkout (``git archive COMMIT | tar -x -C /tmp/base``) for
the figures before a change.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROBES = ("zero", "strides", "race", "misses", "nan")
BF16_NAME = "bfloat16"


def run(name: str, tree: Path, seconds: float = 60.0, calls: int = 2000, shapes: int = 90_000) -> int:
    """Run probe ``name`` in a child process on ``tree``'s graphcache; print
    what it printed and its exit status (returned)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    env.pop("GRAPHCACHE_SDPA_ON_MISS", None)
    argv = [sys.executable, str(Path(__file__).resolve()), name, "--seconds", str(seconds)]
    argv += ["--calls", str(calls), "--shapes", str(shapes), "--tree", str(tree)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, timeout=seconds + 1800)
    print(done.stdout, end="")
    if done.returncode != 0:
        print(done.stderr[-3000:], end="", file=sys.stderr)
    signal = f" (signal {-done.returncode})" if done.returncode < 0 else ""
    code = 128 - done.returncode if done.returncode < 0 else done.returncode
    print(f"{name}: exit {code}{signal} after {time.monotonic() - started:.1f} s")
    return code


# -- in the child ----------------------------------------------------------------------------------


def _rss_mib(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _runtime(folder: str, on_miss: str) -> Any:
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore

    gt.reset()
    gt.configure(GraphCache(DiskStore(folder), compiler="reference"), device="cpu", on_miss=on_miss)
    return gt


def _same(got: Any, want: Any) -> bool:
    """Equal shapes, NaN where torch has NaN, and equal values elsewhere (inf included)."""
    import torch

    if got.shape != want.shape:
        return False
    if not torch.equal(got.isnan(), want.isnan()):
        return False
    finite = ~want.isnan()
    return torch.equal(got[finite].float(), want[finite].float())


EMPTY = {
    "batch 0": ((0, 8, 16, 64), (0, 8, 16, 64)),
    "heads 0": ((1, 0, 16, 64), (1, 0, 16, 64)),
    "seq_q 0": ((1, 8, 0, 64), (1, 8, 16, 64)),
    "seq_kv 0": ((1, 8, 16, 64), (1, 8, 0, 64)),
    "head_dim 0": ((1, 8, 16, 0), (1, 8, 16, 0)),
}


def child_zero(folder: str) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    from graphcache.hf.backend import attention

    gt = _runtime(folder, "build")
    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    layer = torch.nn.Module()
    layer.is_causal = True  # type: ignore[assignment]
    for what, (qs, ks) in EMPTY.items():
        q, k = torch.randn(qs, dtype=torch.bfloat16), torch.randn(ks, dtype=torch.bfloat16)
        want = F.scaled_dot_product_attention(q, k, k)
        answers = {}
        for door in ("patch()", "install()", "hf"):
            try:
                if door == "patch()":
                    got = _patched(gt, q, k)
                elif door == "install()":
                    got = _installed(gt, op, q, k)
                else:
                    got = attention(layer, q, k, k, None, is_causal=False)[0].transpose(1, 2)
                answers[door] = "torch's" if _same(got, want) else "differs"
            except Exception as exc:  # noqa: BLE001 - reported
                answers[door] = f"{type(exc).__name__}: {str(exc)[:60]}"
        print(f"  {what:10} q {qs} k {ks}: " + ", ".join(f"{d} {a}" for d, a in answers.items()))
    for what, (tokens, heads, dim, cu) in {
        "varlen, no token": (0, 8, 64, [0, 0]),
        "varlen, no sequence": (0, 8, 64, [0]),
        "varlen, head_dim 0": (16, 8, 0, [0, 16]),
    }.items():
        q = torch.randn(tokens, heads, dim, dtype=torch.bfloat16)
        offsets = torch.tensor(cu, dtype=torch.int32)
        try:
            out = gt.varlen_attn(q, q, q, offsets, offsets, max(tokens, 0), max(tokens, 0))
            print(f"  {what}: {tuple(out.shape)} (as q's)" if out.shape == q.shape else f"  {what}: {tuple(out.shape)}")
        except Exception as exc:  # noqa: BLE001 - reported
            print(f"  {what}: {type(exc).__name__}: {exc}")
    stats = gt.stats()
    print(f"  counted: fallbacks {stats['fallbacks']}, graphs built {len(stats['built_graphs'])}")
    script = Path(folder, "eb.py")
    script.write_text(
        "import torch, torch.nn.functional as F\n"
        "q = torch.randn(0, 8, 16, 64, dtype=torch.bfloat16)\n"
        "F.scaled_dot_product_attention(q, q, q)\n"
        "k = torch.randn(1, 8, 16, 64, dtype=torch.bfloat16)\n"
        "F.scaled_dot_product_attention(k, k, k)\n"
    )
    env = {**os.environ, "GRAPHCACHE_DIR": str(Path(folder, "cli-store"))}
    cli = [sys.executable, "-m", "graphcache"]
    ran = subprocess.run([*cli, "run", "--compiler", "reference", "--", sys.executable, str(script)], env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    recorded = subprocess.run([*cli, "record", "-o", str(Path(folder, "eb.yaml")), str(script)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    print(f"  graphcache run: exit {ran.returncode}; graphcache record: exit {recorded.returncode}")


def _patched(gt: Any, q: Any, k: Any) -> Any:
    import torch.nn.functional as F  # noqa: N812

    with gt.patch():
        return F.scaled_dot_product_attention(q, k, k)


def _installed(gt: Any, op: Any, q: Any, k: Any) -> Any:
    with gt.install(dispatch_key="CPU"):
        return op(q, k, k, None, False)[0]


def child_strides(folder: str, calls: int) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    from graphcache.stores import DiskStore

    gt = _runtime(folder, "build")
    buf = torch.randn(64 + calls + 64, dtype=torch.bfloat16)
    started = time.perf_counter()
    with torch.no_grad(), gt.patch():
        for w in range(64, 64 + calls):
            t = buf.as_strided((1, 1, 1, 64), (w, w, w, 1))
            F.scaled_dot_product_attention(t, t, t)
    took = time.perf_counter() - started
    stats = gt.stats()
    stored = len(list(DiskStore(folder).keys()))
    memo = len(gt.RUNTIME._memo)
    print(
        f"  {calls} calls differing only in size-1 strides: {stored} graph(s) stored, "
        f"{len(stats['built_graphs'])} built, {memo} memo entries, {stats['graphs_loaded']} loaded, {took:.1f} s"
    )


def child_race(folder: str, seconds: float) -> None:
    import torch

    gt = _runtime(folder, "build")
    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    stop = time.monotonic() + seconds
    lock = threading.Lock()
    tally: dict[str, int] = {"answered": 0, "passed on (NotImplementedError)": 0}
    errors: dict[str, int] = {}

    def caller(n: int) -> None:
        g = torch.Generator().manual_seed(n)
        q = torch.randn(1, 2, 16 + n, 64, generator=g, dtype=torch.bfloat16)
        while time.monotonic() < stop:
            try:
                out = op(q, q, q, None, False)
                assert out[0].shape == q.shape, out[0].shape
                what = "answered"
            except NotImplementedError:
                what = "passed on (NotImplementedError)"
            except Exception as exc:  # noqa: BLE001 - reported: a call at the wrong kernel, say
                what = f"{type(exc).__name__}: {str(exc)[:120]}"
                with lock:
                    errors[what] = errors.get(what, 0) + 1
                continue
            with lock:
                tally[what] += 1

    # The first install() registers graphcache's kernels with torch's dispatcher, once per process. On a
    # CPU torch has no kernel of its own for the op, and a call that races that one registration gets
    # torch's missing-kernel error in either form: NotImplementedError, or (1 run in 20 of 1 s here) an
    # internal assert its error report's self-check raises while the table is being written. So it is made
    # before the callers start; every later install() and uninstall() races them.
    gt.install(dispatch_key="CPU").uninstall()
    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    cycles = 0
    while time.monotonic() < stop:
        handle = gt.install(dispatch_key="CPU")
        time.sleep(0.001)
        handle.uninstall()
        cycles += 1
    for t in threads:
        t.join()
    served = gt.stats()["doors"].get("aten", {})
    print(f"  {seconds:.0f} s, 8 calling threads: {cycles} install/uninstall cycles; calls {tally}; errors {errors}")
    print(f"  the aten door counted {served.get('calls', 0)} call(s): {served}")


def child_misses(folder: str, shapes: int) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    gt = _runtime(folder, "torch")
    buf = torch.randn(1, 1, shapes + 1, 8, dtype=torch.bfloat16)
    q = torch.randn(1, 1, 1, 8, dtype=torch.bfloat16)
    with torch.no_grad(), gt.patch():
        F.scaled_dot_product_attention(q, buf[:, :, :1], buf[:, :, :1])  # imports and first-call state
        before = _rss_mib()
        started = time.perf_counter()
        for i in range(2, shapes + 2):
            kv = buf[:, :, :i]
            F.scaled_dot_product_attention(q, kv, kv)
    took = time.perf_counter() - started
    stats = gt.stats()
    after, peak = _rss_mib(), _rss_mib("VmHWM")
    print(
        f"  {shapes} missing shapes in {took:.0f} s: RSS {before:.0f} MiB before, {after:.0f} MiB after "
        f"(+{after - before:.0f}), peak {peak:.0f} MiB; missed_specs {len(stats['missed_specs'])} named, "
        f"{stats.get('missed_specs_dropped', 'no count of')} dropped; misses {stats['misses']}; "
        f"memo {len(gt.RUNTIME._memo)} entries"
    )


def child_nan(folder: str) -> None:
    import torch
    import torch.nn.functional as F  # noqa: N812

    from graphcache.hf.backend import attention

    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    layer = torch.nn.Module()
    layer.is_causal = True  # type: ignore[assignment]
    g = torch.Generator().manual_seed(0)
    base = {r: torch.randn(1, 8, 16, 64, generator=g, dtype=torch.bfloat16) for r in "qkv"}
    rows = []
    for value in (float("nan"), float("inf"), float("-inf")):
        for role in "qkv":
            t = {r: x.clone() for r, x in base.items()}
            t[role][0, 0, 0, 0] = value
            want = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)
            found = {}
            store = str(Path(folder, f"{value}-{role}"))  # empty: the first call is a miss
            for on_miss in ("torch", "build"):  # the miss (torch's SDPA), then the built graph
                gt = _runtime(store, on_miss)
                found["patch() miss" if on_miss == "torch" else "patch() built graph"] = _same(_causal(gt, t), want)
            gt = _runtime(store, "torch")  # the stored graph
            with gt.install(dispatch_key="CPU"):
                found["install() stored graph"] = _same(op(t["q"], t["k"], t["v"], None, False, 0.0, True)[0], want)
            hf = attention(layer, t["q"], t["k"], t["v"], None)[0].transpose(1, 2)
            found["hf"] = _same(hf, want)
            rows.append((value, role, int(want.isnan().sum()), found))
    for value, role, nans, found in rows:
        doors = ", ".join(f"{d} {'= torch' if ok else 'DIFFERS'}" for d, ok in found.items())
        print(f"  {value!s:>4} in {role}: torch has {nans:4d} NaN; {doors}")


def _causal(gt: Any, t: dict[str, Any]) -> Any:
    import torch.nn.functional as F  # noqa: N812

    with gt.patch():
        return F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or ""))
    parser.add_argument("probe", choices=PROBES)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--shapes", type=int, default=90_000)
    parser.add_argument("--tree", type=Path, default=ROOT)
    args = parser.parse_args()
    sys.path.insert(0, str(args.tree.resolve()))
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        if args.probe == "zero":
            child_zero(folder)
        elif args.probe == "strides":
            child_strides(folder, args.calls)
        elif args.probe == "race":
            child_race(folder, args.seconds)
        elif args.probe == "misses":
            child_misses(folder, args.shapes)
        else:
            child_nan(folder)


if __name__ == "__main__":
    main()
