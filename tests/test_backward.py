"""SDPA backward graphs on this CPU (issue 42 item 2): the float32
reference's gradients, the reference compiler's backward plans and the torch
fallback, length classes, and ``graphcache.torch.backward.sdpa_backward``
served from the drop-in's runtime.

The yardstick nothing of graphcache's computes: autograd of torch's own
scaled_dot_product_attention in float64 (its math kernel on a CPU), masks
written out here."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch", reason="backward graphs run on torch tensors")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, GraphSpec, NotFound, Target  # noqa: E402
from graphcache.compilers.reference import ReferenceBackwardGraph  # noqa: E402
from graphcache.compilers.torch_backward import TorchSdpaBackwardGraph  # noqa: E402
from graphcache.errors import ExecutionError, UnsupportedCall  # noqa: E402
from graphcache.reference.backward import backward_inputs, gradient_errors, gradients  # noqa: E402
from graphcache.reference.measure import TOLERANCE, relative_error  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from graphcache.torch.backward import sdpa_backward  # noqa: E402

SDPA = torch._C._nn.scaled_dot_product_attention  # torch's own, whatever is patched


def back(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=2, heads_q=8, seq_q=96, head_dim=32, dtype="float16", kind="backward")
    return GraphSpec(**{**base, **fields})


def float64_gradients(spec: GraphSpec, inputs: dict) -> tuple:
    """dQ, dK, dV (b, h, s, d) by autograd of torch's SDPA in float64, the
    mask written out: causal top-left (is_causal), bottom-right (tril with
    the offset), padding (keys past the length hidden, rows past it dropped)."""

    def bhsd(t):  # noqa: ANN001, ANN202
        return (t.transpose(1, 2) if spec.layout == "bshd" else t).double()

    q, k, v = (bhsd(inputs[r]).requires_grad_() for r in ("q", "k", "v"))
    d_o = bhsd(inputs["d_o"])
    i = torch.arange(spec.seq_q).view(-1, 1)
    j = torch.arange(spec.seq_kv).view(1, -1)
    mask = torch.ones(spec.batch, 1, spec.seq_q, spec.seq_kv, dtype=torch.bool)
    if spec.mask == "causal":
        mask &= j <= i
    if spec.mask == "causal_bottom_right":
        mask &= j <= i + spec.seq_kv - spec.seq_q
    rows = torch.ones(spec.batch, 1, spec.seq_q, 1)
    if spec.padding:
        for b in range(spec.batch):
            lq, lkv = int(inputs["seq_len_q"][b]), int(inputs["seq_len_kv"][b])
            mask[b] &= j < lkv
            rows[b, :, lq:] = 0
    out = SDPA(q, k, v, attn_mask=mask, scale=spec.attn_scale, enable_gqa=True) * rows
    return torch.autograd.grad(out, (q, k, v), d_o)


def as_bhsd(spec: GraphSpec, grads: tuple) -> tuple:
    return tuple(g.transpose(1, 2) if spec.layout == "bshd" else g for g in grads)


CASES = {
    "mha": {},
    "gqa-causal": {"heads_kv": 2, "mask": "causal"},
    "mqa-bhsd": {"heads_kv": 1, "layout": "bhsd"},
    "bottom-right": {"mask": "causal_bottom_right", "seq_q": 64, "seq_kv": 160},
    "padded-causal": {"padding": True, "mask": "causal", "heads_kv": 4},
}


@pytest.mark.parametrize("fields", CASES.values(), ids=CASES.keys())
def test_the_references_gradients_are_autograds_of_torchs_sdpa(fields):
    spec = back(**fields)
    inputs = backward_inputs(spec, "cpu", seed=1)
    lengths = (inputs.get("seq_len_q"), inputs.get("seq_len_kv"))
    ours = as_bhsd(spec, gradients(spec, inputs["q"], inputs["k"], inputs["v"], inputs["d_o"], *lengths))
    for got, want in zip(ours, float64_gradients(spec, inputs), strict=True):
        assert relative_error(got, want) < 1e-5  # float32 against float64 on the same fp16 inputs


@pytest.fixture(autouse=True)
def fresh_runtime(monkeypatch):
    monkeypatch.delenv("GRAPHCACHE_SDPA_ON_MISS", raising=False)
    gt.reset()
    yield
    gt.reset()


@pytest.fixture
def store(tmp_path):
    return DiskStore(tmp_path / "store")


@pytest.mark.parametrize("fields", [*CASES.values(), {"bias": "b1ss", "dtype": "bfloat16"}], ids=[*CASES, "bias"])
def test_the_reference_compilers_backward_plan_matches_autograd(store, fields):
    spec = back(**fields)
    graph = GraphCache(store, "reference", shape_classes="exact").load(spec)
    assert isinstance(graph, ReferenceBackwardGraph) and graph.backend == "reference"
    inputs = backward_inputs(spec, "cpu", seed=2)
    grads = graph.execute(**inputs)
    assert [g.dtype for g in grads] == [torch.float16 if spec.dtype == "float16" else torch.bfloat16] * 3
    assert [tuple(g.shape) for g in grads] == [spec.storage_shape(r) for r in ("dQ", "dK", "dV")]
    errors = gradient_errors(spec, grads, inputs)
    assert max(errors.values()) <= TOLERANCE[spec.dtype], errors
    if spec.bias is None:
        for got, want in zip(as_bhsd(spec, grads), float64_gradients(spec, inputs), strict=True):
            assert relative_error(got, want) <= TOLERANCE[spec.dtype]


def test_a_class_backward_graph_serves_smaller_shapes(store):
    cache = GraphCache(store, "reference", shape_classes="pow2")
    one = back(batch=3, seq_q=100, heads_kv=2, mask="causal")
    graph = cache.load(one)
    assert graph.spec.is_class and graph.spec.covers(one) and (graph.spec.batch, graph.spec.seq_q) == (4, 128)
    for shape in (one, one.replace(batch=1, seq_q=37), one.replace(batch=4, seq_q=128)):
        inputs = backward_inputs(shape, "cpu", seed=3)
        grads = cache.load(shape).execute(**inputs)  # the class graph itself, at the real tensors' shape
        for got, want in zip(as_bhsd(shape, grads), float64_gradients(shape, inputs), strict=True):
            assert relative_error(got, want) <= TOLERANCE[shape.dtype]
    assert len(list(store.keys())) == 1, "one class graph stored for the three shapes"


def test_the_torch_fallback_serves_a_backward_spec_no_compiler_can(store):
    spec = back(mask="causal")
    graph = GraphCache(store, None, torch_fallback=True).load(
        spec, target=Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")
    )
    assert type(graph) is TorchSdpaBackwardGraph and graph.backend == "torch"
    inputs = backward_inputs(spec, "cpu", seed=4)
    assert max(gradient_errors(spec, graph.execute(**inputs), inputs).values()) <= TOLERANCE["float16"]


def test_the_torch_backward_graph_refuses_gradient_buffers_of_another_shape_naming_them(store):
    spec = back(mask="causal", heads_kv=2)
    graph = GraphCache(store, "reference", shape_classes="exact").load(spec)
    inputs = backward_inputs(spec, "cpu", seed=5)
    with pytest.raises(ExecutionError, match=r"^dv has shape"):
        graph.execute(**inputs, dv=torch.empty(spec.storage_shape("q"), dtype=torch.float16))
    with pytest.raises(ExecutionError, match=r"^o is missing"):
        graph.execute(**{**inputs, "o": None})


# -- graphcache.torch.backward.sdpa_backward ------------------------------------------


def step(b=2, hq=8, hk=2, s=100, d=32, dtype=torch.bfloat16, causal=True, q_layout="bshd", seed=0):  # noqa: ANN001, ANN201
    """One backward call as aten's cuDNN backward is asked it: (b, h, s, d)
    views, the forward's output and its log-sum-exp, and the gradients to expect."""
    g = torch.Generator().manual_seed(seed)

    def bshd(h):  # noqa: ANN001, ANN202
        return torch.randn(b, s, h, d, generator=g).to(dtype).transpose(1, 2)

    q = bshd(hq) if q_layout == "bshd" else torch.randn(b, hq, s, d, generator=g).to(dtype)
    k, v, grad_out = bshd(hk), bshd(hk), bshd(hq)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    out = SDPA(q64, k64, v64, is_causal=causal, enable_gqa=True)
    want = torch.autograd.grad(out, (q64, k64, v64), grad_out.double())
    scores = q64 @ k64.repeat_interleave(hq // hk, 1).transpose(-1, -2) * d**-0.5
    if causal:
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1, keepdim=True).float().detach()
    return (grad_out, q, k, v, out.detach().to(dtype), lse), want


def serve(store, on_miss="build", shape_classes="pow2"):  # noqa: ANN001, ANN201
    cache = GraphCache(store, "reference", shape_classes=shape_classes)
    gt.configure(cache, device="cpu", on_miss=on_miss)
    return cache


def test_sdpa_backward_keeps_the_contract_i42_door_codes_against():
    params = inspect.signature(sdpa_backward).parameters
    assert list(params) == ["grad_out", "query", "key", "value", "out", "logsumexp", "is_causal", "scale", "enable_gqa"]
    assert all(params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in ("is_causal", "scale", "enable_gqa"))
    assert issubclass(UnsupportedCall, Exception) and hasattr(UnsupportedCall("x", "miss"), "reason")


@pytest.mark.parametrize("q_layout", ["bshd", "bhsd"])
def test_a_warmed_backward_call_is_served_with_autograds_gradients_in_the_inputs_strides(store, q_layout):
    args, want = step(q_layout=q_layout)
    serve(store, on_miss="torch")
    with pytest.raises(UnsupportedCall) as miss:
        sdpa_backward(*args, is_causal=True, enable_gqa=True)
    assert miss.value.reason == "miss"
    gt.reset()
    cache = serve(store, on_miss="build")
    for _ in range(2):
        grads = sdpa_backward(*args, is_causal=True, enable_gqa=True, scale=32**-0.5)
    for got, primal, expected in zip(grads, args[1:4], want, strict=True):
        assert got.dtype == primal.dtype and got.shape == primal.shape
        assert got.stride() == torch.empty_like(primal).stride()  # what aten's meta kernel promises
        assert relative_error(got, expected) <= TOLERANCE["bfloat16"]
    stats = gt.stats()
    # Built on the spot (on_miss=build): served by its graph, and no hit of the store (issue 39).
    assert stats["backward"] == {
        "calls": 2, "hits": 0, "served_from_store": 0, "built_here": 2, "misses": 2, "fallbacks": {}
    }  # fmt: skip
    assert (stats["calls"], stats["hits"]) == (0, 0), "forward counters see no backward call"
    assert stats["graphs_loaded"] == 1 and cache.stats()["builds"] == 1  # one class graph, b4 s128
    gt.reset()
    serve(store, on_miss="error")  # the next process: what this one stored is a hit
    sdpa_backward(*args, is_causal=True, enable_gqa=True, scale=32**-0.5)
    assert (gt.stats()["backward"]["served_from_store"], gt.stats()["backward"]["built_here"]) == (1, 0)


def test_what_sdpa_backward_cannot_serve_raises_unsupported_call_naming_the_reason(store):
    serve(store)
    args, _ = step()
    grad_out, q, k, v, out, lse = args
    refused = {
        "dtype": (grad_out.float(), q.float(), k.float(), v.float(), out.float(), lse),
        "invalid": (grad_out, q, k, v, out, lse[:, :, :-1]),
        "autograd": (grad_out, q.detach().requires_grad_(), k, v, out, lse),
    }
    for reason, call in refused.items():
        with pytest.raises(UnsupportedCall) as err:
            sdpa_backward(*call, is_causal=True, enable_gqa=True)
        assert err.value.reason == reason, err.value
    assert gt.stats()["backward"]["fallbacks"] == {"dtype": 1, "invalid": 1, "autograd": 1}
    with torch.no_grad():  # a plain backward pass: grad mode off, requires_grad leaves are fine
        sdpa_backward(grad_out, q.detach().requires_grad_(), k, v, out, lse, is_causal=True, enable_gqa=True)


def test_on_miss_error_raises_not_found_naming_the_warm_step(store):
    serve(store, on_miss="error")
    args, _ = step()
    with pytest.raises(NotFound, match=r"record --backward, then graphcache warm"):
        sdpa_backward(*args, is_causal=True, enable_gqa=True)
    assert gt.stats()["backward"] == {
        "calls": 1, "hits": 0, "served_from_store": 0, "built_here": 0, "misses": 1, "fallbacks": {}
    }  # fmt: skip
    assert list(store.keys()) == []


def test_a_graph_that_raises_at_execute_is_not_tried_again_for_that_shape(store, monkeypatch):
    serve(store)
    args, _ = step()
    calls = []

    def broken(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append(1)
        raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED")

    monkeypatch.setattr(ReferenceBackwardGraph, "execute", broken)
    for _ in range(3):
        with pytest.raises(UnsupportedCall) as err:
            sdpa_backward(*args, is_causal=True, enable_gqa=True)
        assert err.value.reason == "execute_failed"
    # The class graph raised, then the call's exact graph (built: on_miss=build) raised too; never again.
    assert len(calls) == 2 and gt.stats()["execute_failures"] == 2
    assert gt.stats()["backward"]["fallbacks"] == {"execute_failed": 3}


def test_the_pages_example_serves_a_backward_call_as_torch_computes_it(tmp_path):
    """docs/backward.md's example, run as written (the reference compiler's
    plan is torch's own backward: the same bits)."""
    import subprocess
    import sys

    from tests.docs_examples import ROOT, example

    block = example("backward-serve")
    env = {"PYTHONPATH": str(ROOT), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", block.text], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, f"{block.where}\n{out.stderr[-3000:]}"
    error, stats = out.stdout.splitlines()[-2:]
    built = {"calls": 1, "hits": 0, "served_from_store": 0, "built_here": 1, "misses": 1, "fallbacks": {}}
    assert float(error) <= TOLERANCE["bfloat16"] and stats == str(built), stats  # an empty store: built here
