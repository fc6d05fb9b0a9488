"""A small continuous-batching engine for the varlen tests, and the
independent per-sequence float32 computation its calls are checked against.

The engine keeps a paged KV pool ``(num_pages, page_size, heads_kv,
head_dim)`` as varlen_attn takes it and, beside it, each sequence's whole K/V
history as plain tensors. A step takes requests ``{seq_id: new_tokens}``:
new ids are prompts (one ragged prefill call, dense K/V of the new tokens),
known ids with one token decode and with more a chunk of prefill over their
cached prefix (one paged call for both, ragged q over the pages). Ids
missing from a step's requests stay; ``leave`` frees a sequence's pages.

The oracle is torch's dense math SDPA per sequence in float32, with the
mask written from flash-attention's docstring (query i of a sequence with
lq queries and lk keys sees keys i + lk - lq - left .. i + lk - lq + right)
and the K/V taken from the history, not from the pool: it shares no code
with graphcache's reference or its offset arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

SDPA = torch._C._nn.scaled_dot_product_attention


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: tuple[int, int], scale: float) -> Any:
    """One sequence: q (lq, H, D), k/v (lk, Hkv, D) -> out (lq, H, D) float32, lse (H, lq)."""
    lq, lk = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    i = torch.arange(lq).view(-1, 1)
    j = torch.arange(lk).view(1, -1)
    keep = torch.ones(lq, lk, dtype=torch.bool)
    if window[0] >= 0:
        keep &= j >= i + lk - lq - window[0]
    if window[1] >= 0:
        keep &= j <= i + lk - lq + window[1]
    out = SDPA(qf.unsqueeze(0), kf.unsqueeze(0), vf.unsqueeze(0), attn_mask=keep, scale=scale)[0]
    scores = (qf @ kf.transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores.masked_fill(~keep, -math.inf), dim=-1)
    return out.transpose(0, 1), lse, keep.any(dim=1)


class Engine:
    """See the module docstring. ``attn`` is the varlen_attn to call."""

    def __init__(
        self,
        attn: Callable[..., Any],
        *,
        heads_q: int = 8,
        heads_kv: int = 2,
        head_dim: int = 64,
        page_size: int = 16,
        num_pages: int = 96,
        pages_per_seq: int = 8,
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        lse: bool = False,
        check: bool = True,
        device: str = "cpu",
    ) -> None:
        self.attn = attn
        self.hq, self.hkv, self.d = heads_q, heads_kv, head_dim
        self.page, self.width, self.dtype = page_size, pages_per_seq, dtype
        self.gen = torch.Generator().manual_seed(seed)
        self.device = device  # where the pool and the calls' tensors live; the history stays on the CPU
        self.pool_k = torch.zeros(num_pages, page_size, heads_kv, head_dim, dtype=dtype, device=device)
        self.pool_v = torch.zeros_like(self.pool_k)
        self.free = torch.randperm(num_pages, generator=self.gen).tolist()  # pages out of order
        self.seqs: dict[Any, dict[str, Any]] = {}
        self.lse, self.check = lse, check
        self.calls = 0
        self.worst = 0.0  # the largest relative error seen

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).mul_(0.5).to(self.dtype)

    def _dev(self, t: Any) -> Any:
        return None if t is None else t.to(self.device)

    def _store(self, sid: Any, k: torch.Tensor, v: torch.Tensor) -> None:
        seq = self.seqs[sid]
        for t in range(k.shape[0]):
            pos = seq["len"]
            if pos // self.page >= len(seq["pages"]):
                seq["pages"].append(self.free.pop())
            page = seq["pages"][pos // self.page]
            self.pool_k[page, pos % self.page] = k[t].to(self.device)
            self.pool_v[page, pos % self.page] = v[t].to(self.device)
            seq["len"] += 1
        seq["k"] = torch.cat([seq["k"], k])
        seq["v"] = torch.cat([seq["v"], v])

    def leave(self, sid: Any) -> None:
        self.free += self.seqs.pop(sid)["pages"]

    def step(self, requests: dict[Any, int]) -> None:
        new = {s: n for s, n in requests.items() if s not in self.seqs}
        old = {s: n for s, n in requests.items() if s in self.seqs}
        if new:
            self._prefill(new)
        if old:
            self._paged(old)

    def _prefill(self, prompts: dict[Any, int]) -> None:
        lens = list(prompts.values())
        q = self._rand(sum(lens), self.hq, self.d)
        k = self._rand(sum(lens), self.hkv, self.d)
        v = self._rand(sum(lens), self.hkv, self.d)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        result = self._call(q, k, v, cu, cu, max(lens), max(lens))
        seqs = []
        for n, sid in enumerate(prompts):
            a, b = int(cu[n]), int(cu[n + 1])
            self.seqs[sid] = {"pages": [], "len": 0, "k": k[:0], "v": v[:0]}
            self._store(sid, k[a:b], v[a:b])
            seqs.append((q[a:b], k[a:b], v[a:b]))
        self._compare(result, seqs, cu)

    def _paged(self, chunks: dict[Any, int]) -> None:
        lens = list(chunks.values())
        q = self._rand(sum(lens), self.hq, self.d)
        for sid, n in chunks.items():
            self._store(sid, self._rand(n, self.hkv, self.d), self._rand(n, self.hkv, self.d))
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        used = torch.tensor([self.seqs[s]["len"] for s in chunks], dtype=torch.int32)
        table = torch.zeros(len(chunks), self.width, dtype=torch.int32)
        for row, sid in enumerate(chunks):
            pages = self.seqs[sid]["pages"]
            table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        result = self._call(q, self.pool_k, self.pool_v, cu, None, max(lens), int(used.max()), used, table)
        seqs = [(q[int(cu[n]) : int(cu[n + 1])], self.seqs[s]["k"], self.seqs[s]["v"]) for n, s in enumerate(chunks)]
        self._compare(result, seqs, cu)

    def _call(self, q, k, v, cu_q, cu_k, max_q, max_k, used=None, table=None) -> Any:  # noqa: ANN001
        from torch.nn.attention.varlen import AuxRequest

        self.calls += 1
        d = self._dev
        result = self.attn(
            d(q), d(k), d(v), d(cu_q), d(cu_k), max_q, max_k, window_size=(-1, 0), enable_gqa=True,
            seqused_k=d(used), block_table=d(table), return_aux=AuxRequest(lse=True) if self.lse else None,
        )  # fmt: skip
        return tuple(t.cpu() for t in result) if self.lse else result.cpu()

    def _compare(self, result: Any, seqs: list[tuple[Any, Any, Any]], cu: torch.Tensor) -> None:
        if not self.check:
            return
        out, lse = result if self.lse else (result, None)
        assert out.dtype == self.dtype and out.shape == (int(cu[-1]), self.hq, self.d)
        for n, (q, k, v) in enumerate(seqs):
            a, b = int(cu[n]), int(cu[n + 1])
            want, want_lse, rows = oracle(q, k, v, (-1, 0), 1.0 / math.sqrt(self.d))
            got = out[a:b].float()[rows]
            err = float(torch.linalg.vector_norm(got - want[rows]) / torch.linalg.vector_norm(want[rows]))
            self.worst = max(self.worst, err)
            assert err <= 2e-2, f"sequence {n}: relative error {err}"
            if lse is not None:
                assert lse.shape == (self.hq, int(cu[-1]))
                torch.testing.assert_close(lse[:, a:b][:, rows], want_lse[:, rows], atol=2e-2, rtol=2e-2)
