"""Which layer makes an attention call, and a model cut to the layers that
differ.

A transformers model is stacks of like layers (an ``nn.ModuleList`` of one
class whose members hold an attention module: a decoder's ``layers``, BERT's
``encoder.layer``, T5's ``block``). ``Where`` hooks every member of every
stack and every attention module inside one, so each call the trace notes
carries the stack, the layer's index and the attention (``self_attn``,
``encoder_attn``, ...) that made it.

``cut`` shortens each stack to its shortest prefix that holds one layer of
every kind, a kind being the calls a layer made in the probe forwards (so
layers of one type, full or sliding-window or chunked, are one kind). A
prefix, not a pick of layers, keeps every layer's index, which transformers
reads as it is (``config.layer_types[i]``, the cache's layer index).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Site:
    """Where a call was made: a stack's path in the model, the layer's index
    in it, and the attention module's path in the layer."""

    stack: str
    layer: int
    attention: str


def _attention_modules(layer: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """A layer's outermost attention modules (class name holding 'Attention')."""
    found: list[tuple[str, torch.nn.Module]] = []
    for name, module in layer.named_modules():
        if name and "Attention" in type(module).__name__ and not any(name.startswith(f + ".") for f, _ in found):
            found.append((name, module))
    return found


def stacks(model: torch.nn.Module) -> dict[str, torch.nn.ModuleList]:
    """The model's stacks of like layers that hold attention, by path."""
    out = {}
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) < 2:
            continue
        kinds = {type(m) for m in module}
        # Any member holding attention: a hybrid's first layers may be Mamba ones (Granite 4.0-H).
        if len(kinds) == 1 and any(_attention_modules(m) for m in module):
            out[path] = module
    return out


class Where:
    """The site of the call being made now (``site``), kept by hooks on the
    model's stacks, and on attention modules outside any stack (a UNet's
    blocks of one transformer layer each: their path is the site, layer -1);
    ``remove()`` takes the hooks off."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._frames: list[tuple[str, Any]] = []
        self._handles: list[Any] = []
        inside: set[int] = set()
        for path, stack in stacks(model).items():
            for index, layer in enumerate(stack):
                self._hook(layer, ("layer", (path, index)))
                inside.update(id(m) for m in layer.modules())
                for name, attention in _attention_modules(layer):
                    self._hook(attention, ("attention", name))
        for path, attention in _attention_modules(model):
            if id(attention) not in inside:
                self._hook(attention, ("layer", (path, -1)))

    def _hook(self, module: torch.nn.Module, frame: tuple[str, Any]) -> None:
        def enter(*_: Any) -> None:
            self._frames.append(frame)

        def leave(*_: Any) -> None:
            if self._frames and self._frames[-1] == frame:
                self._frames.pop()

        self._handles.append(module.register_forward_pre_hook(enter))
        self._handles.append(module.register_forward_hook(leave))

    def reset(self) -> None:
        """Forget frames a forward that raised left behind."""
        self._frames.clear()

    def site(self) -> Site | None:
        layer = next((f[1] for f in reversed(self._frames) if f[0] == "layer"), None)
        if layer is None:
            return None
        inner = [f[1] for f in self._frames if f[0] == "attention"]
        return Site(layer[0], layer[1], inner[-1] if inner else "")

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


@dataclass(frozen=True)
class Cut:
    """How a model was cut: per stack, its full length and the prefix kept,
    and each kept layer's kind (the layers of the full stack that call alike)."""

    lengths: dict[str, int]
    kept: dict[str, int]
    kinds: dict[tuple[str, int], tuple[int, ...]]

    def members(self, stack: str, layer: int) -> tuple[int, ...]:
        """The layers of the full model that call as ``layer`` of ``stack`` does."""
        return self.kinds.get((stack, layer), (layer,))

    @property
    def changed(self) -> bool:
        return any(self.kept[s] < self.lengths[s] for s in self.lengths)


def kinds_of(calls: list[tuple[Site | None, Any]], lengths: dict[str, int]) -> Cut:
    """The prefix of each stack that holds every kind of layer, from the
    probe's ``calls`` (site, what the call was) at full depth."""
    by_layer: dict[tuple[str, int], list[Any]] = {}
    for site, what in calls:
        if site is not None:
            by_layer.setdefault((site.stack, site.layer), []).append((site.attention, what))
    kinds: dict[tuple[str, int], tuple[int, ...]] = {}
    kept: dict[str, int] = {}
    for stack, length in lengths.items():
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index in range(length):
            groups.setdefault(tuple(by_layer.get((stack, index), ())), []).append(index)
        kept[stack] = max(members[0] for members in groups.values()) + 1 if groups else length
        for members in groups.values():
            for index in members:
                kinds[(stack, index)] = tuple(members)
    return Cut(lengths, kept, kinds)


@contextmanager
def cut(model: torch.nn.Module, plan: Cut) -> Iterator[None]:
    """Within the block, each stack of ``model`` holds only its kept prefix."""
    saved = []
    # Inner stacks first: a stack nested in another's member (Swin's blocks in its stages) is
    # reached through the outer stack's full list, which a cut of the outer one would drop.
    for path, length in sorted(plan.kept.items(), key=lambda item: -item[0].count(".")):
        if length >= plan.lengths[path]:
            continue
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        full = getattr(parent, name)
        saved.append((parent, name, full))
        setattr(parent, name, torch.nn.ModuleList(list(full)[:length]))
    try:
        yield
    finally:
        for parent, name, full in reversed(saved):
            setattr(parent, name, full)
