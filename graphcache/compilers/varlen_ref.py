"""Moved: the ragged / paged float32 reference is ``graphcache.reference.varlen``
(with the dense reference, the input checks and the error measures, in a
package that imports no compiler). Its names are re-exported here, so
``from graphcache.compilers.varlen_ref import varlen_reference`` keeps
working; new code imports ``graphcache.reference.varlen``.
"""

from __future__ import annotations

from graphcache.reference.varlen import (
    REFERENCE_BUDGET,
    allowed,
    defined_rows,
    lengths,
    run_spec,
    sequence_kv,
    varlen_reference,
)

__all__ = ["REFERENCE_BUDGET", "allowed", "defined_rows", "lengths", "run_spec", "sequence_kv", "varlen_reference"]
