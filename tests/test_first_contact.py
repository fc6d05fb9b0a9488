"""What first contact with a GPU is likely to hit (issue 29), tested on this CPU.

Each failure is played by a stand-in that raises exactly what cudnn-frontend
1.32 raises there, read from the installed wheel and the frontend's sources:

- ``execute`` refused by the backend: ``_CUDNN_CHECK_CUDNN_ERROR`` around
  ``execute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr())``
  (include/cudnn_frontend/plans.h, graph_helpers.h) returns
  ``CUDNN_BACKEND_API_FAILED`` with "<call> failed with message: <cuDNN's last
  error>, and code: <status>", which ``throw_if`` raises as a RuntimeError
  (both strings are in 1.32's ``_compiled_module``); a status such as
  ``CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE`` (an override the plan
  refuses, cudnn-frontend#1087) or ``CUDNN_STATUS_BAD_PARAM`` (PR #1148). The
  last-error text is cuDNN's own and was not read: the stand-ins leave it
  short. 1.32's Python layer raises ``cudnn.cudnnGraphNotSupportedError``
  itself (``cudnn_graph_not_supported``) and ValueError for a plan that takes
  no overrides;
- ``check_support`` when every plan is barred by a note filter: the C++
  ``GRAPH_EXECUTION_PLAN_CREATION_FAILED`` "[cudnn_frontend] Error: No
  execution plans support the graph." (include/cudnn_frontend/plans.h),
  which ``throw_if`` (python/pycudnn.cpp) raises as
  ``cudnn.cudnnGraphNotSupportedError``;

The GPU halves are tests/test_gpu.py, tests/test_classes_gpu.py and
tests/test_varlen_gpu.py (run by scripts/gpu/gpu_check.sh); not yet run on a GPU.
"""

from __future__ import annotations

import pytest

from graphcache import GraphCache, GraphSpec, NotSerializable, UnsupportedSpec
from graphcache.stores import DiskStore
from tests.fakes import TARGET, FakeCompiler

NO_PLAN_SUPPORTS = "[cudnn_frontend] Error: No execution plans support the graph."
BACKEND_EXECUTE = "execute(handle, plan->get_raw_desc(), variant_pack_descriptor.get_ptr())"


def refused_at_execute(status: str) -> RuntimeError:
    """What 1.32 raises when cuDNN's execute returns ``status``."""
    return RuntimeError(f"{BACKEND_EXECUTE} failed with message: (cuDNN's last error), and code: {status}")


def make(**changes) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 2, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal", **changes})


# -- 3. every plan filtered out: NotSerializable, not "unsupported" ------------------------


class _Backend:
    """cuDNN's plan list for one graph, as 1.32's pygraph reports it
    (get_execution_plan_count, get_plan_name_at_index,
    get_behavior_notes_for_plan_at_index), with check_support answering as
    the C++ backend does: a note filter bars the plans without the note, and
    with none left (or ``supports`` False) it raises the frontend's error."""

    def __init__(self, cudnn, plans: list[tuple[str, list]], supports: bool = True) -> None:  # noqa: ANN001
        self.cudnn, self.plans, self.supports = cudnn, plans, supports
        self.check_support_calls: list[bool] = []

    def install(self, monkeypatch) -> None:  # noqa: ANN001
        backend = self
        graph = self.cudnn.pygraph

        def create_execution_plans(self, modes=None):  # noqa: ANN001, ANN202
            self._standin_keep = None

        def select_behavior_notes(self, notes):  # noqa: ANN001, ANN202
            self._standin_keep = list(notes)
            return self

        def check_support(self):  # noqa: ANN001, ANN202
            keep = getattr(self, "_standin_keep", None)
            backend.check_support_calls.append(keep is not None)
            left = [p for p in backend.plans if keep is None or all(n in p[1] for n in keep)]
            if not left or not backend.supports:
                raise backend.cudnn.cudnnGraphNotSupportedError(NO_PLAN_SUPPORTS)

        monkeypatch.setattr(graph, "create_execution_plans", create_execution_plans)
        monkeypatch.setattr(graph, "select_behavior_notes", select_behavior_notes)
        monkeypatch.setattr(graph, "check_support", check_support)
        monkeypatch.setattr(graph, "build_plans", lambda self: None)
        monkeypatch.setattr(graph, "get_execution_plan_count", lambda self: len(backend.plans))
        monkeypatch.setattr(graph, "get_plan_name_at_index", lambda self, i: backend.plans[i][0])
        monkeypatch.setattr(graph, "get_behavior_notes_for_plan_at_index", lambda self, i: list(backend.plans[i][1]))


def _precompiled_only(cudnn) -> list[tuple[str, list]]:  # noqa: ANN001
    notes = cudnn.behavior_note
    return [("eng8_k24=1", [notes.SUPPORTS_CUDA_GRAPH_NATIVE_API]), ("eng10_k3=2", [])]


def test_a_spec_whose_plans_are_all_filtered_out_is_not_serializable_naming_engines_and_notes(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    backend = _Backend(cudnn, _precompiled_only(cudnn))
    backend.install(monkeypatch)
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(cudnn, make())
    assert isinstance(info.value, NotSerializable), f"cuDNN supports the spec, it cannot serialize it: {info.value}"
    assert info.value.step == "check_support"
    text = str(info.value)
    assert "eng8_k24=1" in text and "eng10_k3=2" in text and "SUPPORTS_CUDA_GRAPH_NATIVE_API" in text
    assert backend.check_support_calls == [True, False], "once with the filter, once more without it"


def test_a_spec_refused_without_the_filter_too_stays_unsupported_with_the_plans_seen(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    backend = _Backend(cudnn, _precompiled_only(cudnn), supports=False)
    backend.install(monkeypatch)
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(cudnn, make())
    assert not isinstance(info.value, NotSerializable) and info.value.step == "check_support"
    assert "No execution plans support the graph" in str(info.value)
    assert "eng8_k24=1" in str(info.value) and "SUPPORTS_CUDA_GRAPH_NATIVE_API" in str(info.value)


def test_no_second_try_when_a_runtime_compiled_plan_was_there(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    plans = [("eng8_k24=1", [cudnn.behavior_note.RUNTIME_COMPILATION])]
    backend = _Backend(cudnn, plans, supports=False)
    backend.install(monkeypatch)
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(cudnn, make())
    assert not isinstance(info.value, NotSerializable)
    assert backend.check_support_calls == [True], "the filter emptied nothing: cuDNN's verdict stands"


class _Building(FakeCompiler):
    """The cache above a compiler whose builds run build_graph on ``cudnn``."""

    def __init__(self, cudnn) -> None:  # noqa: ANN001
        super().__init__()
        self.cudnn = cudnn

    def build(self, spec, target, uids=None):  # noqa: ANN001, ANN201
        from graphcache.compilers.cudnn import build_graph

        self.builds += 1
        build_graph(self.cudnn, spec, uids)
        raise AssertionError("the stand-in backend supports no serializable plan")


def test_the_negative_entry_records_the_plans_seen_and_is_counted(cudnn, monkeypatch, tmp_path):
    _Backend(cudnn, _precompiled_only(cudnn)).install(monkeypatch)
    cache = GraphCache(DiskStore(tmp_path), _Building(cudnn))
    with pytest.raises(NotSerializable):
        cache.get(make(), TARGET)
    stored = cache.lookup(make(), TARGET)
    assert stored is not None and stored.runtime["unsupported_kind"] == "NotSerializable"
    assert "SUPPORTS_CUDA_GRAPH_NATIVE_API" in stored.unsupported and "eng10_k3=2" in stored.unsupported
    assert cache.stats()["unsupported"] == 1


# -- 2. zero-length sequences: cuDNN >= 9.25 ------------------------------------------------


def test_zero_length_sequences_are_a_row_of_the_release_table_from_cudnn_9_25():
    from graphcache.compilers.cudnn.releases import ZERO_LENGTH, available, feature, missing

    assert not available(ZERO_LENGTH, "1.32.0", "9.24.0", "9.0") and not available(ZERO_LENGTH, "1.32.0", 92200, "9.0")
    assert available(ZERO_LENGTH, "1.32.0", "9.25.0", "9.0") and available(ZERO_LENGTH, "1.32.0", 92800, "10.0")
    assert "cuDNN >= 9.25" in missing(ZERO_LENGTH, "1.32.0", "9.22.0", "9.0")
    assert "test_thd_zero_seqlen" in feature(ZERO_LENGTH).source


# -- 6. scripts/gpu/gpu_kinds.py: the first GPU run reads as a table --------------------------


def _gpu_kinds():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "gpu_kinds.py"
    spec = importlib.util.spec_from_file_location("gpu_kinds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kinds_table_says_built_served_refused_or_failed_and_why(tmp_path):
    from graphcache import BuildError

    kinds = _gpu_kinds()
    assert set(kinds.KINDS) >= {"dense", "class", "bias", "softcap", "ragged", "paged"}
    spec = make()
    served = kinds.on_gpu("dense", spec, tmp_path, 2, FakeCompiler())
    assert served["status"] == "served" and served["cold_s"] > 0 and served["warm_s"] > 0
    refused = kinds.on_gpu("causal", spec, tmp_path, 2, FakeCompiler(unsupported={"causal"}))
    assert refused["status"] == "refused" and "not serializable at serialize" in refused["why"]
    failing = FakeCompiler()
    failing.build = lambda *a, **k: (_ for _ in ()).throw(BuildError("NVRTC missing"))  # noqa: ARG005
    failed = kinds.on_gpu("broken", spec, tmp_path, 2, failing)
    assert failed["status"] == "failed" and "NVRTC missing" in failed["why"]
    unknown = kinds.spec_of({"batch": 1, "heads_q": 8, "seq_q": 16, "head_dim": 64, "made_up": 1})
    assert isinstance(unknown, str) and "made_up" in unknown
    rows = [served, refused, failed, {"kind": "softcap", "status": "not supported by this tree", "why": unknown}]
    text = kinds.table(rows)
    for row in rows:
        assert row["kind"] in text and row["status"] in text
    assert "NVRTC missing" in text and "made_up" in text


# -- 1. execute-time errors in the build checks: classified as build errors are ----------


@pytest.mark.parametrize(
    ("make_exc", "verdict", "named"),
    [
        (lambda c: refused_at_execute("CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"), "unsupported",
         "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"),
        (lambda c: c.cudnnGraphNotSupportedError("no plan in the list could be built"), "unsupported",
         "cudnnGraphNotSupportedError"),
        (lambda c: refused_at_execute("CUDNN_STATUS_BAD_PARAM"), "error", "CUDNN_STATUS_BAD_PARAM"),
        (lambda c: refused_at_execute("CUDNN_STATUS_EXECUTION_FAILED"), "error", "EXECUTION_FAILED"),
        (lambda c: refused_at_execute("CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH: driver too old"), "error", "driver"),
        (lambda c: ValueError("sdpa_fwd_prefill_sm90: this plan does not support execute-time shape or stride "
                              "overrides"), "error", "ValueError"),
        (lambda c: RuntimeError("CUDNN_STATUS_ALLOC_FAILED"), "error", "out of memory"),
    ],
    ids=["invalid-dynamic-shape", "graph-not-supported", "bad-param", "execution-failed", "host-words", "value-error",
         "oom"],
)  # fmt: skip
def test_an_execute_failure_is_sorted_as_a_build_failure(cudnn, make_exc, verdict, named):
    from graphcache import BuildError
    from graphcache.compilers.cudnn import execute_failure

    failure = execute_failure(cudnn, make(), make_exc(cudnn), "the class check")
    if verdict == "unsupported":
        assert isinstance(failure, UnsupportedSpec) and failure.step == "check"
    else:
        assert isinstance(failure, BuildError) and not isinstance(failure, UnsupportedSpec)
    assert named in str(failure) and "the class check" in str(failure) and make().summary() in str(failure)


def _refusing(exc: BaseException):  # noqa: ANN202
    def execute(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise exc

    return execute


class _DensePlan:
    """A loaded dense plan on the CPU (cuDNN cannot run one here): torch's
    SDPA, or the frontend's exception ``exc`` raised from execute."""

    device = "cpu"

    def __init__(self, spec: GraphSpec, exc: BaseException | None = None, artifact=None) -> None:  # noqa: ANN001
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.spec, self.artifact = spec, artifact
        self.execute = _refusing(exc) if exc is not None else TorchSdpaGraph(spec).execute


class _ClassPlan:
    """A loaded class graph on the CPU, what override.execute_class reads of
    one, whose frontend graph refuses the override at execute with ``exc``
    (a round-tripped plan that does not take overrides, cudnn-frontend#1087)."""

    def __init__(self, spec: GraphSpec, exc: BaseException) -> None:
        import threading
        from types import SimpleNamespace

        import torch

        from graphcache import UidMap
        from tests.fakes import make_artifact

        self.spec, self.uids, self.device = spec, UidMap.default(), torch.device("cpu")
        self.artifact = make_artifact(spec, TARGET)
        self.workspace_size, self._workspaces = 0, {}
        self._graph = SimpleNamespace(execute=_refusing(exc), get_workspace_size=lambda *a, **k: 0)
        self._compiler = SimpleNamespace(_lock=threading.RLock(), handle=lambda: None, device=0)

    @property
    def workspace(self):  # noqa: ANN201
        import torch

        return torch.empty(1, dtype=torch.uint8)

    def execute(self, q, k, v, *, out=None, seq_len_q=None, seq_len_kv=None):  # noqa: ANN001, ANN201
        from graphcache.compilers.cudnn.override import execute_class

        return execute_class(self, q, k, v, out, seq_len_q, seq_len_kv)


class _VarlenPlan:
    """A loaded ragged / paged plan on the CPU: the reference's run_varlen,
    or ``exc`` raised from it."""

    device = "cpu"

    def __init__(self, spec: GraphSpec, exc: BaseException | None = None) -> None:
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.calls: list[list[int]] = []
        inner = TorchSdpaGraph(spec).run_varlen if exc is None else _refusing(exc)

        def run_varlen(q, k, v, cu_seq_q, cu_seq_k, seqused_k=None, block_table=None):  # noqa: ANN001, ANN202
            self.calls.append([int(n) for n in cu_seq_q.diff()])
            return inner(q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table)

        self.run_varlen = run_varlen


def _standin_frontend():  # noqa: ANN202
    from tests.cudnn_standins import fe_1_32

    return fe_1_32()


def _compiler(cudnn=None):  # noqa: ANN001, ANN202
    from graphcache.compilers.cudnn import CudnnCompiler

    return CudnnCompiler(canary=False, cudnn_module=cudnn or _standin_frontend())


INVALID_DYNAMIC_SHAPE = "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"
KLASS = GraphSpec(batch=4, heads_q=8, heads_kv=2, seq_q=1, seq_kv=256, head_dim=64, dtype="bfloat16", shapes="class")
RAGGED = GraphSpec(
    batch=4, heads_q=8, heads_kv=2, seq_q=128, head_dim=64, dtype="bfloat16", layout="thd",
    mask="causal_bottom_right", generate_stats=True,
)  # fmt: skip
PAGED = GraphSpec(
    batch=4, heads_q=8, heads_kv=2, seq_q=16, head_dim=64, dtype="bfloat16", layout="thd",
    mask="causal_bottom_right", page_size=16, num_pages=64, pages_per_seq=16,
)  # fmt: skip


@pytest.mark.parametrize("kind", ["dense", "class", "ragged", "paged"])
def test_a_plan_refused_at_execute_in_any_build_check_is_unsupported_at_check_naming_the_status(kind):
    pytest.importorskip("torch", reason="the checks run on torch tensors")
    from graphcache import BuildError
    from graphcache.compilers.cudnn.compiler import _checked_ragged
    from tests.fakes import make_artifact

    spec = {"dense": make(), "class": KLASS, "ragged": RAGGED, "paged": PAGED}[kind]
    compiler = _compiler()
    for status, verdict in ((INVALID_DYNAMIC_SHAPE, UnsupportedSpec), ("CUDNN_STATUS_BAD_PARAM", BuildError)):
        exc = refused_at_execute(status)
        plan = {"dense": _DensePlan, "class": _ClassPlan, "ragged": _VarlenPlan, "paged": _VarlenPlan}[kind](spec, exc)
        artifact = make_artifact(spec, TARGET)
        with pytest.raises(verdict) as info:
            if kind in ("ragged", "paged"):
                _checked_ragged(artifact, plan, compiler.cudnn())
            else:
                compiler._checked(artifact, plan)
        assert status in str(info.value) and f"the {kind if kind != 'dense' else 'build'} check" in str(info.value)
        assert isinstance(info.value, UnsupportedSpec) == (verdict is UnsupportedSpec)
        if verdict is UnsupportedSpec:
            assert info.value.step == "check"


def test_a_stored_plan_refused_at_execute_in_its_canary_is_sorted_the_same():
    pytest.importorskip("torch", reason="the canary runs on torch tensors")
    from graphcache import BuildError
    from tests.fakes import make_artifact

    spec = make(dtype="bfloat16")
    compiler = _compiler()
    checked = compiler._checked(make_artifact(spec, TARGET), _DensePlan(spec))
    assert checked.canary is not None
    compiler._check_canary(_DensePlan(spec, artifact=checked))  # the plan as built: passes
    with pytest.raises(UnsupportedSpec, match=f"the canary: {INVALID_DYNAMIC_SHAPE}") as info:
        compiler._check_canary(_DensePlan(spec, refused_at_execute(INVALID_DYNAMIC_SHAPE), checked))
    assert info.value.step == "check"
    with pytest.raises(BuildError, match="CUDNN_STATUS_EXECUTION_FAILED"):
        compiler._check_canary(_DensePlan(spec, refused_at_execute("CUDNN_STATUS_EXECUTION_FAILED"), checked))


class _Checking(FakeCompiler):
    """The cache above CudnnCompiler's real build check: class specs' plans
    refuse their override at execute; exact ones run torch's SDPA, or raise
    ``exact_exc``."""

    def __init__(self, exact_exc: BaseException | None = None) -> None:
        super().__init__()
        self.exact_exc = exact_exc

    def build(self, spec, target, uids=None):  # noqa: ANN001, ANN201
        from tests.fakes import make_artifact

        self.builds += 1
        artifact = make_artifact(spec, target, uids=uids)
        plan = _ClassPlan(spec, refused_at_execute(INVALID_DYNAMIC_SHAPE)) if spec.is_class else None
        return _compiler()._checked(artifact, plan or _DensePlan(spec, self.exact_exc))


def test_graphcache_serves_the_exact_graph_where_the_class_plan_refuses_its_override(tmp_path):
    pytest.importorskip("torch", reason="the checks run on torch tensors")
    exact = GraphSpec(batch=3, heads_q=8, heads_kv=2, seq_q=1, seq_kv=200, head_dim=64, dtype="bfloat16")
    cache = GraphCache(DiskStore(tmp_path), _Checking(), shape_classes="pow2")
    graph = cache.load(exact, TARGET)
    assert graph.spec == exact, "the exact graph serves, not the class"
    stats = cache.stats()
    # The class in both forms (override, then padded: this stand-in's class plans refuse every execute), then
    # the exact graph.
    assert stats["unsupported"] == 2 and stats["builds"] == 3
    from graphcache.spec.classes import class_of

    stored = cache.lookup(class_of(exact, "pow2"), TARGET)
    assert stored is not None and INVALID_DYNAMIC_SHAPE in stored.unsupported
    assert stored.runtime["unsupported_step"] == "check"
    cache.load(exact, TARGET)
    assert cache.stats()["builds"] == 3, "the class's negative entries answer the next load"


def test_graphcache_serves_torch_where_the_exact_plan_fails_at_execute(tmp_path):
    pytest.importorskip("torch", reason="the checks run on torch tensors")
    compiler = _Checking(exact_exc=refused_at_execute("CUDNN_STATUS_BAD_PARAM"))
    cache = GraphCache(DiskStore(tmp_path), compiler, shape_classes="exact", torch_fallback=True)
    graph = cache.load(make(), TARGET)
    assert graph.backend == "torch" and "CUDNN_STATUS_BAD_PARAM" in graph.reason
    assert cache.stats()["fallbacks"] == 1 and list(cache.store.keys()) == [], "a BuildError is never stored"


# -- 2. below cuDNN 9.25, no zero-length sequence reaches cuDNN ----------------------------


def _three_of_four():  # noqa: ANN202
    import torch

    cu_q = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 6, 16], dtype=torch.int32)
    return cu_q, cu_k


def test_below_9_25_missing_sequences_are_one_token_dummies_writing_past_the_calls_rows():
    pytest.importorskip("torch", reason="the offsets are torch tensors")
    from graphcache.compilers.varlen_args import graph_inputs

    cu_q, cu_k = _three_of_four()
    got = graph_inputs(RAGGED, cu_q, cu_k, zero_length=False, rows=10)  # q has 10 rows (one of slack)
    assert got["seq_len_q"].flatten().tolist() == [3, 1, 5, 1] and got["seq_len_kv"].flatten().tolist() == [5, 1, 10, 1]
    assert got["ragged_q"].flatten().tolist()[:4] == [0, 3 * 512, 4 * 512, 0], "the dummy reads the first query"
    assert got["ragged_k"].flatten().tolist()[:4] == [0, 5 * 128, 6 * 128, 0], "and the first key"
    assert got["ragged_o"].flatten().tolist() == [0, 3 * 512, 4 * 512, 10 * 512, 11 * 512], "past the call's rows"
    assert got["ragged_stats"].flatten().tolist() == [0, 24, 32, 80, 88]
    today = graph_inputs(RAGGED, cu_q, cu_k)  # 9.25 and later: a 0-length fourth sequence, as before
    assert today["seq_len_q"].flatten().tolist() == [3, 1, 5, 0]


def test_below_9_25_a_paged_call_of_fewer_sequences_pads_with_dummies_on_page_zero():
    torch = pytest.importorskip("torch", reason="the tables are torch tensors")
    from graphcache.compilers.varlen_args import graph_inputs

    table = torch.arange(32, dtype=torch.int32).view(2, 16)
    got = graph_inputs(PAGED, torch.tensor([0, 1, 2]), None, torch.tensor([17, 3]), table, zero_length=False, rows=2)
    assert got["seq_len_q"].flatten().tolist() == [1, 1, 1, 1] and got["seq_len_kv"].flatten().tolist() == [17, 3, 1, 1]
    assert not got["page_table_k"][2:].any() and got["ragged_o"].flatten().tolist()[2:] == [2 * 512, 3 * 512, 4 * 512]


class _Backend922:
    """cuDNN executing a thd variant pack on the CPU as the GPU does: each
    sequence read at its ragged offsets for its seq_len, its output written
    at its own offset. Like cuDNN below 9.25 (TransformerEngine#1179, cudnn-
    frontend#943), a zero-length sequence spoils the call: NaN everywhere."""

    def __init__(self, spec: GraphSpec) -> None:
        from graphcache import UidMap

        self.spec, self.uids = spec, UidMap.default().for_spec(spec)

    def execute(self, pack: dict) -> None:
        import torch

        from graphcache.reference.varlen import varlen_reference
        from graphcache.spec.ragged import window

        spec, u = self.spec, self.uids
        q, k, v, o = pack[u["q"]], pack[u["k"]], pack[u["v"]], pack[u["o"]]
        lq, lk = pack[u["seq_len_q"]].flatten().tolist(), pack[u["seq_len_kv"]].flatten().tolist()
        if 0 in lq or 0 in lk:
            o.fill_(float("nan"))
            return
        for b in range(spec.batch):
            sq = int(pack[u["ragged_q"]].flatten()[b]) // (spec.heads_q * spec.head_dim)
            sk = int(pack[u["ragged_k"]].flatten()[b]) // (spec.heads_kv * spec.head_dim)
            so = int(pack[u["ragged_o"]].flatten()[b]) // (spec.heads_q * spec.head_dim_v)
            cu = (torch.tensor([0, lq[b]]), torch.tensor([0, lk[b]]))
            out, _ = varlen_reference(q[sq : sq + lq[b]], k[sk : sk + lk[b]], v[sk : sk + lk[b]], *cu,
                                      scale=spec.attn_scale, window=window(spec))  # fmt: skip
            o[so : so + lq[b]] = out.to(o.dtype)


@pytest.mark.parametrize("zero_length", [False, True], ids=["cudnn-9.22", "as-before"])
def test_below_9_25_a_call_of_fewer_sequences_than_the_batch_is_right_and_the_dummies_rows_are_dropped(zero_length):
    torch = pytest.importorskip("torch", reason="the call runs on torch tensors")
    from graphcache.compilers.cudnn.ragged import variant_pack
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    spec = RAGGED.replace(generate_stats=False)
    cu_q, cu_k = _three_of_four()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(n, h, 64, generator=gen).to(torch.bfloat16) for n, h in ((9, 8), (16, 2), (16, 2)))
    pack, out, _ = variant_pack(spec, _Backend922(spec).uids, q, k, v, cu_q, cu_k, zero_length=zero_length)
    _Backend922(spec).execute(pack)
    want, _ = TorchSdpaGraph(spec).run_varlen(q, k, v, cu_q, cu_k)
    assert out.shape == want.shape, "the dummies' rows are not returned"
    if zero_length:
        assert out.isnan().all(), "the stand-in spoils a call with a zero-length sequence, as cuDNN < 9.25 may"
    else:
        torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=0)


def test_the_ragged_check_leaves_out_0_token_sequences_below_9_25_and_runs_fewer_sequences_always():
    pytest.importorskip("torch", reason="the check runs on torch tensors")
    from graphcache import Artifact, Target
    from graphcache.compilers.cudnn.compiler import _checked_ragged

    for cudnn, zero in (("9.22.0", False), ("9.28.0", True)):
        target = Target.parse(f"h200-sm90-cudnn{cudnn}-fe1.32.0")
        for spec in (RAGGED, PAGED):
            plan = _VarlenPlan(spec)
            artifact = Artifact(spec=spec, target=target, payload=b"plan", runtime={"engine": "stand-in"})
            checked = _checked_ragged(artifact, plan)
            assert checked.canary is not None
            assert any(0 in call for call in plan.calls) == zero, (cudnn, spec.summary(), plan.calls)
            assert any(len(call) < spec.batch for call in plan.calls), "a call of fewer sequences than the batch"


# -- 4. the class path checks its seq_len tensors as the exact path does -------------------


@pytest.mark.parametrize(
    ("role", "bad", "words"),
    [
        ("seq_len_q", lambda t: t.flatten(), r"seq_len_q has shape \(3,\); .* needs \(3, 1, 1, 1\)"),
        (
            "seq_len_kv",
            lambda t: t.to(__import__("torch").int64),
            r"seq_len_kv is torch.int64; the spec needs torch.int32",
        ),
        ("seq_len_q", lambda t: t[:2], r"seq_len_q has shape \(2, 1, 1, 1\); .* needs \(3, 1, 1, 1\)"),
    ],
    ids=["rank-1", "int64", "short"],
)
def test_a_class_graph_refuses_seq_len_tensors_the_exact_path_refuses_naming_the_argument(role, bad, words):
    torch = pytest.importorskip("torch", reason="the class path runs on torch tensors")
    from graphcache import ExecutionError
    from graphcache.compilers.torch_sdpa import random_inputs

    klass = KLASS.replace(padding=True)
    real = klass.at(3, 1, 200)
    feed = random_inputs(real, "cpu", seed=1)
    assert feed["seq_len_q"].dtype == torch.int32 and tuple(feed["seq_len_q"].shape) == (3, 1, 1, 1)
    feed[role] = bad(feed[role])
    plan = _ClassPlan(klass, refused_at_execute("(never reached: the arguments are refused first)"))
    with pytest.raises(ExecutionError, match=words):
        plan.execute(feed["q"], feed["k"], feed["v"], seq_len_q=feed["seq_len_q"], seq_len_kv=feed["seq_len_kv"])
