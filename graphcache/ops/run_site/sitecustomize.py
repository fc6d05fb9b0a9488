"""Python runs this module at start-up in every process ``graphcache run``
starts (its folder is first on PYTHONPATH there): graphcache's doors once the
program imports torch (graphcache.ops.launch.bootstrap), then the
``sitecustomize`` the environment had, if any, as Python would have run it.
Nothing else lives in this folder: every name here would shadow a module of
the program's."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _graphcache() -> None:
    if not os.environ.get("GRAPHCACHE_RUN_DIR"):
        return
    try:
        from graphcache.ops.launch import bootstrap
    except ImportError as exc:
        print(f"graphcache run: {sys.executable} cannot import graphcache ({exc}): install it there", file=sys.stderr)
        return
    bootstrap()


def _theirs() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_graphcache()
_theirs()
