"""Compilers turn specs into artifacts and artifacts into runnable graphs.

Nothing here imports torch or cudnn at import time.
"""

from __future__ import annotations

from graphcache.compilers.base import Compiler, LoadedGraph

__all__ = ["Compiler", "LoadedGraph"]
