"""``graphcache.torch.install()``: graphcache's kernels at PyTorch's own door.

Registers ``graphcache.torch.aten``'s kernels for
``aten::_scaled_dot_product_cudnn_attention`` and its backward at a dispatch
key with ``torch.library.Library("aten", "IMPL")``: ``CUDA`` where torch has
CUDA, else ``CPU`` (on a CPU only direct callers of the op reach it: torch's
SDPA never picks cuDNN there, and torch has no CPU kernel for the op). The
op's autograd kernel and the C++ worker ops (``aten::_cudnn_attention_*``,
the fallback) are left as they are.

A key's kernels are registered once; a later ``install()`` counts, and each
handle's ``uninstall()`` gives back one count, the last removing exactly
what was registered (torch's dispatcher then serves with whatever was there
before: another provider's kernel, or torch's own). Another provider's
kernel at the key (cudnn-frontend's ``cudnn.torch.install_sdpa_overrides()``,
also what ``torch.backends.cuda.enable_cudnn_sdp_python(True)`` and
``activate_flash_attention_impl("CUDNN")`` install) is never left to serve
silently beside graphcache's: the last registered serves (torch's
dispatcher), ``install()`` puts graphcache's on top with a warning naming
the other, and ``kernels()`` and ``stats()`` say which one serves now, with
a warning, once, where another was registered over graphcache's since.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from graphcache.torch import aten
from graphcache.torch.runtime import RUNTIME

log = logging.getLogger(__name__)

KEYS = ("CUDA", "CPU")
HERE = str(Path(__file__).resolve())  # the file torch's dispatcher names as our kernels' registrar

_lock = threading.Lock()
_libs: dict[str, list[Any]] = {}  # dispatch key -> graphcache's Library objects there (the last serves)
_counts: dict[str, int] = {}
_warned: set[tuple[str, str]] = set()


class Installation:
    """What one ``install()`` holds; ``uninstall()`` gives it back (once), and
    ``with graphcache.torch.install():`` uninstalls on exit."""

    def __init__(self, dispatch_key: str) -> None:
        self.dispatch_key = dispatch_key
        self.active = True

    def uninstall(self) -> None:
        """Give back this installation; the last one at the key removes
        graphcache's kernels there. Calling it again does nothing."""
        with _lock:
            if not self.active:
                return
            self.active = False
            left = _counts.get(self.dispatch_key, 0) - 1  # 0 already where uninstall() removed them
            _counts[self.dispatch_key] = max(left, 0)
            if left == 0:
                _remove(self.dispatch_key)

    def __enter__(self) -> Installation:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.uninstall()

    def __repr__(self) -> str:
        return f"<graphcache.torch installation at {self.dispatch_key}: {'active' if self.active else 'uninstalled'}>"


def install(dispatch_key: str | None = None) -> Installation:
    """Serve ``aten::_scaled_dot_product_cudnn_attention`` and its backward
    from graphcache at ``dispatch_key`` (``"CUDA"`` where torch has CUDA,
    else ``"CPU"``). Returns the handle that uninstalls it; installing again
    is harmless (counted). Where another provider's kernel serves the key,
    graphcache's goes on top, with a warning naming it.

    Raises ValueError for a key other than CUDA or CPU, SettingsError for a
    bad GRAPHCACHE_SDPA_ON_MISS (here, not at the first miss).
    """
    key = dispatch_key or ("CUDA" if torch.cuda.is_available() else "CPU")
    if key not in KEYS:
        raise ValueError(f"dispatch_key={dispatch_key!r}: graphcache's kernels go at 'CUDA' or 'CPU'")
    RUNTIME.on_miss()
    with _lock:
        other = owner(key)
        if not _libs.get(key) or not _ours(other):
            if other is not None and not _ours(other) and not other.endswith((".cpp", ".cu")):
                warnings.warn(
                    f"graphcache.torch.install(): {describe(other)} served aten::{aten.FORWARD} at the {key} key; "
                    "graphcache's kernels serve it now, and that provider's serve again after "
                    "graphcache.torch.uninstall() (it stays registered beneath)",
                    UserWarning,
                    stacklevel=2,
                )
            _libs.setdefault(key, []).append(_register(key))
        _counts[key] = _counts.get(key, 0) + 1
    return Installation(key)


def uninstall(dispatch_key: str | None = None) -> None:
    """Remove graphcache's kernels at ``dispatch_key`` (every key where None),
    whatever handles are still held."""
    with _lock:
        for key in [dispatch_key] if dispatch_key else list(_libs):
            _remove(key)


def kernels() -> dict[str, str]:
    """Where graphcache installed its kernels: which kernel serves each of
    those dispatch keys now, ``graphcache`` or the other provider registered
    over it since (then logged as a warning, once)."""
    with _lock:
        keys = [k for k, libs in _libs.items() if libs]
    found = {}
    for key in keys:
        other = owner(key)
        found[key] = "graphcache" if _ours(other) else describe(other)
        if found[key] != "graphcache" and (key, found[key]) not in _warned:
            _warned.add((key, found[key]))
            log.warning(
                "graphcache's kernel for aten::%s at %s is shadowed by %s, registered after "
                "graphcache.torch.install(): calls reach that provider, not graphcache (graphcache.torch.install() "
                "again puts graphcache's on top)",
                aten.FORWARD,
                key,
                found[key],
            )
    return found


def owner(key: str, op: str = aten.FORWARD) -> str | None:
    """The file that registered ``aten::op``'s kernel at ``key``, as torch's
    dispatcher records it (``torch._C._dispatch_dump``), or None."""
    dump = torch._C._dispatch_dump(f"aten::{op}")
    match = re.search(rf"^{key}: registered at (\S+?)(?::\d+)? ::", dump, re.MULTILINE)
    return match[1] if match else None


def describe(path: str | None) -> str:
    """Who a kernel registered from ``path`` belongs to, in words."""
    if path is None:
        return "no kernel"
    if _ours(path):
        return "graphcache"
    if path.replace("\\", "/").endswith("cudnn/torch/sdpa_provider.py"):
        return f"cudnn-frontend's SDPA provider (cudnn.torch, installed by {_route()})"
    if path.endswith((".cpp", ".cu")):
        return "PyTorch's own kernel"
    return f"a Python kernel registered at {path}"


def _route() -> str:
    """How cudnn-frontend's provider was installed: torch's own switch
    (torch main, pytorch#195981), the flash-attention registry (torch 2.13,
    2.14) or a direct call."""
    cuda = torch.backends.cuda
    enabled = getattr(cuda, "cudnn_sdp_python_enabled", None)
    if callable(enabled) and enabled():
        return "torch.backends.cuda.enable_cudnn_sdp_python(True)"
    current = getattr(torch.nn.attention, "current_flash_attention_impl", None)
    if callable(current) and current() == "CUDNN":
        return 'torch.nn.attention.activate_flash_attention_impl("CUDNN")'
    return "cudnn.torch.install_sdpa_overrides()"


def _ours(path: str | None) -> bool:
    return bool(path) and str(Path(str(path)).resolve()) == HERE


def _register(key: str) -> Any:
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        # torch warns once when a kernel goes over another at the key: meant here, and said above.
        warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
        lib.impl(aten.FORWARD, aten.forward, key)
        lib.impl(aten.BACKWARD, aten.backward, key)
    return lib


def _remove(key: str) -> None:
    for lib in reversed(_libs.pop(key, [])):
        lib._destroy()
    _counts[key] = 0
