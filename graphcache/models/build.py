"""A transformers model built from a config.json for a trace: on the meta
device (no weights, no memory), in eval mode, with the attention
implementation of the route, or refused naming why.

Refusals name the feature and transformers' own reason: a model_type the
installed transformers does not know, one transformers refuses sdpa for
(MPT, Bloom, DeBERTa-v2, ...: its "does not support an attention
implementation through torch.nn.functional.scaled_dot_product_attention
yet"), one whose attention does not dispatch through transformers'
AttentionInterface (route ``graphcache`` only: Falcon up to transformers
5.24, found by building it: 5.25's Falcon dispatches), and a config
transformers cannot build from.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import ManifestError

EXTRA = "hf"
ROUTE_IMPLEMENTATION = {"sdpa": "sdpa", "graphcache": "graphcache"}
SOFTCAP = ", its attention caps scores (softcap)"


def libraries() -> tuple[Any, Any]:
    """torch and transformers, or ManifestError naming the extra that has them."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ManifestError(
            f"graphcache manifest traces the model with torch and transformers ({exc.name or exc} is not installed): "
            f"pip install 'graphcache[{EXTRA}]' (or --method config: the offline reader of the families it knows)"
        ) from None
    return torch, transformers


def config_of(data: dict[str, Any], source: str) -> Any:
    """The transformers config of a config.json's mapping; ManifestError
    for a missing or unknown model_type, or fields transformers refuses."""
    _, transformers = libraries()
    from transformers import CONFIG_MAPPING

    from graphcache.models.config import special_floats

    data = special_floats(data)  # {"__float__": "Infinity"}, as transformers 5 writes it
    kind = data.get("model_type")
    if kind is None:
        raise ManifestError(f"{source}: model_type is missing (a transformers config.json names its model_type)")
    if kind == "mistral" and "layer_types" in data:
        kind = "ministral"  # AutoConfig.from_pretrained's own rule: alternating attention is ministral's
    if kind not in CONFIG_MAPPING:
        raise ManifestError(
            f"{source}: model_type {kind!r} is not a model transformers {transformers.__version__} knows "
            "(models that need trust_remote_code are not traced): record a run with graphcache record"
        )
    try:
        return CONFIG_MAPPING[kind].from_dict({**data, "model_type": kind})
    except Exception as exc:  # noqa: BLE001 - transformers' (and huggingface_hub's strict dataclass) refusal, named
        raise ManifestError(f"{source}: transformers cannot read this {kind} config: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    """An exception's text on one line: huggingface_hub's strict-dataclass
    errors ("Validation error for field 'x':" then the cause) put the field
    on the first line and the reason on the next."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines) or type(exc).__name__


def model_of(config: Any, route: str, dtype: str, source: str) -> Any:
    """The model of ``config`` on the meta device, for ``route``."""
    torch, transformers = libraries()
    if route == "graphcache":
        import graphcache.hf

        graphcache.hf.register()
    kind = config.model_type
    mapped = transformers.AutoModel._model_mapping
    cls = mapped[type(config)] if type(config) in mapped else None
    if route == "graphcache" and cls is not None and not cls._supports_sdpa and not cls._supports_attention_backend:
        try:  # transformers' own words for the sdpa refusal
            model_of(config, "sdpa", dtype, source)
        except ManifestError as exc:
            reason = str(exc)
            raise ManifestError(f"{reason}, and lets no attention backend serve it either") from None
    try:
        with torch.device("meta"):
            model = transformers.AutoModel.from_config(
                config, attn_implementation=ROUTE_IMPLEMENTATION[route], dtype=getattr(torch, dtype)
            )
    except ValueError as exc:
        text = str(exc).split("\n")[0]
        if "scaled_dot_product_attention" in text or "sdpa" in text.lower():
            first = text.split(". ")[0].rstrip(".")
            why = _why_no_sdpa(config)
            if why == SOFTCAP:  # the backend route refuses it too (every call softcap): never send the user there
                hint = (
                    ": no route serves softcap (cudnn-frontend cannot serialize a score modifier), so there is "
                    "no graph to warm for this model; it runs as it is, on transformers' eager attention"
                )
            elif getattr(cls, "_supports_attention_backend", 0):
                hint = ": try --route graphcache, the graphcache backend"
            else:
                hint = ""
            raise ManifestError(
                f"{source}: transformers {transformers.__version__} refuses sdpa for model_type {kind!r} "
                f"({first}){why}{hint}"
            ) from None
        raise ManifestError(f"{source}: transformers cannot build model_type {kind!r}: {text}") from None
    except KeyError as exc:
        if route == "graphcache":
            raise ManifestError(
                f"{source}: model_type {kind!r} does not dispatch its attention through transformers' "
                f"AttentionInterface (building it with attn_implementation='graphcache' raised KeyError {exc}), so "
                "the graphcache backend cannot serve it: use --route sdpa (graphcache.torch.patch() over sdpa)"
            ) from None
        raise ManifestError(f"{source}: transformers cannot build model_type {kind!r}: KeyError {exc}") from None
    return model.eval()


def no_backend(kind: str, source: str) -> ManifestError:
    """A model built with the graphcache backend that never called it."""
    return ManifestError(
        f"{source}: model_type {kind!r} made no attention call through the graphcache backend: its attention "
        "does not dispatch through transformers' AttentionInterface; use --route sdpa"
    )


def _why_no_sdpa(config: Any) -> str:
    """The attention feature behind transformers' refusal, where the config names it."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "attn_logit_softcapping", None) is not None:
        return SOFTCAP
    if getattr(text, "model_type", "") == "gpt_oss":
        return ", its attention has sinks (s_aux)"
    return ""
