"""What a build failure, a reference check and a canary mean for the shared cache.

Run against the real cudnn-frontend 1.32 binding where this CPU allows (graph
construction, validate, build_operation_graph, and its real failure at
create_execution_plans without a driver), and against torch tensors on the
CPU for the numerical checks. The GPU halves are in tests/test_gpu.py.
"""

from __future__ import annotations

import math

import pytest

from graphcache import BuildError, GraphCache, GraphCacheError, GraphSpec, NotSerializable, UidMap, UnsupportedSpec
from graphcache.stores import DiskStore
from tests.fakes import TARGET, FakeCompiler
from tests.fakes import spec as fake_spec

torch = pytest.importorskip("torch", reason="the numerical checks run on torch tensors")


def make(**changes) -> GraphSpec:
    return GraphSpec.from_dict({"batch": 2, "heads_q": 8, "seq_q": 128, "head_dim": 64, "mask": "causal", **changes})


@pytest.fixture(autouse=True)
def exact_shapes(monkeypatch):
    """GraphCache.load of exact specs here, as under policy exact: the class
    path of load is tests/test_classes.py's."""
    monkeypatch.setenv("GRAPHCACHE_SHAPE_CLASSES", "exact")


# -- a failure of this host is never "unsupported" ----------------------------------


def test_a_host_without_a_driver_is_a_build_error_not_an_unsupported_spec(cudnn):
    from graphcache.compilers.cudnn import build_graph

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the driver failure cannot be seen here")
    # Frontend 1.32 reports "no driver" as cudnnGraphNotSupportedError at
    # create_execution_plans; stored as unsupported, it would poison the cache
    # for every host of the target.
    with pytest.raises(GraphCacheError) as info:
        build_graph(cudnn, make())
    assert isinstance(info.value, BuildError) and not isinstance(info.value, UnsupportedSpec)
    assert "create_execution_plans" in str(info.value) and "Not recorded as unsupported" in str(info.value)
    assert isinstance(info.value.__cause__, cudnn.cudnnGraphNotSupportedError)


def _refuse_at(monkeypatch, cudnn, step: str, exc: BaseException) -> None:
    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        raise exc

    monkeypatch.setattr(cudnn.pygraph, step, refuse)


def test_cudnn_saying_not_supported_is_an_unsupported_spec_naming_the_step(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    monkeypatch.setattr(cudnn.pygraph, "create_execution_plans", lambda self, modes=None: None)
    refusal = cudnn.cudnnGraphNotSupportedError("No valid engine configs for SDPA_FWD with head dim 64")
    _refuse_at(monkeypatch, cudnn, "check_support", refusal)
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(cudnn, make())
    assert info.value.step == "check_support"
    assert "does not support" in str(info.value) and "cudnn-frontend 1.32" in str(info.value)


def _decline_at_planning(monkeypatch, cudnn, backend_error: BaseException) -> None:
    """What 1.31+'s create_execution_plans does when no engine proposes a
    plan: the backend's own error is kept on the graph (_backend_declined)
    and the whole is raised as cudnnGraphNotSupportedError."""

    def plan(self, modes=None):  # noqa: ANN001
        self._backend_declined = backend_error
        raise cudnn.cudnnGraphNotSupportedError(
            f"no engine proposed a plan for this graph (the backend declined: {backend_error})"
        )

    monkeypatch.setattr(cudnn.pygraph, "create_execution_plans", plan)


def test_planning_declined_by_the_backend_itself_is_unsupported(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    _decline_at_planning(monkeypatch, cudnn, cudnn.cudnnGraphNotSupportedError("No valid engine configs for SDPA"))
    with pytest.raises(UnsupportedSpec) as info:
        build_graph(cudnn, make())
    assert info.value.step == "create_execution_plans"


def test_planning_declined_because_the_backend_failed_is_a_build_error(cudnn, monkeypatch):
    """A RuntimeError the backend raised (a failing device, a bad descriptor)
    is folded into "not supported" by 1.31+; its words need not name the host."""
    from graphcache.compilers.cudnn import build_graph

    _decline_at_planning(monkeypatch, cudnn, RuntimeError("CUDNN_STATUS_BAD_PARAM"))
    with pytest.raises(BuildError):
        build_graph(cudnn, make())


def test_no_plan_built_is_never_recorded_as_unsupported(cudnn, monkeypatch):
    """build_plans' "No valid execution plans built." (include/cudnn_frontend/
    plans.h, v1.23.0) is what every plan failing to compile looks like,
    NVRTC or libcuda missing included."""
    from graphcache.compilers.cudnn import build_graph

    monkeypatch.setattr(cudnn.pygraph, "create_execution_plans", lambda self, modes=None: None)
    monkeypatch.setattr(cudnn.pygraph, "check_support", lambda self: None)
    refusal = cudnn.cudnnGraphNotSupportedError("[cudnn_frontend] Error: No valid execution plans built.")
    _refuse_at(monkeypatch, cudnn, "build_plans", refusal)
    with pytest.raises(BuildError, match="build_plans"):
        build_graph(cudnn, make())


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDNN_STATUS_ALLOC_FAILED: out of memory"),
        RuntimeError("CUDNN_STATUS_INTERNAL_ERROR at plan finalize"),
        RuntimeError("[cudnn_frontend] Error: NVRTC compilation failed: libnvrtc.so.12 not found"),
        RuntimeError("cudaErrorLaunchFailure: unspecified launch failure on stream 0x5"),
        ValueError("something nobody expected"),
        TypeError("'NoneType' object is not subscriptable"),  # a TypeError that is not a keyword refusal
    ],
    ids=["oom", "internal", "nvrtc", "stream", "unexpected", "other-typeerror"],
)
def test_host_and_internal_failures_at_any_step_are_build_errors(cudnn, monkeypatch, exc):
    from graphcache.compilers.cudnn import build_graph

    _refuse_at(monkeypatch, cudnn, "build_operation_graph", exc)
    with pytest.raises(BuildError, match="build_operation_graph|out of memory"):
        build_graph(cudnn, make())


def test_not_supported_words_about_the_driver_are_still_the_hosts_fault(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    exc = cudnn.cudnnGraphNotSupportedError("the backend declined: CUDA driver version is insufficient")
    _refuse_at(monkeypatch, cudnn, "build_operation_graph", exc)
    with pytest.raises(BuildError):
        build_graph(cudnn, make())


def test_the_hosts_words_are_matched_as_words(cudnn, monkeypatch):
    from graphcache.compilers.cudnn import build_graph

    exc = cudnn.cudnnGraphNotSupportedError("No valid engine configs; see the upstream support matrix")
    _refuse_at(monkeypatch, cudnn, "build_operation_graph", exc)
    with pytest.raises(UnsupportedSpec):
        build_graph(cudnn, make())


def test_plans_are_restricted_to_runtime_compiled_engines_before_check_support(cudnn, monkeypatch):
    """Only runtime-compiled plans serialize: the filter must be in force when
    check_support and build_plans pick a plan."""
    from graphcache.compilers.cudnn import build_graph

    seen: dict[str, object] = {}
    monkeypatch.setattr(cudnn.pygraph, "create_execution_plans", lambda self, modes=None: None)

    def check_support(self):  # noqa: ANN001
        # 1.32 records note filters and barred engine names on the graph
        # (pygraph._note_filters, _barred_names) and replays them on the
        # backend once it has plans.
        # The first call: a refusal with the filter is tried once more without it (issue 29).
        seen.setdefault("filters", list(self._note_filters))
        seen.setdefault("barred", set(self._barred_names))
        raise cudnn.cudnnGraphNotSupportedError("No valid engine configs (stop here)")

    monkeypatch.setattr(cudnn.pygraph, "check_support", check_support)
    with pytest.raises(UnsupportedSpec):
        build_graph(cudnn, make())
    assert ("behavior", cudnn.behavior_note.RUNTIME_COMPILATION, True) in seen["filters"]
    # Python (CuTe DSL) engines are kept out: their blobs load only under the
    # builder's exact CUDA driver, which the key does not cover.
    assert "sdpa_fwd_prefill_sm90" in seen["barred"] and "sdpa_fwd_prefill_sm100" in seen["barred"]


@pytest.mark.parametrize(
    "exc, kind, reason",
    [
        # 1.27+'s own words when a blob holds no precompiled plan (read from the wheels).
        (
            RuntimeError("enforce_precompiled requested, but serialized graph has no precompiled execution plan"),
            "PlanRejected",
            "needs_recompile",
        ),
        (RuntimeError("Unsupported graph JSON version. Expected 2.0"), "PlanRejected", "deserialize_failed"),
        (TypeError("deserialize(): incompatible function arguments"), "BuildError", None),
        (RuntimeError("CUDA driver version is insufficient for CUDA runtime version"), "BuildError", None),
        (RuntimeError("CUDNN_STATUS_ALLOC_FAILED"), "BuildError", None),
    ],
    ids=["needs-recompile", "bad-blob", "call-form", "driver", "oom"],
)
def test_a_load_failure_drops_the_entry_only_when_the_blob_is_at_fault(exc, kind, reason):
    from graphcache.compilers.cudnn import load_failure
    from tests.fakes import make_artifact

    failure = load_failure(make_artifact(make(), TARGET), exc)
    assert type(failure).__name__ == kind
    assert getattr(failure, "reason", None) == reason


def test_a_plan_that_cannot_be_written_is_not_serializable_unless_the_host_failed(cudnn):
    # 1.32's own exception for a plan it cannot represent (a TypeError subclass).
    from cudnn import _plan_serdes  # type: ignore[import-not-found]

    from graphcache.compilers.cudnn import serialize_failure

    unserializable = _plan_serdes._Unserializable("graph holds a callable, which a serialized plan cannot represent")
    failure = serialize_failure(make(), "cudnn-backend", [], "1.32.0", unserializable)
    assert isinstance(failure, NotSerializable) and failure.step == "serialize"
    oom = serialize_failure(make(), "cudnn-backend", [], "1.32.0", RuntimeError("CUDNN_STATUS_ALLOC_FAILED"))
    assert isinstance(oom, BuildError) and not isinstance(oom, UnsupportedSpec)


def test_a_python_engine_plan_is_never_cached():
    from graphcache.compilers.cudnn import serialization_refusal

    # Names as 1.31/1.32 report them (pygraph.selected_engine.name). 1.31
    # cannot serialize them; 1.32's blobs are tied to the builder's driver.
    assert "sdpa_fwd_prefill_sm90" in serialization_refusal("sdpa_fwd_prefill_sm90", "1.31.0")
    assert "CUDA driver" in serialization_refusal("sdpa_fwd_prefill_sm90", "1.32.0")
    assert serialization_refusal("cudnn-backend", "1.28.0") is None


def test_the_engine_is_named_from_the_real_graph(cudnn):
    from graphcache.compilers.cudnn import build_graph, engine_name

    built = build_graph(cudnn, make(), lower=False)
    assert engine_name(built.graph) == "cudnn-backend"  # no plan selected: the backend path


# -- the cache stores only what is the spec's own ---------------------------------------


class _Failing(FakeCompiler):
    """FakeCompiler (the stand-in for CudnnCompiler) whose builds raise ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def build(self, spec, target, uids=None):  # noqa: ANN001
        self.builds += 1
        raise self.exc


def test_a_build_error_is_reported_and_nothing_is_stored(tmp_path):
    store = DiskStore(tmp_path)
    compiler = _Failing(BuildError("building failed at build_plans because of this host: NVRTC missing"))
    cache = GraphCache(store, compiler)
    for _ in range(2):
        with pytest.raises(BuildError):
            cache.get(fake_spec(), TARGET)
    assert list(store.keys()) == []
    assert compiler.builds == 2  # tried again: nothing was remembered


def test_an_unsupported_spec_is_stored_with_frontend_cudnn_and_step(tmp_path):
    store = DiskStore(tmp_path)
    cache = GraphCache(store, _Failing(UnsupportedSpec("cuDNN does not support it", step="check_support")))
    with pytest.raises(UnsupportedSpec):
        cache.get(fake_spec(), TARGET)
    (key,) = list(store.keys())
    from graphcache import Artifact

    header = Artifact.decode(store.get(key)).runtime
    assert header["unsupported_step"] == "check_support"
    assert (header["frontend"], header["cudnn"]) == (TARGET.frontend, TARGET.cudnn)
    with pytest.raises(UnsupportedSpec) as again:  # answered from the stored entry, its step with it
        cache.get(fake_spec(), TARGET)
    assert again.value.step == "check_support" and cache.compiler.builds == 1


def test_a_custom_uid_map_reaches_the_compiler(tmp_path):
    uids = UidMap({**UidMap.default().to_dict(), "o": 40})
    cache = GraphCache(DiskStore(tmp_path), FakeCompiler(), uids=uids)
    artifact = cache.get(fake_spec(), TARGET)
    assert artifact.uids == uids and artifact.key == cache.key(fake_spec(), TARGET)


@pytest.mark.parametrize("reason", ["canary_mismatch", "needs_recompile", "deserialize_failed"])
def test_a_rejected_plan_is_dropped_rebuilt_and_counted(tmp_path, reason):
    store = DiskStore(tmp_path)
    builder = FakeCompiler()
    GraphCache(store, builder).get(fake_spec(), TARGET)
    stale = store.get(GraphCache(store).key(fake_spec(), TARGET))

    worker = FakeCompiler(reject_loads=[reason])
    cache = GraphCache(store, worker)
    graph = cache.load(fake_spec())
    assert graph.spec == fake_spec() and worker.builds == 1 and worker.loads == 2
    stats = cache.stats()
    assert stats["rejected"] == 1
    assert stats["canary_failures"] == (1 if reason == "canary_mismatch" else 0)
    assert store.get(cache.key(fake_spec())) is not None and stale is not None


def test_a_plan_rejected_twice_is_an_error_not_a_loop(tmp_path):
    from graphcache import PlanRejected

    cache = GraphCache(DiskStore(tmp_path), FakeCompiler(reject_loads=["canary_mismatch"] * 5))
    with pytest.raises(PlanRejected):
        cache.load(fake_spec())


# -- the reference check --------------------------------------------------------------


def test_nan_never_passes_the_reference_check():
    from graphcache.compilers.torch_sdpa import relative_error, within_tolerance

    ref = torch.ones(4, 4)
    bad = ref.clone()
    bad[1, 2] = float("nan")
    assert relative_error(bad, ref) == math.inf and relative_error(ref, bad) == math.inf
    assert relative_error(ref.clone().fill_(float("inf")), ref) == math.inf
    assert not within_tolerance(make(), relative_error(bad, ref))
    assert not within_tolerance(make(), float("nan"))
    assert within_tolerance(make(), relative_error(ref, ref))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_padded_rows_are_ignored_on_both_sides_and_valid_rows_are_not(layout):
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs, reference_error, within_tolerance

    spec = make(dtype="float16", padding=True, layout=layout, seq_q=64)
    feed = random_inputs(spec, "cpu", seed=3)
    feed["seq_len_q"] = torch.tensor([40, 64], dtype=torch.int32).view(2, 1, 1, 1)
    out = TorchSdpaGraph(spec).execute(**feed).float()
    assert within_tolerance(spec, reference_error(spec, out, feed))

    garbage = out.clone()
    rows = (slice(None), slice(40, None)) if layout == "bshd" else (slice(None), slice(None), slice(40, None))
    garbage[0][rows[1:]] = float("nan")  # batch 0's padded query rows: cuDNN promises nothing there
    assert within_tolerance(spec, reference_error(spec, garbage, feed))

    broken = out.clone()
    first_row = (0, 3) if layout == "bshd" else (0, slice(None), 3)
    broken[first_row] = float("nan")  # a valid row
    assert not within_tolerance(spec, reference_error(spec, broken, feed))


# -- the numerical canary ---------------------------------------------------------------


def _canary_case(spec: GraphSpec):
    from graphcache.compilers import canary
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    feed = canary.inputs(spec, "cpu")
    return canary, feed, TorchSdpaGraph(spec).execute(**feed)


def test_the_canary_input_is_the_same_on_every_call():
    canary, feed, _ = _canary_case(make())
    again = canary.inputs(make(), "cpu")
    assert all(torch.equal(feed[r], again[r]) for r in ("q", "k", "v"))


def test_a_deterministic_plan_must_match_bit_for_bit():
    spec = make()
    canary, feed, out = _canary_case(spec)
    record = canary.describe(spec, out, feed, deterministic=True)
    assert canary.mismatch(spec, record, out.clone(), feed) is None
    nudged = out.clone()
    nudged.view(torch.int16).view(-1)[17] += 1  # one unit in the last place of one value
    assert "bits differ" in canary.mismatch(spec, record, nudged, feed)


def test_a_deterministic_plan_is_not_rejected_for_another_torchs_summation_order(monkeypatch):
    """The same output bits, summed by a torch that adds in another order
    (float64 sum and norm off in the last bits), still pass: otherwise
    workers on two torch releases would drop each other's shared plan."""
    spec = make()
    canary, feed, out = _canary_case(spec)
    record = canary.describe(spec, out, feed, deterministic=True)
    assert canary.same_bits(spec, record, out.clone(), feed)
    real_sum = torch.Tensor.sum

    def other_order(self, *args, **kwargs):
        total = real_sum(self, *args, **kwargs)
        return total * (1 + 1e-14) if total.dtype == torch.float64 else total

    monkeypatch.setattr(torch.Tensor, "sum", other_order)
    assert canary.mismatch(spec, record, out.clone(), feed) is None
    monkeypatch.setattr(torch.Tensor, "sum", real_sum)
    far = dict(record, sum=record["sum"] + 1e-6 * record["l2"])  # what a changed unsampled value does
    assert "bits differ" in canary.mismatch(spec, far, out.clone(), feed)


def test_a_nondeterministic_plan_passes_within_tolerance_and_fails_beyond():
    spec = make(dtype="bfloat16")
    canary, feed, out = _canary_case(spec)
    record = canary.describe(spec, out, feed, deterministic=False)
    close = (out.float() * (1 + 1e-3)).to(out.dtype)
    assert canary.mismatch(spec, record, close, feed) is None
    far = (out.float() * 1.5).to(out.dtype)
    assert canary.mismatch(spec, record, far, feed) is not None
    dropped = torch.zeros_like(out)  # e.g. a plan that lost softmax_precision badly
    assert canary.mismatch(spec, record, dropped, feed) is not None


def test_the_canary_ignores_padded_rows_but_not_valid_ones():
    from graphcache.compilers import canary
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph

    spec = make(padding=True, seq_q=64, layout="bshd")
    feed = canary.inputs(spec, "cpu")
    feed["seq_len_q"] = torch.tensor([40, 64], dtype=torch.int32).view(2, 1, 1, 1)
    out = TorchSdpaGraph(spec).execute(**feed)
    record = canary.describe(spec, out, feed, deterministic=True)
    junk = out.clone()
    junk[0, 40:] = 7.0  # batch 0's query rows past its valid length
    assert canary.mismatch(spec, record, junk, feed) is None
    junk[0, 39] = 7.0  # its last valid row
    assert canary.mismatch(spec, record, junk, feed) is not None


def test_canary_can_be_turned_off_from_the_environment(monkeypatch):
    from graphcache.compilers.cudnn import CudnnCompiler

    monkeypatch.setenv("GRAPHCACHE_CANARY", "0")
    assert CudnnCompiler().canary is False
    monkeypatch.delenv("GRAPHCACHE_CANARY")
    assert CudnnCompiler().canary is True


def test_dropout_is_not_claimed_as_checked():
    """A dropout spec records no validation error (null) and says why."""
    import dataclasses

    from graphcache.compilers.cudnn import CudnnCompiler
    from tests.fakes import make_artifact

    artifact = make_artifact(make(dropout=0.1), TARGET)
    checked = CudnnCompiler(canary=False)._checked(artifact, loaded=None)  # type: ignore[arg-type]
    assert checked.validation_error is None and checked.canary is None
    assert "dropout" in checked.runtime["validation"]
    assert dataclasses.replace(checked, runtime={}).header()["validation_error"] is None


def test_negative_entries_are_kinds_of_unsupported_spec():
    assert issubclass(NotSerializable, UnsupportedSpec) and not issubclass(BuildError, UnsupportedSpec)


def test_rows_the_mask_leaves_without_a_key_are_not_compared():
    """Bottom-right alignment with more queries than keys leaves the first
    rows no key: the reference writes zeros there, cuDNN promises nothing."""
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs, reference_error, within_tolerance

    spec = make(mask="causal_bottom_right", seq_q=64, seq_kv=32, dtype="float16")
    feed = random_inputs(spec, "cpu", seed=5)
    out = TorchSdpaGraph(spec).execute(**feed).float()
    undefined = out.clone()
    undefined[:, :32] = float("nan")  # bshd: rows 0..31 see no key
    assert within_tolerance(spec, reference_error(spec, undefined, feed))
    undefined[:, 32] = float("nan")  # row 32 sees key 0
    assert not within_tolerance(spec, reference_error(spec, undefined, feed))


def test_a_canary_drawn_from_another_input_is_skipped_not_failed():
    from graphcache.compilers import canary

    spec = make()
    feed = canary.inputs(spec, "cpu")
    record = canary.describe(spec, feed["q"], feed, deterministic=True)
    assert canary.comparable(record, feed)
    other = dict(feed, q=feed["q"] + 1)  # what another torch's generator might draw
    assert not canary.comparable(record, other)
    assert not canary.comparable({**record, "seed": 1}, feed)


def test_a_worker_with_the_torch_fallback_runs_torch_when_this_host_cannot_build(tmp_path):
    cache = GraphCache(
        DiskStore(tmp_path), _Failing(BuildError("building failed at build_plans: NVRTC missing")), torch_fallback=True
    )
    graph = cache.load(fake_spec(), TARGET)
    assert graph.backend == "torch" and "NVRTC" in graph.reason
    assert cache.stats()["fallbacks"] == 1 and list(DiskStore(tmp_path).keys()) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"mask": "causal"},
        {"mask": "none", "heads_kv": 2},
        {"mask": "causal_bottom_right", "seq_q": 48, "seq_kv": 80, "padding": True},
        {"mask": "sliding_window", "window_left": 8, "window_right": 3, "layout": "bhsd", "generate_stats": True},
    ],
    ids=["causal", "gqa", "bottom-right-padded", "window"],
)
def test_the_reference_in_head_chunks_equals_the_reference_at_once_and_torch(changes):
    """A prefill spec's whole score tensor would not fit in a GPU: the
    reference works a batch element and a group of heads at a time."""
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs, reference

    spec = make(**{"batch": 2, "heads_q": 8, "seq_q": 64, "dtype": "float16", **changes})
    feed = random_inputs(spec, "cpu", seed=11)
    at_once, stats_at_once = reference(spec, **feed, budget=1 << 40)
    one_head, stats_one_head = reference(spec, **feed, budget=1)  # one head at a time
    torch.testing.assert_close(one_head, at_once, rtol=0, atol=1e-6)
    torch.testing.assert_close(stats_one_head, stats_at_once, rtol=0, atol=1e-5)
    if not spec.padding and not spec.generate_stats:
        torch.testing.assert_close(at_once, TorchSdpaGraph(spec).execute(**feed).float(), rtol=2e-3, atol=2e-3)


# -- the stats (log-sum-exp) are checked as well as the output ------------------------


class _Plan:
    """A stand-in for a loaded CudnnGraph (cuDNN cannot run a plan here):
    torch SDPA's exact semantics on the CPU, returning ``(out, stats)`` as
    ``CudnnGraph.execute`` does for ``generate_stats``, its stats changed by
    ``spoil``."""

    device = "cpu"

    def __init__(self, spec: GraphSpec, spoil=None) -> None:  # noqa: ANN001
        from graphcache.compilers.torch_sdpa import TorchSdpaGraph

        self.inner, self.spec, self.spoil = TorchSdpaGraph(spec), spec, spoil

    def execute(self, **feed):  # noqa: ANN003, ANN201
        out, stats = self.inner.execute(**feed)
        if self.spoil is not None:
            self.spoil(self.spec, stats, feed)
        return out, stats


def _first_head_of_each_group_only(spec: GraphSpec, stats, feed) -> None:  # noqa: ANN001
    """cudnn-frontend#1083 (SM100, cuDNN 9.26/9.27, s_q 1 with GQA): the lse
    is written for the first q head of each kv group only; the others keep
    what the buffer held (zeros here, as varlen's WrongGqaLse)."""
    group = spec.heads_q // spec.heads_kv
    stats[:, [h for h in range(spec.heads_q) if h % group]] = 0.0


def _nan_past_the_valid_rows(spec: GraphSpec, stats, feed) -> None:  # noqa: ANN001
    lengths = feed["seq_len_q"].reshape(-1).tolist()
    assert min(lengths) < spec.seq_q, "the canary's input must have padded rows for this to test anything"
    for b, n in enumerate(lengths):
        stats[b, :, n:] = float("nan")  # padded query rows: cuDNN promises nothing there


def _checked(spec: GraphSpec, spoil=None):  # noqa: ANN001, ANN202
    from graphcache.compilers.cudnn import CudnnCompiler
    from tests.fakes import make_artifact

    artifact = make_artifact(spec, TARGET)
    return CudnnCompiler(canary=False)._checked(artifact, _Plan(spec, spoil))  # type: ignore[arg-type]


DECODE_GQA_STATS = make(seq_q=1, seq_kv=256, heads_kv=2, mask="none", generate_stats=True, dtype="bfloat16")


def test_a_plan_with_a_right_output_and_wrong_stats_for_some_heads_is_unsupported_at_check():
    checked = _checked(DECODE_GQA_STATS)
    assert checked.validation_error <= 2e-2 and checked.runtime["lse_error"] <= 1e-5 and checked.canary is not None
    with pytest.raises(UnsupportedSpec, match=r"wrong log-sum-exp \(stats\).*while the output agrees.*1083") as err:
        _checked(DECODE_GQA_STATS, _first_head_of_each_group_only)
    assert err.value.step == "check" and DECODE_GQA_STATS.summary() in str(err.value)


def test_stats_in_padded_rows_are_not_compared_and_wrong_stats_of_a_valid_row_are():
    spec = make(seq_q=128, heads_kv=2, padding=True, generate_stats=True, dtype="float16")
    assert _checked(spec, _nan_past_the_valid_rows).runtime["lse_error"] <= 1e-5

    def one_valid_row_off(spec: GraphSpec, stats, feed) -> None:  # noqa: ANN001
        stats[0, 3, 0] += 0.1  # row 0 is valid in every batch element (lengths >= 1)

    with pytest.raises(UnsupportedSpec, match="wrong log-sum-exp"):
        _checked(spec, one_valid_row_off)
