"""torch's own varlen kernel called the way the installed torch takes it
(graphcache.torch.varlen_torch), on a CPU.

The installed torch's op is real (2.13: 14 arguments; run on meta tensors,
its registered fake, since its kernel is CUDA-only). torch 2.11's op is
played by a stand-in custom op with its 10-argument schema, read from
torch/nn/attention/varlen.py of 2.11 (``_varlen_attn(query, key, value,
cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None,
window_size=None)``), which an H200 with torch 2.11 showed refusing the 14
arguments graphcache passed. torch 2.15's op, which takes a last
``backend`` that its ``varlen_attn`` chooses, is played by a stand-in with
that schema (read from 2.15's torch/nn/attention/varlen.py) beside a
stand-in of its selector; on torch 2.15 itself the real op and selector run
too. The GPU half is tests/test_varlen_gpu.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="graphcache.torch needs torch")

from graphcache.errors import UnsupportedCall  # noqa: E402
from graphcache.torch.varlen.torch_op import TorchVarlen  # noqa: E402

SEEN: list[dict] = []


@torch.library.custom_op("graphcache_standins::varlen_attn_2_11", mutates_args=())
def _varlen_attn_2_11(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stands in for torch 2.11's torch_attn::_varlen_attn: its schema; it
    records what it was given and returns tensors of the op's shapes."""
    SEEN.append(dict(heads=(query.shape[1], key.shape[1]), max_q=max_q, max_k=max_k, is_causal=is_causal,
                     scale=scale, window_size=window_size))  # fmt: skip
    lse = torch.zeros(query.shape[1], query.shape[0], dtype=torch.float32)
    return torch.zeros_like(query), lse, torch.zeros(2, dtype=torch.int64)


@torch.library.custom_op("graphcache_standins::varlen_attn_2_15", mutates_args=())
def _varlen_attn_2_15(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    is_causal: bool = False,
    scale: float | None = None,
    window_size: list[int] | None = None,
    enable_gqa: bool = False,
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
    backend: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stands in for torch 2.15's torch_attn::_varlen_attn (its schema:
    backend last, 1 flash-attention by default, 3 cuDNN); records it."""
    SEEN.append(dict(max_q=max_q, is_causal=is_causal, window_size=window_size, backend=backend))
    lse = torch.zeros(query.shape[1], query.shape[0], dtype=torch.float32)
    return torch.zeros_like(query), lse, torch.zeros(2, dtype=torch.int64)


def select_2_15(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor | None,
    max_q: int,
    window_size: list[int],
    seqused_k: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    num_splits: int | None = None,
) -> int:
    """Stands in for torch 2.15's varlen._select_backend (its signature) on
    a GPU where cuDNN qualifies for long, full-window queries: 3 (cuDNN)
    there, else 1 (flash-attention)."""
    SEEN.append(dict(selector=(max_q, window_size, seqused_k is not None, num_splits)))
    return 3 if max_q > 128 and window_size == [-1, -1] and num_splits is None else 1


def gqa_call(device: str = "cpu") -> tuple:
    q = torch.randn(9, 8, 64, dtype=torch.bfloat16, device=device)
    kv = torch.randn(9, 2, 64, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
    return q, kv, kv, cu, cu, 5, 5


def test_torch_2_11s_op_gets_its_ten_arguments_by_name_and_gqa_by_head_counts():
    SEEN.clear()
    kernel = TorchVarlen(torch.ops.graphcache_standins.varlen_attn_2_11)
    assert kernel.names == {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal",
                            "scale", "window_size"}  # fmt: skip
    out, lse = kernel(*gqa_call(), scale=0.125, window_size=(-1, 0), enable_gqa=True, num_splits=None)
    assert SEEN == [dict(heads=(8, 2), max_q=5, max_k=5, is_causal=True, scale=0.125, window_size=[-1, 0])]
    assert out.shape == (9, 8, 64) and lse.shape == (8, 9)
    kernel(*gqa_call(), window_size=(32, 0), num_splits=4)  # a tuning knob this op has not: left out, same answer
    assert SEEN[-1]["window_size"] == [32, 0] and SEEN[-1]["is_causal"] is False


def test_what_torch_2_11s_op_cannot_take_is_named_and_never_passed():
    SEEN.clear()
    kernel = TorchVarlen(torch.ops.graphcache_standins.varlen_attn_2_11)
    table, used = torch.zeros(2, 4, dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32)
    assert "takes no block_table" in kernel.lacks(used, table)
    assert "takes no seqused_k" in kernel.lacks(used, None)
    assert kernel.lacks() is None
    with pytest.raises(UnsupportedCall, match="takes no block_table") as info:
        kernel(*gqa_call(), seqused_k=used, block_table=table)
    assert info.value.reason == "torch_varlen" and SEEN == []


def test_the_installed_torchs_op_takes_every_argument_the_drop_in_has():
    kernel = TorchVarlen.installed()
    if "block_table" not in kernel.names:
        pytest.skip(f"torch {torch.__version__}'s op has no paged KV: {kernel.lacks(block_table=1)}")
    q = torch.empty(3, 8, 64, dtype=torch.bfloat16, device="meta")  # its fake kernel: the real one is CUDA-only
    pool = torch.empty(16, 16, 2, 64, dtype=torch.bfloat16, device="meta")
    cu = torch.zeros(4, dtype=torch.int32, device="meta")
    used, table = torch.zeros(3, dtype=torch.int32, device="meta"), torch.zeros(3, 4, dtype=torch.int32, device="meta")
    assert kernel.lacks(used, table) is None
    out, lse = kernel(q, pool, pool, cu, None, 1, 60, window_size=(-1, 0), enable_gqa=True, seqused_k=used,
                      block_table=table, num_splits=1)  # fmt: skip
    assert out.shape == (3, 8, 64) and lse.shape == (8, 3)


def test_torch_2_15s_op_gets_the_backend_torchs_selector_chooses_for_each_call():
    SEEN.clear()
    kernel = TorchVarlen(torch.ops.graphcache_standins.varlen_attn_2_15, select=select_2_15)
    assert kernel.select is select_2_15 and kernel.lacks() is None
    q, k, v, cu, _, _, _ = gqa_call()
    kernel(q, k, v, cu, cu, 200, 200, enable_gqa=True)  # long and full-window: cuDNN where torch would
    kernel(q, k, v, cu, cu, 200, 200, window_size=(-1, 0), enable_gqa=True)  # causal: flash-attention
    kernel(q, k, v, cu, cu, 200, 200, enable_gqa=True, num_splits=2)
    assert SEEN == [
        dict(selector=(200, [-1, -1], False, None)), dict(max_q=200, is_causal=False, window_size=[-1, -1], backend=3),
        dict(selector=(200, [-1, 0], False, None)), dict(max_q=200, is_causal=True, window_size=[-1, 0], backend=1),
        dict(selector=(200, [-1, -1], False, 2)), dict(max_q=200, is_causal=False, window_size=[-1, -1], backend=1),
    ]  # fmt: skip


def test_a_selector_graphcache_cannot_call_as_torch_2_15_does_leaves_the_ops_default_backend():
    def renamed(query, key, value, cu_q, cu_k, max_q, window_size):  # noqa: ANN001, ANN202 - other names
        raise AssertionError("never called")

    SEEN.clear()
    for select in (None, renamed, lambda *args: 3):
        kernel = TorchVarlen(torch.ops.graphcache_standins.varlen_attn_2_15, select=select)
        assert kernel.select is None and kernel.lacks() is None
        kernel(*gqa_call(), enable_gqa=True)
    assert [seen["backend"] for seen in SEEN] == [1, 1, 1]  # the op's own default: flash-attention
    # torch 2.11's op takes no backend: a selector is never asked.
    assert TorchVarlen(torch.ops.graphcache_standins.varlen_attn_2_11, select=select_2_15).select is None


def test_the_installed_torchs_selector_chooses_where_its_op_takes_a_backend():
    import torch.nn.attention.varlen as varlen
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernel = TorchVarlen.installed()
    if "backend" not in kernel.names:
        pytest.skip(f"torch {torch.__version__}'s torch_attn::_varlen_attn chooses its backend itself")
    assert kernel.select is varlen._select_backend
    q = torch.empty(300, 8, 64, dtype=torch.bfloat16, device="meta")  # its fake kernel: the real one is CUDA-only
    cu = torch.zeros(3, dtype=torch.int32, device="meta")
    out, lse = kernel(q, q, q, cu, cu, 200, 200)
    assert out.shape == (300, 8, 64) and lse.shape == (8, 300)
    # Only cuDNN allowed, for a call cuDNN cannot take (not on CUDA): torch's own refusal, word for word.
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        with pytest.raises(RuntimeError, match="CUDNN_ATTENTION was requested for varlen_attn") as theirs:
            varlen.varlen_attn(q, q, q, cu, cu, 200, 200)
        with pytest.raises(RuntimeError) as ours:
            kernel(q, q, q, cu, cu, 200, 200)
    assert str(ours.value) == str(theirs.value)


def test_an_op_requiring_an_argument_graphcache_does_not_know_is_refused_naming_it():
    @torch.library.custom_op("graphcache_standins::varlen_attn_future", mutates_args=())
    def future(query: torch.Tensor, cu_seq_q: torch.Tensor, max_q: int, layout_tag: int) -> torch.Tensor:
        return torch.zeros_like(query)

    assert "requires layout_tag" in TorchVarlen(torch.ops.graphcache_standins.varlen_attn_future).lacks()


# A torch without torch.nn.attention.varlen (before varlen_attn): the import
# fails as it would there; graphcache.torch imports, patch() works, and the
# drop-in's fallback names what is missing.
NO_VARLEN = r"""
import sys
sys.modules["torch.nn.attention.varlen"] = None  # import raises ImportError, as on a torch without it
import torch
import graphcache.torch as gt
from graphcache.torch.varlen import TORCH_VARLEN
print(TORCH_VARLEN.lacks())
with gt.patch():
    q = torch.randn(6, 2, 16)
    cu = torch.tensor([0, 2, 6], dtype=torch.int32)
    out = gt.varlen_attn(q, q, q, cu, cu, 4, 4, window_size=(-1, 0))
print(tuple(out.shape), gt.stats()["fallbacks"])
"""


def test_a_torch_without_varlen_attn_still_imports_patches_and_says_what_is_missing():
    done = subprocess.run([sys.executable, "-c", NO_VARLEN], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert "has no torch.nn.attention.varlen" in lines[-2]
    assert lines[-1] == "(6, 2, 16) {'dtype': 1}"
