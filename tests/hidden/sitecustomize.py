"""Makes this Python behave as if some packages were not installed.

Tests run the CLI with this folder first on PYTHONPATH and
GRAPHCACHE_TEST_HIDE=torch,cudnn,... to check the paths of a host without
them (the server host the README installs has no torch). A hidden name, and
everything under it, raises ModuleNotFoundError on import, as a missing
package does; subprocesses inherit PYTHONPATH and the variable, so they are
hidden there too.
"""

from __future__ import annotations

import os
import sys
from importlib.abc import MetaPathFinder

HIDDEN = tuple(n.strip() for n in os.environ.get("GRAPHCACHE_TEST_HIDE", "").split(",") if n.strip())


class _Hide(MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if HIDDEN:
    sys.meta_path.insert(0, _Hide())
