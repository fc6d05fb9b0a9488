"""The shared core every door of graphcache.torch goes through: one per
process, for every door and thread.

- ``derive``, ``bias``: call to spec. A call's GraphSpec from its shapes,
  strides and dtypes (layouts read off strides, a mask as a bias spec), or
  ``UnsupportedCall`` with the reason.
- ``plan``: what the calls of one shape do (``Plan``): run a loaded graph,
  or fall back to torch for a named reason.
- ``runtime``, ``memo``, ``onmiss``: the per-process state (``RUNTIME``):
  the cache and device, loaded graphs by spec, the memo from call shape to
  plan and its bounds, the miss policy (GRAPHCACHE_SDPA_ON_MISS).
- ``counts``, ``doors``: what each call was served by, counted once at the
  door that decided it; the relay between doors, and nothing built while a
  CUDA stream captures.
- ``guard``: a cached graph that raises at execute; the exact graph or
  torch serves, and the pair is never tried again.

Nothing here imports a door (``graphcache.torch.sdpa``, ``.aten``,
``.varlen``, ``.backward``) or ``graphcache.torch.recording``: they import it.
This ``__init__`` imports nothing; the modules are imported by their full
names (``from graphcache.torch.core.runtime import RUNTIME``).
"""
