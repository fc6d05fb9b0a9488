"""The graph recipe version: which graph a spec turns into.

The key covers it, so that a change to how graphcache builds a spec's graph
(tensor dtypes, mask bounds, tensor layout, UIDs set, plan filters) makes
every old entry a miss instead of serving a plan built from the old recipe.
Bump it in the same commit as such a change; ``graphcache.compilers.cudnn``
re-exports it as ``RECIPE_VERSION``.

History:
    1  the first recipe (graphcache 0.1, before the number existed)
    2  plans restricted to runtime-compiled engines (behavior notes) before
       check_support; the stored blob is round-tripped before it is stored
"""

from __future__ import annotations

RECIPE_VERSION = 2
