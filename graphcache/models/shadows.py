"""Meta tensors that remember the values of the small ones.

A model built on the ``meta`` device runs its forward for free (no memory, no
arithmetic: shapes only), but code that reads a value on the host (a padding
mask's ``.all()``, ``.tolist()``, ``bool(t)``) fails there, and that is
exactly the code that decides which attention a call makes: transformers'
mask functions and graphcache.hf's own. ``Shadows`` (a TorchDispatchMode)
runs every op as usual and, where each meta input has a known value and the
result is small (``limit`` elements), runs the op once more on CPU copies of
those values (the shadows) and keeps the result beside the meta output. A
host read of a meta tensor then answers from its shadow. Token ids, position
ids, padding masks and cache positions are small and so are known; hidden
states and weights are large and stay shapes only. A host read of a tensor
whose value is not known (one computed from activations: a router's choice
of experts, say) raises ``UnknownValue`` naming the op.

The shadow of a view is a view of its base's shadow, so in-place writes
through views stay consistent; an in-place write whose inputs are not all
known drops the written tensor's shadow.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

LIMIT = 1 << 21  # elements, by default: a (64, 8192) padding mask is 2**19
_ATTR = "_graphcache_shadow"
_aten = torch.ops.aten
_READS = {_aten._local_scalar_dense.default}
_COPIES = {_aten._to_copy.default}


class UnknownValue(RuntimeError):
    """A host read of a meta tensor whose value the tracer does not know."""


def shadow(t: Any) -> torch.Tensor | None:
    """The CPU tensor holding ``t``'s value, where it is known."""
    return t.__dict__.get(_ATTR) if isinstance(t, torch.Tensor) else None


def _is_meta(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "meta"


def _on_cpu(x: Any) -> Any:
    """An op argument as the shadow op takes it: meta tensors by their
    shadows, the meta device as the CPU."""
    if _is_meta(x):
        return shadow(x)
    if isinstance(x, torch.device) and x.type == "meta":
        return torch.device("cpu")
    return x


def _leaves(x: Any) -> list[Any]:
    """The tensors and devices in an op's arguments or results (lists,
    tuples and dicts of them: all an aten op takes or gives)."""
    if isinstance(x, (list, tuple)):
        return [leaf for item in x for leaf in _leaves(item)]
    if isinstance(x, dict):
        return [leaf for item in x.values() for leaf in _leaves(item)]
    return [x]


def _map(fn: Any, x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        items = [_map(fn, item) for item in x]
        if isinstance(x, list):
            return items
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)  # a namedtuple, or a tuple / structseq
    if isinstance(x, dict):
        return {k: _map(fn, v) for k, v in x.items()}
    return fn(x)


def _attach(out: Any, values: Any) -> None:
    for o, v in zip(_leaves(out), _leaves(values), strict=False):
        if _is_meta(o) and isinstance(v, torch.Tensor):
            o.__dict__[_ATTR] = v


class _Literals(TorchFunctionMode):
    """``torch.tensor(data, device="meta")`` and ``as_tensor``: data that never
    reaches the dispatcher, kept as the new meta tensor's shadow."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in (torch.tensor, torch.as_tensor) and _is_meta(out) and not isinstance(args[0], torch.Tensor):
            value = func(*args, **{**kwargs, "device": "cpu"})
            if value.numel() <= self.limit:
                out.__dict__[_ATTR] = value
        return out


class Shadows(TorchDispatchMode):
    """Within this mode, meta tensors carry CPU shadows of their values where
    those are small (at most ``limit`` elements) and computed from known
    values (see the module's text). A tracer sets ``limit`` to the largest
    padding mask it makes: (q, kv) matrices of position ids and biases are
    larger and need no value, and computing theirs is most of the cost."""

    def __init__(self, limit: int = LIMIT) -> None:
        super().__init__()
        self.limit = limit

    def __enter__(self) -> Shadows:
        self._literals = _Literals(self.limit)
        self._literals.__enter__()
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._literals.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        metas = [x for x in _leaves((args, kwargs)) if _is_meta(x)]
        known = all(shadow(m) is not None for m in metas)
        if func in _READS and metas:
            value = shadow(args[0])
            if value is None:
                raise UnknownValue(_unknown(func, args[0]))
            return value.item()
        if func in _COPIES and metas and _leaves_meta(kwargs):
            value = shadow(args[0])
            if value is None:
                raise UnknownValue(_unknown(func, args[0]))
            return func(value, **_map(_on_cpu, kwargs))
        try:
            out = func(*args, **kwargs)
        except (NotImplementedError, RuntimeError):
            # A data-dependent op meta cannot size (nonzero, masked_select, ...):
            # its result's shape comes from the values, where they are known.
            if not (metas and known):
                raise
            values = func(*_map(_on_cpu, args), **_map(_on_cpu, kwargs))
            out = _map(lambda v: torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) else v, values)
            _attach(out, values)
            return out
        outs = [o for o in _leaves(out) if _is_meta(o)]
        if not outs:
            return out
        if known and all(o.numel() <= self.limit for o in outs) and all(_small(m, self.limit) for m in metas):
            values = func(*_map(_on_cpu, args), **_map(_on_cpu, kwargs))
            _attach(out, values)
        else:
            for o in outs:  # written with unknown inputs (or too large): its value is no longer known
                o.__dict__.pop(_ATTR, None)
        return out


def _small(t: torch.Tensor, limit: int) -> bool:
    value = shadow(t)
    return value is not None and value.numel() <= limit


def _leaves_meta(kwargs: dict[str, Any]) -> bool:
    device = kwargs.get("device")
    return device is not None and torch.device(device).type != "meta"


def _unknown(func: Any, t: torch.Tensor) -> str:
    return (
        f"{func} read the value of a meta tensor of shape {tuple(t.shape)} ({t.dtype}) that the trace does not "
        "know: a value computed from the model's activations decides control flow here"
    )
