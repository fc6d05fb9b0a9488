"""Which stored graph serves a class on a target: its own key (the
mechanism its target serves it by), else its padded form where the
target's override was refused for it (``releases.forms``). What ``warm``,
``warm --check`` and ``explain`` ask of a store.

May import: graphcache's library modules, never another ops module.
"""

from __future__ import annotations

from graphcache.compilers.cudnn.releases import class_mechanism, forms
from graphcache.errors import CorruptArtifact
from graphcache.key import key_for
from graphcache.spec import GraphSpec
from graphcache.stores import stored_header
from graphcache.stores.base import Store
from graphcache.target import Target


def padded_form(klass: GraphSpec, target: Target) -> GraphSpec | None:
    """The ``padded`` form of the class ``klass`` where ``target`` serves it
    through execute-time override and has the padding mask (what a load
    tries once override is refused for the spec; ``releases.forms``); else None."""
    tried = forms(klass, target)
    return tried[1] if len(tried) > 1 else None


def served_form(store: Store, klass: GraphSpec, target: Target) -> GraphSpec | None:
    """``klass`` where its key (its target's mechanism) holds a graph, else
    its padded form where that does (override refused for it), else None."""
    if serves_graph(store, key_for(klass, target)):
        return klass
    padded = padded_form(klass, target)
    if padded is not None and serves_graph(store, key_for(padded, target)):
        return padded
    return None


def mechanism_name(klass: GraphSpec, target: Target) -> str:
    chosen = class_mechanism(klass, target)
    return chosen.name if chosen is not None else ""


def serves_graph(store: Store, key: str) -> bool:
    """Whether ``key`` is stored and is a graph (not a negative entry)."""
    if not store.exists(key):
        return False
    try:
        header = stored_header(store, key)
    except CorruptArtifact:
        return False
    return header is not None and not header.get("unsupported")
