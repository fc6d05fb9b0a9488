"""Every graph a described model (graphcache.models.config) can call, as the
specs ``warm`` builds: the manifest ``graphcache manifest`` writes.

Sizes follow the pow2 class policy (graphcache.spec.classes): batches 1, 2, 4 ...
up to the max batch rounded up, lengths 128, 256 ... up to the max sequence
rounded up; a dense call's graph is a class spec (it serves every smaller
batch and length, ``covers``), a ragged (thd) call's graph is declared at the
rounded sizes (``classes.declared``).

What each attention of a model calls, by route (what transformers hands
graphcache; read from transformers 5.24 and checked by recording tiny models
of each family through ``graphcache.torch.record``):

- a decoder's self-attention: prefill causal with as many queries as keys
  (``bhsd`` with ``layout_q: bshd``: the cache's k/v contiguous per head, q
  its projection's transposed view, as transformers' sdpa hands them over
  and graphcache.torch.derive reads them; a model's own q layout where
  ``Attention.q_layout`` names one: Phi-3 and Whisper contiguous, GPT-2 a
  view of its fused c_attn), decode one query over the cache (mask none;
  ``bhsd``: a one-token q fits k's layout, but GPT-2's above batch 1). A sliding window in reach (more keys
  than the window) and a padded batch (batch > 1) arrive as a mask tensor on
  route ``sdpa``, served by bias graphs (``bias: b1ss``); on route
  ``graphcache`` (graphcache.hf) they are ragged graphs with bottom-right
  masks (``thd``), padding as per-sequence offsets, except an unpadded
  prompt with its window in reach: a dense ``sliding_window`` graph.
  ``--chunk`` adds chunked prefill (fewer queries than keys), the same way.
- an encoder's self-attention: bidirectional (mask none, ``bshd``), at the
  model's fixed length where it has one (Whisper: 1500 frames).
- an encoder-decoder's decoder: its self-attention as a decoder's (its first
  step arrives ``bshd``, later ones ``bhsd``), and cross-attention from one
  query (decode) or a prompt (prefill) to the encoder's output.
- T5 (``position_bias``): every call carries its relative position bias as
  a float mask, on either route (graphcache.hf hands T5 to the drop-in), so
  every graph is a bias graph (mask none, the causal mask inside the bias):
  at batch 1 ``bhss`` (the drop-in's name for any batch-1 bias), above it
  ``1hss`` (the position bias alone) and, where the encoder's input is
  padded (its own calls and cross-attention), ``bhss`` (bias plus padding).
  Its decoder's prefill and decode steps arrive ``bhsd``, its first decode
  step ``bshd``, the encoder ``bshd`` (recorded through a tiny T5, transformers 5.24).
"""

from __future__ import annotations

import json

from graphcache.models.call_graphs import Layouts, ModelSpecs, _Maker
from graphcache.models.config import Attention, Model
from graphcache.spec import GraphSpec
from graphcache.spec.classes import MIN_LENGTH, class_of
from graphcache.spec.layouts import FIELDS

LAYOUT_FIELDS = ("layout", *FIELDS)

ROUTES = ("sdpa", "graphcache")
# A prompt's q against the KV cache: q its projection's transposed view, k/v the cache.
ON_CACHE: dict[str, str] = {"layout": "bhsd", "layout_q": "bshd"}


def on_cache(a: Attention, decode: bool = False, batch: int = 2) -> Layouts:
    """The layouts of ``a``'s calls against the KV cache (k/v bhsd): a
    prompt's q (``ON_CACHE``, or the model's own ``q_layout``), a decode
    step's (k's layout, which a one-token q fits, or its ``q_decode_layout``
    above batch 1: at batch 1 torch's view gives the one-token q the strides
    of a contiguous tensor, GPT-2's included)."""
    q = (a.q_decode_layout if batch > 1 else None) if decode else (a.q_layout or "bshd")
    return {"layout": "bhsd", "layout_q": q} if q else "bhsd"


DEFAULT_ROUTE = "sdpa"
# The cold-build estimate's default: ~0.4 s per cuDNN SDPA build, reported in
# sglang#4650 (docs/benchmarks.md, "Graphs per workload"); cited, not measured here.
SECONDS_PER_BUILD = 0.4


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def lengths(longest: int) -> list[int]:
    """The length classes up to ``longest``: 128, 256, ... (at least one)."""
    out = [MIN_LENGTH]
    while out[-1] < longest:
        out.append(out[-1] * 2)
    return out


def batches(largest: int) -> list[int]:
    return [1 << i for i in range(_pow2(largest).bit_length())]


def specs_for(
    model: Model,
    *,
    max_batch: int,
    max_seq: int,
    route: str = DEFAULT_ROUTE,
    dtype: str = "bfloat16",
    decode: bool = True,
    chunk: int | None = None,
) -> ModelSpecs:
    """Every spec ``model`` can call with batches up to ``max_batch`` and
    sequences up to ``max_seq`` on ``route`` (see the module's text)."""
    if route not in ROUTES:
        raise ValueError(f"route={route!r} is not one of {', '.join(ROUTES)}")
    out = ModelSpecs()
    maker = _Maker(out, route, dtype, "bias" in GraphSpec.field_names())
    if any(a.position_bias for a in model.attentions):
        _position_biased(maker, model, max_batch, max_seq, decode, chunk)
        return out
    for attention in model.attentions:
        longest = min(max_seq, attention.max_q) if attention.max_q else max_seq
        for batch in batches(max_batch):
            if attention.role == "encoder":
                seqs = lengths(attention.fixed_kv or max_seq)[-1:] if attention.fixed_kv else lengths(max_seq)
                # An input of fixed length (Whisper's 30 s of audio) is never padded.
                for s in seqs:
                    maker.call(attention, batch, s, s, attention.layout or "bshd", "encoder", not attention.fixed_kv)
            elif attention.role == "cross":
                keys = lengths(attention.fixed_kv)[-1:] if attention.fixed_kv else lengths(max_seq)
                for kv in keys:
                    if decode:
                        maker.call(
                            attention, batch, 1, kv, on_cache(attention, True, batch), "decode", not attention.fixed_kv
                        )
                    for q in lengths(longest):
                        maker.call(attention, batch, q, kv, on_cache(attention), "prefill", not attention.fixed_kv)
            else:
                prefill = attention.layout or ("bshd" if model.encoder_decoder else on_cache(attention))
                padded = not model.encoder_decoder  # a decoder's own inputs are not padded in an encoder-decoder
                for s in lengths(longest):
                    maker.call(attention, batch, s, s, prefill, "prefill", padded)
                if decode:
                    if model.encoder_decoder:  # the first step: k/v of the one token, not the cache
                        maker.call(attention, batch, 1, MIN_LENGTH, "bshd", "first decode step", padded)
                    # A sliding layer's cache holds its window (transformers' sliding cache layers).
                    reach = min(longest, attention.window) if attention.window else longest
                    for kv in lengths(reach):
                        maker.call(
                            attention, batch, 1, kv, on_cache(attention, True, batch), "decode", padded, min(kv, reach)
                        )
                for q in lengths(chunk) if chunk else []:
                    for kv in lengths(longest):
                        if kv > q:
                            maker.call(
                                attention,
                                batch,
                                q,
                                kv,
                                on_cache(attention),
                                f"chunked prefill (chunks up to {chunk})",
                                padded,
                            )
    return out


def _position_biased(
    maker: _Maker, model: Model, max_batch: int, max_seq: int, decode: bool, chunk: int | None
) -> None:
    """T5's calls (see the module's text): bias graphs only."""
    if not maker.bias:
        maker.out.lack("bias graphs (GraphSpec has no bias field here): T5's position bias arrives as a float mask")
        return
    for a in model.attentions:
        for batch in batches(max_batch):
            kv_lengths = lengths(max_seq)
            if a.role == "encoder":
                for s in kv_lengths:
                    maker.biased(a, batch, s, s, "bshd", "encoder", padded=True)
                continue
            if a.role == "cross":
                for kv in kv_lengths:
                    for q in ([1] if decode else []) + lengths(max_seq):
                        layout = "bhsd" if q == 1 else ON_CACHE
                        maker.biased(a, batch, q, kv, layout, "decode" if q == 1 else "prefill", padded=True)
                continue
            for s in kv_lengths:
                maker.biased(a, batch, s, s, ON_CACHE, "prefill")
            if decode:
                maker.biased(a, batch, 1, MIN_LENGTH, "bshd", "first decode step")
                for kv in kv_lengths:
                    maker.biased(a, batch, 1, kv, "bhsd", "decode")
            for q in lengths(chunk) if chunk else []:
                for kv in (kv for kv in kv_lengths if kv > q):
                    maker.biased(a, batch, q, kv, ON_CACHE, f"chunked prefill (chunks up to {chunk})")


def widened(
    spec: GraphSpec, route: str, max_batch: int, windows: frozenset[int] = frozenset(), rows: int = 1
) -> list[GraphSpec]:
    """The class specs that calls of ``spec``'s shape make in batches up to
    ``max_batch`` on ``route``, unpadded and padded (left and right), by the
    rules above: what ``graphcache record --max-batch`` adds for a call it
    saw. A one-query call (a decode step, or cross-attention's) is widened
    both as causal and not, and a causal call also with each sliding window
    in ``windows`` (those the recording saw): the call alone says neither.
    ``rows``: the rows each input of the recording makes in this call (an
    image's windows: Swin's and SAM's windowed attention runs images x
    windows rows); the call is then widened by inputs too, to ``rows`` x 1,
    2, 4 ... ``max_batch`` rows (``per_input``). A ragged (thd) call's batch
    is its sequences, no input's rows: widened by batch alone."""
    if route not in ROUTES:
        raise ValueError(f"route={route!r} is not one of {', '.join(ROUTES)}")
    out = ModelSpecs()
    every = batches(max_batch)
    sizes = every if spec.layout == "thd" else sorted({*every, *per_input(rows, max_batch)})
    klass = class_of(spec, "pow2") if spec.layout != "thd" else spec
    layout = {name: getattr(spec, name) for name in LAYOUT_FIELDS if getattr(spec, name) is not None}
    # A batch-1 view whose batch lies inside a fused group (SAM's q, k, v: its qkv projection reshaped to
    # (3, b x heads, s, d), "s[3]bhd") is no view at a larger batch: torch's reshape copies it, contiguous.
    copied = spec.batch == 1 and any(_inside(value) for value in layout.values())
    if spec.layout == "thd" or spec.bias is not None or spec.sinks or spec.padding or spec.dropout:
        # Already what a padded batch calls (a ragged or bias graph), or a kind
        # the padded-batch rules do not cover: the same graph at each batch.
        bias = {"bhss", "1hss"} if spec.bias == "bhss" else {spec.bias}  # T5: the position bias alone above 1
        contiguous = dict.fromkeys(FIELDS, None)
        for b in sizes:
            for dims in bias:
                out.add(klass.replace(batch=b, bias=dims if b > 1 else spec.bias), "")
                if copied and b > 1:
                    out.add(klass.replace(batch=b, bias=dims, layout="bhsd", **contiguous), "")
        return list(out.users)
    maker = _Maker(out, route, spec.dtype, "bias" in GraphSpec.field_names())
    own = spec.window_left + 1 if spec.mask == "sliding_window" and spec.window_left is not None else None
    causal = spec.mask != "none" or (spec.seq_q == 1 and spec.seq_kv != 1)
    scale = spec.attn_scale if spec.attn_scale is not None else spec.head_dim**-0.5
    seq_kv = klass.seq_kv if klass.seq_kv is not None else klass.seq_q
    heads_kv = spec.heads_kv or spec.heads_q
    for kind in {causal, False} if spec.seq_q == 1 else {causal}:
        for window in {own} if own is not None or not kind else {None, *windows}:
            a = Attention("self", (), spec.heads_q, heads_kv, spec.head_dim, scale, kind, window)
            for b in sizes:
                maker.call(a, b, klass.seq_q, seq_kv, layout, "widened")
                if copied and b > 1:
                    maker.call(a, b, klass.seq_q, seq_kv, "bhsd", "widened")
                if route == "graphcache" and kind and b > 1 and spec.seq_q == seq_kv and window is None:
                    # graphcache.hf: a right-padded causal prompt is a padded dense graph.
                    out.add(maker._dense(a, b, klass.seq_q, seq_kv, layout, "causal", padding=True), "")
    return list(out.users)


def _inside(layout: str) -> bool:
    """Whether a layout's batch comes after a fused group's (``s[3]bhd``)."""
    return "]" in layout and "b" in layout and layout.index("b") > layout.index("]")


def per_input(rows: int, max_batch: int) -> list[int]:
    """The batch classes of a call that runs ``rows`` rows per input, for 1,
    2, 4 ... up to ``max_batch`` inputs: ``batches(max_batch)`` for one row
    per input; an image's 9 windows at up to 2 images: 16 and 32."""
    return sorted({_pow2(rows * n) for n in batches(max_batch)})


def lengthened(spec: GraphSpec, max_seq: int) -> list[GraphSpec]:
    """The class specs that calls of ``spec``'s shape make at every length
    class up to ``max_seq`` (its own class among them): what ``graphcache
    record --max-seq`` adds for a call it saw, so a run recorded at one
    resolution or prompt length serves others. The call's own lengths say
    which kind of call it is, whatever classes they fall in: as many queries
    as keys (self-attention, a prompt, a diffusion model's joint attention)
    grow together; a one-query call (a decode step) grows its keys; any
    other call (cross-attention: image tokens to a prompt's, 64 queries to
    24 keys as much as 256 to 77) grows each side to every class, keeping
    which side is the longer where a mask depends on it (not for mask none).
    A class spec says only its classes: equal ones are taken as a square
    call. A paged spec's keys are its page table's reach: kept."""
    klass = class_of(spec, "pow2") if spec.layout != "thd" else spec
    if spec.page_size is not None:
        return [klass]
    q, kv = spec.seq_q, spec.seq_kv if spec.seq_kv is not None else spec.seq_q
    sizes = lengths(max_seq)
    if q == kv:
        pairs = {(n, n) for n in sizes}
    elif q == 1:
        pairs = {(1, n) for n in sizes}
    else:
        free = spec.mask == "none"
        pairs = {(a, b) for a in sizes for b in sizes if free or a == b or (a < b) == (q < kv)}
    own_kv = klass.seq_kv if klass.seq_kv is not None else klass.seq_q
    pairs.add((klass.seq_q, own_kv))
    return [klass.replace(seq_q=a, seq_kv=b) for a, b in sorted(pairs)]


def render(specs: ModelSpecs, header: list[str]) -> str:
    """The manifest text: ``header`` as comments, then one family per spec
    but its batch (the batches as a list), each under a comment naming the
    layers and phases that call it. ``graphcache.ops.manifest.load`` reads it."""
    groups: dict[str, tuple[GraphSpec, list[int], list[str]]] = {}
    for spec, users in specs.users.items():
        rest = spec.to_dict()
        del rest["batch"]
        key = json.dumps(rest, sort_keys=True)
        entry = groups.setdefault(key, (spec, [], []))
        entry[1].append(spec.batch)
        entry[2].extend(u for u in users if u not in entry[2])
    lines = [f"# {line}" if line else "#" for line in header]
    lines += ["graphs:"]
    for index, (spec, sizes, users) in enumerate(groups.values()):
        lines += [f"  # {user}" for user in users]
        summary = " ".join(spec.summary().split()[1:])
        lines.append(f"  - name: {json.dumps(f'g{index + 1} {summary}')}")
        lines.append(f"    batch: {json.dumps(sorted(sizes))}")
        for name, value in spec.to_dict().items():
            # What the spec's defaults give again is left out (the same spec is read back).
            if name != "batch" and value not in (None, False) and not (name == "dropout" and value == 0.0):
                lines.append(f"    {name}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"
