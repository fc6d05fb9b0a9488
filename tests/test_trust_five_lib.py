"""Trust, round five, the library's findings: odd tensors get torch's
answer, nothing grows per call shape, install()/uninstall() never crash a
process, and NaN stays NaN. Each finding as it was found, through the public
library (graphcache.torch, graphcache.hf) and the CLI, with the reference
compiler on this CPU; docs/reliability.md lists them, and
``scripts/probes/hardening_probe.py --only zero|strides|race|misses|nan`` measures
them (docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
pytest.importorskip("transformers", reason="graphcache.hf needs transformers (the dev extra)")

import torch.nn.functional as F  # noqa: E402

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, manifest  # noqa: E402
from graphcache.hf.backend import attention  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests.clirun import cli  # noqa: E402

BF16 = torch.bfloat16
OP = torch.ops.aten._scaled_dot_product_cudnn_attention


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    gt.reset()
    yield
    gt.uninstall()
    gt.reset()


def served(tmp_path, on_miss: str) -> DiskStore:  # noqa: ANN001
    store = DiskStore(tmp_path / "store")
    gt.configure(GraphCache(store, compiler="reference"), device="cpu", on_miss=on_miss)
    return store


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal shapes, NaN exactly where torch has NaN, inf where torch has it, the rest within bf16's rounding."""
    assert got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan()), (int(got.isnan().sum()), int(want.isnan().sum()))
    seen = ~want.isnan()
    torch.testing.assert_close(got[seen].float(), want[seen].float(), atol=2e-2, rtol=2e-2)


def hf_layer(causal: bool = True) -> torch.nn.Module:
    layer = torch.nn.Module()
    layer.is_causal = causal  # type: ignore[assignment]
    return layer


# -- 1: zero-size tensors --------------------------------------------------------------------------

EMPTY = [
    ((0, 8, 16, 64), (0, 8, 16, 64)),  # batch 0
    ((1, 0, 16, 64), (1, 0, 16, 64)),  # no heads
    ((1, 8, 0, 64), (1, 8, 16, 64)),  # seq_q 0
    ((1, 8, 16, 64), (1, 8, 0, 64)),  # seq_kv 0: zeros, no key to attend
    ((1, 8, 16, 0), (1, 8, 16, 0)),  # head_dim 0
]


def test_empty_calls_get_torchs_answer_at_every_door_and_build_nothing(tmp_path):
    """Finding 1: ZeroDivisionError from the layout reader reached the
    caller. Each door now answers as torch does, builds nothing (on_miss
    build), and counts the call under ``empty``."""
    store = served(tmp_path, "build")
    for qs, ks in EMPTY:
        q, k = torch.randn(qs, dtype=BF16), torch.randn(ks, dtype=BF16)
        for causal in (False, True):
            want = F.scaled_dot_product_attention(q, k, k, is_causal=causal)
            with gt.patch():
                same(F.scaled_dot_product_attention(q, k, k, is_causal=causal), want)
            with gt.install(dispatch_key="CPU"):  # torch has no CPU kernel for the op: its math's answer
                out, lse, *_ = OP(q, k, k, None, True, 0.0, causal)
            same(out, want)
            assert lse.shape == (qs[0], qs[1], qs[2], 1)
            same(attention(hf_layer(causal), q, k, k, None)[0], want.transpose(1, 2))
    for tokens, heads, dim, offsets in ((0, 8, 64, [0, 0]), (0, 8, 64, [0]), (16, 8, 0, [0, 16])):
        q = torch.randn(tokens, heads, dim, dtype=BF16)
        cu = torch.tensor(offsets, dtype=torch.int32)
        assert gt.varlen_attn(q, q, q, cu, cu, tokens, tokens).shape == q.shape
    stats = gt.stats()
    calls = len(EMPTY) * 2
    assert stats["fallbacks"] == {"empty": 3 * calls + 3}, stats["fallbacks"]
    assert {door: row["fallbacks"] for door, row in stats["doors"].items()} == {
        "sdpa": {"empty": calls}, "aten": {"empty": calls}, "hf": {"empty": calls}, "varlen": {"empty": 3},
    }  # fmt: skip
    assert stats["built_graphs"] == [] and list(store.keys()) == []


EMPTY_SCRIPT = """\
import torch
import torch.nn.functional as F

q = torch.randn(0, 8, 16, 64, dtype=torch.bfloat16)
print("empty", tuple(F.scaled_dot_product_attention(q, q, q).shape))
k = torch.randn(1, 8, 16, 64, dtype=torch.bfloat16)
print("full", tuple(F.scaled_dot_product_attention(k, k, k, is_causal=True).shape))
"""


def test_graphcache_run_and_record_go_on_past_an_empty_call(tmp_path):
    """Finding 1, the CLI: ``run`` and ``record`` exited 1 on the
    ZeroDivisionError; they exit 0, the empty call counted as ``empty``."""
    script = tmp_path / "eb.py"
    script.write_text(EMPTY_SCRIPT)
    env = {"GRAPHCACHE_DIR": str(tmp_path / "store")}
    ran = cli("run", "--compiler", "reference", "--stats", str(tmp_path / "run.json"), "--",
              sys.executable, str(script), env=env)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "empty (0, 8, 16, 64)" in ran.stdout
    counted = json.loads((tmp_path / "run.json").read_text())["total"]
    assert counted["calls"] == 2 and counted["fallbacks"]["empty"] == 1, counted
    recorded = cli("record", "-o", str(tmp_path / "eb.yaml"), str(script), env=env)
    assert recorded.returncode == 0, recorded.stderr[-2000:]
    text = (tmp_path / "eb.yaml").read_text()
    assert "#   empty: 1 call(s)" in text
    (spec,) = manifest.load(tmp_path / "eb.yaml")
    assert (spec.batch, spec.mask) == (1, "causal")


# -- 2: size-1 strides -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "strides"),
    [((1, 1, 1, 64), lambda w: (w, w, w, 1)), ((1, 8, 1, 64), lambda w: (w, 64, w, 1))],
    ids=["every-dim-1", "batch-and-seq-1"],
)
def test_calls_differing_only_in_size_1_strides_share_one_graph(tmp_path, shape, strides):
    """Finding 2: each stride of a size-1 dim made a layout of its own
    (``bhs[+N]d``), so a graph per call was built and stored. Calls cuDNN
    runs identically now share one spec, one graph and one stored entry."""
    store = served(tmp_path, "build")
    buf = torch.randn(8 * 2048, dtype=BF16)
    calls = [buf.as_strided(shape, strides(w)) for w in range(64, 64 + 300)]
    with torch.no_grad(), gt.patch():
        outs = [F.scaled_dot_product_attention(t, t, t) for t in calls]
    for t, out in zip(calls, outs, strict=True):
        torch.testing.assert_close(out, F.scaled_dot_product_attention(t, t, t))
    stats = gt.stats()
    assert len(list(store.keys())) == 1 and len(stats["built_graphs"]) == 1, stats["built_graphs"]
    assert stats["built_here"] == 300 and stats["fallbacks"] == {}
    specs = {gt.spec_for(t, t, t) for t in (buf.as_strided(shape, strides(w)) for w in range(64, 2064))}
    assert len(specs) == 1


# -- 3: install() / uninstall() racing calls -------------------------------------------------------

RACE = """\
import sys, threading, time, warnings
import torch
import graphcache.torch as gt
from graphcache import GraphCache
from graphcache.stores import DiskStore
from graphcache.torch.aten import cpu_math as aten_math

warnings.simplefilter("ignore")
torch.set_num_threads(1)
gt.configure(GraphCache(DiskStore(sys.argv[1]), compiler="reference"), device="cpu", on_miss="build")
OP = torch.ops.aten._scaled_dot_product_cudnn_attention
beneath = {"calls": 0}

# Stands in for another provider's kernel beneath graphcache's (cudnn-frontend's registers at CUDA, which no
# call reaches on this CPU): torch's math, and a count of the calls it answers.
def provider(q, k, v, bias, lse, dropout_p=0.0, is_causal=False, debug=False, *, scale=None):
    beneath["calls"] += 1
    out, logsumexp = aten_math.forward(q, k, v, bias, dropout_p, is_causal, scale)
    seed = torch.empty((), dtype=torch.int64)
    return out, logsumexp, None, None, q.shape[2], k.shape[2], seed, seed.clone(), None

lib = torch.library.Library("aten", "IMPL")
lib.impl("_scaled_dot_product_cudnn_attention", provider, "CPU")
stop = time.monotonic() + float(sys.argv[2])
errors, answered, lock = {}, [0], threading.Lock()

def caller(n):
    q = torch.randn(1, 2, 16 + n, 64, dtype=torch.bfloat16)
    want = aten_math.forward(q, q, q, None, 0.0, False, None)[0].float()
    while time.monotonic() < stop:
        try:
            out = OP(q, q, q, None, False)[0]
            assert (out.float() - want).abs().max() < 0.05, "a wrong answer"
        except Exception as exc:
            what = type(exc).__name__ + ": " + str(exc)[:80]
            with lock:
                errors[what] = errors.get(what, 0) + 1
            continue
        with lock:
            answered[0] += 1

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
door = gt.stats()["doors"].get("aten", {}).get("calls", 0)
print(f"cycles {cycles} answered {answered[0]} graphcache {door} beneath {beneath['calls']} errors {errors}")
sys.exit(1 if errors or door + beneath["calls"] != answered[0] else 0)
"""


def test_install_and_uninstall_beside_calls_on_other_threads_never_crash_or_cross(tmp_path):
    """Finding 3: a registration destroyed while calls were in flight
    segfaulted the process (exit 139) or sent forward calls to the backward
    kernel (TypeError). Now nothing is destroyed: every call is answered,
    by graphcache while it is installed, else by the kernel beneath (a
    provider's), and each is counted by exactly one of them."""
    script = tmp_path / "race.py"
    script.write_text(RACE)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store"), "4"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-3000:])
    cycles, answered, ours, beneath = (int(done.stdout.split()[i]) for i in (1, 3, 5, 7))
    assert cycles > 20 and answered > 100 and ours > 0 and beneath > 0, done.stdout


def test_uninstall_passes_calls_to_the_kernel_beneath_and_install_takes_them_back(tmp_path):
    """What a call gets while graphcache is uninstalled: the kernel that
    served the key before (here another provider's, stood in for at the CPU
    key), and NotImplementedError, torch's own answer, once that one is gone."""
    served(tmp_path, "build")
    seen = []

    def provider(q, k, v, bias, lse, dropout_p=0.0, is_causal=False, debug=False, *, scale=None):  # noqa: ANN001, ANN202
        seen.append(q.shape)
        seed = torch.empty((), dtype=torch.int64)
        out = torch.zeros(q.shape, dtype=q.dtype)
        return out, torch.zeros(q.shape[:-1] + (1,)), None, None, q.shape[2], k.shape[2], seed, seed.clone(), None

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_dot_product_cudnn_attention", provider, "CPU")
    q = torch.randn(1, 2, 16, 64, dtype=BF16)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # install() names the provider it goes over
            handle = gt.install(dispatch_key="CPU")
        assert OP(q, q, q, None, False)[0].abs().sum() > 0 and seen == []
        handle.uninstall()
        assert gt.kernels() == {} and OP(q, q, q, None, False)[0].abs().sum() == 0 and len(seen) == 1
        with gt.install(dispatch_key="CPU"):
            OP(q, q, q, None, False)
        assert len(seen) == 1 and gt.stats()["doors"]["aten"]["calls"] == 2
    finally:
        lib._destroy()  # no call is in flight here
    with pytest.raises(NotImplementedError, match="uninstalled"):
        OP(q, q, q, None, False)


# -- 5: per-process records are bounded ----------------------------------------------------------


def test_missed_specs_keep_the_most_recent_with_a_count_of_those_dropped(tmp_path):
    """Finding 5: ``stats()["missed_specs"]`` grew by one entry per missing
    shape (89,964 of them, RSS +200 MiB). It keeps the most recent 1,024
    and counts the rest in ``missed_specs_dropped``."""
    served(tmp_path, "torch")
    buf = torch.randn(1, 1, 1600, 8, dtype=BF16)
    q = torch.randn(1, 1, 1, 8, dtype=BF16)
    with torch.no_grad(), gt.patch():
        for n in range(1, 1501):
            F.scaled_dot_product_attention(q, buf[:, :, :n], buf[:, :, :n])
    stats = gt.stats()
    assert stats["misses"] == 1500 and stats["fallbacks"] == {"miss": 1500}
    assert len(stats["missed_specs"]) == 1024 and stats["missed_specs_dropped"] == 1500 - 1024
    assert [m["spec"]["seq_kv"] for m in stats["missed_specs"][-2:]] == [1499, 1500]  # the most recent, newest last


def test_a_recording_keeps_the_most_recent_reasons_and_says_how_many_it_dropped(tmp_path):
    """Finding 5, the recorder: every call no graph serves was kept by
    reason and message (each naming its shape). It keeps the most recent
    1,024, and the manifest says how many it dropped."""
    path = tmp_path / "m.yaml"
    k = torch.randn(1, 2, 8, 64, dtype=BF16)
    with torch.no_grad(), gt.record(path, shape_classes="exact") as recorder:
        F.scaled_dot_product_attention(k, k, k)
        for n in range(1, 1101):
            empty = torch.randn(0, 2, n, 64, dtype=BF16)
            F.scaled_dot_product_attention(empty, empty, empty)
    assert len(recorder.ineligible) == 1024 and recorder.dropped() == {"ineligible": 1100 - 1024}
    assert "it dropped the oldest: 76 ineligible" in path.read_text()
    assert len(manifest.load(path)) == 1


# -- 6: NaN and inf --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("role", ["q", "k", "v"])
def test_nan_and_inf_in_the_inputs_give_torchs_answer_at_every_door(tmp_path, value, role):
    """Finding 6: with a NaN in q torch's output had 64 NaNs and
    graphcache's 0 (nan_to_num in the fallback and the reference graph).
    The miss (torch's SDPA), the built graph, the stored graph at the aten
    door and the transformers backend give torch's answer, NaN for NaN."""
    g = torch.Generator().manual_seed(0)
    t = {r: torch.randn(1, 8, 16, 64, generator=g, dtype=BF16) for r in "qkv"}
    t[role][0, 0, 0, 0] = value
    want = F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True)
    if value != value:  # NaN: torch's output shows it
        assert want.isnan().any()
    for on_miss in ("torch", "build"):  # the miss, then the graph built (and stored) here
        gt.reset()
        served(tmp_path, on_miss)
        with gt.patch():
            same(F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True), want)
    assert gt.stats()["built_here"] == 1
    with gt.install(dispatch_key="CPU"):  # the stored graph, at PyTorch's door
        same(OP(t["q"], t["k"], t["v"], None, False, 0.0, True)[0], want)
    same(attention(hf_layer(), t["q"], t["k"], t["v"], None)[0], want.transpose(1, 2))  # the drop-in's graph
    assert {door: row["built_here"] for door, row in gt.stats()["doors"].items()} == {"sdpa": 2, "aten": 1}


def test_a_nan_in_a_ragged_call_stays_in_its_own_rows(tmp_path):
    """Finding 6, varlen_attn: the reference graph's rows hid a NaN too. A
    NaN in one token's query gives NaN in that token's row, as torch's math
    SDPA gives for the same sequence, and nowhere else (torch has no CPU
    varlen kernel; its CPU flash kernel, which no varlen call reaches, drops
    this NaN at these small sizes)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    served(tmp_path, "build")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(24, 4, 64, generator=g, dtype=BF16) for _ in range(3))
    q[5, 1, 0] = float("nan")
    cu = torch.tensor([0, 10, 24], dtype=torch.int32)
    out = gt.varlen_attn(q, k, v, cu, cu, 14, 14, window_size=(-1, 0))
    for start, end in ((0, 10), (10, 24)):
        dense = [x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
        with sdpa_kernel(SDPBackend.MATH):
            want = F.scaled_dot_product_attention(*dense, is_causal=True)[0].transpose(0, 1)
        assert torch.equal(out[start:end].isnan(), want.isnan())
    assert out.isnan().any() and gt.stats()["doors"]["varlen"]["built_here"] == 1


def test_rows_that_see_no_key_are_still_torchs_zeros(tmp_path):
    """What NaN-proofing is kept: a row a mask leaves no key (every key
    hidden by a boolean mask, or -inf bias) is 0, torch's answer, from the
    bias graph as from torch, with a NaN elsewhere left as it is."""
    served(tmp_path, "build")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 8, 64, generator=g, dtype=BF16) for _ in range(3))
    q[1, 2, 5, 0] = float("nan")
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    mask[0, :, 3] = False  # row 3 of the first sequence sees nothing
    for m in (mask, torch.zeros(mask.shape, dtype=BF16).masked_fill(~mask, float("-inf"))):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        with gt.patch():
            got = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        same(got, want)
        assert got[0, :, 3].abs().sum() == 0 and got[1, 2, 5].isnan().all()
    assert gt.stats()["built_here"] == 2


def test_the_reference_check_keeps_its_nan_proofing_for_rows_that_see_no_key():
    """The build check's NaN-proofing stays inside the check
    (graphcache.reference): a bottom-right causal spec with more queries than
    keys (rows that see no key) has a reference of zeros there, no NaN, and
    the reference graph's output measures an error of 0 against it."""
    from graphcache.compilers.reference import ReferenceCompiler
    from graphcache.reference.dense import random_inputs, reference, reference_error
    from graphcache.spec import GraphSpec

    spec = GraphSpec.from_dict(
        {"batch": 1, "heads_q": 2, "seq_q": 8, "seq_kv": 4, "head_dim": 64, "dtype": "bfloat16",
         "layout": "bhsd", "mask": "causal_bottom_right"}
    )  # fmt: skip
    inputs = random_inputs(spec, "cpu")
    out, stats = reference(spec, **inputs)
    assert out[:, :, :4].abs().sum() == 0 and not out.isnan().any() and out[:, :, 4:].abs().sum() > 0
    assert stats[:, :, :4].isneginf().all()
    compiler = ReferenceCompiler()
    graph = compiler.load(compiler.build(spec, compiler.target()))
    assert reference_error(spec, graph.execute(inputs["q"], inputs["k"], inputs["v"]), inputs) < 1e-2
