"""Issue 25's measure on the other route: attn_implementation="sdpa" under
``graphcache.torch.patch()``, where transformers hands padded batches,
sliding-window band masks and T5's position bias over as ``attn_mask``
tensors (bias graphs). Models built from configs (tests/hf_models.py),
recorded on prompts of 37/200/513 tokens, warmed, then served on other
prompt lengths, a left-padded batch of 4 and 2-beam search (the windowed
models with their config's manifest warmed beside the recording); the CPU
stand-in compiler executes every graph. docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch (pip install '.[gpu]' or '.[dev]')")
transformers = pytest.importorskip("transformers", reason="needs Hugging Face transformers (the dev extra)")

import graphcache.torch as gt  # noqa: E402
from graphcache import GraphCache, UidMap  # noqa: E402
from graphcache.compilers.cudnn import build_graph  # noqa: E402
from graphcache.models.config import describe  # noqa: E402
from graphcache.models.specs import specs_for  # noqa: E402
from graphcache.spec.classes import class_of  # noqa: E402
from graphcache.stores import DiskStore  # noqa: E402
from tests import hf_models  # noqa: E402
from tests.test_torch_bias import no_host_reads  # noqa: E402, F401
from tests.test_torch_gpu import masked_hit_without_sync  # noqa: E402
from tests.torch_standins import CpuGraphCompiler  # noqa: E402

SDPA = torch._C._nn.scaled_dot_product_attention  # torch's own, whatever is patched
NEW_TOKENS = 3


@pytest.fixture(autouse=True)
def fresh_runtime():
    gt.reset()
    yield
    gt.reset()


def assert_served(cases: list[hf_models.Case]) -> None:
    for case in cases:
        assert case.calls > 0, case
        assert case.fraction >= 0.95, case
        assert case.equal or case.tie, case


@pytest.mark.parametrize("name", ["llama", "bart", "t5"])
def test_a_recorded_model_on_route_sdpa_is_served_by_graphs_with_torchs_tokens(tmp_path, name):
    compiler = CpuGraphCompiler()
    assert_served(hf_models.measure(name, compiler, tmp_path, hf_models.Lengths(), NEW_TOKENS, attn="sdpa"))
    assert compiler.executions > 0


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_a_windowed_model_on_route_sdpa_with_its_config_manifest_beside_the_recording(tmp_path, name):
    # The recording's 2-beam search (37 tokens) never reached the 64-token
    # window, so a 2-beam prompt past it (a band mask at batch 2) has no
    # recorded class; the config's manifest (batch classes up to 4) has it.
    manifest = specs_for(describe(hf_models.config(name).to_dict()), max_batch=4, max_seq=1024, route="sdpa")
    lengths = hf_models.Lengths()
    cases = hf_models.measure(name, CpuGraphCompiler(), tmp_path, lengths, NEW_TOKENS, "sdpa", manifest.users)
    assert_served(cases)


# -- a GQA decode step whose query heads transformers packed into rows -------------------


def packed_decode(b=2, heads=8, heads_kv=2, kv=40, d=32, pad=(0, 9)):  # noqa: ANN001
    """transformers' sdpa on a masked GQA decode step (``pack_gqa``): the
    (b, heads, 1, d) query as (b, heads_kv, heads / heads_kv, d) rows, the
    cache's (b, heads_kv, kv, d) keys, a left-padding mask (b, 1, 1, kv)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, heads, 1, d, generator=g).to(torch.bfloat16).reshape(b, heads_kv, heads // heads_kv, d)
    k, v = (torch.randn(b, heads_kv, kv, d, generator=g).to(torch.bfloat16) for _ in range(2))
    mask = torch.stack([torch.arange(kv) >= p for p in pad]).reshape(b, 1, 1, kv)
    return q, k, v, mask


def test_a_masked_gqa_decode_step_is_the_decode_spec_it_came_from():
    q, k, v, mask = packed_decode()
    spec = gt.spec_for(q, k, v, attn_mask=mask)
    assert (spec.heads_q, spec.heads_kv, spec.seq_q, spec.bias) == (8, 2, 1, "b1ss")
    rows = mask.expand(2, 1, 4, 40).contiguous()  # a mask that differs by row could: the rows stay rows
    assert (gt.spec_for(q, k, v, attn_mask=rows).seq_q, gt.spec_for(q, k, v, attn_mask=rows).heads_q) == (4, 2)


def test_a_masked_gqa_decode_step_is_served_with_torchs_answer_and_no_host_read(
    tmp_path,
    monkeypatch,
    no_host_reads,  # noqa: F811
):
    gt.configure(
        GraphCache(DiskStore(tmp_path / "s"), CpuGraphCompiler(), shape_classes="pow2"), device="cpu", on_miss="build"
    )
    q, k, v, mask = packed_decode()
    gt.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # builds and loads the decode class
    q2, k2, v2, other = packed_decode(kv=41, pad=(3, 0))  # the next step: one key more, a new mask
    no_host_reads()
    got = gt.scaled_dot_product_attention(q2, k2, v2, attn_mask=other)
    monkeypatch.undo()  # the checks below read values
    stats = gt.stats()
    assert stats["built_here"] == 2 and stats["fallbacks"] == {}, stats
    assert {(g.spec.heads_q, g.spec.seq_q) for g in gt.RUNTIME._graphs.values()} == {(8, 1)}
    assert got.shape == q2.shape
    torch.testing.assert_close(got.float(), SDPA(q2, k2, v2, attn_mask=other).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.cudnn
def test_the_folded_decode_steps_bias_class_validates_and_lowers_with_the_real_frontend(cudnn):
    """The class graph a packed decode step is served by (GQA, one query, a
    (b, 1, 1, kv) bias) through validate() and build_operation_graph() of
    frontend 1.32 on this CPU. Not yet run on a GPU."""
    q, k, v, mask = packed_decode(b=3, kv=300, pad=(0, 9, 40))
    spec = class_of(gt.spec_for(q, k, v, attn_mask=mask), "pow2")
    assert (spec.batch, spec.heads_q, spec.heads_kv, spec.seq_q, spec.seq_kv, spec.bias) == (4, 8, 2, 1, 512, "b1ss")
    built = build_graph(cudnn, spec, UidMap.default(), lower=False)
    assert list(built.tensors["bias"].get_dim()) == [4, 1, 1, 512]
    built.graph.build_operation_graph()


@pytest.mark.gpu
def test_a_packed_gqa_decode_step_is_a_cudnn_bias_graph_hit_with_torchs_answer_and_no_sync(tmp_path):
    """The fold on a GPU with cuDNN: built on the first call, served on the
    second under torch.cuda.set_sync_debug_mode('error'). Not yet run on a GPU."""
    from graphcache.compilers.cudnn import CudnnCompiler
    from graphcache.compilers.torch_sdpa import TOLERANCE, relative_error

    gt.configure(GraphCache(DiskStore(tmp_path / "store"), CudnnCompiler()), on_miss="build")
    q, k, v, mask = (t.to("cuda") for t in packed_decode(b=2, kv=300, pad=(0, 100)))
    want = SDPA(q, k, v, attn_mask=mask)
    got = masked_hit_without_sync(q, k, v, mask)  # builds the decode class, then a hit
    assert gt.stats()["built_here"] == 2 and gt.stats()["fallbacks"] == {}, gt.stats()
    assert {(g.spec.heads_q, g.spec.seq_q) for g in gt.RUNTIME._graphs.values()} == {(8, 1)}
    assert relative_error(got, want) < TOLERANCE["bfloat16"]
