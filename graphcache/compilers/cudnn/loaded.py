"""A loaded (deserialized) plan: its per-stream workspaces and execution.

May import: graphcache.artifact/spec/errors, graphcache.reference (input
checks), override and padded (class graphs), planapi (the compiler's type), ragged (a thd call's variant pack). Not
``compiler``, which imports this module: the compiler is typed by what a plan
uses of it (``planapi.Loader``).
"""

from __future__ import annotations

from typing import Any

from graphcache.artifact import Artifact
from graphcache.compilers.cudnn.override import ClassRun, execute_class
from graphcache.compilers.cudnn.padded import PaddedRun, execute_padded
from graphcache.compilers.cudnn.planapi import Loader
from graphcache.compilers.cudnn.ragged import variant_pack, zero_length_ok
from graphcache.errors import ExecutionError
from graphcache.reference.checks import check_inputs, check_sink
from graphcache.spec import GraphSpec


def _output(result: Any, spec: GraphSpec) -> Any:
    return result[0] if spec.generate_stats else result


class CudnnGraph:
    """A deserialized cuDNN plan with its workspace.

    ``execute`` keys its variant pack by the artifact's UID map, the same
    table the builder used, and runs on the caller's current CUDA stream.
    The workspace is allocated once per stream, on that stream: two streams
    running the plan at once never share scratch memory.
    """

    backend = "cudnn"

    def __init__(self, compiler: Loader, artifact: Artifact, graph: Any) -> None:
        import torch

        self._compiler = compiler
        self.artifact = artifact
        self.spec = artifact.spec
        self.uids = artifact.uids
        self._graph = graph
        self.device = torch.device("cuda", compiler.device)
        self.workspace_size = int(graph.get_workspace_size())
        self._workspaces: dict[int, Any] = {}
        self._dropout_calls = 0
        # cuDNN < 9.25 takes no zero-length sequence: a thd call of fewer
        # sequences than the batch is padded with 1-token dummies instead.
        self.zero_length = zero_length_ok(artifact.target.cudnn)
        # The graph's own tensors are declared (b, h, s, d) with the layout's
        # strides: torch's views of the same memory, what run_views takes.
        self._out_view = (tuple(self.spec.dims("o")), tuple(self.spec.strides("o")))

    @property
    def workspace(self) -> Any:
        """The workspace of the current stream (allocated on first use)."""
        import torch

        stream = torch.cuda.current_stream(self.device)
        workspace = self._workspaces.get(stream.cuda_stream)
        if workspace is None:
            with torch.cuda.device(self.device):
                workspace = torch.empty(max(self.workspace_size, 1), device=self.device, dtype=torch.uint8)
            self._workspaces[stream.cuda_stream] = workspace
        return workspace

    def execute(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        out: Any = None,
        seq_len_q: Any = None,
        seq_len_kv: Any = None,
        bias: Any = None,
        sink: Any = None,
    ) -> Any:
        """Run the plan; returns ``out`` (allocated when None), and
        ``(out, stats)`` when the spec generates stats. ``bias``: a bias
        spec's packed (b|1, h|1, s_q, s_kv) tensor; ``sink``: a sink spec's
        float32 (1, h_q, 1, 1) logits. Raises ExecutionError for
        tensors that do not match the spec or are not on this graph's GPU."""
        import torch

        spec = self.spec
        if spec.is_class:  # real tensors of any shape the class covers: override, or declared sizes (padded)
            run = execute_padded if spec.mechanism == "padded" else execute_class
            return run(self, q, k, v, out, seq_len_q, seq_len_kv, bias=bias, sink=sink)
        tensors = {"q": q, "k": k, "v": v, "o": out, "seq_len_q": seq_len_q, "seq_len_kv": seq_len_kv, "bias": bias}
        check_inputs(spec, tensors, device_type="cuda")
        check_sink(spec, sink, q)
        if q.device != self.device:
            raise ExecutionError(f"q is on {q.device}; this graph was loaded on {self.device}: move the tensors")
        with torch.cuda.device(self.device), self._compiler._lock:
            if out is None:
                out = torch.empty(spec.storage_shape("o"), dtype=q.dtype, device=q.device)
            pack = {self.uids[r]: t for r, t in (("q", q), ("k", k), ("v", v), ("o", out))}
            if spec.padding:
                pack[self.uids["seq_len_q"]] = seq_len_q
                pack[self.uids["seq_len_kv"]] = seq_len_kv
            if bias is not None:
                pack[self.uids["bias"]] = bias
            if sink is not None:
                pack[self.uids["sink"]] = sink
            stats = None
            if spec.generate_stats:
                stats = torch.empty(spec.dims("stats"), dtype=torch.float32, device=q.device)
                pack[self.uids["stats"]] = stats
            if spec.dropout:
                self._dropout_calls += 1
                seed = torch.randint(0, 2**62, (1, 1, 1, 1), dtype=torch.int64, device=q.device)
                offset = torch.full((1, 1, 1, 1), self._dropout_calls, dtype=torch.int64, device=q.device)
                pack[self.uids["dropout_seed"]] = seed
                pack[self.uids["dropout_offset"]] = offset
            # The handle is bound to the current stream, where ``out`` and this
            # stream's workspace were allocated and the caller's kernels run.
            self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return (out, stats) if spec.generate_stats else out

    def run_varlen(
        self, q: Any, k: Any, v: Any, cu_seq_q: Any, cu_seq_k: Any, seqused_k: Any = None, block_table: Any = None
    ) -> tuple[Any, Any]:
        """A thd (ragged / paged) graph's call with ``varlen_attn``'s tensors:
        ``(out (T_q, H_q, D_v), lse (H_q, T_q) float32 or None)``. The
        offsets, lengths and tables are computed on the GPU
        (``ragged.variant_pack``): no host synchronisation. The caller
        (graphcache.torch's memo) has matched shapes, dtypes and device to
        the spec; ``varlen_args.check_call`` is the checked form."""
        import torch

        with torch.cuda.device(self.device), self._compiler._lock:
            pack, out, stats = variant_pack(
                self.spec, self.uids, q, k, v, cu_seq_q, cu_seq_k, seqused_k, block_table, zero_length=self.zero_length
            )
            self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        # cuDNN's ragged stats are token-major (T, H); varlen_attn's lse is (H, T).
        lse = None if stats is None else stats[: q.shape[0]].t().contiguous()
        return out, lse

    def bind(self, spec: GraphSpec) -> Any:
        """This class graph at one exact spec of its class, its override
        lists made once (``override.ClassRun``), or for a padded class its
        declared shapes and seq-len tensors (``padded.PaddedRun``). Raises
        ExecutionError for a spec the class does not cover."""
        return PaddedRun(self, spec) if self.spec.mechanism == "padded" else ClassRun(self, spec)

    def run_views(self, q: Any, k: Any, v: Any, bias: Any = None) -> Any:
        """The per-call path of graphcache.torch: ``q``, ``k``, ``v`` are the
        (b, h, s, d) views torch's SDPA takes, whose strides are the graph's
        own (the caller has matched shapes, strides, dtypes and device, as
        graphcache.torch's memo does); returns the output as such a view. No
        view is made and nothing is copied: cuDNN reads the memory through the
        strides the graph was built with (a bias spec's packed ``bias`` too).
        For specs without padding, stats or dropout; ``execute`` is the
        checked path."""
        import torch

        shape, strides = self._out_view
        with torch.cuda.device(self.device), self._compiler._lock:
            out = torch.empty_strided(shape, strides, dtype=q.dtype, device=q.device)
            pack = {self.uids["q"]: q, self.uids["k"]: k, self.uids["v"]: v, self.uids["o"]: out}
            if bias is not None:
                pack[self.uids["bias"]] = bias
            self._graph.execute(pack, self.workspace, handle=self._compiler.handle())
        return out
