"""graphcache for ordinary PyTorch code: a drop-in for
``torch.nn.functional.scaled_dot_product_attention`` served from cached
cuDNN graphs, one for ``torch.nn.attention.varlen.varlen_attn``
(``varlen_attn``: ragged and paged-KV graphs, docs/serving-engines.md),
``patch()`` to route a model's calls through them, ``install()`` to serve
PyTorch's own door (``aten::_scaled_dot_product_cudnn_attention`` and its
backward, what torch's SDPA calls when it picks cuDNN; docs/two-doors.md),
and ``record()`` to write the manifest of the specs a real run makes.

Importing this module imports torch (nothing else in graphcache does), and
registers the ``graphcache::sdpa`` custom op that torch.compile traces.

A package per door, where its calls enter: ``sdpa`` (the drop-in,
``patch()``), ``aten`` (``install()``'s kernels), ``varlen``
(``varlen_attn``), ``backward`` (``sdpa_backward``); ``core``, the shared
core they all go through (call to spec, the per-process runtime and memo,
counts, the guard); ``recording``, ``record()``, which every door reports to.

    import graphcache.torch as gt

    with gt.patch():                 # nn.MultiheadAttention, HF "sdpa" models, ...
        out = model(**inputs)
    gt.stats()                       # calls, served_from_store (hits), built_here, fallbacks by reason
    print(gt.summary())              # the same in one line

    with gt.record("manifest.yaml", dtype="bfloat16"):
        model.generate(...)          # then: graphcache warm manifest.yaml

A miss on an eligible spec does what GRAPHCACHE_SDPA_ON_MISS says: ``torch``
(default: run torch's SDPA, count and remember the miss), ``build`` (build,
store, use) or ``error`` (raise NotFound).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch as _torch

# enable_gqa (torch 2.5) and torch.library.custom_op (2.4) are part of the contract.
if tuple(int(p) for p in _torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
    raise ImportError(f"graphcache.torch needs torch >= 2.5, found {_torch.__version__}: pip install -U torch")

import graphcache as _graphcache
from graphcache.cache import GraphCache
from graphcache.errors import UnsupportedCall
from graphcache.torch.aten.install import Installation, install, kernels, uninstall
from graphcache.torch.core import counts as _counts
from graphcache.torch.core.derive import spec_for
from graphcache.torch.core.onmiss import ON_MISS, ON_MISS_VAR
from graphcache.torch.recording import Recorder, record
from graphcache.torch.sdpa import RUNTIME, disable, enable, enabled, patch, scaled_dot_product_attention
from graphcache.torch.varlen import varlen_attn

# The modules' old names stay attributes of this package (``gt.derive``,
# ``gt.runtime``), as before the doors had packages of their own; their old
# import paths are graphcache.MOVED's.
for _old, _new in _graphcache.MOVED.items():
    if _old.rpartition(".")[0] == __name__:
        globals()[_old.rpartition(".")[2]] = importlib.import_module(_new)
del _old, _new

__all__ = [
    "ON_MISS",
    "ON_MISS_VAR",
    "Installation",
    "Recorder",
    "UnsupportedCall",
    "configure",
    "disable",
    "enable",
    "enabled",
    "install",
    "kernels",
    "patch",
    "record",
    "reset",
    "scaled_dot_product_attention",
    "spec_for",
    "stats",
    "summary",
    "uninstall",
    "varlen_attn",
]


def stats() -> dict[str, Any]:
    """This process's drop-in counters (graphcache.torch.counts): ``calls``;
    ``served_from_store`` (= ``hits``: calls served by a graph the store
    held); ``built_here`` (calls served by a graph this process built on a
    miss, on_miss ``build``: no hit) and ``built_graphs`` (those graphs, one
    line each, the most recent 1,024; ``built_graphs_dropped`` counts the rest); ``misses`` (calls whose graph the store did not
    hold: built here, ran torch, or raised);
    ``fallbacks`` (calls that ran torch's SDPA or varlen kernel, by reason:
    miss, mask, dtype, head_dim, not_4d, empty, device, autograd, unsupported,
    known_bad, no_gpu, execute_failed, capture, and for varlen_attn
    num_splits, window, page_size, layout, ...; at the aten door attn_bias,
    dropout, debug_mask), ``copies`` and ``copied`` (tensors of served calls
    copied into a layout a graph reads, by tensor and reason:
    head_dim_stride, broadcast, overlap, strides; graphcache.torch.derive),
    ``execute_failures`` (the (graph, call shape) pairs whose execute raised:
    graphcache.torch.guard), ``graphs_loaded`` (and ``graphs_dropped``: the
    loaded graphs kept are the most recent 4,096), ``shapes_served`` (the
    distinct call shapes the loaded graphs served: under length classes, many
    per graph), ``missed_specs`` (the most recent 1,024 specs that missed,
    with their calls; ``missed_specs_dropped`` counts the older ones), and ``doors``: per door a call came through
    (sdpa, aten, aten_backward, varlen, hf) its calls, hits, built_here,
    relayed calls and fallbacks by reason. A call is counted once, at the door that decided
    it; backward calls only under ``doors``. Where install() registered
    kernels, ``kernels`` says which serves each key now
    (graphcache.torch.kernels())."""
    found = RUNTIME.stats()
    served = kernels()
    if served:
        found["kernels"] = served
    return found


def summary() -> str:
    """``stats()`` in one line: ``16 calls: 0 served from the store, 16 by
    graphs built here (2 built: ...), 0 fell back to torch``."""
    return _counts.summary(RUNTIME.stats())


def configure(cache: GraphCache | None = None, *, device: Any = None, on_miss: str | None = None) -> None:
    """Serve tensors on ``device`` from ``cache`` instead of the default
    (``GraphCache.from_env()`` with the cuDNN compiler, made at the first
    CUDA call). ``on_miss`` overrides GRAPHCACHE_SDPA_ON_MISS."""
    RUNTIME.configure(cache, device=device, on_miss=on_miss)


def reset() -> None:
    """Forget loaded graphs, remembered misses, counters and configure()."""
    RUNTIME.reset()
