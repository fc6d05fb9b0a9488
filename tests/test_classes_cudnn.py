"""Class graphs in the cuDNN compiler on this CPU (issue 18, item 4).

- With the real frontend 1.32: a class spec's graph goes through validate()
  and build_operation_graph() declared with is_override_shape_enabled=True
  and the padding mask (read back from the frontend's own SDPA analyzer).
- The override keywords execute passes are checked against the real
  ``execute`` / ``get_workspace_size`` signatures of 1.32 (.venv) and 1.24
  (.cache/old-frontends, scripts/tools/old_frontends.sh).
- The version gate comes from the release table.
- The execute path and the build-time check run against a CPU stand-in of
  the frontend graph, written to 1.32's ``pygraph.execute(tensor_dict,
  workspace, handle, override_uids, override_shapes, override_strides)``: it
  reads every tensor through the override shapes and strides it is given
  (what cuDNN does on a GPU), so wrong lists, or a plan that ignores them,
  give wrong or NaN output. The GPU runs are tests/test_gpu.py's (marked gpu).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from graphcache import Artifact, GraphSpec, Target, UidMap, UnsupportedSpec
from graphcache.spec.classes import class_of

torch = pytest.importorskip("torch", reason="the class graph's execute path runs on torch tensors")

from graphcache.compilers.classgraph import bhsd_view, storage_view  # noqa: E402
from graphcache.compilers.cudnn import override  # noqa: E402
from graphcache.compilers.cudnn.loaded import CudnnGraph  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
OLD = Path(os.environ.get("GRAPHCACHE_OLD_FRONTENDS", REPO / ".cache" / "old-frontends"))


def klass(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=4, heads_q=8, heads_kv=2, seq_q=1, seq_kv=256, head_dim=64, dtype="bfloat16", shapes="class")
    return GraphSpec(**{**base, **fields})


# -- the real frontend 1.32 on this CPU ---------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [{}, {"seq_q": 256, "mask": "causal", "generate_stats": True, "layout": "bhsd"}],
    ids=["decode", "prefill"],
)
def test_a_class_graph_is_declared_with_the_override_flag_and_the_padding_mask_in_the_real_frontend(fields):
    cudnn = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend 1.32")
    if tuple(int(x) for x in cudnn.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"validate() without a GPU needs frontend 1.32+, found {cudnn.__version__}")
    from cudnn.sdpa.graph_analyzer import analyze

    from graphcache.compilers.cudnn import build_graph

    spec = klass(**fields)
    built = build_graph(cudnn, spec, lower=False)  # validate()
    built.graph.build_operation_graph()
    facts = analyze(built.graph)
    assert facts.shape_overrides and facts.padded, "override flag and padding mask, as the frontend sees them"
    assert (facts.b, facts.s_q, facts.s_kv) == (spec.batch, spec.seq_q, spec.seq_kv)  # declared at the maxima
    uids = UidMap.default()
    for role in ("seq_len_q", "seq_len_kv"):
        assert built.tensors[role].get_uid() == uids[role] and built.tensors[role].get_dim() == [spec.batch, 1, 1, 1]
    exact = build_graph(cudnn, spec.at(3, spec.seq_q, 200), lower=False)
    assert not analyze(exact.graph).shape_overrides and "seq_len_q" not in exact.tensors


@pytest.mark.parametrize(
    "fields",
    [{}, {"seq_q": 256, "mask": "causal", "generate_stats": True, "layout": "bhsd"}],
    ids=["decode", "prefill"],
)
def test_a_padded_class_graph_has_the_padding_mask_at_the_maxima_and_no_override_flag_in_the_real_frontend(fields):
    # What a cuDNN below 9.21 is handed: the frontend's own analyzer reads the validated graph.
    cudnn = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend 1.32")
    if tuple(int(x) for x in cudnn.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"validate() without a GPU needs frontend 1.32+, found {cudnn.__version__}")
    from cudnn.sdpa.graph_analyzer import analyze

    from graphcache.compilers.cudnn import build_graph

    spec = klass(mechanism="padded", **fields)
    built = build_graph(cudnn, spec, lower=False)  # validate()
    built.graph.build_operation_graph()
    facts = analyze(built.graph)
    assert facts.padded and not facts.shape_overrides, "the padding mask, and no override an old cuDNN lacks"
    assert (facts.b, facts.s_q, facts.s_kv) == (spec.batch, spec.seq_q, spec.seq_kv)  # declared at the maxima
    uids = UidMap.default()
    for role in ("seq_len_q", "seq_len_kv"):
        assert built.tensors[role].get_uid() == uids[role] and built.tensors[role].get_dim() == [spec.batch, 1, 1, 1]


def _signature_job() -> str:
    return (
        "import inspect, json, cudnn\n"
        "e = inspect.signature(cudnn.pygraph.execute)\n"
        "src = inspect.getsource(cudnn.pygraph.execute)\n"
        "try:\n"
        "    w = str(inspect.signature(cudnn.pygraph.get_workspace_size))\n"
        "except ValueError:  # a pybind overload (1.24): its docstring lists the signatures\n"
        "    w = cudnn.pygraph.get_workspace_size.__doc__\n"
        "print(json.dumps({'version': cudnn.__version__, 'execute': list(e.parameters),"
        " 'forwards': src.split('_execute(')[-1].count('override_'), 'workspace': w}))\n"
    )


def _real_signatures(version: str) -> dict:
    env = dict(os.environ)
    if version != "installed":
        path = OLD / f"fe-{version}"
        if not path.is_dir():
            pytest.skip(f"frontend {version} is not installed: run scripts/tools/old_frontends.sh")
        env["PYTHONPATH"] = str(path)
        lib = OLD / "runtime" / "nvidia" / "cudnn" / "lib"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), env.get("LD_LIBRARY_PATH")]))
    out = subprocess.run(
        [sys.executable, "-c", _signature_job()], capture_output=True, text=True, timeout=120, env=env, check=False
    )
    if out.returncode:
        pytest.skip(f"frontend {version} does not import here: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", ["1.24.0", "installed"])
def test_the_override_keywords_fit_the_real_execute_and_workspace_signatures(version):
    real = _real_signatures(version)
    if version == "installed" and not real["version"].startswith("1.32"):
        pytest.skip(f"the installed frontend is {real['version']}, not 1.32")
    lists = override.lists_for(klass().at(3, 1, 200), UidMap.default())
    # execute(tensor_dict, workspace, handle, override_uids, override_shapes, override_strides): 4th-6th after self
    assert real["execute"][1:7][3:] == list(lists) == ["override_uids", "override_shapes", "override_strides"]
    assert real["execute"][3] == "handle", "the call passes handle= by name"
    assert real["forwards"] >= 3, f"{real['version']}'s execute() must forward the override lists to the backend"
    for name in lists:
        assert name in real["workspace"], f"get_workspace_size of {real['version']} takes {name}"
    assert len({len(v) for v in lists.values()}) == 1, "the three lists name the same tensors"


def test_a_class_spec_on_a_stack_without_shape_override_is_unsupported_naming_what_is_needed():
    spec = klass()
    with pytest.raises(UnsupportedSpec, match=r"cudnn-frontend >= 1\.24.*cudnn-frontend 1\.23\.0") as err:
        override.check_target(spec, "1.23.0", "9.28.0")
    assert err.value.step == "preflight"
    with pytest.raises(UnsupportedSpec, match=r"cuDNN >= 9\.21.*cuDNN 9\.20\.0"):
        override.check_target(spec, "1.32.0", "9.20.0")
    override.check_target(spec, "1.24.0", "9.21.0")  # no error


def test_the_check_shapes_cover_the_maximum_the_smallest_and_off_tile_lengths():
    prefill = klass(batch=8, seq_q=256, seq_kv=256, mask="causal")
    sizes = [(s.batch, s.seq_q, s.seq_kv) for s in override.check_shapes(prefill)]
    assert sizes == [(8, 256, 256), (1, 2, 1), (8, 2, 1), (8, 33, 33), (7, 96, 96), (7, 160, 160)]
    small = [(s.batch, s.seq_q, s.seq_kv) for s in override.check_shapes(klass(batch=1, seq_kv=128))]
    assert small == [(1, 1, 128), (1, 1, 1), (1, 1, 33), (1, 1, 96)]  # 160 keys do not fit in 128
    assert all(prefill.covers(s) for s in override.check_shapes(prefill))
    canary = override.canary_spec(prefill)
    assert prefill.covers(canary) and (canary.batch, canary.seq_q, canary.seq_kv) != (8, 256, 256)


# -- execute and the build-time check, against a CPU stand-in of the frontend graph ------


class StandinFrontendGraph:
    """1.32's ``pygraph.execute`` and ``get_workspace_size`` signatures; on
    execute it reads each tensor through the override shape and strides it
    was given (from the tensor's storage, as cuDNN reads device memory) and
    writes O the same way. ``ignore_overrides`` reads the declared shapes
    instead: a plan that does not honour the override. ``stats_bug`` writes a
    right O and wrong stats: "first-head" writes the lse of each kv group's
    first q head only, leaving the others as the buffer held them
    (cudnn-frontend#1083 on SM100 9.26/9.27, s_q 1 with GQA); "declared"
    writes the stats through the declared shape and strides (a plan whose
    stats ignore the override)."""

    def __init__(self, declared: GraphSpec, ignore_overrides: bool = False, stats_bug: str | None = None) -> None:
        self.declared = declared
        self.ignore = ignore_overrides
        self.stats_bug = stats_bug
        self.calls: list[dict] = []

    def get_workspace_size(self, handle=None, override_uids=None, override_shapes=None, override_strides=None):  # noqa: ANN001, ANN201
        self.calls.append({"workspace": override_shapes})
        return 4096

    def execute(
        self,
        tensor_dict,
        workspace=None,
        handle=None,
        override_uids=None,
        override_shapes=None,
        override_strides=None,
        tensor_uids=None,
    ):  # noqa: ANN001, ANN201, E501
        from graphcache.compilers.torch_sdpa import reference

        assert len(override_uids) == len(override_shapes) == len(override_strides)
        self.calls.append({"uids": override_uids, "shapes": override_shapes})
        uids = UidMap.default()
        given = dict(zip(override_uids, zip(override_shapes, override_strides, strict=True), strict=True))
        spec = self.declared

        def read(role, declared=self.ignore):  # noqa: ANN001, ANN202
            t = tensor_dict[uids[role]]
            shape, stride = (spec.dims(role), spec.strides(role)) if declared else given[uids[role]]
            base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            try:
                return base.as_strided(shape, stride, t.storage_offset())
            except RuntimeError:  # past the buffer: on a GPU, memory that is not the tensor's
                return torch.full(shape, float("nan") if t.is_floating_point() else 0, dtype=t.dtype)

        b, _, sq, _ = read("q").shape
        real = spec.at(b, sq, read("k").shape[2])
        lq, lkv = read("seq_len_q"), read("seq_len_kv")
        store = {r: storage_view(real, r, read(r)) for r in ("q", "k", "v")}  # each in its own layout
        out, stats = reference(real.replace(padding=True), store["q"], store["k"], store["v"], lq, lkv)
        o = read("o")
        o.copy_(bhsd_view(real, "o", out).to(o.dtype))
        if uids["stats"] in given:
            if self.stats_bug == "declared":
                read("stats", declared=True)[: stats.shape[0], :, : stats.shape[2]].copy_(stats.flip(2))
                return
            target = read("stats")
            heads = range(0, real.heads_q, real.heads_q // real.heads_kv) if self.stats_bug else range(real.heads_q)
            target[:, list(heads)] = stats[:, list(heads)]


class CpuCompiler:
    def __init__(self) -> None:
        self._lock = threading.RLock()

    def handle(self) -> object:
        return object()


def cpu_graph(spec: GraphSpec, cudnn_version: str = "9.28.0", **standin) -> CudnnGraph:  # noqa: ANN003
    """A CudnnGraph of a class spec on the CPU: the real class, with the
    frontend graph and the compiler's handle stood in."""
    target = Target.parse(f"h200-sm90-mp132-cudnn{cudnn_version}-fe1.32.0")
    artifact = Artifact(spec=spec, target=target, payload=b"x", uids=UidMap.default())
    graph = CudnnGraph.__new__(CudnnGraph)
    graph._compiler, graph.artifact, graph.spec, graph.uids = CpuCompiler(), artifact, spec, artifact.uids
    graph._graph = StandinFrontendGraph(spec, **standin)
    graph.device = torch.device("cpu")
    graph.workspace_size = 1024
    graph._workspaces = {}
    type(graph).workspace = property(lambda self: torch.empty(1 << 16, dtype=torch.uint8))  # type: ignore[assignment]
    return graph


@pytest.fixture(autouse=True)
def _restore_workspace_property():
    saved = CudnnGraph.__dict__["workspace"]
    yield
    CudnnGraph.workspace = saved  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"layout": "bhsd"},
        {"seq_q": 256, "mask": "causal", "generate_stats": True},
        {"seq_q": 128, "mask": "causal_bottom_right", "seq_kv": 256},
        # issue 40: each tensor read where it lies, every one a view into a NaN-filled buffer of a longer call's strides
        {"seq_q": 256, "layout": "sbhd"},
        {"seq_q": 256, "heads_kv": 8, "layout": "bs[3]hd"},
        {"seq_q": 256, "mask": "causal", "layout": "bhsd", "layout_q": "bshd"},
        {"seq_q": 256, "heads_kv": 1, "layout_q": "bs[+2]hd"},
    ],
    ids=["decode-bshd", "decode-bhsd", "prefill-stats", "bottom-right", "sbhd", "vit", "hf-prefill", "bigcode"],
)
def test_the_build_check_passes_a_plan_that_honours_the_overrides_and_names_shapes_where_one_does_not(fields):
    spec = klass(batch=2, **fields)
    assert override.check_class(cpu_graph(spec)) < 2e-2
    with pytest.raises(
        UnsupportedSpec, match=r"disagrees with the float32 reference at real shapes b\d+ q\d+ kv\d+"
    ) as err:
        override.check_class(cpu_graph(spec, ignore_overrides=True))
    assert err.value.step == "check" and "b2 q" in str(err.value) and "exact specs serve this target" in str(err.value)


def test_execute_passes_every_b_or_s_tensor_in_declared_axis_order_with_the_real_buffers_strides():
    from graphcache.compilers.torch_sdpa import TorchSdpaGraph, random_inputs

    spec = klass(seq_q=128, mask="causal", generate_stats=True)
    graph = cpu_graph(spec)
    real = spec.at(3, 100, 100)
    feed = random_inputs(real, "cpu", seed=1)
    big = torch.full((4, 128, 8, 64), float("nan"), dtype=torch.bfloat16)  # bshd storage, declared maxima
    q = big[:3, :100]
    q.copy_(feed["q"])
    out, stats = graph.execute(q, feed["k"], feed["v"])
    want, want_stats = TorchSdpaGraph(real).execute(**feed)
    assert torch.allclose(out.float(), want.float(), atol=2e-2) and torch.allclose(stats, want_stats, atol=1e-3)
    call = graph._graph.calls[-1]
    uids = UidMap.default()
    assert call["uids"] == [uids[r] for r in ("q", "k", "v", "o", "stats", "seq_len_q", "seq_len_kv")]
    assert call["shapes"][0] == [3, 8, 100, 64] and call["shapes"][4] == [3, 8, 100, 1]
    assert call["shapes"][5] == call["shapes"][6] == [3, 1, 1, 1]
    assert graph._graph.calls[-2]["workspace"] == call["shapes"], "cuDNN >= 9.23: the override-aware workspace query"
    old = cpu_graph(spec, cudnn_version="9.22.0")
    old.execute(q, feed["k"], feed["v"])
    assert all("workspace" not in c for c in old._graph.calls), "before 9.23 the declared size is used"


def test_a_bound_class_run_prepares_its_lists_once_and_serves_torchs_views():
    from graphcache.compilers.classgraph import bind
    from graphcache.errors import ExecutionError

    spec = klass(batch=1)
    graph = cpu_graph(spec)
    run = bind(graph, spec.at(1, 1, 77))
    assert run.lists == override.lists_for(spec.at(1, 1, 77), UidMap.default())
    assert [int(t) for t in run.seq_lens] == [1, 77]
    other = bind(graph, spec.at(1, 1, 200))
    assert [int(t) for t in other.seq_lens] == [1, 200] and [int(t) for t in run.seq_lens] == [1, 77]
    assert other.seq_lens[1].untyped_storage().data_ptr() == run.seq_lens[1].untyped_storage().data_ptr(), (
        "bound shapes share the class graph's length table: nothing allocated per shape"
    )
    q, k, v = (
        torch.randn(1, n, 8 if r == "q" else 2, 64, dtype=torch.bfloat16).transpose(1, 2)
        for r, n in (("q", 1), ("k", 77), ("v", 77))
    )
    out = run.run_views(q, k, v)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert out.shape == (1, 8, 1, 64) and torch.allclose(out.float(), want, atol=2e-2)
    with pytest.raises(ExecutionError, match="seq_kv <= 256"):
        bind(graph, spec.at(1, 1, 300))
    assert class_of(spec.at(1, 1, 77), "pow2") == klass(batch=1, seq_kv=128)  # 77 keys' own class is kv128


@pytest.mark.parametrize(
    "fields",
    [{"seq_kv": 16}, {"seq_kv": 30}, {"seq_q": 16, "seq_kv": 16, "mask": "causal"}, {"seq_q": 8, "seq_kv": 40}],
    ids=["decode-kv16", "decode-kv30", "prefill-16", "prefill-q8-kv40"],
)
def test_a_short_declared_class_is_checked_and_canaried_at_shapes_inside_it(fields):
    # A class spec written by hand may declare fewer than 33 keys (pow2 never
    # does): its check and canary must stay inside it, not fail its build
    # with a shape the class does not serve or a length below 1.
    spec = klass(batch=2, **fields)
    shapes = override.check_shapes(spec)
    assert all(spec.covers(s) for s in shapes), [s.summary() for s in shapes if not spec.covers(s)]
    assert spec.covers(override.canary_spec(spec))
    assert override.check_class(cpu_graph(spec)) < 2e-2


@pytest.mark.parametrize(
    ("fields", "bug"),
    [
        ({"generate_stats": True}, "first-head"),
        ({"seq_q": 256, "mask": "causal", "generate_stats": True, "layout": "bhsd"}, "first-head"),
        ({"seq_q": 256, "mask": "causal", "generate_stats": True}, "declared"),
    ],
    ids=["decode-1083", "prefill-1083", "prefill-stats-ignore-override"],
)
def test_a_class_plan_with_a_right_output_and_wrong_stats_is_refused_naming_the_stats_and_shapes(fields, bug):
    spec = klass(batch=2, **fields)
    assert override.check_class(cpu_graph(spec)) < 2e-2, "a plan writing right stats passes"
    with pytest.raises(UnsupportedSpec, match=r"wrong log-sum-exp \(stats\) at real shapes b\d+ q\d+ kv\d+") as err:
        override.check_class(cpu_graph(spec, stats_bug=bug))
    assert err.value.step == "check" and "while its output agrees" in str(err.value)
    assert "exact specs serve this target" in str(err.value)


def test_the_class_checks_stats_buffer_is_a_view_into_a_nan_filled_buffer():
    # The stand-in writes nothing past the real extent; a plan that did, or
    # that left a row unwritten, would show NaN, not the zeros of a fresh buffer.
    spec = klass(batch=2, generate_stats=True)
    graph = cpu_graph(spec)
    seen = []
    execute = graph._graph.execute

    def spy(tensor_dict, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        seen.append(tensor_dict[UidMap.default()["stats"]])
        return execute(tensor_dict, *args, **kwargs)

    graph._graph.execute = spy
    override.check_class(graph)
    assert seen and all(t.dtype == torch.float32 for t in seen)
    for t in seen:
        base = t.as_strided((t.untyped_storage().nbytes() // 4,), (1,), 0)
        assert base.numel() > t.numel() and bool(torch.isnan(base).any()), "stats must be a view into NaN"
