"""graphcache as a Hugging Face transformers attention backend.

    import graphcache.hf
    graphcache.hf.register()                      # once, before building the model
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="graphcache")
    # or: model.set_attn_implementation("graphcache")

Every attention call of the model then goes through graphcache.torch's
runtime: the same configuration (``graphcache.torch.configure``,
GRAPHCACHE_SDPA_ON_MISS, GRAPHCACHE_SHAPE_CLASSES), the same counters
(``graphcache.torch.stats()``) and the same ``graphcache.torch.record()``.
The backend receives padding as transformers' flash-attention paths do, a
per-token (batch, kv) mask, and turns it into per-sequence lengths (ragged
offsets into the padded tensors), never a bias; what no graph can express
falls back to transformers' own ``sdpa`` (or the model's ``eager`` where sdpa
refuses) under a named reason. docs/models.md has the table.

Importing this module imports neither torch nor transformers; ``register()``
imports both and checks the transformers version (SUPPORTED).
"""

from __future__ import annotations

from graphcache.errors import UnsupportedVersion

NAME = "graphcache"
# The transformers releases this backend was written against and tested on
# (the attention and mask interfaces, their keyword arguments, masking_utils'
# mask functions): 5.24.0 and 5.25.0. Others in the range are expected to work.
SUPPORTED = ">=5.24,<6"
_LOWEST, _BELOW = (5, 24), (6, 0)

__all__ = ["NAME", "SUPPORTED", "check_version", "register"]


def check_version(version: str) -> None:
    """Raise UnsupportedVersion unless transformers ``version`` is in SUPPORTED."""
    try:
        found = tuple(int(part) for part in version.split("+")[0].split(".")[:2])
    except ValueError:
        found = ()
    if len(found) != 2 or not (_LOWEST <= found < _BELOW):
        raise UnsupportedVersion(
            f"graphcache.hf supports transformers {SUPPORTED} (tested on 5.24.0 and 5.25.0); found {version}: "
            f"pip install 'transformers{SUPPORTED}', or run the model with attn_implementation='sdpa' "
            "under graphcache.torch.patch()"
        )


def register(name: str = NAME) -> None:
    """Register ``name`` (default "graphcache") with transformers'
    AttentionInterface (the attention function) and AttentionMaskInterface
    (the mask function that hands it the per-token padding mask). Calling it
    again is harmless.

    Raises UnsupportedVersion for a transformers release outside SUPPORTED,
    ImportError where transformers or torch is not installed.
    """
    import transformers
    from transformers import AttentionInterface, AttentionMaskInterface

    check_version(transformers.__version__)

    from graphcache.hf.backend import attention
    from graphcache.hf.masks import padding_mask

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, padding_mask)
