"""The ragged / paged float32 reference (graphcache.compilers.varlen_ref)
against an independent per-sequence computation.

The independent side is written from flash-attention's docstring (query i
of a sequence attends keys [i + lk - lq - left, i + lk - lq + right], a
negative bound unbounded), one query row at a time in float64, with the
keys gathered from the pool token by token. torch's own varlen_attn has no
CPU kernel (``aten::_flash_attention_forward`` is CUDA-only in torch 2.13),
so the comparison with it is in tests/test_varlen_gpu.py.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="the reference needs torch")

from graphcache.compilers.varlen_ref import defined_rows, varlen_reference  # noqa: E402


def per_row(q, k, v, lens_q, lens_k, starts_k, *, scale, window, pages=None, page_size=0):
    """Row by row in float64: (T_q, H_q, D) out and (H_q, T_q) lse."""
    total, hq, _ = q.shape
    hkv = k.shape[2] if pages is not None else k.shape[1]
    out = torch.zeros(total, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((hq, total), math.inf, dtype=torch.float64)
    row = 0
    for b, (lq, lk) in enumerate(zip(lens_q, lens_k, strict=True)):
        if pages is not None:
            keys = [k[pages[b][j // page_size], j % page_size] for j in range(lk)]
            vals = [v[pages[b][j // page_size], j % page_size] for j in range(lk)]
        else:
            keys = [k[starts_k[b] + j] for j in range(lk)]
            vals = [v[starts_k[b] + j] for j in range(lk)]
        for i in range(lq):
            lo = i + lk - lq - window[0] if window[0] >= 0 else -(10**9)
            hi = i + lk - lq + window[1] if window[1] >= 0 else 10**9
            seen = [j for j in range(lk) if lo <= j <= hi]
            for h in range(hq):
                if not seen:
                    continue
                g = h // (hq // hkv)
                s = torch.stack([q[row, h].double() @ keys[j][g].double() * scale for j in seen])
                p = torch.softmax(s, 0)
                out[row, h] = sum(p[n] * vals[j][g].double() for n, j in enumerate(seen))
                lse[h, row] = torch.logsumexp(s, 0)
            row += 1
    return out, lse


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


WINDOWS = [(-1, -1), (-1, 0), (3, 0), (2, 1), (-1, 2)]


@pytest.mark.parametrize("window", WINDOWS)
def test_ragged_matches_rows_with_gqa_unequal_lengths_and_empty_sequences(window):
    g = torch.Generator().manual_seed(1)
    lens_q = [5, 1, 0, 3, 2]
    lens_k = [5, 7, 4, 0, 9]  # a chunk over a prefix (1 of 7), an empty q, an empty k
    hq, hkv, d = 4, 2, 8
    q = torch.randn(sum(lens_q) + 2, hq, d, generator=g)  # 2 slack tokens past cu_seq_q[-1]
    k = torch.randn(sum(lens_k), hkv, d, generator=g)
    v = torch.randn(sum(lens_k), hkv, d, generator=g)
    out, lse = varlen_reference(q, k, v, cu(lens_q), cu(lens_k), scale=0.3, window=window)
    starts_k = cu(lens_k).tolist()[:-1]
    want, want_lse = per_row(q, k, v, lens_q, lens_k, starts_k, scale=0.3, window=window)
    assert out.shape == (q.shape[0], hq, d) and lse.shape == (hq, q.shape[0])
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


def test_seqused_k_limits_the_keys_and_moves_the_bottom_right_diagonal():
    g = torch.Generator().manual_seed(2)
    lens_q, slots = [2, 3], [8, 8]
    used = [5, 1]
    q = torch.randn(sum(lens_q), 2, 8, generator=g)
    k = torch.randn(sum(slots), 2, 8, generator=g)
    v = torch.randn(sum(slots), 2, 8, generator=g)
    used_t = torch.tensor(used, dtype=torch.int32)
    out, lse = varlen_reference(q, k, v, cu(lens_q), cu(slots), scale=0.5, window=(-1, 0), seqused_k=used_t)
    want, want_lse = per_row(q, k, v, lens_q, used, [0, 8], scale=0.5, window=(-1, 0))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [(-1, 0), (-1, -1), (4, 0)])
def test_paged_decode_and_chunked_prefill_read_the_pages_the_table_names(window):
    g = torch.Generator().manual_seed(3)
    page, num_pages, hq, hkv, d = 4, 16, 8, 2, 16
    pool_k = torch.randn(num_pages, page, hkv, d, generator=g)
    pool_v = torch.randn(num_pages, page, hkv, d, generator=g)
    perm = torch.randperm(num_pages, generator=g).tolist()
    table = torch.tensor([perm[0:4], perm[4:8], perm[8:12]], dtype=torch.int32)  # 3 sequences, 4 pages each
    used = [13, 1, 0]
    lens_q = [3, 1, 0]  # chunked prefill, decode, an empty slot
    q = torch.randn(sum(lens_q), hq, d, generator=g)
    out, lse = varlen_reference(
        q, pool_k, pool_v, cu(lens_q), None, scale=0.25, window=window,
        seqused_k=torch.tensor(used, dtype=torch.int32), block_table=table,
    )  # fmt: skip
    want, want_lse = per_row(
        q, pool_k, pool_v, lens_q, used, None, scale=0.25, window=window, pages=table.tolist(), page_size=page
    )
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


def test_bf16_inputs_are_computed_in_float32_and_defined_rows_skip_what_sees_nothing():
    g = torch.Generator().manual_seed(4)
    lens_q, lens_k = [3, 2], [3, 0]
    q = torch.randn(5, 2, 8, generator=g).bfloat16()
    k = torch.randn(3, 2, 8, generator=g).bfloat16()
    out, lse = varlen_reference(q, k, k, cu(lens_q), cu(lens_k), scale=0.35, window=(-1, 0))
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    want, _ = per_row(q.float(), k.float(), k.float(), lens_q, lens_k, [0, 3], scale=0.35, window=(-1, 0))
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    assert defined_rows(cu(lens_q), cu(lens_k), (-1, 0)).tolist() == [True, True, True, False, False]
    assert torch.isinf(lse[:, 3:]).all() and (out[3:] == 0).all()
