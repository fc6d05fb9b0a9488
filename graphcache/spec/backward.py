"""The ``kind`` field of a GraphSpec: a forward graph (the default) or the
backward graph of SDPA, a graph kind of its own.

A backward graph (``kind="backward"``) takes what a training step's forward
left, q, k, v, its output o and its stats (the log-sum-exp of each query
row's scaled scores, a float32 (b, h_q, s_q, 1) tensor), and the gradient of
the loss with respect to o (role ``dO``), and writes the gradients dQ, dK and
dV, each in the dims and layout of q, k and v (dK and dV have the key/value
head count: GQA and MQA). It is cuDNN's ``sdpa_backward`` (cudnn-frontend
from 1.0.0: ``python_bindings/pygraph/sdpa.cpp``). Every other field means
what it means for the forward it pairs with: sizes, dtype, layout, mask and
window, scale, padding, an additive ``bias`` (an input; its gradient, dBias,
is not computed here); a ``shapes="class"`` backward is a length class like
a forward one. ``kind="forward"`` (the default) is left out of the canonical
form, so every forward spec keeps its key.

``generate_stats`` says whether a graph writes the stats: a backward graph
reads them and writes none, so it is stored false (a manifest family with
``generate_stats: true`` and ``kind: [forward, backward]`` gives the forward
that writes the stats and the backward that reads them).

A backward spec refuses (SpecError naming the field) what graphcache does
not serve backward: dropout (the backward must replay the forward graph's
own random stream, which a forward graph here does not hand out, and no
reference could check it), ragged / paged (thd) layouts and attention sinks
(whose gradient, dSink, is a further output).

May import: graphcache.errors.
"""

from __future__ import annotations

from typing import Any

from graphcache.errors import SpecError

KINDS = ("forward", "backward")
# A gradient role has the dims and strides of the tensor it is the gradient of.
PRIMAL = {"dO": "o", "dQ": "q", "dK": "k", "dV": "v"}


def check(spec: Any) -> None:
    """Raise SpecError naming the field for an unknown ``kind``, or a field a
    backward graph does not take here; a backward spec's ``generate_stats``
    is set false (it reads the stats, it writes none)."""
    if spec.kind not in KINDS:
        raise SpecError(
            f"kind={spec.kind!r} is not supported; allowed: forward (the default: o from q, k, v), "
            "backward (dQ, dK, dV from q, k, v, o, dO and the forward's stats)",
            "kind",
        )
    if spec.kind == "forward":
        return
    object.__setattr__(spec, "generate_stats", False)
    refused = (
        (
            "dropout",
            bool(spec.dropout),
            "dropout (the backward must replay the forward graph's random stream): "
            "set dropout to 0, or let torch run the backward",
        ),
        (
            "layout",
            spec.layout == "thd",
            "layout 'thd' (ragged / paged backward graphs are not served here): use a bshd or bhsd spec",
        ),
        ("sinks", spec.sinks, "sinks (their gradient, dSink, is not computed here): use sinks false"),
        *(  # issue 40's per-tensor layouts: the backward graphs here read and write all in one packed layout
            (
                name,
                getattr(spec, name) not in (("thd", "bshd", "bhsd") if name == "layout" else (None,)),
                f"{name}={getattr(spec, name)!r} "
                "(backward graphs here take q, k, v, o and their gradients in one layout, bshd or bhsd)",
            )
            for name in ("layout", "layout_q", "layout_v", "layout_o")
        ),
    )
    for name, bad, why in refused:
        if bad:
            raise SpecError(f"kind 'backward' is not supported with {why}", name)


def role_of(role: str) -> str:
    """The forward role whose dims and strides a role has (``dQ`` -> ``q``)."""
    return PRIMAL.get(role, role)


def backward_of(spec: Any) -> Any:
    """The backward spec of a forward spec: the same graph with ``kind``
    backward, in k's layout where q, v or o differ from it (a backward call
    packs its tensors into the spec's one layout: graphcache.torch.backward).
    Raises SpecError (naming the field) where there is none."""
    if spec.layout in ("bshd", "bhsd"):
        spec = spec.replace(layout_q=None, layout_v=None, layout_o=None)
    return spec.replace(kind="backward")


def training(spec: Any) -> tuple[Any, Any]:
    """The two graphs a training step calls for a forward call of ``spec``:
    the forward that writes the stats (``generate_stats`` true), and its
    backward. Raises SpecError where the forward has no backward here."""
    return spec.replace(generate_stats=True), backward_of(spec)


def json_schema_props() -> dict[str, Any]:
    return {"kind": {"enum": list(KINDS)}}


def summary_part(spec: Any) -> list[str]:
    return ["backward"] if spec.kind == "backward" else []
