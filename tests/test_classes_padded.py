"""Length classes on cuDNN without execute-time override (``mechanism:
padded``): which mechanism a target serves a class by, the key that says
so, where a call's tensors are read from (in place or copied, counted), the
cuDNN graph's execute and build check against a CPU stand-in of the
frontend graph (1.28's ``execute(variant_pack, workspace, handle)``, no
override lists), and the reference compiler standing in for cuDNN 9.19.

The GPU side is tests/test_classes_gpu.py's (marked gpu): not yet run on a GPU.
"""

from __future__ import annotations

import threading

import pytest

from graphcache import Artifact, GraphSpec, SpecError, Target, UidMap, UnsupportedSpec
from graphcache.compilers.cudnn import releases
from graphcache.key import key_for

H200 = "h200-sm90-mp132-cudnn{}-fe{}"


def klass(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=4, heads_q=8, heads_kv=2, seq_q=1, seq_kv=256, head_dim=64, dtype="bfloat16", shapes="class")
    return GraphSpec(**{**base, **fields})


# -- which mechanism, and the key -----------------------------------------------------


@pytest.mark.parametrize(
    ("target", "name"),
    [
        (H200.format("9.10.2", "1.12.0"), "padded"),  # every cu126 torch wheel
        (H200.format("9.15.1", "1.24.0"), "padded"),  # torch 2.10 on cu130
        (H200.format("9.19.0", "1.28.0"), "padded"),  # torch 2.11: the lent H200
        (H200.format("9.20.0", "1.32.0"), "padded"),  # torch 2.12, 2.13 on cu130
        (H200.format("9.21.0", "1.24.0"), "override"),  # the override's floor
        (H200.format("9.26.0", "1.23.0"), "padded"),  # a frontend whose execute() drops the override lists
        (H200.format("9.26.0", "1.32.0"), "override"),  # torch 2.15 on cu132
        ("reference-sm00-cudnn0.0.0-fe0.0.0", "override"),  # the reference target names no release
        ("reference-sm00-cudnn9.19.0-fe0.0.0", "padded"),
        ("reference-sm00-cudnn9.26.0-fe1.23.0", "padded"),
    ],
)
def test_a_target_serves_a_class_by_override_where_it_has_it_else_padded(target, name):
    chosen = releases.class_mechanism(klass(), Target.parse(target))
    assert chosen is not None and chosen.serves and chosen.name == name
    if name == "padded":
        assert "execute-time shape override needs cuDNN >= 9.21 and cudnn-frontend >= 1.24" in chosen.why
        assert "copied into a buffer of the declared size" in chosen.why
    assert releases.class_mechanism(klass().at(3, 1, 200), Target.parse(target)) is None, "an exact spec has none"


def test_a_backward_class_without_override_is_not_served_and_a_bias_class_follows_the_bias_floor():
    old = Target.parse(H200.format("9.19.0", "1.28.0"))
    backward = releases.class_mechanism(klass(seq_q=128, seq_kv=128, kind="backward"), old)
    assert backward is not None and not backward.serves and "backward classes have no padded form" in backward.why
    bias = releases.class_mechanism(klass(bias="b1ss"), Target.parse(H200.format("9.21.0", "1.24.0")))
    assert bias is not None and bias.name == "override"
    assert releases.class_mechanism(klass(bias="b1ss"), old).name == "padded"  # type: ignore[union-attr]


def test_the_key_says_the_mechanism_and_keeps_every_override_key():
    old, new = Target.parse(H200.format("9.19.0", "1.28.0")), Target.parse(H200.format("9.26.0", "1.32.0"))
    listed, padded = klass(), klass(mechanism="padded")
    assert key_for(listed, old) == key_for(padded, old), "a manifest's class is keyed as its target serves it"
    assert key_for(listed, new) != key_for(padded, new), "one store holds both kinds of class graph"
    assert releases.resolved(listed, old) == padded and releases.resolved(listed, new) == listed
    # An override class's key is the one it had before mechanisms existed (read off graphcache at fa2f322):
    # stores warmed on a cuDNN with override keep serving.
    assert "mechanism" not in listed.canonical_json() and '"mechanism":"padded"' in padded.canonical_json()
    assert key_for(listed, new) == "5c578570e71d781ecb4b5b86b831f268ced57ae4713c05270f15899f11914c04"


def test_a_mechanism_on_a_spec_it_cannot_apply_to_is_an_error_naming_the_field():
    for fields, words in (
        ({"mechanism": "override"}, "allowed: padded"),
        ({"mechanism": "padded", "shapes": "exact"}, "shapes='exact'"),
        ({"mechanism": "padded", "seq_q": 128, "seq_kv": 128, "kind": "backward"}, "kind='backward'"),
    ):
        with pytest.raises(SpecError, match=words) as err:
            klass(**fields)
        assert err.value.field == "mechanism"


def test_a_padded_class_covers_what_its_listed_class_covers():
    padded = klass(mechanism="padded")
    call = klass().at(3, 1, 200)
    assert padded.covers(call) and klass().covers(call)
    assert padded.summary().endswith("class(padded)") and padded.as_listed() == klass()
    assert padded.at(3, 1, 200) == call, "its exact shapes are the listed class's"


# -- where a call's tensors are read from ---------------------------------------------


torch = pytest.importorskip("torch", reason="the padded graphs run on torch tensors")

from graphcache.compilers import padded as padded_mod  # noqa: E402
from graphcache.compilers.classgraph import bhsd_view, storage_view  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_counts():
    padded_mod.reset()
    yield
    padded_mod.reset()


def test_a_tensor_whose_memory_fits_the_declared_strides_is_read_in_place_and_any_other_is_copied_and_counted():
    spec = klass(layout="bhsd")
    real = spec.at(4, 1, 77)
    shape = padded_mod.PaddedShape(spec, real, torch.device("cpu"))
    # A static cache as long as the class: k/v are views of its first 77 rows, strides the declared ones.
    cache = torch.randn(4, 2, 256, 64, dtype=torch.bfloat16)
    k_static = cache[:, :, :77]
    # A DynamicCache's k: contiguous at 77 rows, a head stride the declaration does not have.
    k_dynamic = k_static.contiguous()
    q = torch.randn(4, 8, 1, 64, dtype=torch.bfloat16)  # decode q at the class's batch: the declared strides
    placed = shape.place(q, k_static, k_dynamic).tensors
    assert placed["k"].data_ptr() == cache.data_ptr(), "read in place: the cache itself"
    assert placed["q"].data_ptr() == q.data_ptr()
    assert placed["v"].data_ptr() != k_dynamic.data_ptr() and torch.equal(placed["v"][:, :, :77], k_dynamic)
    assert tuple(placed["v"].shape) == (4, 2, 256, 64) and placed["v"].stride() == spec.strides("v")
    assert padded_mod.copies() == {"v": {"copies": 1, "bytes": k_dynamic.numel() * 2}}
    assert [int(n) for n in placed["seq_len_kv"].flatten()] == [77] * 4
    # A smaller batch than the class's: a view of a larger batch's memory is still read in place; a
    # tensor of 3 rows does not hold the declared extent, so it is copied. The batch rows past the
    # call's run at length 1 and are dropped.
    small = padded_mod.PaddedShape(spec, spec.at(3, 1, 77), torch.device("cpu"))
    assert small.place(q[:3], k_static[:3], k_static[:3]).tensors["q"].data_ptr() == q.data_ptr()
    q3 = q[:3].clone()
    placed = small.place(q3, k_static[:3], k_dynamic[:3]).tensors
    assert placed["q"].data_ptr() != q3.data_ptr() and padded_mod.copies()["q"]["copies"] == 1
    assert [int(n) for n in placed["seq_len_kv"].flatten()] == [77, 77, 77, 1]
    assert small.output(small.place(q3, k_static[:3], k_dynamic[:3])).shape == (3, 8, 1, 64)


def test_the_buffers_are_reused_across_calls_and_classes_per_thread():
    padded_mod.release_buffers()
    spec, smaller = klass(layout="bhsd"), klass(layout="bhsd", seq_kv=128)
    k = torch.randn(1, 2, 100, 64, dtype=torch.bfloat16)
    first = padded_mod.place("k", k, spec.dims("k"), spec.strides("k"))
    again = padded_mod.place("k", k[:, :, :50].contiguous(), smaller.dims("k"), smaller.strides("k"))
    assert first.data_ptr() == again.data_ptr(), "one buffer per role, reused by every class"
    held = padded_mod.buffer_bytes()
    assert held == 4 * 2 * 256 * 64 * 2, "the largest declared k so far, nothing more"
    seen = []
    worker = threading.Thread(target=lambda: seen.append(padded_mod.place("k", k, spec.dims("k"), spec.strides("k"))))
    worker.start()
    worker.join()
    assert seen[0].data_ptr() != first.data_ptr(), "another thread (on a GPU: stream) has its own"
    assert padded_mod.buffer_bytes() == held, "a thread's own buffers go with it"
    padded_mod.release_buffers()
    assert padded_mod.buffer_bytes() == 0


# -- the reference compiler standing in for cuDNN 9.19 ----------------------------------


OLD_REFERENCE = "9.19.0"


def reference_compiler(cudnn: str = OLD_REFERENCE, frontend: str = "0.0.0"):  # noqa: ANN201
    from graphcache.compilers.reference import ReferenceCompiler

    return ReferenceCompiler(cudnn=cudnn, frontend=frontend)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"layout": "bhsd", "seq_kv": 512},
        {"seq_q": 256, "mask": "causal", "generate_stats": True},
        {"seq_q": 128, "seq_kv": 256, "mask": "causal_bottom_right"},
        {"seq_q": 128, "seq_kv": 128, "mask": "sliding_window", "window_left": 20},
        {"seq_q": 128, "seq_kv": 128, "layout": "bhsd", "layout_q": "bshd", "bias": "b1ss"},
        {"seq_q": 128, "seq_kv": 128, "padding": True},
    ],
    ids=["decode", "decode-bhsd", "prefill-stats", "bottom-right", "window", "bias", "padding"],
)
def test_a_padded_class_serves_every_shape_it_covers_with_the_exact_graphs_answer(fields):
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph
    from graphcache.reference.dense import random_inputs

    compiler = reference_compiler()
    spec = klass(**fields)
    artifact = compiler.build(spec, compiler.target())
    assert artifact.spec == spec.replace(mechanism="padded") and artifact.key == key_for(spec, compiler.target())
    graph = compiler.load(Artifact.decode(artifact.encode()))
    assert type(graph).__name__ == "ReferencePaddedGraph"
    for n, (b, sq, skv) in enumerate(
        [(4, spec.seq_q, spec.seq_kv), (1, 1 if spec.seq_q == 1 else 2, 1), (3, 1 if spec.seq_q == 1 else 33, 33)]
    ):
        real = spec.at(b, sq, skv)
        feed = random_inputs(real, "cpu", seed=n)
        # Every buffer a tensor is copied into is NaN first: rows past the real ones never reach the output.
        with padded_mod.poisoned():
            got = graph.execute(**feed)
        want = TorchSdpaGraph(real).execute(**feed)
        if real.generate_stats:
            assert torch.allclose(got[1], want[1], atol=1e-3)
            got, want = got[0], want[0]
        assert got.shape == want.shape and torch.isfinite(got).all()
        assert torch.allclose(got.float(), want.float(), atol=2e-2), (fields, b, sq, skv)
    assert sum(row["copies"] for row in padded_mod.copies().values()) > 0


def test_a_bound_padded_run_serves_torchs_views_and_counts_its_copies():
    compiler = reference_compiler()
    spec = klass()
    graph = compiler.load(compiler.build(spec, compiler.target()))
    run = graph.bind(spec.at(2, 1, 100))
    q = torch.randn(2, 1, 8, 64, dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(2, 100, 2, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    out = run.run_views(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert out.shape == (2, 8, 1, 64) and torch.allclose(out.float(), want, atol=2e-2)
    assert set(padded_mod.copies()) == {"q", "k", "v"}, "a batch of 2 in a class of 4: nothing fits in place"
    assert padded_mod.copies()["k"]["bytes"] == k.numel() * 2


def test_the_reference_standing_in_for_old_cudnn_refuses_what_that_release_cannot_do():
    from graphcache.errors import TargetMismatch, UnsupportedGpu

    compiler = reference_compiler()
    target = compiler.target()
    assert str(target) == "reference-sm00-cudnn9.19.0-fe0.0.0"
    with pytest.raises(UnsupportedSpec, match="backward classes have no padded form") as err:
        compiler.build(klass(seq_q=128, seq_kv=128, kind="backward"), target)
    assert err.value.step == "preflight"
    gqa_decode = GraphSpec(batch=4, heads_q=8, heads_kv=2, seq_q=1, seq_kv=256, head_dim=64, layout="thd")
    assert releases.refused(gqa_decode, target) is not None, "cuDNN 9.19's known-bad window applies"
    assert releases.refused(gqa_decode, Target.parse("reference-sm00-cudnn0.0.0-fe0.0.0")) is None
    with pytest.raises(UnsupportedGpu, match="cuDNN >= 9.0"):
        reference_compiler("8.9.7").build(klass().at(1, 1, 10), Target.parse("reference-sm00-cudnn8.9.7-fe0.0.0"))
    with pytest.raises(TargetMismatch, match="GRAPHCACHE_REFERENCE_CUDNN"):
        compiler.build(klass(), Target.parse("reference-sm00-cudnn0.0.0-fe0.0.0"))


def test_a_class_graph_on_9_19_and_9_26_is_one_store_two_keys(tmp_path):
    from graphcache import GraphCache
    from graphcache.stores import DiskStore

    store = DiskStore(tmp_path / "s")
    old = GraphCache(store, reference_compiler(OLD_REFERENCE), shape_classes="pow2")
    new = GraphCache(store, reference_compiler("9.26.0"), shape_classes="pow2")
    call = klass().at(3, 1, 200)
    assert old.load(call).spec == klass(mechanism="padded")
    assert new.load(call).spec == klass()
    assert len(list(store.keys())) == 2


# -- cuDNN's padded graph, against a CPU stand-in of the frontend graph ------------------


class StandinPaddedGraph:
    """cudnn-frontend 1.28's ``pygraph.execute(tensor_dict, workspace,
    handle)`` (no override lists: ``_pygraph.py`` of the 1.28 wheel) on a
    padded class graph: it reads every tensor through the DECLARED dims and
    strides from its memory (as cuDNN reads device memory), runs each batch
    row over its seq-len tensors' lengths (cuDNN's bmm1/bmm2 m/n/k overrides
    and padding mask, cudnn-frontend v1.0+), and writes O (and the stats)
    the same way. ``leaky``: a plan that reads V past seq_len_kv (masked
    scores, but 0 x NaN in the second matmul)."""

    def __init__(self, declared: GraphSpec, leaky: bool = False) -> None:
        self.declared = declared
        self.leaky = leaky
        self.calls = 0

    def execute(self, tensor_dict, workspace=None, handle=None):  # noqa: ANN001, ANN201
        from graphcache.reference.dense import reference

        self.calls += 1
        uids, spec = UidMap.default().for_spec(self.declared), self.declared

        def read(role):  # noqa: ANN001, ANN202
            t = tensor_dict[uids[role]]
            base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            return base.as_strided(spec.dims(role), spec.strides(role), t.storage_offset())

        lq, lkv = (read(r).flatten().tolist() for r in ("seq_len_q", "seq_len_kv"))
        o = read("o")
        stats = read("stats") if spec.generate_stats else None
        for b in range(spec.batch):
            real = spec.at(1, lq[b], spec.seq_kv if self.leaky else lkv[b])
            sl = (slice(b, b + 1), slice(None), slice(0, lq[b]))
            kv = (slice(b, b + 1), slice(None), slice(0, real.seq_kv))
            q, k, v = read("q")[sl], read("k")[kv], read("v")[kv]
            bias = None
            if spec.bias:
                rows = sl[0] if spec.dims("bias")[0] > 1 else slice(0, 1)
                bias = read("bias")[rows, :, : lq[b], : real.seq_kv]
            lens = (None, None)
            if self.leaky:  # the scores past the length masked, the values past it read all the same
                real = real.replace(padding=True)
                lens = tuple(torch.tensor([n], dtype=torch.int32).view(1, 1, 1, 1) for n in (lq[b], lkv[b]))
            store = {r: storage_view(real, r, t) for r, t in (("q", q), ("k", k), ("v", v))}
            out, lse = reference(real, store["q"], store["k"], store["v"], *lens, bias)
            o[sl].copy_(bhsd_view(real, "o", out).to(o.dtype))
            if stats is not None:
                stats[sl].copy_(lse)


class CpuCompiler:
    def __init__(self) -> None:
        self._lock = threading.RLock()

    def handle(self) -> object:
        return object()


def cpu_graph(spec: GraphSpec, **standin):  # noqa: ANN003, ANN201
    """A CudnnGraph of a padded class on the CPU: the real class, with the
    frontend graph and the compiler's handle stood in."""
    from graphcache.compilers.cudnn.loaded import CudnnGraph

    target = Target.parse(H200.format("9.19.0", "1.28.0"))
    artifact = Artifact(spec=spec, target=target, payload=b"x", uids=UidMap.default())
    graph = CudnnGraph.__new__(CudnnGraph)
    graph._compiler, graph.artifact, graph.spec, graph.uids = CpuCompiler(), artifact, spec, artifact.uids
    graph._graph = StandinPaddedGraph(spec, **standin)
    graph.device = torch.device("cpu")
    graph.workspace_size = 1024
    graph._workspaces = {}
    return graph


@pytest.fixture
def _cpu_workspace():
    from graphcache.compilers.cudnn.loaded import CudnnGraph

    saved = CudnnGraph.__dict__["workspace"]
    CudnnGraph.workspace = property(lambda self: torch.empty(1 << 16, dtype=torch.uint8))  # type: ignore[assignment]
    yield
    CudnnGraph.workspace = saved  # type: ignore[misc]


@pytest.mark.usefixtures("_cpu_workspace")
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"layout": "bhsd"},
        {"seq_q": 256, "mask": "causal", "generate_stats": True},
        {"seq_q": 256, "layout": "sbhd"},
    ],
    ids=["decode", "decode-bhsd", "prefill-stats", "sbhd"],
)
def test_the_build_check_passes_a_padded_plan_and_refuses_one_that_reads_past_the_lengths(fields):
    from graphcache.compilers.cudnn.padded import check_padded

    spec = klass(batch=2, mechanism="padded", **fields)
    assert check_padded(cpu_graph(spec)) < 2e-2
    with pytest.raises(UnsupportedSpec, match=r"disagrees with the float32 reference at real shapes b\d+ q\d+ kv\d+"):
        check_padded(cpu_graph(spec, leaky=True))


@pytest.mark.usefixtures("_cpu_workspace")
@pytest.mark.parametrize("graph_of", ["cudnn", "reference"])
def test_a_bound_padded_runs_checked_call_with_the_callers_lengths_serves_it_and_reuses_its_shape(graph_of):
    # What a padding mask's call takes (graphcache.hf, a static cache's prefix): the bound run's execute
    # with the caller's seq-len tensors, b 3 of a class of 4; its declared shapes made once, at bind.
    from graphcache.compilers.classgraph import bind
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph
    from graphcache.reference.dense import random_inputs

    spec = klass(seq_q=128, seq_kv=128, padding=True, mechanism="padded")
    if graph_of == "cudnn":
        graph = cpu_graph(spec)
    else:
        compiler = reference_compiler()
        graph = compiler.load(Artifact.decode(compiler.build(spec, compiler.target()).encode()))
    real = spec.at(3, 100, 100)
    run = bind(graph, real)
    made = []
    saved = padded_mod.PaddedShape.__init__

    def counted(self, *args):  # noqa: ANN001, ANN002
        made.append(args)
        saved(self, *args)

    padded_mod.PaddedShape.__init__ = counted
    try:
        for seed in range(3):
            feed = random_inputs(real, "cpu", seed=seed)
            feed["seq_len_q"] = torch.full_like(feed["seq_len_q"], 100)  # every query row, as graphcache.hf passes
            want = TorchSdpaGraph(real).execute(**feed)
            got = run.execute(feed.pop("q"), feed.pop("k"), feed.pop("v"), **feed)
            assert got.shape == want.shape and torch.allclose(got.float(), want.float(), atol=2e-2)
    finally:
        padded_mod.PaddedShape.__init__ = saved
    assert len(made) <= 1, "the bound run's declared shapes, made once, serve every call of its spec"


@pytest.mark.usefixtures("_cpu_workspace")
def test_a_padded_cudnn_graph_passes_no_override_lists_and_binds_once_per_shape():
    from graphcache.compilers.classgraph import bind

    spec = klass(mechanism="padded")
    graph = cpu_graph(spec)
    run = bind(graph, spec.at(3, 1, 77))
    assert type(run).__name__ == "PaddedRun"
    q = torch.randn(3, 1, 8, 64, dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(3, 77, 2, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in range(2))
    out = run.run_views(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert out.shape == (3, 8, 1, 64) and torch.allclose(out.float(), want, atol=2e-2)
    assert graph._graph.calls == 1


def test_the_aten_doors_nine_outputs_keep_the_meta_kernels_strides_through_a_padded_class(tmp_path):
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.stores import DiskStore

    op = torch.ops.aten._scaled_dot_product_cudnn_attention
    gt.reset()
    try:
        gt.configure(GraphCache(DiskStore(tmp_path), reference_compiler()), device="cpu", on_miss="build")
        gt.install(dispatch_key="CPU")
        q, k, v = (torch.randn(1, n, 8, 64, dtype=torch.bfloat16).transpose(1, 2) for n in (16, 32, 32))
        got = op(q, k, v, None, True, 0.0, True, False)  # the logsumexp asked: a stats graph
        metas = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (q, k, v)]
        want = op(*metas, None, True, 0.0, True, False)
        for mine, theirs in zip(got[:2], want[:2], strict=True):
            assert (mine.shape, mine.stride()) == (theirs.shape, theirs.stride())
        assert any(g.endswith("stats class(padded)") for g in gt.stats()["built_graphs"]), gt.stats()["built_graphs"]
        torch.testing.assert_close(got[0].float(), torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), is_causal=True), atol=2e-2, rtol=0)  # fmt: skip
    finally:
        gt.uninstall()
        gt.reset()
