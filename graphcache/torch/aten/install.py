"""``graphcache.torch.install()``: graphcache's kernels at PyTorch's own door.

Registers ``graphcache.torch.aten``'s kernels for
``aten::_scaled_dot_product_cudnn_attention`` and its backward at a dispatch
key with ``torch.library.Library("aten", "IMPL")``: ``CUDA`` where torch has
CUDA, else ``CPU`` (on a CPU only direct callers of the op reach it: torch's
SDPA never picks cuDNN there, and torch has no CPU kernel for the op). The
op's autograd kernel and the C++ worker ops (``aten::_cudnn_attention_*``,
the fallback) are left as they are.

A key's kernels are registered once per process, the first time
``install()`` asks for that key, and never removed: torch's dispatcher
reads its kernel table without a lock, and a registration destroyed while
another thread's call is inside it crashed the process (a segfault, or a
forward call reaching the backward kernel through memory the destroy had
freed). ``install()`` and ``uninstall()`` switch serving on and off instead:
each ``install()`` counts, each handle's ``uninstall()`` gives back one
count, and at the last one graphcache's kernels pass every call on to the
kernel that served the key before graphcache's was registered (torch's
dispatcher's own record of it, ``torch.library.get_kernel``: another
provider's kernel, or torch's own; where there was none, as on a CPU, the
call raises NotImplementedError as torch's dispatcher does). A call that
is already inside graphcache's kernel when ``uninstall()`` runs finishes
there; every later one is passed on. ``owner()`` and ``kernels()`` say
which kernel serves a key's calls now. Another provider's kernel at the key (cudnn-frontend's ``cudnn.torch.install_sdpa_overrides()``,
also what ``torch.backends.cuda.enable_cudnn_sdp_python(True)`` and
``activate_flash_attention_impl("CUDNN")`` install) is never left to serve
silently beside graphcache's: the last registered serves (torch's
dispatcher), ``install()`` puts graphcache's on top with a warning naming
the other (one more registration of graphcache's, kept as the first is),
and ``kernels()`` and ``stats()`` say which one serves now, with a warning,
once, where another was registered over graphcache's since.
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
from graphcache.torch.core.runtime import RUNTIME

log = logging.getLogger(__name__)

KEYS = ("CUDA", "CPU")
HERE = str(Path(__file__).resolve())  # the file torch's dispatcher names as our kernels' registrar
OPS = (aten.FORWARD, aten.BACKWARD)

_lock = threading.Lock()
_counts: dict[str, int] = {}  # dispatch key -> installations held there (serving while > 0)
_warned: set[tuple[str, str]] = set()
# torch.library.get_kernel (torch 2.9): the kernel that served a key before graphcache's, to pass calls on to.
_GET_KERNEL = getattr(torch.library, "get_kernel", None)


class _Switch:
    """Whether graphcache serves a key's calls: read by its kernels on every
    call (one attribute), set under ``_lock``."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False


class _Registration:
    """One registration of graphcache's kernels at a key (a ``Library`` kept
    for the life of the process) and, per op, the kernel that served the
    key when it was made (None: none), to which its kernels pass calls while
    graphcache is uninstalled there."""

    def __init__(self, key: str, switch: _Switch, below: _Registration | None) -> None:
        self.key = key
        self.switch = switch
        self.below = below  # graphcache's registration beneath this one at the key (None: the first)
        self.keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))
        self.beneath = {op: _kernel_at(op, key) for op in OPS}  # before this one goes on top
        self.lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # torch warns once when a kernel goes over another at the key: meant here, and said in install().
            warnings.filterwarnings("ignore", message=".*Overriding a previously registered kernel.*")
            self.lib.impl(aten.FORWARD, self._forward, key)
            self.lib.impl(aten.BACKWARD, self._backward, key)

    def _forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.switch.on:
            return aten.forward(*args, **kwargs)
        return self.pass_on(aten.FORWARD, args, kwargs)

    def _backward(self, *args: Any, **kwargs: Any) -> Any:
        if self.switch.on:
            return aten.backward(*args, **kwargs)
        return self.pass_on(aten.BACKWARD, args, kwargs)

    def pass_on(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call while graphcache is uninstalled at the key: the kernel that
        served the key before this registration; where that one has been
        removed since, the one before graphcache's registration beneath, and
        so on; where there was none, NotImplementedError as torch raises it."""
        found: _Registration | None = self
        while found is not None:
            kernel = found.beneath[op]
            if kernel is not None:
                try:
                    return kernel.call_boxed(found.keyset, *args, **kwargs)
                except RuntimeError as exc:
                    if "invalidated" not in str(exc):  # the kernel's own error, not its removal
                        raise
            found = found.below
        if _GET_KERNEL is None and self.key == "CUDA":  # a torch that cannot say: its own C++ kernel
            return aten.torch_kernel(op, args, kwargs)
        raise NotImplementedError(
            f"Could not run 'aten::{op}' with arguments from the '{self.key}' backend: graphcache's kernel there "
            "is uninstalled (graphcache.torch.install() serves it again), and torch has none of its own there"
        )


_registrations: dict[str, _Registration] = {}  # dispatch key -> graphcache's top registration there
_switches: dict[str, _Switch] = {}


class Installation:
    """What one ``install()`` holds; ``uninstall()`` gives it back (once), and
    ``with graphcache.torch.install():`` uninstalls on exit."""

    def __init__(self, dispatch_key: str) -> None:
        self.dispatch_key = dispatch_key
        self.active = True

    def uninstall(self) -> None:
        """Give back this installation; at the last one at the key,
        graphcache's kernels pass the key's calls on to the kernel that
        served it before (see the module's docs). Calling it again does nothing."""
        with _lock:
            if not self.active:
                return
            self.active = False
            left = _counts.get(self.dispatch_key, 0) - 1  # 0 already where uninstall() switched it off
            _counts[self.dispatch_key] = max(left, 0)
            if left <= 0:
                _off(self.dispatch_key)

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
    graphcache's goes on top, with a warning naming it. Safe beside calls
    on other threads: nothing registered is ever removed (see the module's docs).

    Raises ValueError for a key other than CUDA or CPU, SettingsError for a
    bad GRAPHCACHE_SDPA_ON_MISS (here, not at the first miss).
    """
    key = dispatch_key or ("CUDA" if torch.cuda.is_available() else "CPU")
    if key not in KEYS:
        raise ValueError(f"dispatch_key={dispatch_key!r}: graphcache's kernels go at 'CUDA' or 'CPU'")
    RUNTIME.on_miss()
    with _lock:
        top = next(iter(_registered(key)), None)  # the kernel serving there now
        if key not in _registrations or not _ours(top):
            if top is not None and not _ours(top) and not top.endswith((".cpp", ".cu")):
                warnings.warn(
                    f"graphcache.torch.install(): {describe(top)} served aten::{aten.FORWARD} at the {key} key; "
                    "graphcache's kernels serve it now, and that provider's serve again after "
                    "graphcache.torch.uninstall() (it stays registered beneath)",
                    UserWarning,
                    stacklevel=2,
                )
            switch = _switches.setdefault(key, _Switch())
            _registrations[key] = _Registration(key, switch, _registrations.get(key))
        _counts[key] = _counts.get(key, 0) + 1
        _switches[key].on = True
    return Installation(key)


def uninstall(dispatch_key: str | None = None) -> None:
    """Stop serving at ``dispatch_key`` (every key where None), whatever
    handles are still held: calls there pass on to the kernel that served
    it before."""
    with _lock:
        for key in [dispatch_key] if dispatch_key else list(_counts):
            _off(key)


def kernels() -> dict[str, str]:
    """Where graphcache is installed: which kernel serves each of those
    dispatch keys now, ``graphcache`` or the other provider registered
    over it since (then logged as a warning, once)."""
    with _lock:
        keys = [k for k, n in _counts.items() if n > 0]
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
    """The file that registered the kernel serving ``aten::op``'s calls at
    ``key`` now, or None: the kernel registered last there (torch's
    dispatcher's record, ``torch._C._dispatch_dump``), or, where that is
    graphcache's and graphcache is uninstalled, the one its calls pass on
    to, the first registration beneath that is not graphcache's."""
    switch = _switches.get(key)
    for path in _registered(key, op):
        if not (_ours(path) and not (switch is not None and switch.on)):
            return path
    return None


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


def _registered(key: str, op: str = aten.FORWARD) -> list[str]:
    """The files that registered ``aten::op``'s kernels at ``key``, the one
    that serves (registered last) first, as torch's dispatcher lists them."""
    dump = torch._C._dispatch_dump(f"aten::{op}")
    return re.findall(rf"^{key}(?: \(inactive\))?: registered at (\S+?)(?::\d+)? ::", dump, re.MULTILINE)


def _kernel_at(op: str, key: str) -> Any:
    """The kernel serving ``aten::op`` at ``key`` now, as torch's dispatcher
    hands it out to call (None where there is none, or this torch cannot
    hand it out: before 2.9)."""
    if _GET_KERNEL is None:
        return None
    try:
        return _GET_KERNEL(f"aten::{op}", key)
    except RuntimeError:  # "no kernel for CPU": torch has none there
        return None


def _off(key: str) -> None:
    """Stop serving at ``key`` (the lock held): nothing is removed, the kernels pass calls on."""
    _counts[key] = 0
    switch = _switches.get(key)
    if switch is not None:
        switch.on = False
