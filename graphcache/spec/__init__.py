"""What a graph is: ``GraphSpec`` (``graphcache.spec.core``) and its parts.

- ``core``: the spec itself, its validation and canonical form;
- ``ragged``: the thd (ragged, paged) rules and tensor descriptors;
- ``bias``: an additive score bias's dims; ``sinks``: per-head attention sinks;
- ``backward``: ``kind``, a forward graph or its backward;
- ``uids``: the tensor role to UID map (``UidMap``);
- ``classes``: the length-class policy (``class_of``, ``declared``).

``from graphcache.spec import GraphSpec`` is the import users write; the
parts are imported by their full names (``from graphcache.spec.classes
import class_of``).
"""

from __future__ import annotations

from graphcache.spec.core import DTYPES, LAYOUTS, MASKS, MAX_HEAD_DIM, SHAPES, GraphSpec

__all__ = ["DTYPES", "LAYOUTS", "MASKS", "MAX_HEAD_DIM", "SHAPES", "GraphSpec"]
