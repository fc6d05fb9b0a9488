"""A transformers model's attention, read from its ``config.json``.

``read(path)`` takes a ``config.json`` or a folder holding one (a model
folder), offline: no hub, no transformers import. ``describe(config)`` says
which attentions the model calls, per layer type: heads, GQA heads, head dims,
scale, causal or not, the sliding window and the layers that use each, for
the decoder and, for encoder-decoders, the encoder and the cross-attention.

Families read (the field names of transformers 5.24's configs):

- decoders: llama, mistral, mixtral, qwen2, qwen3, phi3, gemma, gemma2,
  gemma3 / gemma3_text (a gemma3 checkpoint's ``text_config``), gpt2;
- encoder-decoders: bart, mbart, whisper, t5, mt5 (T5's relative position
  bias arrives with every attention call as a float mask: ``position_bias``,
  served by bias graphs; its scale is 1.0, no 1/sqrt(d)).

A family read here whose attention graphcache cannot describe is refused
naming what is missing (softcap: Gemma 2; a scale per layer: GPT-2 with
``scale_attn_by_inverse_layer_idx``), and so is every other ``model_type``:
nothing is skipped silently.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError
from graphcache.spec import GraphSpec

DECODERS = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "gemma3_text", "gpt2")
ENCODER_DECODERS = ("bart", "mbart", "whisper", "t5", "mt5")
FAMILIES = DECODERS + ENCODER_DECODERS
# Read here but refused, naming what the manifest cannot write for them.
REFUSED = {
    # GraphSpec.sinks exists (graphcache.hf passes them); modelspecs does not list sink specs yet.
    "gpt_oss": "attention sinks (s_aux): graphcache manifest does not write sink specs yet",
}


@dataclass(frozen=True)
class Attention:
    """One kind of attention call a model makes."""

    role: str  # "self" (a decoder's), "encoder" or "cross"
    layers: tuple[int, ...]
    heads_q: int
    heads_kv: int
    head_dim: int
    scale: float
    causal: bool
    window: int | None = None  # a sliding window: the keys a query sees, itself included (transformers' sliding_window)
    fixed_kv: int | None = None  # the encoder length when the model fixes it (Whisper's 1500 frames)
    max_q: int | None = None  # the longest decoder sequence the model allows (Whisper's 448)
    # Every call arrives with a float mask (T5: its relative position bias, on the
    # cross-attention zeros, plus any padding): only bias graphs serve it.
    position_bias: bool = False
    # The layout its prompts' k/v arrive in where the model makes them contiguous (Whisper: bhsd).
    layout: str | None = None
    # q's layout against a cache where it is not its projection's transposed view (bshd), as
    # graphcache.torch.derive reads it: contiguous (Whisper, Phi-3's rotary of a fused slice:
    # bhsd) or a fused projection's view (GPT-2's c_attn: bs[3]hd, and at a decode step above batch 1 b[3]hsd, in the cache's order).
    q_layout: str | None = None
    q_decode_layout: str | None = None

    def users(self) -> str:
        """``decoder layers 0-31 (sliding window 4096)``: who makes these calls."""
        stack = {"self": "decoder", "encoder": "encoder", "cross": "decoder cross-attention,"}[self.role]
        kind = f"sliding window {self.window}" if self.window else ("causal" if self.causal else "bidirectional")
        return f"{stack} layers {ranges(self.layers)} ({kind})"


@dataclass(frozen=True)
class Model:
    model_type: str
    attentions: tuple[Attention, ...]
    softcap: float | None = None

    @property
    def encoder_decoder(self) -> bool:
        return any(a.role == "cross" for a in self.attentions)


# A diffusers pipeline folder's denoiser: the component graphcache manifest traces.
DENOISERS = ("transformer", "unet", "prior", "decoder")


def locate(path: str | Path) -> Path:
    """The config.json ``path`` names: itself, the one in a model folder, or
    a diffusers pipeline folder's (``model_index.json``) denoiser's.

    Raises ManifestError naming the folder where it holds none."""
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / "config.json").is_file() or not (path / "model_index.json").is_file():
        return path / "config.json"
    for name in DENOISERS:
        if (path / name / "config.json").is_file():
            return path / name / "config.json"
    raise ManifestError(
        f"{path}: a diffusers pipeline folder (model_index.json) with no {' or '.join(DENOISERS)} folder holding a "
        "config.json: give the denoiser's folder or its config.json"
    )


def read(path: str | Path) -> dict[str, Any]:
    """The config mapping in ``path``: a config.json, or a folder holding one
    (``locate``), its values as transformers reads them (``special_floats``).

    Raises ManifestError naming the path and what is wrong."""
    path = Path(path)
    file = locate(path)
    if path.is_dir() and not file.is_file():
        raise ManifestError(f"{path}: no config.json in this folder (give a model folder or its config.json)")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ManifestError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(
            f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start}): a config.json is JSON"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{file}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{file}: a config.json is a JSON object")
    return special_floats(data)


# transformers 5 writes the floats JSON has no literal for as {"__float__": "Infinity"}
# (PreTrainedConfig._encode_special_floats: Granite 4.0-H's and Falcon-H1's
# time_step_limit) and reads them back with _decode_special_floats; the bare
# literals Infinity / NaN that Python's json writes are read by json.loads itself.
_FLOAT_TAG = "__float__"
_FLOAT_VALUES = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def special_floats(value: Any) -> Any:
    """``value`` with every ``{"__float__": "Infinity" | "-Infinity" | "NaN"}``
    replaced by its float, as transformers' config reader decodes it (a tag
    it does not know stays as it is, as there)."""
    if isinstance(value, dict):
        if set(value) == {_FLOAT_TAG} and isinstance(value[_FLOAT_TAG], str) and value[_FLOAT_TAG] in _FLOAT_VALUES:
            return _FLOAT_VALUES[value[_FLOAT_TAG]]
        return {k: special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [special_floats(v) for v in value]
    return value


def describe(config: dict[str, Any], source: str = "config.json") -> Model:
    """The attentions the model of ``config`` calls. Raises ManifestError for
    a model type not read here, a feature graphcache cannot describe, or a
    missing or bad field (each naming it)."""
    kind = config.get("model_type")
    if kind == "gemma3" and isinstance(config.get("text_config"), dict):
        config, kind = {**config["text_config"], "model_type": "gemma3_text"}, "gemma3_text"
    if kind is None:
        raise ManifestError(f"{source}: model_type is missing (a transformers config.json names its model_type)")
    if kind in REFUSED:
        raise ManifestError(f"{source}: model_type {kind!r} cannot be described: {REFUSED[kind]}")
    if kind not in FAMILIES:
        raise ManifestError(
            f"{source}: model_type {kind!r} is not a family graphcache manifest reads; it reads "
            f"{', '.join(FAMILIES)} (others: record a run with graphcache record)"
        )
    fields = _Fields(config, source, kind)
    if kind in ENCODER_DECODERS:
        return Model(kind, _encoder_decoder(fields, kind))
    softcap = config.get("attn_logit_softcapping")
    if softcap is not None:  # checked whether or not a spec field for it exists: no spec here writes one
        what = (
            "graphcache's specs have no softcap field"
            if "softcap" not in GraphSpec.field_names()
            else ("graphcache manifest does not write softcap specs yet")
        )
        raise ManifestError(
            f"{source}: attn_logit_softcapping={softcap} ({kind}) cannot be described: {what} "
            "(and transformers' sdpa refuses softcap; graphcache.hf runs such layers on eager)"
        )
    return Model(kind, _decoder(fields, kind), softcap)


class _Fields:
    """Typed reads of a config's fields, each error naming the field."""

    def __init__(self, config: dict[str, Any], source: str, kind: str) -> None:
        self.config, self.source, self.kind = config, source, kind

    def int(self, name: str, default: int | None = None) -> int:
        value = self.config.get(name, default)
        if value is None and default is not None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            what = "is missing" if value is None else f"={value!r} is not a positive integer"
            raise ManifestError(f"{self.source}: {name} {what} (model_type {self.kind!r} needs it)")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.config.get(name, default)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ManifestError(f"{self.source}: {name}={value!r} is not a positive number")
        return float(value)


def _decoder(f: _Fields, kind: str) -> tuple[Attention, ...]:
    c = f.config
    if kind == "gpt2":
        heads, layers = f.int("n_head"), f.int("n_layer")
        head_dim = f.int("n_embd") // heads
        if c.get("scale_attn_by_inverse_layer_idx"):
            raise ManifestError(
                f"{f.source}: scale_attn_by_inverse_layer_idx=true cannot be described yet: each layer has its "
                "own scale (1/sqrt(d)/(layer+1)), not written out per layer here"
            )
        scale = head_dim**-0.5 if c.get("scale_attn_weights", True) else 1.0
        # q: a view of c_attn's (b, s, 3 * E) output, at a prompt and at a decode step
        layers_ = tuple(range(layers))
        return (
            Attention(
                "self", layers_, heads, heads, head_dim, scale, True, q_layout="bs[3]hd", q_decode_layout="b[3]hsd"
            ),
        )
    heads, layers = f.int("num_attention_heads"), f.int("num_hidden_layers")
    heads_kv = f.int("num_key_value_heads", heads)
    head_dim = f.int("head_dim", f.int("hidden_size") // heads)
    if kind in ("gemma2", "gemma3", "gemma3_text"):
        scale = f.number("query_pre_attn_scalar", float(head_dim)) ** -0.5
    else:
        scale = head_dim**-0.5
    window = c.get("sliding_window")
    types = _layer_types(f, kind, layers, window)
    groups: dict[int | None, list[int]] = {}
    for index, layer_type in enumerate(types):
        if layer_type == "sliding_attention":
            groups.setdefault(f.int("sliding_window"), []).append(index)
        elif layer_type == "full_attention":
            groups.setdefault(None, []).append(index)
        else:
            raise ManifestError(
                f"{f.source}: layer_types[{index}]={layer_type!r} cannot be described: graphcache manifest "
                "reads full_attention and sliding_attention layers"
            )
    q_layout = "bhsd" if kind == "phi3" else None  # rotary of a fused qkv_proj slice: a contiguous q
    return tuple(
        Attention("self", tuple(members), heads, heads_kv, head_dim, scale, True, w, q_layout=q_layout)
        for w, members in groups.items()
    )


def _layer_types(f: _Fields, kind: str, layers: int, window: Any) -> list[str]:
    """The config's ``layer_types``, or what transformers derives without one."""
    given = f.config.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != layers:
            raise ManifestError(f"{f.source}: layer_types must list one type per layer ({layers})")
        return given
    full, sliding = "full_attention", "sliding_attention"
    if window is None or kind in ("llama", "gemma", "gpt2"):
        return [full] * layers
    if kind in ("qwen2", "qwen3"):
        if not f.config.get("use_sliding_window", False):
            return [full] * layers
        first = f.config.get("max_window_layers", layers)
        return [sliding if i >= first else full for i in range(layers)]
    if kind == "gemma2":
        return [sliding if (i + 1) % 2 else full for i in range(layers)]
    if kind in ("gemma3", "gemma3_text"):
        pattern = f.int("sliding_window_pattern", 6)
        return [sliding if (i + 1) % pattern else full for i in range(layers)]
    return [sliding] * layers  # mistral, mixtral, phi3: every layer


def _encoder_decoder(f: _Fields, kind: str) -> tuple[Attention, ...]:
    if kind in ("t5", "mt5"):
        return _t5(f)
    width = f.int("d_model")
    enc_heads, dec_heads = f.int("encoder_attention_heads"), f.int("decoder_attention_heads")
    enc_layers, dec_layers = f.int("encoder_layers"), f.int("decoder_layers")
    enc_dim, dec_dim = width // enc_heads, width // dec_heads
    whisper = kind == "whisper"
    fixed = f.int("max_source_positions") if whisper else None
    max_q = f.int("max_target_positions") if whisper else None
    enc = tuple(range(enc_layers))
    dec = tuple(range(dec_layers))
    # Whisper scales q in its projection (attention scaling 1.0) and hands the attention contiguous tensors.
    enc_scale, dec_scale = (1.0, 1.0) if whisper else (enc_dim**-0.5, dec_dim**-0.5)
    layout = "bhsd" if whisper else None
    return (
        Attention("encoder", enc, enc_heads, enc_heads, enc_dim, enc_scale, False, fixed_kv=fixed, layout=layout),
        Attention("self", dec, dec_heads, dec_heads, dec_dim, dec_scale, True, max_q=max_q, layout=layout),
        Attention(
            "cross", dec, dec_heads, dec_heads, dec_dim, dec_scale, False, fixed_kv=fixed, max_q=max_q, q_layout=layout
        ),
    )


def _t5(f: _Fields) -> tuple[Attention, ...]:
    """T5 and mT5: num_heads heads of d_kv (not d_model / heads), no scaling
    (the 1/sqrt(d) is folded into the weights), num_layers encoder layers and
    num_decoder_layers (default num_layers) decoder layers, the relative
    position bias (relative_attention_num_buckets, _max_distance) on every call."""
    heads, dim = f.int("num_heads"), f.int("d_kv")
    for name, default in (
        ("d_model", None),
        ("relative_attention_num_buckets", 32),
        ("relative_attention_max_distance", 128),
    ):
        f.int(name, default)  # read, so a bad config is refused naming the field
    enc = tuple(range(f.int("num_layers")))
    dec = tuple(range(f.int("num_decoder_layers", len(enc))))
    return (
        Attention("encoder", enc, heads, heads, dim, 1.0, False, position_bias=True),
        Attention("self", dec, heads, heads, dim, 1.0, True, position_bias=True),
        Attention("cross", dec, heads, heads, dim, 1.0, False, position_bias=True),
    )


def ranges(layers: tuple[int, ...]) -> str:
    """``0-3,6`` for (0, 1, 2, 3, 6)."""
    parts: list[str] = []
    start = prev = None
    for n in layers + (None,):  # type: ignore[operator]
        if start is not None and n == prev + 1:  # type: ignore[operator]
            prev = n
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = n
    return ",".join(parts)
