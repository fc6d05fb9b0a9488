"""The ``graphcache`` attention function transformers calls (registered by
``graphcache.hf.register``): one call of a model's attention layer, served by
graphcache.torch's runtime where a graph can express it.

How a call is served (docs/models.md has the table):

- no padding mask: causal with as many queries as keys, a decode step (one
  query), or no causal mask (encoders, cross-attention) is the SDPA drop-in's
  dense graph (``graphcache.torch.scaled_dot_product_attention``, bshd/bhsd);
  a causal prompt with a sliding window in reach is a dense ``sliding_window``
  graph (``graphcache.hf.dense``); more queries than one but fewer than the
  keys (a prompt continued on a cache, with or without a window) is a ragged
  (thd) graph with a bottom-right mask (``graphcache.torch.varlen_attn``);
- a padding mask (``graphcache.hf.masks.padding_mask``): left padding, and
  any padding of a non-causal call, is a thd graph whose key offsets start
  each sequence at its first token inside the padded tensors (``cu_seq_k``,
  ``seqused_k``: device arithmetic, no host sync); right padding of a causal
  prompt is a dense graph with ``padding`` (``seq_len_q`` / ``seq_len_kv``)
  (``graphcache.hf.dense``);
- a static cache with no row padded (the mask tagged ``static``): a dense
  graph with ``padding`` over every slot of the cache, each row's tokens its
  ``seq_len_kv``, the prompt ``causal_bottom_right``, a decode step no mask;
- a 4-D mask (a static cache's padded rows, a custom pattern, padding with
  holes) goes to the drop-in with the mask and the key and value heads as
  they are (``enable_gqa``), which serves it as a bias graph (or counts it
  under ``mask``); T5's ``position_bias`` runs transformers' sdpa under the
  drop-in;
- under ``torch.compile`` nothing reads a value on the host: an unmasked
  call as above through the drop-in's ``graphcache::sdpa`` op, anything
  else the drop-in with its mask made on the device (a bias graph), so a
  compiled attention call is one op and ``fullgraph=True`` holds;
- what no graph expresses falls back, counted under its reason in
  ``graphcache.torch.stats()``: ``empty`` (a tensor with no elements:
  torch's own SDPA), ``softcap`` and ``sinks`` where no sink
  graph expresses the call (to the model's ``eager``: transformers' sdpa
  refuses softcap and has no sinks), ``output_attentions`` (eager, which
  returns the weights), ``dropout`` with a padding mask, ``shape`` (more
  queries than keys).

Keyword arguments transformers' sdpa ignores, the backend ignores too
(``SDPA_ARGUMENTS`` lists those it reads).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import graphcache.torch as gt
from graphcache.hf.dense import run_dense
from graphcache.hf.masks import LENGTHS_ATTR, PADDING_ATTR, dense_mask, padding_side
from graphcache.torch.core.doors import TORCH_SDPA
from graphcache.torch.core.plan import Plan

# transformers' sdpa_attention_forward (5.24): every argument it reads beyond
# (module, query, key, value), and what the backend does with each. Any other
# keyword argument a model passes (ModernBERT's deterministic, position_ids,
# cache_position, cu_seq_lens_*, max_length_*, ...) changes nothing sdpa
# computes, so the backend ignores it too. tests/test_hf_backend.py reads the
# installed function's arguments and holds this table to them.
SDPA_ARGUMENTS = {
    "attention_mask": "the padding mask: ragged offsets or a padded dense graph; a 4-D mask through the drop-in",
    "dropout": "the spec's dropout (dense graphs); with a padding mask or a window: transformers' sdpa (dropout)",
    "scaling": "the spec's attn_scale",
    "is_causal": "the spec's mask (unset: the module's is_causal)",
    "position_bias": "transformers' sdpa under the drop-in: a bias graph",
    "softcap": "the model's eager attention (softcap), which caps: sdpa refuses softcap",
    "output_attentions": "true: the model's eager attention, and the weights it computes (output_attentions)",
}
# What sdpa takes from its 4-D mask, the backend's (per-token) mask leaves out,
# or sdpa cannot compute: read from the model's own keyword arguments.
BACKEND_ARGUMENTS = {
    "sliding_window": "the spec's window (sdpa reads it from its 4-D mask)",
    "s_aux": "attention sinks: the spec's sinks (sdpa has none: gpt-oss refuses it)",
}


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    s_aux: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """transformers' attention interface: query (b, h_q, s_q, d), key and
    value (b, h_kv, s_kv, d) in, (b, s_q, h_q, d_v) out, and the weights
    where ``output_attentions=True`` asks for them (the model's eager
    attention computes them). Keyword arguments not in SDPA_ARGUMENTS or
    BACKEND_ARGUMENTS are ignored, as transformers' sdpa ignores them."""
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    for recorder in gt.RUNTIME.recorders:  # a recording made through the backend: its route is graphcache
        recorder.backend = True
    call = _Call(module, query, key, value, attention_mask, dropout, scaling, sliding_window, causal, kwargs)
    if softcap is not None:
        return call.eager(
            "softcap", "softcap (tanh score capping): cuDNN 1.32's score modifier does not serialize", softcap=softcap
        )
    compiling = torch.compiler.is_compiling()
    if s_aux is not None:
        if compiling:  # the sink graphs' path reads the runtime's memo: not for a compiled graph
            return call.eager("sinks", "attention sinks (s_aux) under torch.compile: the model's eager attention")
        return call.sinks(s_aux)
    if kwargs.get("output_attentions"):
        return call.eager("output_attentions", "output_attentions=True asks for the weights: eager computes them")
    if kwargs.get("position_bias") is not None:
        return call.through_dropin()
    if query.numel() == 0 or key.numel() == 0 or value.numel() == 0:
        return call.empty()
    if attention_mask is not None and attention_mask.dim() != 2:
        static = getattr(attention_mask, PADDING_ATTR, None) == "static"
        if static and causal and not dropout and not compiling and sliding_window is None:
            return call.static(getattr(attention_mask, LENGTHS_ATTR))
        return call.masked()
    sq, skv = query.shape[2], key.shape[2]
    if causal and sq > skv:
        return call.sdpa("shape", f"causal with more queries ({sq}) than keys ({skv})")
    window = sliding_window if sliding_window is not None and skv > sliding_window else None
    plain = attention_mask is None and window is None and (not causal or sq == skv or sq == 1)
    if plain:
        return call.dense()
    if compiling:  # one graphcache::sdpa op in the compiled graph: the mask made on the device, a bias graph
        return call.masked()
    if attention_mask is None:
        if window is not None and not causal and sq != skv:
            return call.sdpa("window", f"a bidirectional window with {sq} queries and {skv} keys")
        if window is not None and causal and sq == skv:
            return call.windowed(window)
        return call.ragged(None)
    if dropout:
        return call.sdpa("dropout", "dropout with a padding mask: the ragged graphs take no dropout")
    side = getattr(attention_mask, PADDING_ATTR, None) or padding_side(attention_mask.to(torch.bool))
    if side == "holes":
        return call.masked()
    if side == "right" and causal and sq > 1:
        if window is not None or sq != skv:
            return call.sdpa("padding", "right padding with a window or a cache: no graph expresses it")
        return call.padded()
    return call.ragged(attention_mask.to(torch.bool), left=side == "left")


class _Call:
    """One attention call's arguments and the ways to serve it."""

    def __init__(
        self,
        module: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: Any,
        dropout: float,
        scaling: float | None,
        window: int | None,
        causal: bool,
        kwargs: dict[str, Any],
    ) -> None:
        self.module, self.q, self.k, self.v, self.mask = module, q, k, v, mask
        self.dropout, self.scaling, self.window, self.causal, self.kwargs = dropout, scaling, window, causal, kwargs

    # served ---------------------------------------------------------------------

    def dense(self) -> tuple[torch.Tensor, None]:
        """The SDPA drop-in's dense graph: what transformers' sdpa would call."""
        q, k = self.q, self.k
        out = gt.scaled_dot_product_attention(
            q,
            k,
            self.v,
            dropout_p=self.dropout,
            is_causal=self.causal and q.shape[2] > 1,
            scale=self.scaling,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2).contiguous(), None

    def ragged(self, pad: torch.Tensor | None, left: bool = True) -> tuple[torch.Tensor, None]:
        """A thd graph over the padded tensors: each sequence's queries are
        its s_q rows, its keys start at its first token (``cu_seq_k``) and
        count its tokens (``seqused_k``); the mask is bottom-right aligned."""
        if self.dropout:
            return self.sdpa("dropout", "dropout: the ragged graphs take no dropout")
        q, k, v = self.q, self.k, self.v
        b, hq, sq, _ = q.shape
        skv = k.shape[2]
        dev = q.device
        qt, kt, vt = (_tokens(t) for t in (q, k, v))
        step = torch.arange(b + 1, device=dev, dtype=torch.int32)
        cu_q = step * sq
        cu_k = step * skv
        used = None
        if pad is not None:
            used = pad.sum(dim=1, dtype=torch.int32)
            if left:  # the first token of row i is at skv - used[i]
                cu_k = cu_k + torch.nn.functional.pad(skv - used, (0, 1))
        if self.causal:
            window_size = (-1 if self.window is None else self.window - 1, 0)
        else:
            window_size = (-1, -1) if self.window is None else (self.window - 1, self.window - 1)
        out = gt.varlen_attn(
            qt,
            kt,
            vt,
            cu_q,
            cu_k,
            sq,
            skv,
            scale=self.scaling,
            window_size=window_size,
            enable_gqa=hq != k.shape[1],
            seqused_k=used,
        )
        assert isinstance(out, torch.Tensor)
        out = out.view(b, sq, hq, out.shape[-1])
        if pad is not None and self.causal and sq > 1:
            # A padded query row of a causal call padded on the left sees no key: torch's SDPA answers 0 there
            # (transformers' sdpa too), whatever the kernel left (a fill, not a product: NaN * 0 is NaN).
            out = out.masked_fill(~pad[:, -sq:].view(b, sq, 1, 1), 0.0)
        return out, None

    def padded(self) -> tuple[torch.Tensor, None]:
        """A dense graph with per-sequence key lengths (right padding,
        causal): a padded query row attends over its sequence's tokens, as in
        transformers' sdpa (graphcache.hf.dense)."""
        out = run_dense(self.q, self.k, self.v, self.scaling, None, self.mask.sum(dim=1, dtype=torch.int32))
        return (out, None) if out is not None else self.sdpa_uncounted()

    def sinks(self, s_aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention sinks (gpt-oss's ``s_aux``): a dense ``sinks`` graph for
        an unpadded causal prompt (a window in reach or not) or a decode step
        (one query: with a window in reach, over its last ``window`` keys, a
        copy of those keys); anything else is the model's eager under ``sinks``."""
        sq, skv = self.q.shape[2], self.k.shape[2]
        window = self.window if self.window is not None and skv > self.window else None
        plain = not self.dropout and not self.kwargs.get("output_attentions")
        if plain and self.mask is None and self.causal and (sq == skv or sq == 1):
            k, v = self.k, self.v
            if sq == 1 and window is not None:  # the keys a decode step's window sees: the last `window`
                k, v, window = k[:, :, -window:].contiguous(), v[:, :, -window:].contiguous(), None
            out = run_dense(self.q, k, v, self.scaling, window, sink=s_aux)
            if out is not None:
                return out, None
            return self.eager_uncounted(s_aux=s_aux)
        why = "a padding mask, a cache with several queries, dropout or weights"
        return self.eager("sinks", f"attention sinks (s_aux) with {why}: no sink graph expresses it", s_aux=s_aux)

    def static(self, lengths: torch.Tensor) -> tuple[torch.Tensor, None]:
        """A static cache's call, no row padded: a dense graph over every
        slot of the cache, each row's tokens (``lengths``) its padding mask's
        key lengths, causal bottom-right (a decode step: no mask), so the
        prompt and every decode step of a cache share its shape."""
        out = run_dense(self.q, self.k, self.v, self.scaling, None, lengths, static=True)
        return (out, None) if out is not None else self.sdpa_uncounted()

    def masked(self) -> tuple[torch.Tensor, None]:
        """A 4-D mask (a static cache holding padded rows, a custom pattern,
        padding with holes; under torch.compile, any padding): the SDPA
        drop-in with the mask, as transformers' sdpa computes it, the key
        and value heads as they are (``enable_gqa``: no repeated copy, and
        the same spec in eager and compiled code), which serves it as a bias
        graph or counts it under its reason."""
        q, k = self.q, self.k
        mask = self.mask if self.mask is not None and self.mask.dim() == 4 else self._dense_mask(explicit=True)
        out = gt.scaled_dot_product_attention(
            q,
            k,
            self.v,
            attn_mask=mask,
            dropout_p=self.dropout,
            scale=self.scaling,
            enable_gqa=q.shape[1] != k.shape[1],
        )
        return out.transpose(1, 2).contiguous(), None

    def windowed(self, window: int) -> tuple[torch.Tensor, None]:
        """A dense graph with a sliding window (a causal prompt, no padding)."""
        if self.dropout:
            return self.sdpa("dropout", "dropout with a sliding window: the window graphs take no dropout")
        out = run_dense(self.q, self.k, self.v, self.scaling, window)
        return (out, None) if out is not None else self.sdpa_uncounted()

    # fallbacks ----------------------------------------------------------------------

    def empty(self) -> tuple[torch.Tensor, None]:
        """A call with no elements (a batch, heads, length or head dim of 0):
        torch's own SDPA answers it (an empty output, or zeros where there is
        no key), counted as ``empty``. Not transformers' sdpa: its reshape
        of a batch of 0 raises. A mask changes nothing where nothing is computed."""
        _count("empty", "an empty call (a batch, heads, length or head dim of 0): torch's SDPA answers it")
        q, k = self.q, self.k
        out = TORCH_SDPA(
            q, k, self.v, dropout_p=self.dropout, is_causal=self.causal and q.shape[2] > 1, scale=self.scaling,
            enable_gqa=q.shape[1] != k.shape[1],
        )  # fmt: skip
        return out.transpose(1, 2).contiguous(), None

    def sdpa(self, reason: str, message: str) -> tuple[torch.Tensor, None]:
        """transformers' own sdpa, counted under ``reason``."""
        _count(reason, message)
        return self.sdpa_uncounted()

    def sdpa_uncounted(self) -> tuple[torch.Tensor, None]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            self.module,
            self.q,
            self.k,
            self.v,
            self._dense_mask(),
            dropout=self.dropout,
            scaling=self.scaling,
            is_causal=self.causal,
            **{k: v for k, v in self.kwargs.items() if k != "output_attentions"},
        )

    def through_dropin(self) -> tuple[torch.Tensor, None]:
        """transformers' sdpa with a tensor mask (or T5's position bias),
        under the SDPA drop-in, which serves or counts the call itself."""
        with gt.patch():
            return self.sdpa_uncounted()

    def eager(self, reason: str, message: str, **extra: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's own eager attention (softcap, sinks, weights), counted
        under ``reason``; with ``output_attentions=True``, its weights too."""
        _count(reason, message)
        return self.eager_uncounted(**extra)

    def eager_uncounted(self, **extra: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        own = getattr(sys.modules.get(type(self.module).__module__), "eager_attention_forward", None)
        eager = own if callable(own) else sdpa_attention_forward
        mask = self._dense_mask(explicit=True)  # eager applies no causal pattern of its own
        if mask is not None and mask.dtype == torch.bool:  # eager adds its mask to the scores
            mask = torch.zeros(mask.shape, dtype=self.q.dtype, device=self.q.device).masked_fill(
                ~mask, torch.finfo(self.q.dtype).min
            )
        out, weights = eager(
            self.module,
            self.q,
            self.k,
            self.v,
            mask,
            dropout=self.dropout,
            scaling=self.scaling,
            sliding_window=self.window,
            **extra,
            **self.kwargs,
        )
        return out, weights if self.kwargs.get("output_attentions") else None

    def _dense_mask(self, explicit: bool = False) -> Any:
        if self.mask is not None and self.mask.dim() != 2:
            return self.mask
        sq, skv = self.q.shape[2], self.k.shape[2]
        window = self.window if self.window is not None and skv > self.window else None
        causal = self.causal and sq > 1
        if self.mask is None and window is None and (not causal or (sq == skv and not explicit)):
            return None  # sdpa's own is_causal says it
        return dense_mask(self.mask, sq, skv, causal, window, self.q.device)


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """(b, h, s, d) as varlen_attn's token-major (b * s, h, d): a view where
    the tensor is a transposed (b, s, h, d) one, else one copy."""
    b, h, s, d = t.shape
    return t.transpose(1, 2).contiguous().view(b * s, h, d)


def _count(reason: str, message: str) -> None:
    """Count one call that no graph serves, in the drop-in's stats and recorders."""
    gt.RUNTIME.count(Plan(None, None, reason, message), "hf")
    for recorder in list(gt.RUNTIME.recorders):
        recorder.count((reason, message))
