"""The ``sinks`` field of a GraphSpec: per-head attention sink logits, a graph input.

An attention sink (gpt-oss's ``s_aux``, transformers' ``module.sinks``) is one
logit per query head that joins each query row's softmax denominator and is
then dropped: a row's weights are ``exp(s_j) / (sum_j exp(s_j) + exp(sink_h))``
over the keys it sees, so they sum to less than one (a row that sees no key
gives zeros). cuDNN's SDPA takes them as ``sink_token``, a float32
(1, h_q, 1, 1) tensor (cudnn-frontend's C++ API from 1.14.0, its Python
``sdpa(sink_token=...)`` from 1.19.0, cuDNN >= 9.13; the release table has
the row). ``sinks=True`` makes that tensor an input of the graph (role
``sink``); ``False`` (the default) is left out of the canonical form, so every
other spec keeps its key.

May import: graphcache.errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import SpecError


def check(spec: Any) -> None:
    """Raise SpecError naming ``sinks`` for a non-boolean, or a combination
    this graph kind does not take here."""
    sinks = spec.sinks
    if not isinstance(sinks, bool):
        raise SpecError(f"sinks={sinks!r} must be true or false", "sinks")
    if not sinks:
        return
    refused = (
        (spec.layout == "thd", "layout 'thd' (ragged / paged graphs take no sink tensor here): use a bshd/bhsd spec"),
        (bool(spec.dropout), "dropout (sink graphs here are inference graphs): set dropout to 0"),
        (spec.generate_stats, "generate_stats (what the log-sum-exp of a sink row means is not checked here)"),
    )
    for bad, why in refused:
        if bad:
            raise SpecError(f"sinks is not supported with {why}", "sinks")


def dims(spec: Any) -> tuple[int, int, int, int]:
    """The sink tensor's dims: one float32 logit per query head."""
    return (1, spec.heads_q, 1, 1)


def json_schema_props() -> dict[str, Any]:
    return {"sinks": {"type": "boolean"}}


def summary_part(spec: Any) -> list[str]:
    return ["sinks"] if spec.sinks else []
