"""The mask side of the Hugging Face backend: what transformers hands the
``graphcache`` attention as its ``attention_mask``, and the dense masks the
fallbacks need.

``padding_mask`` (registered with AttentionMaskInterface) gives the
attention what transformers' flash-attention paths get: ``None`` when no
token is padding, else the per-token (batch, kv) boolean padding mask,
tagged with the side its padding is on (``PADDING_ATTR``: "left" or
"right"). Telling those apart reads the mask once per forward and mask kind
(one host sync, as transformers' own ``flash_attention_mask`` and
``sdpa_mask`` make); each attention call then works on the device only.

A static cache (``cache_implementation="static"``) hands attention every
slot of the cache, written or not. Where no row is padded (each row's tokens
fill its first slots, up to the one written last) the mask is transformers'
4-D mask tagged ``static`` with each row's length (``LENGTHS_ATTR``): the
attention's graph reads the whole cache with the lengths as cuDNN's padding
mask (the same math as the mask, and the same shape at every step).
``generate`` makes it once per step, outside the model's forward (compiled
or not), and the forward takes a 4-D mask as it is.

A mask pattern other than causal, bidirectional and sliding windows (packed
sequences, chunked attention, a model's own ``or``/``and`` mask functions),
a causal mask over keys past the tokens seen that is no such prefix (a
static cache holding a padded batch, a sliding-window static cache), and a
padding mask with holes (a row that is not padding then tokens, or tokens
then padding), get transformers' own 4-D ``sdpa_mask``: the attention runs
them through the SDPA drop-in (a bias graph, or counted under ``mask``).

Under ``torch.compile`` nothing here reads a value on the host (a read would
break the graph, and ``fullgraph=True`` refuses it) or looks into the mask
function: the mask is transformers' own ``sdpa_mask``, None exactly where
it would hand sdpa ``is_causal`` alone, else 4-D (a bias graph).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# The attribute of a 2-D padding mask that says where its padding is.
PADDING_ATTR = "graphcache_padding"
# The attribute of a static cache's prefix mask (PADDING_ATTR "static"): each row's tokens, (batch,) int32.
LENGTHS_ATTR = "graphcache_lengths"

# masking_utils' own pattern functions that the backend expresses as spec
# fields (causal, bidirectional, sliding windows) and the combinators that
# join them; any other function in the pattern makes it a custom one.
_PLAIN = frozenset(
    {
        "causal_mask_function",
        "bidirectional_mask_function",
        "sliding_window_overlay.<locals>.inner_mask",
        "sliding_window_bidirectional_overlay.<locals>.inner_mask",
        "sliding_window_causal_mask_function",
        "sliding_window_bidirectional_mask_function",
        "and_masks.<locals>.and_mask",
    }
)


def pattern_names(fn: Any, depth: int = 0) -> set[str] | None:
    """The masking_utils functions the mask function ``fn`` is built from,
    or None when it holds any other (a custom pattern): plain patterns are
    causal, bidirectional and sliding windows, what the attention's own
    ``is_causal`` and ``sliding_window`` arguments say again."""
    if fn is None:
        return set()
    if depth > 8 or not callable(fn):
        return None
    if getattr(fn, "__module__", "") != "transformers.masking_utils" or fn.__qualname__ not in _PLAIN:
        return None
    names = {fn.__qualname__}
    for cell in getattr(fn, "__closure__", None) or ():
        content = cell.cell_contents
        parts = content if isinstance(content, (tuple, list)) else (content,)
        for part in parts:
            if callable(part):
                inner = pattern_names(part, depth + 1)
                if inner is None:
                    return None
                names |= inner
    return names


def padding_side(pad: torch.Tensor, whole: torch.Tensor | None = None) -> str:
    """``"none"``, ``"left"``, ``"right"`` or ``"holes"`` for a (batch, kv)
    boolean padding mask (True = a token). ``"none"`` only where ``whole``
    (the batch's whole mask, of which ``pad`` is the last kv columns; default
    ``pad``) has no padding: a padded batch's calls stay ragged when their
    window holds only tokens, so they share the graphs of the calls whose
    window holds padding. Reads the masks (one host sync)."""
    whole = pad if whole is None else whole
    rises = (pad[:, 1:] & ~pad[:, :-1]).any()  # a token after padding
    falls = (~pad[:, 1:] & pad[:, :-1]).any()  # padding after a token
    everything, rises_any, falls_any = torch.stack([whole.all(), rises, falls]).tolist()
    if everything:
        return "none"
    if not falls_any:
        return "left"  # padding then tokens (or tokens only), in every row
    if not rises_any:
        return "right"
    return "holes"


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> Any:
    """transformers' mask interface for the ``graphcache`` attention:
    ``None`` (no padding), the (batch, kv_length) boolean padding mask
    tagged with its side, or transformers' 4-D ``sdpa_mask`` for a custom
    pattern or padding with holes."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    def dense() -> Any:  # never None: the attention must not guess a causal alignment
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function or causal_mask_function,
            attention_mask=attention_mask,
            **{**kwargs, "allow_is_causal_skip": False},
        )

    if torch.compiler.is_compiling():
        # No host read (the padding's side) and no look into the mask function (dynamo cannot trace
        # it): transformers' own sdpa mask, None exactly where it hands sdpa is_causal alone.
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function or causal_mask_function,
            attention_mask=attention_mask,
            **kwargs,
        )
    names = pattern_names(mask_function)
    if kwargs.get("use_vmap") or names is None:
        return dense()
    causal = "bidirectional_mask_function" not in names
    if causal and (isinstance(q_offset, torch.Tensor) or kv_offset + kv_length != q_offset + q_length):
        # A static cache: keys past the tokens seen, which only a mask (or lengths) leaves out.
        found = None
        if kv_offset == 0 and names <= {"causal_mask_function"}:
            found = static_prefix(batch_size, q_length, kv_length, q_offset, attention_mask, kwargs.get("device"))
        return dense() if found is None else found
    if attention_mask is None:
        return None
    pad = attention_mask[:, -kv_length:].to(torch.bool)
    if pad.shape[-1] != kv_length:  # a static cache longer than the tokens seen: sdpa's mask slices it
        return dense()
    side = padding_side(pad, attention_mask.to(torch.bool))
    if side == "none":
        return None
    if side == "holes":
        return dense()
    setattr(pad, PADDING_ATTR, side)
    return pad


def static_prefix(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any,
    attention_mask: torch.Tensor | None,
    device: Any = None,
) -> torch.Tensor | None:
    """A static cache's mask where every row's tokens fill its first slots,
    up to this call's (no row padded): transformers' 4-D boolean mask
    (batch, 1, q_length, kv_length), each row's queries its last tokens,
    tagged ``static`` with each row's length (``LENGTHS_ATTR``, (batch,)
    int32 on the device), which the attention serves with the lengths as a
    padding mask; None where a row is padded (transformers' mask, a bias).
    With a padding mask, reads one flag on the host (one sync, as
    ``padding_side``); without one, nothing. ``device``: the model's (the
    mask interface's ``device``), where neither the offset nor a mask says it."""
    offset = q_offset.reshape(-1)[:1].to(torch.int64) if isinstance(q_offset, torch.Tensor) else int(q_offset)
    if attention_mask is None:
        device = q_offset.device if isinstance(q_offset, torch.Tensor) else device
        lengths = (torch.zeros(1, dtype=torch.int64, device=device) + offset + q_length).to(torch.int32)
        lengths = lengths.expand(batch_size)
    else:
        tokens = attention_mask.to(torch.bool)
        if tokens.shape[-1] > kv_length:
            return None
        lengths = tokens.sum(dim=1, dtype=torch.int32)
        # generate's mask is as long as the cache: tokens, then the slots not written yet; a caller's, the tokens.
        prefix = (tokens[:, 1:] <= tokens[:, :-1]).all() & (lengths == offset + q_length).all()
        if not bool(prefix.tolist()):
            return None
    mask = static_mask(lengths, q_length, kv_length)
    setattr(mask, PADDING_ATTR, "static")
    setattr(mask, LENGTHS_ATTR, lengths)
    return mask


def static_mask(lengths: torch.Tensor, q_len: int, kv_len: int) -> torch.Tensor:
    """The (batch, 1, q_len, kv_len) boolean mask of a static cache's call
    whose rows hold ``lengths`` tokens: each row's queries are its last
    ``q_len`` tokens, seeing the tokens up to their own."""
    n = lengths.view(-1, 1, 1, 1).to(torch.int64)
    i = torch.arange(q_len, device=lengths.device).view(1, 1, -1, 1)
    j = torch.arange(kv_len, device=lengths.device).view(1, 1, 1, -1)
    return (j < n) & (j <= i + (n - q_len))


def dense_mask(
    pad: torch.Tensor | None, q_len: int, kv_len: int, causal: bool, window: int | None, device: Any
) -> torch.Tensor | None:
    """The (batch or 1, 1, q_len, kv_len) boolean mask (True = attend) that
    says what the backend's arguments say, for the fallbacks: queries are
    the last ``q_len`` of the ``kv_len`` positions (bottom-right), causal
    and ``window`` (a query sees the ``window`` positions up to its own) as
    transformers applies them, ``pad`` (batch, kv_len) the tokens. None when
    nothing is masked and no causal pattern is needed."""
    if pad is None and not causal and window is None:
        return None
    i = torch.arange(q_len, device=device).view(-1, 1) + (kv_len - q_len)
    j = torch.arange(kv_len, device=device).view(1, -1)
    allowed = torch.ones((q_len, kv_len), dtype=torch.bool, device=device)
    if causal:
        allowed = allowed & (j <= i)
    if window is not None:
        allowed = allowed & (j > i - window) if causal else allowed & ((j - i).abs() < window)
    mask = allowed.view(1, 1, q_len, kv_len)
    if pad is not None:
        mask = mask & pad.to(torch.bool).view(pad.shape[0], 1, 1, kv_len)
    return mask
