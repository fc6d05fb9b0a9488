"""Bias graphs in the cuDNN compiler on this CPU (issue 25, item 1): the
declaration against the real cudnn-frontend 1.32 (validate and
build_operation_graph run without a GPU), the override lists of a class
graph, the release table, and the float32 reference and torch fallback
they are checked against. Not yet run on a GPU."""

from __future__ import annotations

import pytest

from graphcache import GraphSpec, UidMap
from graphcache.compilers.cudnn import build_graph
from graphcache.compilers.cudnn.releases import BIAS, BIAS_OVERRIDE, available, missing
from tests.test_compiler_cudnn import _frontend_1_32, _has_driver

torch = pytest.importorskip("torch", reason="the reference checks run on torch tensors")

BIASES = ("bhss", "b1ss", "1hss", "11ss")


def make(**changes) -> GraphSpec:  # noqa: ANN003
    base = {"batch": 2, "heads_q": 8, "heads_kv": 2, "seq_q": 128, "seq_kv": 192, "head_dim": 64}
    return GraphSpec.from_dict({**base, "dtype": "bfloat16", **changes})


@pytest.mark.cudnn
@pytest.mark.skipif(_has_driver(), reason="records what 1.32 does on a machine without an NVIDIA driver")
@pytest.mark.parametrize("bias", BIASES)
@pytest.mark.parametrize(
    "extra",
    [{}, {"layout": "bhsd", "mask": "causal"}, {"shapes": "class", "generate_stats": True}, {"bias_dtype": "float32"}],
)
def test_a_bias_graph_validates_and_lowers_with_the_bias_tensor_it_declares(bias, extra):
    cudnn = _frontend_1_32()
    spec = make(bias=bias, **extra)
    uids = UidMap.default()
    built = build_graph(cudnn, spec, uids, lower=False)
    t = built.tensors["bias"]
    assert list(t.get_dim()) == list(spec.dims("bias")) and list(t.get_stride()) == list(spec.strides("bias"))
    assert t.get_data_type() == (cudnn.data_type.FLOAT if spec.bias_dtype else cudnn.data_type.BFLOAT16)
    assert t.get_uid() == 17 == uids.for_spec(spec)["bias"]
    node = built.graph.nodes() if callable(built.graph.nodes) else built.graph.nodes
    assert node[0].inputs["bias"] is t  # the sdpa node reads it as its bias
    built.graph.build_operation_graph()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="NVIDIA driver"):
        built.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])


@pytest.mark.cudnn
@pytest.mark.parametrize("bias", BIASES)
def test_the_frontends_own_sdpa_analyzer_reads_the_bias_as_declared(bias):
    """1.32's graph analyzer (cudnn/sdpa/graph_analyzer.py) resolves a graph to
    the facts its Python engines run: the bias must be there, valid, with the
    spec's dims, packed strides, io dtype and UID."""
    cudnn = _frontend_1_32()
    from cudnn.sdpa.graph_analyzer import analyze

    spec = make(bias=bias)
    facts = analyze(build_graph(cudnn, spec, UidMap.default(), lower=False).graph)
    assert facts is not None and facts.invalid is None and facts.has_bias and not facts.has_dbias
    assert facts.bias_dim == spec.dims("bias") and facts.bias_stride == spec.strides("bias")
    assert facts.bias_dtype == cudnn.data_type.BFLOAT16 and facts.bias_t.uid == 17


@pytest.mark.cudnn
def test_a_float32_bias_is_declared_float32_and_the_frontends_analyzer_takes_it():
    """1.32's analyzer finds nothing invalid in a float32 bias with bf16
    q/k/v (its SM80 Python engine compiles a float32 bias load; which of the
    native engines run one is not yet seen on a GPU)."""
    cudnn = _frontend_1_32()
    from cudnn.sdpa.graph_analyzer import analyze

    spec = make(bias="1hss", bias_dtype="float32")
    facts = analyze(build_graph(cudnn, spec, UidMap.default(), lower=False).graph)
    assert facts is not None and facts.invalid is None and facts.has_bias
    assert facts.bias_dtype == cudnn.data_type.FLOAT and facts.dtype == cudnn.data_type.BFLOAT16


def test_a_graph_without_bias_declares_none():
    cudnn = _frontend_1_32()
    built = build_graph(cudnn, make(), UidMap.default(), lower=False)
    assert "bias" not in built.tensors


def test_the_release_table_says_who_takes_a_bias_and_a_bias_under_override():
    assert available(BIAS, "1.3.0", "9.0.0")
    assert available(BIAS_OVERRIDE, "1.32.0", "9.28.0")
    assert "cuDNN >= 9.21" in (missing(BIAS_OVERRIDE, "1.32.0", "9.20.0") or "")
    assert "cudnn-frontend >= 1.24" in (missing(BIAS_OVERRIDE, "1.23.0", "9.28.0") or "")


# -- class graphs: the bias's shape overridden like q/k/v (a CPU stand-in of the frontend graph) --


class BiasStandin:
    """1.32's ``pygraph.execute`` on the CPU: reads every tensor through the
    override shape and strides it was given (from its storage, as cuDNN reads
    device memory), the bias included, and writes O with the float32
    reference. ``declared_bias`` reads the bias with its declared strides
    instead: a plan that does not honour the bias's override."""

    def __init__(self, declared: GraphSpec, declared_bias: bool = False) -> None:
        self.declared, self.declared_bias, self.calls = declared, declared_bias, []

    def get_workspace_size(self, handle=None, **lists):  # noqa: ANN001, ANN003, ANN201
        return 4096

    def execute(self, pack, workspace=None, handle=None, **lists):  # noqa: ANN001, ANN003, ANN201
        from graphcache.compilers.torch_sdpa import reference

        self.calls.append(lists)
        uids = UidMap.default().for_spec(self.declared)
        given = dict(
            zip(
                lists["override_uids"],
                zip(lists["override_shapes"], lists["override_strides"], strict=True),
                strict=True,
            )
        )

        def read(role):  # noqa: ANN001, ANN202
            t = pack[uids[role]]
            shape, stride = given[uids[role]]
            if role == "bias" and self.declared_bias:  # the real extent read with the declared strides
                stride = self.declared.strides(role)
            base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            try:
                return base.as_strided(shape, stride, t.storage_offset())
            except RuntimeError:  # past the buffer: on a GPU, memory that is not the tensor's
                return torch.full(shape, float("nan") if t.is_floating_point() else 0, dtype=t.dtype)

        q, k, v, o = (read(r) for r in ("q", "k", "v", "o"))
        real = self.declared.at(q.shape[0], q.shape[2], k.shape[2])
        store = [t.transpose(1, 2) if real.layout == "bshd" else t for t in (q, k, v)]
        lengths = read("seq_len_q"), read("seq_len_kv")
        out, _ = reference(real.replace(padding=True), *store, *lengths, read("bias"))
        o.copy_((out.transpose(1, 2) if real.layout == "bshd" else out).to(o.dtype))


def bias_class_graph(spec: GraphSpec, **standin):  # noqa: ANN003, ANN201
    """test_classes_cudnn's CPU class graph, with this file's frontend stand-in."""
    from tests.test_classes_cudnn import cpu_graph

    graph = cpu_graph(spec)
    graph._graph = BiasStandin(spec, **standin)
    return graph


@pytest.fixture
def cpu_workspace(monkeypatch):
    from graphcache.compilers.cudnn import CudnnGraph, override

    monkeypatch.setattr(CudnnGraph, "workspace", property(lambda self: torch.empty(1 << 16, dtype=torch.uint8)))
    monkeypatch.setattr(override, "workspace", lambda graph, size: torch.empty(size, dtype=torch.uint8))


@pytest.mark.parametrize("bias_dtype", [None, "float32"])
@pytest.mark.parametrize("bias", ["b1ss", "1hss"])
def test_a_bias_class_graph_passes_its_check_and_one_ignoring_the_bias_override_does_not(
    cpu_workspace, bias, bias_dtype
):
    from graphcache import UnsupportedSpec
    from graphcache.compilers.cudnn import override

    spec = make(bias=bias, bias_dtype=bias_dtype, shapes="class", seq_q=256, seq_kv=256, mask="none")
    assert override.check_class(bias_class_graph(spec)) < 2e-2
    with pytest.raises(UnsupportedSpec, match="disagrees with the float32 reference"):
        override.check_class(bias_class_graph(spec, declared_bias=True))


def test_the_override_lists_carry_the_bias_at_the_real_shape_and_a_bound_run_serves_torchs_views(cpu_workspace):
    from graphcache.compilers.classgraph import bind
    from graphcache.compilers.cudnn import override

    spec = make(bias="b1ss", shapes="class", seq_q=128, seq_kv=256, layout="bhsd")
    real = spec.at(2, 100, 200)
    lists = override.lists_for(real, UidMap.default())
    assert lists["override_uids"][-1] == 17 and lists["override_shapes"][-1] == [2, 1, 100, 200]
    assert lists["override_strides"][-1] == [100 * 200, 100 * 200, 200, 1]
    run = bind(bias_class_graph(spec), real)
    q, k, v = (torch.randn(2, h, s, 64, dtype=torch.bfloat16) for h, s in ((8, 100), (2, 200), (2, 200)))
    mask = torch.rand(2, 1, 100, 200) > 0.3
    bias = torch.where(mask, 0.0, float("-inf")).to(torch.bfloat16)
    out = run.run_views(q, k, v, bias)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True
    )
    assert torch.allclose(out.float(), want, atol=2e-2)
    assert run.graph._graph.calls[-1]["override_uids"][-1] == 17


def test_a_bias_class_on_a_stack_whose_override_engine_takes_no_bias_is_unsupported():
    from graphcache import UnsupportedSpec
    from graphcache.compilers.cudnn import override

    spec = make(bias="b1ss", shapes="class")
    override.check_target(spec, "1.32.0", "9.21.0")
    with pytest.raises(UnsupportedSpec, match="cuDNN >= 9.21"):
        override.check_target(spec, "1.32.0", "9.20.0")


# -- the reference and the fallback graph ------------------------------------------------


@pytest.mark.parametrize("bias", BIASES)
def test_the_reference_adds_the_bias_and_zeroes_rows_that_see_no_key_as_torch_does(bias):
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, compared_rows, random_inputs, reference

    spec = make(bias=bias, seq_q=96, seq_kv=160)
    feed = random_inputs(spec, "cpu", seed=4)
    b = feed["bias"]
    assert b.shape == spec.dims("bias") and b.dtype == torch.bfloat16
    hidden = (b == float("-inf")).all(-1)
    assert hidden.any(), "a row that sees no key"
    assert (b[-1, :, :, :80] == float("-inf")).all(), "a left-padded sequence: its first 64-key tile hidden"
    out, stats = reference(spec, **feed)
    group = spec.heads_q // spec.heads_kv
    q, k, v = (feed[r].transpose(1, 2).float() for r in ("q", "k", "v"))
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=b.float()
    )
    assert torch.allclose(out.transpose(1, 2), want, atol=1e-4)
    rows = hidden.expand(spec.batch, spec.heads_q, spec.seq_q)
    assert (out.transpose(1, 2)[rows] == 0).all() and (stats.squeeze(-1)[rows] == float("-inf")).all()
    keep = compared_rows(spec, bias=b)
    assert not keep[hidden.any(1) if b.shape[0] > 1 else hidden.any(1).expand(spec.batch, -1)].any()
    fallback = TorchSdpaGraph(spec).execute(feed["q"], feed["k"], feed["v"], bias=b)
    assert torch.allclose(fallback.float().transpose(1, 2), want, atol=2e-2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_float32_bias_spec_gives_torchs_answer_for_t5_sized_biases_where_the_io_dtype_cast_does_not(dtype):
    """T5's relative position biases (and biases of +-32) added in float32,
    as torch's SDPA adds a float32 mask to 16-bit scores: the reference and
    the fallback graph of a ``bias_dtype: float32`` spec give torch's answer;
    the bias cast to the io dtype first is off by more than bf16's tolerance."""
    from graphcache import ExecutionError
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs, reference
    from graphcache.reference.measure import TOLERANCE, relative_error

    spec = make(bias="1hss", bias_dtype="float32", dtype=dtype, layout="bhsd")
    feed = random_inputs(spec, "cpu", seed=6)
    assert feed["bias"].dtype == torch.float32
    bias = (torch.rand(spec.dims("bias"), generator=torch.Generator().manual_seed(6)) * 2 - 1) * 32
    q, k, v = feed["q"], feed["k"], feed["v"]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
    ref, _ = reference(spec, q, k, v, bias=bias)
    assert relative_error(ref, want) < TOLERANCE[dtype] / 4
    assert torch.equal(TorchSdpaGraph(spec).execute(q, k, v, bias=bias), want)
    cast = TorchSdpaGraph(spec.replace(bias_dtype=None)).execute(q, k, v, bias=bias.to(q.dtype))
    if dtype == "bfloat16":
        assert relative_error(cast, want) > TOLERANCE[dtype], "what casting the bias to bf16 cost"
    with pytest.raises(ExecutionError, match="float32"):
        TorchSdpaGraph(spec).execute(q, k, v, bias=bias.to(q.dtype))


def test_the_fallback_graph_combines_the_bias_with_the_specs_mask_and_refuses_a_missing_one():
    from graphcache import ExecutionError
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs, reference, reference_error

    spec = make(bias="bhss", mask="causal", seq_q=64, seq_kv=64, layout="bhsd")
    feed = random_inputs(spec, "cpu", seed=5)
    out = TorchSdpaGraph(spec).execute(**feed)
    assert reference_error(spec, out, feed) < 2e-2
    ref, _ = reference(spec, **feed)
    assert ref[0, 0, 0].abs().sum() > 0 or (feed["bias"][0, 0, 0, 0] == float("-inf"))
    with pytest.raises(ExecutionError, match="bias is missing"):
        TorchSdpaGraph(spec).execute(feed["q"], feed["k"], feed["v"])
    with pytest.raises(ExecutionError, match="no bias"):
        TorchSdpaGraph(make(layout="bhsd", seq_q=64, seq_kv=64)).execute(
            feed["q"], feed["k"], feed["v"], bias=feed["bias"]
        )


# -- the dense build check (CudnnCompiler._checked) on a bias graph -----------------------


class DensePlan:
    """A stand-in for a loaded exact bias graph: torch's semantics on the CPU,
    NaN on the rows that see no key (where cuDNN promises nothing);
    ``ignore_bias`` runs without the bias, a plan that dropped it."""

    device = "cpu"

    def __init__(self, spec: GraphSpec, ignore_bias: bool = False) -> None:
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.spec, self.ignore = spec, ignore_bias
        self.inner = TorchSdpaGraph(spec.replace(bias=None) if ignore_bias else spec)

    def execute(self, **feed):  # noqa: ANN003, ANN201
        bias = feed.pop("bias")
        out = self.inner.execute(**feed, **({} if self.ignore else {"bias": bias}))
        hidden = (bias == float("-inf")).all(-1, keepdim=True)  # (b|1, h|1, s_q, 1)
        (out.transpose(1, 2) if self.spec.layout == "bshd" else out).masked_fill_(hidden, float("nan"))
        return out


@pytest.mark.parametrize("bias", ["b1ss", "1hss"])
def test_the_build_check_passes_a_bias_plan_with_nan_on_rows_without_keys_and_fails_one_ignoring_the_bias(bias):
    from graphcache import BuildError
    from graphcache.compilers.cudnn import CudnnCompiler
    from tests.fakes import TARGET, make_artifact

    spec = make(bias=bias, seq_q=96, seq_kv=160, mask="causal")
    checked = CudnnCompiler(canary=False)._checked(make_artifact(spec, TARGET), DensePlan(spec))  # type: ignore[arg-type]
    assert checked.validation_error <= 2e-2 and checked.canary is not None
    with pytest.raises(BuildError, match="reference"):
        CudnnCompiler(canary=False)._checked(make_artifact(spec, TARGET), DensePlan(spec, ignore_bias=True))  # type: ignore[arg-type]
