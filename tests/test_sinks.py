"""Attention sinks (issue 25: gpt-oss's ``s_aux``): the ``sinks`` spec field,
its key and UID, the float32 reference against transformers' own gpt-oss
eager attention, the torch fallback and reference compiler that serve sink
specs through it, and the cuDNN declaration (``sdpa(sink_token=)``) against
the real cudnn-frontend 1.32 on this CPU. The cuDNN graph is not yet run on
a GPU."""

from __future__ import annotations

import json

import pytest

from graphcache import GraphCache, GraphSpec, SpecError, Target, UidMap, key_for
from graphcache.compilers.cudnn import build_graph
from graphcache.compilers.cudnn.releases import SINKS, available, missing
from graphcache.compilers.reference import ReferenceCompiler
from graphcache.errors import ExecutionError
from graphcache.reference.dense import random_inputs, reference
from graphcache.stores import DiskStore
from tests.test_compiler_cudnn import _frontend_1_32, _has_driver

torch = pytest.importorskip("torch", reason="the reference runs on torch tensors")

TARGET = Target.parse("h200-sm90-cudnn9.28.0-fe1.32.0")


def make(**changes) -> GraphSpec:  # noqa: ANN003
    base = {"batch": 2, "heads_q": 8, "heads_kv": 2, "seq_q": 96, "seq_kv": 96, "head_dim": 64}
    return GraphSpec.from_dict({**base, "dtype": "bfloat16", "mask": "causal", **changes})


# -- the field, its key and its UID ------------------------------------------------


def test_a_spec_without_sinks_keeps_its_canonical_form_and_key():
    plain = make()
    assert "sinks" not in json.loads(plain.canonical_json())
    assert GraphSpec.from_dict({**plain.to_dict(), "sinks": False}) == plain
    sink = make(sinks=True)
    assert json.loads(sink.canonical_json())["sinks"] is True
    assert key_for(sink, TARGET) != key_for(plain, TARGET)
    assert GraphSpec.from_dict(json.loads(sink.canonical_json())) == sink
    assert "sinks" in sink.summary() and "sinks" not in plain.summary()


def test_only_a_sink_specs_uid_map_holds_the_sink_role():
    assert "sink" not in UidMap.default().for_spec(make()).uids
    assert UidMap.default().for_spec(make(sinks=True))["sink"] == 18
    assert make(sinks=True).dims("sink") == (1, 8, 1, 1) and make(sinks=True).strides("sink") == (8, 1, 1, 1)


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"sinks": 1}, "true or false"),
        ({"sinks": True, "dropout": 0.1}, "dropout"),
        ({"sinks": True, "generate_stats": True}, "generate_stats"),
    ],
)
def test_sink_combinations_not_taken_here_are_spec_errors_naming_sinks(changes, says):
    with pytest.raises(SpecError, match=says) as err:
        make(**changes)
    assert err.value.field == "sinks"


# -- the reference: what transformers' gpt-oss eager attention computes -----------


def _gpt_oss_eager(spec: GraphSpec, q, k, v, sink):  # noqa: ANN001, ANN202
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    module = torch.nn.Module()
    module.num_key_value_groups = spec.heads_q // (spec.heads_kv or spec.heads_q)
    module.sinks = sink.reshape(-1)
    module.training = False
    s = spec.seq_q
    mask = torch.zeros(s, s).masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    bhsd = [t.float().transpose(1, 2) for t in (q, k, v)]  # bshd storage -> (b, h, s, d)
    out, _ = eager_attention_forward(module, *bhsd, mask.view(1, 1, s, s), scaling=spec.attn_scale)
    return out  # (b, s, h, d), the bshd storage form


def test_the_reference_with_sinks_is_transformers_gpt_oss_eager_attention():
    pytest.importorskip("transformers.models.gpt_oss")
    spec = make(sinks=True)
    inputs = random_inputs(spec, "cpu")
    out, _ = reference(spec, **inputs)
    want = _gpt_oss_eager(spec, inputs["q"], inputs["k"], inputs["v"], inputs["sink"])
    assert torch.allclose(out, want, atol=1e-5)
    without, _ = reference(make(), inputs["q"], inputs["k"], inputs["v"])
    assert not torch.allclose(without, want, atol=1e-3)  # the sinks change the answer


def test_the_reference_compiler_serves_a_sink_spec_with_its_sink_tensor(tmp_path):
    spec = make(sinks=True)
    graph = GraphCache(DiskStore(tmp_path / "store"), ReferenceCompiler()).load(spec)
    inputs = random_inputs(spec, "cpu", seed=3)
    out = graph.execute(**inputs)
    want, _ = reference(spec, **inputs)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), want, atol=2e-2)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    with pytest.raises(ExecutionError, match="sink is missing"):
        graph.execute(q, k, v)
    with pytest.raises(ExecutionError, match="float32"):
        graph.execute(q, k, v, sink=inputs["sink"].to(torch.bfloat16))
    plain = GraphCache(DiskStore(tmp_path / "store"), ReferenceCompiler()).load(make())
    with pytest.raises(ExecutionError, match="sinks=false"):
        plain.execute(q, k, v, sink=inputs["sink"])


# -- cuDNN: the declaration against the real frontend 1.32, and the release row ----


@pytest.mark.cudnn
@pytest.mark.skipif(_has_driver(), reason="records what 1.32 does on a machine without an NVIDIA driver")
@pytest.mark.parametrize("extra", [{}, {"layout": "bhsd", "bias": "b1ss"}, {"shapes": "class", "seq_q": 128}])
def test_a_sink_graph_validates_and_lowers_with_the_sink_tensor_it_declares(extra):
    cudnn = _frontend_1_32()
    spec = make(sinks=True, **extra)
    built = build_graph(cudnn, spec, UidMap.default(), lower=False)
    t = built.tensors["sink"]
    assert list(t.get_dim()) == [1, 8, 1, 1] and list(t.get_stride()) == [8, 1, 1, 1] and t.get_uid() == 18
    assert t.get_data_type() == cudnn.data_type.FLOAT
    node = built.graph.nodes() if callable(built.graph.nodes) else built.graph.nodes
    assert node[0].inputs["sink_token"] is t  # the sdpa node reads it as its sink logits
    built.graph.build_operation_graph()
    with pytest.raises(cudnn.cudnnGraphNotSupportedError, match="NVIDIA driver"):
        built.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])


@pytest.mark.cudnn
def test_the_frontends_own_sdpa_analyzer_reads_the_sink_as_valid():
    cudnn = _frontend_1_32()
    from cudnn.sdpa.graph_analyzer import analyze

    facts = analyze(build_graph(cudnn, make(sinks=True), UidMap.default(), lower=False).graph)
    assert facts is not None and facts.invalid is None and facts.has_sink and facts.sink_t.uid == 18
    plain = analyze(build_graph(cudnn, make(), UidMap.default(), lower=False).graph)
    assert plain is not None and not plain.has_sink


def test_the_release_table_says_who_takes_sink_logits():
    assert available(SINKS, "1.19.0", "9.13.0")
    assert "cuDNN >= 9.13" in (missing(SINKS, "1.32.0", "9.12.0") or "")
    assert "cudnn-frontend >= 1.19" in (missing(SINKS, "1.18.0", "9.28.0") or "")


@pytest.mark.gpu
@pytest.mark.skip(reason="needs an NVIDIA GPU with cuDNN >= 9.13: sink graphs are not yet run on a GPU")
def test_a_cudnn_sink_graph_matches_the_reference_on_a_gpu():  # pragma: no cover - GPU only
    from graphcache.compilers.cudnn import CudnnCompiler

    spec = make(sinks=True)
    compiler = CudnnCompiler()
    graph = compiler.load(compiler.build(spec, compiler.target()))
    inputs = random_inputs(spec, "cuda")
    want, _ = reference(spec, **inputs)
    assert torch.allclose(graph.execute(**inputs).float(), want, atol=2e-2)


# -- a class graph's check on this CPU (test_cudnn_bias's frontend stand-in) --------


def _sink_standin(spec: GraphSpec, ignore_sink: bool = False):  # noqa: ANN202
    from tests.test_cudnn_bias import BiasStandin

    class SinkStandin(BiasStandin):
        """Reads q/k/v/o through their override lists and the sink from the
        pack by its UID (a (1, h, 1, 1) tensor no class overrides)."""

        def execute(self, pack, workspace=None, handle=None, **lists):  # noqa: ANN001, ANN003, ANN202
            self.calls.append(lists)
            given = dict(zip(lists["override_uids"], lists["override_shapes"], strict=True))
            q, k, v, o = (pack[uid] for uid in (1, 2, 3, 4))
            assert tuple(q.shape) == tuple(given[1])  # (b, h, s, d) views at the real shape
            real = self.declared.at(q.shape[0], q.shape[2], k.shape[2])
            store = [t.transpose(1, 2) for t in (q, k, v)]  # bshd storage
            sink = None if ignore_sink else pack[18]
            out, _ = reference(real.replace(sinks=sink is not None), *store, sink=sink)
            o.copy_(out.transpose(1, 2).to(o.dtype))

    from tests.test_classes_cudnn import cpu_graph

    graph = cpu_graph(spec)
    graph._graph = SinkStandin(spec)
    return graph


def test_a_sink_class_graph_is_checked_with_its_sink_and_one_ignoring_it_fails(monkeypatch):
    from graphcache import UnsupportedSpec
    from graphcache.compilers.cudnn import CudnnGraph, override

    monkeypatch.setattr(CudnnGraph, "workspace", property(lambda self: torch.empty(1 << 16, dtype=torch.uint8)))
    monkeypatch.setattr(override, "workspace", lambda graph, size: torch.empty(size, dtype=torch.uint8))
    spec = make(sinks=True, shapes="class", seq_q=128, seq_kv=128)
    assert override.check_class(_sink_standin(spec)) < 2e-2
    with pytest.raises(UnsupportedSpec, match="disagrees with the float32 reference"):
        override.check_class(_sink_standin(spec, ignore_sink=True))
