"""The float32 reference, the input checks and the error measures: what
every check of a plan compares against, in a room of its own.

``measure``
    ``relative_error``, ``lse_difference``, ``TOLERANCE`` and
    ``within_tolerance`` (``error <= tolerance``, so NaN never passes).
``dense``
    the dense (bshd / bhsd) reference (``reference``, ``allowed_mask``), the
    rows a comparison looks at (``compared_rows``, ``valid_rows``),
    ``reference_errors`` and the seeded ``random_inputs``.
``varlen``
    the ragged / paged reference with flash-attention's semantics
    (``varlen_reference``, ``defined_rows``) and ``run_spec``, a thd spec
    run by it.
``checks``
    ``check_inputs`` (a dense graph's tensors) and ``check_call`` (a thd
    graph's ``varlen_attn`` arguments).

It imports no compiler: the cuDNN compiler's build checks, the canary, the
torch fallback graph (``compilers/torch_sdpa.py``) and the reference
compiler all import it, and it imports none of them back, so the reference a
plan is judged by never depends on the plan's own code. Its modules import
each other by their full names, and this file imports none of them:
``from graphcache.reference.dense import reference``. torch is imported
inside the functions that use it (docs/architecture.md, "Import rules").
"""
