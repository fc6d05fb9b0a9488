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
tests/test_varlen_gpu.py (run by scripts/gpu_check.sh); not yet run on a GPU.
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


@pytest.fixture
def cudnn():
    module = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend (1.32 runs its graph code on a CPU)")
    if tuple(int(x) for x in module.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"lowering without a GPU needs frontend 1.32+, found {module.__version__}")
    return module


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


# -- 6. scripts/gpu_kinds.py: the first GPU run reads as a table --------------------------


def _gpu_kinds():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_kinds.py"
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
