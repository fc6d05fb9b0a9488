"""SDPA backward graphs in the cuDNN compiler on this CPU (issue 42 item 2).

- With the real frontend 1.32: a backward spec's graph goes through
  validate() and build_operation_graph(), and 1.32's own SDPA analyzer reads
  it back as a backward node with the spec's heads, lengths, mask, bias,
  padding and (for a class) the override flag.
- The version gate is the release table's.
- The execute path and the build-time check run against a CPU stand-in of a
  deserialized 1.32 ``sdpa_backward`` plan: its ``execute(tensor_dict,
  workspace, handle, override_uids, override_shapes, override_strides)``
  reads every tensor by UID through the declared (or the overridden) dims
  and strides, as cuDNN reads device memory, and computes dQ, dK, dV from
  Q, K, V, O, dO and the stats the way a flash backward does
  (P = exp(S - stats), dS = P * (dP - rowsum(dO * O))), so a wrong UID, a
  wrong stats tensor or an override the plan ignores gives wrong gradients.
- On a GPU (``-m gpu``): run on an H200 with cuDNN 9.19 / frontend 1.28,
  where the class case skips (no execute-time override below cuDNN 9.21).
"""

from __future__ import annotations

import threading

import pytest

from graphcache import Artifact, BuildError, GraphSpec, Target, UidMap, UnsupportedSpec

torch = pytest.importorskip("torch", reason="the backward graph's execute path runs on torch tensors")

from graphcache.compilers import canary  # noqa: E402
from graphcache.compilers.cudnn import backward, refuses_keywords  # noqa: E402
from graphcache.reference.dense import allowed_mask  # noqa: E402

TARGET = Target.parse("h200-sm90-mp132-cudnn9.28.0-fe1.32.0")


def back(**fields) -> GraphSpec:  # noqa: ANN003
    base = dict(batch=2, heads_q=8, heads_kv=2, seq_q=128, head_dim=64, dtype="bfloat16", kind="backward")
    return GraphSpec(**{**base, **fields})


# -- the real frontend 1.32 on this CPU ---------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"mask": "causal"},
        {"mask": "causal_bottom_right", "seq_kv": 256, "layout": "bhsd"},
        {"mask": "sliding_window", "window_left": 31, "heads_kv": 8},
        {"bias": "b1ss", "padding": True, "heads_kv": 1},
        {"shapes": "class", "mask": "causal"},
    ],
    ids=["gqa-causal", "bottom-right-bhsd", "window", "bias-padded-mqa", "class"],
)
def test_a_backward_graph_is_declared_as_sdpa_backward_in_the_real_frontend(fields):
    cudnn = pytest.importorskip("cudnn", reason="needs nvidia-cudnn-frontend 1.32")
    if tuple(int(x) for x in cudnn.__version__.split(".")[:2]) < (1, 32):
        pytest.skip(f"validate() without a GPU needs frontend 1.32+, found {cudnn.__version__}")
    from cudnn.sdpa.graph_analyzer import analyze

    from graphcache.compilers.cudnn import build_graph

    spec = back(**fields)
    built = build_graph(cudnn, spec, lower=False)  # the dialect chain, then validate()
    built.graph.build_operation_graph()
    facts = analyze(built.graph)
    assert facts.is_backward and facts.invalid is None
    assert (facts.b, facts.h_q, facts.h_kv, facts.s_q, facts.s_kv, facts.d_qk) == (
        spec.batch, spec.heads_q, spec.heads_kv, spec.seq_q, spec.seq_kv, spec.head_dim,
    )  # fmt: skip
    assert facts.causal == (spec.mask != "none") and facts.bottom_right == (spec.mask == "causal_bottom_right")
    assert facts.window_left == (spec.window_left if spec.mask == "sliding_window" else None)
    assert facts.has_bias == (spec.bias is not None) and facts.padded == (spec.padding or spec.is_class)
    assert facts.shape_overrides == spec.is_class and facts.bshd_layout == (spec.layout == "bshd")
    uids = UidMap.default().for_spec(spec)
    for role in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV"):
        tensor = built.tensors[role]
        assert tensor.get_uid() == uids[role], role
        assert (tuple(tensor.get_dim()), tuple(tensor.get_stride())) == (spec.dims(role), spec.strides(role)), role


def test_the_gate_is_the_release_tables_and_names_the_field():
    with pytest.raises(UnsupportedSpec, match=r"mask 'causal_bottom_right'.*cudnn-frontend >= 1\.5.*1\.4\.0") as err:
        backward.check_target(back(mask="causal_bottom_right"), "1.4.0", "9.28.0", "9.0")
    assert err.value.step == "preflight"
    with pytest.raises(UnsupportedSpec, match=r"kind 'backward'.*cuDNN >= 9\.0.*cuDNN 8\.9\.7"):
        backward.check_target(back(), "1.32.0", "8.9.7", "9.0")
    with pytest.raises(UnsupportedSpec, match=r"compute capability >= 8\.0"):
        backward.check_target(back(), "1.32.0", "9.28.0", "7.5")
    backward.check_target(back(mask="causal"), "1.4.0", "9.0.0", "8.0")  # use_causal_mask: every release
    # s_q = s_kv = 1: frontends before 1.16 would build it; graphcache refuses it on every stack.
    with pytest.raises(UnsupportedSpec, match=r"seq_q 1: sdpa_backward does not run s_q = s_kv = 1"):
        backward.check_target(back(seq_q=1, seq_kv=1), "1.10.0", "9.5.0", "9.0")
    backward.check_target(back(seq_q=1, seq_kv=64), "1.10.0", "9.5.0", "9.0")


def test_an_old_frontend_refusing_sdpa_backward_keywords_moves_the_dialect_chain_on():
    refusal = TypeError("sdpa_backward(): incompatible function arguments. The following argument types ...")
    assert refuses_keywords(refusal) and not refuses_keywords(TypeError("unsupported operand type(s)"))


# -- execute and the build-time check, against a CPU stand-in of the plan ------------


class StandinBackwardPlan:
    """1.32's ``pygraph.execute`` of a deserialized ``sdpa_backward`` plan
    declared for ``declared``, on the CPU: every tensor read by UID through
    its declared dims and strides, or the override's where one is given
    (``ignore_overrides``: a plan that does not honour them); ``bug``
    ``"dk_one_head"`` writes dK from the group's first query head only,
    ``"stale_dq"`` adds dQ onto what the previous run left (a float32
    accumulator in the workspace that nothing clears between runs)."""

    def __init__(self, declared: GraphSpec, ignore_overrides: bool = False, bug: str | None = None) -> None:
        self.declared, self.ignore, self.bug = declared, ignore_overrides, bug
        self.packs: list[tuple[list[int], dict]] = []
        self.left = None  # what the last run left in a stale accumulator

    def get_workspace_size(self, handle=None, override_uids=None, override_shapes=None, override_strides=None):  # noqa: ANN001, ANN201
        return 0

    def execute(
        self, tensor_dict, workspace=None, handle=None, override_uids=None, override_shapes=None, override_strides=None
    ):  # noqa: ANN001, ANN201, E501
        uids = UidMap.default().for_spec(self.declared)
        lists = dict(
            zip(override_uids or [], zip(override_shapes or [], override_strides or [], strict=True), strict=True)
        )
        self.packs.append((sorted(tensor_dict), lists))
        spec = self.declared

        def read(role):  # noqa: ANN001, ANN202
            t = tensor_dict[uids[role]]
            dims, strides = (spec.dims(role), spec.strides(role))
            if uids[role] in lists and not self.ignore:
                dims, strides = lists[uids[role]]
            base = t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)
            try:
                return base.as_strided(dims, strides, t.storage_offset())
            except RuntimeError:  # past the buffer: on a GPU, memory that is not the tensor's
                return torch.full(dims, float("nan"), dtype=t.dtype)

        q, k, v, o, d_o = (read(r).float() for r in ("q", "k", "v", "o", "dO"))
        stats = read("stats")
        b, h, sq, _ = q.shape
        real = spec.at(b, sq, k.shape[2]) if spec.is_class else spec
        group = h // k.shape[1]
        kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        allowed = torch.ones(b, 1, sq, k.shape[2], dtype=torch.bool)
        if real.padding or real.is_class:
            lq, lkv = read("seq_len_q").reshape(-1), read("seq_len_kv").reshape(-1)
            for n in range(b):
                rows = torch.arange(sq).view(-1, 1) < int(lq[n])
                allowed[n, 0] = allowed_mask(real, int(lq[n]), int(lkv[n])) & rows
        else:
            allowed[:, 0] = allowed_mask(real)
        scores = q @ kx.transpose(-1, -2) * real.attn_scale
        if real.bias is not None:
            scores = scores + read("bias").float()
        p = torch.exp(scores - stats).masked_fill(~allowed, 0.0)  # the forward's stats, as cuDNN reads them
        dp = d_o @ vx.transpose(-1, -2)
        ds = p * (dp - (d_o * o).sum(-1, keepdim=True)) * real.attn_scale
        dq = ds @ kx
        dk = (ds.transpose(-1, -2) @ q).view(b, -1, group, k.shape[2], k.shape[3])
        dv = (p.transpose(-1, -2) @ d_o).view(b, -1, group, k.shape[2], v.shape[3])
        dk = dk[:, :, 0] * group if self.bug == "dk_one_head" else dk.sum(2)
        if self.bug == "stale_dq":
            dq, self.left = (dq if self.left is None else dq + self.left), dq
        for role, grad in (("dQ", dq), ("dK", dk), ("dV", dv.sum(2))):
            read(role).copy_(grad)


class CpuCompiler:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.device = 0

    def handle(self) -> object:
        return object()


class CpuBackwardGraph(backward.CudnnBackwardGraph):
    """The real CudnnBackwardGraph on the CPU: the frontend graph and the
    compiler's handle stood in, a CPU workspace."""

    workspace = property(lambda self: torch.empty(1 << 12, dtype=torch.uint8))  # type: ignore[assignment]

    def __init__(self, spec: GraphSpec, **standin) -> None:  # noqa: ANN003
        self.artifact = Artifact(spec=spec, target=TARGET, payload=b"x", uids=UidMap.default(), runtime={"engine": "e"})
        self._compiler, self.spec, self.uids = CpuCompiler(), spec, self.artifact.uids
        self._graph = StandinBackwardPlan(spec, **standin)
        self.device = torch.device("cpu")
        self.workspace_size = 0
        self._workspaces = {}


@pytest.mark.parametrize(
    "fields",
    [{"mask": "causal"}, {"layout": "bhsd", "padding": True}, {"bias": "bhss", "heads_kv": 8}],
    ids=["gqa-causal", "padded-bhsd", "bias"],
)
def test_the_build_check_passes_a_right_plan_and_records_a_canary_of_the_three_gradients(fields):
    graph = CpuBackwardGraph(back(**fields))
    artifact = backward.checked(graph.artifact, graph)
    assert artifact.validation_error <= 2e-2 and set(artifact.runtime["gradient_errors"]) == {"dq", "dk", "dv"}
    # Never recorded as bit-exact, though this stand-in gave the same bits twice (BIT_EXACT_CANARY).
    assert artifact.canary["deterministic"] is False
    packed, _ = graph._graph.packs[-1]
    uids = graph.uids
    wanted = {uids[r] for r in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV")}
    wanted |= {uids["seq_len_q"], uids["seq_len_kv"]} if graph.spec.padding else set()
    assert set(packed) == wanted | ({uids["bias"]} if graph.spec.bias else set())
    # What a load does: the plan on the canary's input agrees with the record.
    feed = canary.inputs(graph.spec, "cpu")
    assert canary.mismatch(graph.spec, artifact.canary, graph.execute(**feed), feed) is None


def test_a_load_whose_gradients_differ_from_the_builds_by_an_ulp_passes_its_canary():
    # cuDNN's backward adds dQ across key tiles in whatever order they finish
    # (no use_deterministic_algorithm): on an H200 with cuDNN 9.19 a b4 s2048
    # plan gave one dQ bit pattern in 12 runs and five in the next 20. A plan
    # that matched twice at build must not be rejected, and deleted from the
    # shared store, when a later run differs.
    graph = CpuBackwardGraph(back(mask="causal"))
    artifact = backward.checked(graph.artifact, graph)
    feed = canary.inputs(graph.spec, "cpu")
    dq, dk, dv = graph.execute(**feed)
    dq.view(-1).view(torch.int16)[0] += 1  # one value, one bf16 ulp away
    assert canary.mismatch(graph.spec, artifact.canary, (dq, dk, dv), feed) is None
    dq.mul_(1.5)  # a wrong plan still fails it
    assert "differ" in canary.mismatch(graph.spec, artifact.canary, (dq, dk, dv), feed)


def test_a_plan_whose_second_run_differs_from_its_first_is_a_build_error():
    graph = CpuBackwardGraph(back(mask="causal"), bug="stale_dq")
    with pytest.raises(BuildError, match=r"second run .* other gradients: dq moved by \d.*keeps state between runs"):
        backward.checked(graph.artifact, graph)


def test_a_plan_with_a_wrong_gradient_is_a_build_error_naming_it():
    graph = CpuBackwardGraph(back(mask="causal"), bug="dk_one_head")
    with pytest.raises(BuildError, match=r"differ from the float32 reference's: dk \d") as err:
        backward.checked(graph.artifact, graph)
    assert "dq" not in str(err.value) and "dv" not in str(err.value)


def test_a_class_plan_is_checked_at_real_shapes_in_nan_filled_buffers():
    spec = back(mask="causal", shapes="class", batch=4, heads_q=4, head_dim=32)
    graph = CpuBackwardGraph(spec)
    artifact = backward.checked(graph.artifact, graph)
    assert artifact.validation_error <= 2e-2
    shapes = {tuple(lists[graph.uids["dK"]][0]) for _, lists in graph._graph.packs}
    assert (4, 2, 128, 32) in shapes and (1, 2, 1, 32) in shapes and (3, 2, 96, 32) in shapes
    _, lists = graph._graph.packs[-1]  # dQ's override strides are the NaN-filled buffer's, in (b, h, s, d) order
    assert set(lists) >= {graph.uids[r] for r in ("q", "k", "v", "o", "dO", "stats", "dQ", "dK", "dV", "seq_len_q")}
    with pytest.raises(
        UnsupportedSpec, match=r"disagrees with the float32 reference's gradients at real shapes b\d"
    ) as err:
        backward.checked(graph.artifact, CpuBackwardGraph(spec, ignore_overrides=True))
    assert err.value.step == "check" and "exact specs serve this target" in str(err.value)


def test_execute_names_a_missing_o_and_a_gradient_buffer_the_plan_cannot_write_through():
    from graphcache.errors import ExecutionError

    spec = back(mask="causal")
    graph = CpuBackwardGraph(spec)
    feed = canary.inputs(spec, "cpu")
    with pytest.raises(ExecutionError, match=r"^o is missing"):
        graph.execute(**{**feed, "o": None})
    with pytest.raises(ExecutionError, match=r"dq has shape \(2, 128, 2, 64\).* needs \(2, 128, 8, 64\)"):
        graph.execute(**feed, dq=torch.empty(spec.storage_shape("k"), dtype=torch.bfloat16))  # dK's shape
    not_packed = torch.empty(spec.storage_shape("q")[::-1], dtype=torch.bfloat16).permute(3, 2, 1, 0)
    with pytest.raises(ExecutionError, match=r"dq has strides"):
        graph.execute(**feed, dq=not_packed)
    assert graph._graph.packs == [], "nothing reached the plan"
    klass = CpuBackwardGraph(back(mask="causal", shapes="class", batch=4))
    real = back(mask="causal", batch=3, seq_q=77)
    feed = canary.inputs(real, "cpu")
    with pytest.raises(ExecutionError, match=r"^dk must be torch.bfloat16 \(3, 77, 2, 64\)"):
        klass.execute(**feed, dk=torch.empty(real.storage_shape("q"), dtype=torch.bfloat16))
    with pytest.raises(ExecutionError, match=r"^o is missing"):
        klass.execute(**{**feed, "o": None})


def test_a_bound_class_graph_serves_an_exact_shape_and_refuses_one_outside():
    graph = CpuBackwardGraph(back(mask="causal", shapes="class", batch=4))
    exact = back(mask="causal", batch=3, seq_q=77)
    feed = canary.inputs(exact, "cpu")
    bound = graph.bind(exact)
    assert bound.spec == exact and bound.class_spec == graph.spec
    from graphcache.reference.backward import gradient_errors

    assert max(gradient_errors(exact, bound.execute(**feed), feed).values()) <= 2e-2
    from graphcache.errors import ExecutionError

    with pytest.raises(ExecutionError, match="outside the class"):
        graph.bind(exact.replace(seq_q=300))


# -- on a GPU (skipped, with the reason, where there is none) -------------------------


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fields",
    [
        {"dtype": "float16", "mask": "causal"},
        {"dtype": "bfloat16", "layout": "bhsd", "heads_kv": 8},
        {"dtype": "bfloat16", "mask": "causal", "padding": True},
        {"dtype": "bfloat16", "mask": "causal", "shapes": "class"},
    ],
    ids=["fp16-gqa-causal", "bf16-bhsd", "padded", "class"],
)
def test_on_a_gpu_a_backward_plan_builds_round_trips_and_matches_the_references_gradients(tmp_path, fields):
    from graphcache import GraphCache
    from graphcache.compilers.cudnn import CudnnCompiler
    from graphcache.compilers.cudnn.releases import SHAPE_OVERRIDE, missing
    from graphcache.reference.backward import backward_inputs, gradient_errors
    from graphcache.stores import DiskStore

    spec = back(**fields)
    compiler = CudnnCompiler()
    cache = GraphCache(DiskStore(tmp_path / "store"), compiler, shape_classes="exact")
    need = missing(SHAPE_OVERRIDE, compiler.target().frontend, compiler.target().cudnn) if spec.is_class else None
    if need:  # seen on an H200 with cuDNN 9.19: a negative entry, and exact graphs serve
        with pytest.raises(UnsupportedSpec, match="needs cuDNN >= 9.21"):
            cache.get(spec)
        pytest.skip(f"this stack has no execute-time shape override: {need}")
    artifact = cache.get(spec)  # built, serialized, loaded back and checked against autograd of the reference
    assert set(artifact.runtime["gradient_errors"]) == {"dq", "dk", "dv"} and artifact.canary is not None
    graph = cache.load(spec)  # deserialized again, its canary re-checked
    real = spec.at(spec.batch, 77, 77) if spec.is_class else spec
    inputs = backward_inputs(real, "cuda", seed=9)
    errors = gradient_errors(real, graph.execute(**inputs), inputs)
    assert max(errors.values()) <= (5e-3 if spec.dtype == "float16" else 2e-2), errors


@pytest.mark.gpu
def test_on_a_gpu_sdpa_backward_serves_what_torchs_cudnn_forward_left(tmp_path):
    import graphcache.torch as gt
    from graphcache import GraphCache
    from graphcache.compilers.cudnn import CudnnCompiler
    from graphcache.stores import DiskStore
    from graphcache.torch.backward import sdpa_backward

    gt.reset()
    try:
        gt.configure(GraphCache(DiskStore(tmp_path / "store"), CudnnCompiler()), on_miss="build")
        q, k, v = (torch.randn(2, 200, 8, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)[:2]
        grad_out = torch.randn_like(out)
        dq, dk, dv = sdpa_backward(grad_out, q, k, v, out, lse, is_causal=True)
        leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True).backward(grad_out.double())
        for ours, leaf in zip((dq, dk, dv), leaves, strict=True):
            assert ((ours.double() - leaf.grad).norm() / leaf.grad.norm()).item() <= 2e-2
        assert gt.stats()["backward"]["built_here"] == 1  # on_miss=build, an empty store
    finally:
        gt.reset()


@pytest.mark.gpu
def test_on_a_gpu_a_stored_backward_plan_passes_its_canary_at_every_load():
    # dQ of this plan took 5 bit patterns in 20 runs on an H200 (cuDNN 9.19)
    # after 12 equal ones: a bit-compared canary rejected it at some loads.
    from graphcache.compilers.cudnn import CudnnCompiler

    compiler = CudnnCompiler()
    artifact = compiler.build(back(mask="causal", batch=4, seq_q=2048, head_dim=128), compiler.target())
    assert artifact.canary is not None and artifact.canary["deterministic"] is False
    for _ in range(12):
        compiler.load(artifact)  # deserialized, its canary run and compared: PlanRejected on a mismatch
