"""What ops and engineers run: the deploy verbs' library (``deploy``: warm,
warm --check, purge; ``explain``), manifests (``manifest``: read and expanded),
cold-vs-warm benchmarks (``bench``, each sample in a fresh process:
``benchrun``) and what a host can do (``doctor``).

``from graphcache import ops`` then ``ops.warm(...)``, ``ops.check(...)``,
``ops.purge(...)``, ``ops.explain(...)``, as before these were a package;
``from graphcache import manifest`` is ``graphcache.ops.manifest``.
"""

from __future__ import annotations

from graphcache.ops.deploy import CheckRow, Progress, WarmRow, check, purge, warm
from graphcache.ops.explain import Candidate, Explanation, explain

__all__ = ["Candidate", "CheckRow", "Explanation", "Progress", "WarmRow", "check", "explain", "purge", "warm"]
