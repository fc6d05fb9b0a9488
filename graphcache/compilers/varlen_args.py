"""A ragged / paged graph's per-call inputs, computed on the device from
``varlen_attn``'s arguments. The checks of those arguments against a spec
are ``graphcache.reference.checks.check_call`` (re-exported here).

Nothing here reads a tensor's values on the host (no ``.item()``, no
``.tolist()``, no comparison turned into a Python bool): only shapes,
strides, dtypes and devices, which torch keeps on the host. So a call on a
GPU never waits for the GPU here; tests/test_varlen_args.py checks that by
making ``.item()``/``.tolist()``/``bool()`` raise.

A thd graph declared for ``batch`` sequences of at most ``seq_q`` /
``seq_kv`` tokens serves every call within those. On cuDNN >= 9.25
(``zero_length``, the release table's ZERO_LENGTH row) the offsets repeat
their last value and the sequence lengths are 0 for the ``batch - n``
missing sequences, which the padding mask then skips (cudnn-frontend's
test_sdpa_with_caching pads batches so). Below 9.25 zero-length sequences
are not supported (the frontend's own tests skip them there), so the missing
sequences are 1-token dummies instead: they read the first query and key
token (offset 0, page 0), and write their output past the call's ``rows``
output rows, which the caller allocates and drops.
"""

from __future__ import annotations

from typing import Any

from graphcache.reference.checks import check_call
from graphcache.spec import GraphSpec

__all__ = ["check_call", "graph_inputs"]


def graph_inputs(
    spec: GraphSpec,
    cu_seq_q: Any,
    cu_seq_k: Any,
    seqused_k: Any = None,
    block_table: Any = None,
    *,
    zero_length: bool = True,
    rows: int = 0,
) -> dict[str, Any]:
    """The graph's index tensors by role, on the arguments' device, with
    the dims, strides and dtypes ``spec_ragged.descriptors`` declares:
    ``seq_len_q``/``seq_len_kv`` (int32), ``ragged_*`` element offsets
    (int64) and, for a paged spec, ``page_table_k``/``page_table_v`` (the
    same int32 buffer). Device arithmetic only, no host synchronisation, in
    a few batched kernels (each a launch on a GPU): the offsets of every
    role are one product of the stacked prefix sums with per-role token
    strides, padded to the class's batch by one gather. With ``zero_length``
    False the missing sequences are 1-token dummies whose output rows start
    at row ``rows`` (the module's docstring)."""
    import torch

    b = spec.batch
    n = int(cu_seq_q.shape[0]) - 1
    paged = spec.page_size is not None
    dummies = n != b and not zero_length
    consts = _constants(spec, n, cu_seq_q.device, rows if dummies else None)
    # (sides, n + 1): the query prefix sums, and the keys' unless paged (the
    # pages' placement is the table's, every role's offsets the queries')
    if paged:
        stacked = cu_seq_q.to(torch.int64).unsqueeze(0)
    else:
        stacked = torch.stack([cu_seq_q, cu_seq_k]).to(torch.int64)
    if n != b and not dummies:
        stacked = stacked.index_select(1, consts["gather"])  # the last offset repeated: 0-length sequences
    picked = stacked if paged else stacked.index_select(0, consts["rows"])
    offsets = picked * consts["strides"]  # (roles, b + 1), each row contiguous
    if dummies:  # the real sequences' starts, then the dummies' (and the end)
        offsets = torch.cat([offsets[:, :n], consts["dummy_offsets"]], dim=1)
    out: dict[str, Any] = dict(zip(consts["roles"], offsets.view(-1, b + 1, 1, 1, 1).unbind(0), strict=True))
    diffs = torch.diff(stacked, dim=1).to(torch.int32)
    if dummies:
        diffs = torch.cat([diffs, consts["pad"].expand(diffs.shape[0], -1)], dim=1)
    lengths = diffs.view(-1, b, 1, 1, 1).unbind(0)
    out["seq_len_q"] = lengths[0]
    if paged or seqused_k is not None:
        used = seqused_k if seqused_k.dtype == torch.int32 else seqused_k.to(torch.int32)
        if n != b:
            used = torch.cat([used, consts["pad"][0]])
        out["seq_len_kv"] = used.view(b, 1, 1, 1)
    else:
        out["seq_len_kv"] = lengths[1]
    if paged:
        assert spec.pages_per_seq is not None
        table = block_table if n == b else torch.cat([block_table, consts["rows_pad"]])
        out["page_table_k"] = out["page_table_v"] = table.contiguous().view(b, 1, spec.pages_per_seq, 1)
    return out


_CONSTANTS: dict[tuple[Any, ...], dict[str, Any]] = {}


def _constants(spec: GraphSpec, n: int, device: Any, rows: int | None = None) -> dict[str, Any]:
    """Small per-(spec, n, device) tensors the arithmetic reuses, made once;
    with ``rows``, the 1-token dummies' offsets (output rows from ``rows``)."""
    key = (spec, n, device, rows)
    found = _CONSTANTS.get(key)
    if found is not None:
        return found
    import torch

    assert spec.heads_kv is not None and spec.head_dim_v is not None
    b = spec.batch
    hq, hkv = spec.heads_q, spec.heads_kv
    # role -> (which prefix sums: 0 queries, 1 keys; elements per token)
    table = {"ragged_q": (0, hq * spec.head_dim), "ragged_o": (0, hq * spec.head_dim_v)}
    if spec.generate_stats:
        table["ragged_stats"] = (0, hq)
    if spec.page_size is None:
        table["ragged_k"] = (1, hkv * spec.head_dim)
        table["ragged_v"] = (1, hkv * spec.head_dim_v)
    found = {
        "roles": tuple(table),
        "rows": torch.tensor([r for r, _ in table.values()], dtype=torch.int64, device=device),
        "strides": torch.tensor([[w] for _, w in table.values()], dtype=torch.int64, device=device),
        "gather": torch.tensor([min(i, n) for i in range(b + 1)], dtype=torch.int64, device=device),
        # the missing sequences' lengths: 0, or 1 for dummies
        "pad": torch.full((1, max(b - n, 0)), 0 if rows is None else 1, dtype=torch.int32, device=device),
        "rows_pad": torch.zeros((max(b - n, 0), spec.pages_per_seq or 0), dtype=torch.int32, device=device),
    }
    if rows is not None:  # inputs read token 0; outputs (o, stats) go to rows, rows + 1, ...
        starts = [[(rows + j) * w if role in ("ragged_o", "ragged_stats") else 0 for j in range(b - n + 1)]
                  for role, (_, w) in table.items()]  # fmt: skip
        found["dummy_offsets"] = torch.tensor(starts, dtype=torch.int64, device=device)
    if len(_CONSTANTS) > 4096:  # bounded: a long-running server sees a few specs and batch sizes
        _CONSTANTS.clear()
    _CONSTANTS[key] = found
    return found
