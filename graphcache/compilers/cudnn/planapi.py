"""What the modules that run a loaded plan (``override``, ``padded``,
``backward``) read of it and of its compiler, as Protocols:
``loaded.CudnnGraph`` imports them, so they cannot import it. And ``on``,
the plan's GPU as the current device.

May import: graphcache.spec/uids; torch lazily.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from graphcache.spec import GraphSpec
from graphcache.spec.uids import UidMap


class Loader(Protocol):
    """What a loaded plan uses of the compiler that loaded it
    (``CudnnCompiler`` is one): its GPU, the lock that makes work on its
    handle take turns, and the handle, bound to the current stream."""

    @property
    def device(self) -> int: ...

    @property
    def _lock(self) -> Any: ...

    def handle(self) -> Any: ...


class ClassGraph(Protocol):
    """What a class graph's execution reads of the loaded plan
    (``loaded.CudnnGraph`` is one)."""

    # fmt: off
    @property
    def spec(self) -> GraphSpec: ...
    @property
    def uids(self) -> UidMap: ...
    @property
    def device(self) -> Any: ...
    @property
    def artifact(self) -> Any: ...
    @property
    def workspace_size(self) -> int: ...
    @property
    def workspace(self) -> Any: ...
    @property
    def _workspaces(self) -> dict[int, Any]: ...
    @property
    def _graph(self) -> Any: ...
    @property
    def _compiler(self) -> Loader: ...
    def execute(
        self, q: Any, k: Any, v: Any, *, out: Any = None, seq_len_q: Any = None, seq_len_kv: Any = None
    ) -> Any: ...
    # fmt: on


def on(device: Any) -> Any:
    """The GPU's context (a CPU stand-in of the frontend graph, in tests, needs none)."""
    import torch

    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
