"""The build-time check of a ragged / paged graph: the graph (the blob,
round-tripped) runs on a call built to catch what such graphs get wrong,
and must agree with the float32 reference (``graphcache.reference.varlen``).

The call has sequences of unequal lengths, including 1 and (on cuDNN >=
9.25, which takes them: ``zero_length``) 0 tokens, and lengths off a
64-row tile (63, 65, ...); a second call has fewer sequences than the
graph's batch (``sequences``), what a serving batch after rounding up to
the graph's is; every token the graph must not
read is NaN: query, key and value slack past the last sequence, and, paged,
the pages no sequence owns and the slots past each sequence's ``seqused_k``
in its last page. A graph that reads one of them (or reads a neighbour's
tokens) gives NaN or a wrong row, so the relative error is inf or large.
Where the spec asks for stats, the log-sum-exp is compared too (cuDNN
9.26-9.27 write it wrong for single-token GQA rows with ragged stats,
cudnn-frontend#1083: this check finds that on the GPU that has it).
Only rows that see at least one key are compared (``defined_rows``), by
``graphcache.reference.measure``'s ``relative_error`` and ``lse_difference``.
"""

from __future__ import annotations

from typing import Any

from graphcache.reference.dense import torch_dtype
from graphcache.reference.measure import lse_difference, relative_error
from graphcache.reference.varlen import defined_rows, varlen_reference
from graphcache.spec import GraphSpec
from graphcache.spec.ragged import window

__all__ = ["defined_output", "errors", "inputs", "lengths_for"]

SLACK = 8  # NaN tokens past the last sequence


def lengths_for(spec: GraphSpec, zero_length: bool = True) -> tuple[list[int], list[int]]:
    """Query and key lengths of the check's ``spec.batch`` sequences; a
    0-token one only with ``zero_length`` (cuDNN >= 9.25)."""
    assert spec.seq_kv is not None
    sq, skv = spec.seq_q, spec.seq_kv
    q_pattern = [1] if sq == 1 else [sq, 1, 63, 65, sq // 2 + 1, 2]
    kv_pattern = [skv, 65, 63, 1, max(1, skv // 3), skv - 1 or 1]  # the 1-token query sees 65 keys
    lens_q = [min(sq, q_pattern[b % len(q_pattern)]) for b in range(spec.batch)]
    lens_k = [min(skv, kv_pattern[b % len(kv_pattern)]) for b in range(spec.batch)]
    if spec.batch >= 2 and zero_length:
        lens_q[-1] = 0  # a sequence of 0 tokens (after the 1-token one where there are 3 or more)
    return lens_q, lens_k


def inputs(
    spec: GraphSpec, device: str, seed: int = 0, *, zero_length: bool = True, sequences: int | None = None
) -> dict[str, Any]:
    """The check's call as ``run_varlen`` takes it (keyword arguments),
    drawn on ``device`` (a GPU at build time: a class's pools are hundreds of
    MB) from a generator seeded with ``seed``; the pages are filled by one
    scatter, the table and lengths made on the host (they are small). With
    ``sequences``, only the first that many of the check's sequences."""
    import torch

    assert spec.heads_kv is not None and spec.head_dim_v is not None
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch_dtype(spec)
    lens_q, lens_k = (lens[:sequences] for lens in lengths_for(spec, zero_length))

    def draw(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device=device).mul_(0.5).to(dtype)

    def cumulative(lens: list[int]) -> Any:
        return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)

    nan = float("nan")
    total_q = sum(lens_q)
    q = draw(total_q + SLACK, spec.heads_q, spec.head_dim)
    q[total_q:] = nan
    feed: dict[str, Any] = {"q": q, "cu_seq_q": cumulative(lens_q)}
    if spec.page_size is None:
        total_k = sum(lens_k)
        k = draw(total_k + SLACK, spec.heads_kv, spec.head_dim)
        v = draw(total_k + SLACK, spec.heads_kv, spec.head_dim_v)
        k[total_k:] = nan
        v[total_k:] = nan
        feed.update(k=k, v=v, cu_seq_k=cumulative(lens_k), seqused_k=None, block_table=None)
        return feed
    assert spec.num_pages is not None and spec.pages_per_seq is not None
    page = spec.page_size
    order = torch.randperm(spec.num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    table = [[order[-1]] * spec.pages_per_seq for _ in lens_k]  # past a sequence: a page it must not read
    slots: list[int] = []  # pool rows (page * page_size + offset) of every valid token
    free = iter(order)
    for b, lk in enumerate(lens_k):
        for p in range(-(-lk // page)):
            page_id = next(free, order[-1])  # a pool too small for the check's lengths: reuse the last
            table[b][p] = page_id
            slots += range(page_id * page, page_id * page + min(page, lk - p * page))
    k = torch.full((spec.num_pages, page, spec.heads_kv, spec.head_dim), nan, device=device).to(dtype)
    v = torch.full((spec.num_pages, page, spec.heads_kv, spec.head_dim_v), nan, device=device).to(dtype)
    rows = torch.tensor(slots, dtype=torch.int64, device=device)
    k.view(-1, spec.heads_kv, spec.head_dim)[rows] = draw(len(slots), spec.heads_kv, spec.head_dim)
    v.view(-1, spec.heads_kv, spec.head_dim_v)[rows] = draw(len(slots), spec.heads_kv, spec.head_dim_v)
    feed.update(
        k=k,
        v=v,
        cu_seq_k=None,
        seqused_k=torch.tensor(lens_k, dtype=torch.int32, device=device),
        block_table=torch.tensor(table, dtype=torch.int32, device=device),
    )
    return feed


def errors(spec: GraphSpec, graph: Any, feed: dict[str, Any]) -> tuple[float, float | None]:
    """``(output error, lse error or None)``: relative errors of the graph's
    ``run_varlen`` on ``feed`` against the reference, over the rows that
    see a key (inf for NaN/inf there)."""
    assert spec.attn_scale is not None
    out, lse = graph.run_varlen(**feed)
    # The reference runs where the call ran (a GPU at build time): a class's
    # longest sequences make score matrices a CPU would take minutes over.
    ref, ref_lse = varlen_reference(
        feed["q"], feed["k"], feed["v"], feed["cu_seq_q"], feed["cu_seq_k"], scale=spec.attn_scale,
        window=window(spec), seqused_k=feed["seqused_k"], block_table=feed["block_table"],
    )  # fmt: skip
    rows = defined_rows(feed["cu_seq_q"], feed["cu_seq_k"], window(spec), feed["seqused_k"], feed["q"].shape[0])
    rows = rows.to(out.device)
    error = relative_error(out.float()[rows], ref[rows])
    lse_error = None
    if spec.generate_stats:
        lse_error = float("inf") if lse is None else lse_difference(lse[:, rows], ref_lse[:, rows])
    return error, lse_error


def defined_output(spec: GraphSpec, out: Any, feed: dict[str, Any]) -> Any:
    """``out`` (T_q, H_q, D_v) with the rows that see no key, and the slack
    past the last sequence, set to zero whatever they held (NaN included):
    what the canary summarises of a thd graph's output."""
    import torch

    rows = defined_rows(feed["cu_seq_q"], feed["cu_seq_k"], window(spec), feed["seqused_k"], out.shape[0])
    keep = rows.to(out.device).view(-1, 1, 1)
    return torch.where(keep, out, torch.zeros((), dtype=out.dtype, device=out.device)).contiguous()
