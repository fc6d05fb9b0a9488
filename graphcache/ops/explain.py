"""Why a spec misses (``graphcache explain``): the class it falls in and how
its target serves that class (override or padded), the larger stored class
that serves instead, else the nearest stored entries field by field."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from graphcache.classindex import ClassIndex, check_slack, differences, slack_from_env
from graphcache.compilers.cudnn.releases import Mechanism, class_mechanism, refused
from graphcache.errors import SpecError, TargetError
from graphcache.key import key_for
from graphcache.ops.served import served_form
from graphcache.spec import GraphSpec
from graphcache.spec.classes import ENV_VAR as SHAPES_VAR
from graphcache.spec.classes import check_policy, class_of, has_class, policy_from_env
from graphcache.spec.layouts import shown
from graphcache.stores import stored_headers
from graphcache.stores.base import Store
from graphcache.target import Target


@dataclass
class Candidate:
    key: str
    target: str
    spec: GraphSpec | None
    differences: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    key: str
    present: bool
    nearest: list[Candidate]
    scanned: int
    klass: GraphSpec | None = None  # the class the spec falls in under the policy (None: no class)
    class_key: str = ""
    class_present: bool = False  # that class's graph is stored (not a negative entry): it serves the spec
    serving: GraphSpec | None = None  # the stored class that would serve (its own class, or a larger one)
    serving_key: str = ""
    not_serving: list[str] = field(default_factory=list)  # why each other stored class of its family does not
    refused: str = ""  # why a known-bad window of the release table forbids the spec on the target
    mechanism: Mechanism | None = None  # how the class serves real shapes on the target, and why


def explain(
    spec: GraphSpec,
    target: Target,
    store: Store,
    headers: Iterable[dict[str, Any]] | None = None,
    *,
    top: int = 5,
    shape_classes: str | None = None,
    class_slack: float | None = None,
) -> Explanation:
    """Why ``spec`` misses on ``target``: the class it falls in under the
    policy (``shape_classes``, default GRAPHCACHE_SHAPE_CLASSES) and whether
    that is stored; where it is not, the stored class that would serve
    instead (``GraphCache.serving_class``: the smallest covering it within
    ``class_slack``, default GRAPHCACHE_CLASS_SLACK) and why each other
    stored class of its family does not; else the nearest stored entries and
    exactly which spec or target fields differ.

    ``headers`` are stored headers to compare with (default: read every
    entry of ``store``). A spec a known-bad window of the release table
    forbids on ``target`` is ``refused``: the reason and its source, and
    nothing compared.
    """
    key = key_for(spec, target)
    if (refusal := refused(spec, target)) is not None:
        return Explanation(key, False, [], 0, refused=str(refusal))
    policy = policy_from_env() if shape_classes is None else check_policy(shape_classes, "shape_classes")
    found = class_of(spec, policy)
    klass = found if found != spec else None
    class_key = key_for(klass, target) if klass is not None else ""
    form = served_form(store, klass, target) if klass is not None else None
    mechanism = class_mechanism(form or klass, target) if klass is not None else None
    served = form is not None
    if form is not None and form != klass:  # its padded form serves: override was refused for it
        class_key = key_for(form, target)
    if served or store.exists(key):
        return Explanation(
            key, store.exists(key), [], 0, klass, class_key, served, form, class_key, mechanism=mechanism
        )
    listed = list(headers if headers is not None else stored_headers(store))
    not_serving: list[str] = []
    slack = slack_from_env() if class_slack is None else check_slack(class_slack)
    if klass is not None:
        index = ClassIndex.listed(listed, target)
        chosen, not_serving = index.why(spec, klass, target, slack)
        if chosen != klass:
            larger = served_form(store, chosen, target) or chosen
            return Explanation(
                key, False, [], len(listed), klass, class_key, False, larger, key_for(larger, target), not_serving,
                mechanism=class_mechanism(larger, target),
            )  # fmt: skip
    wanted_spec = _all_fields(spec)
    wanted_target = target.to_dict()
    candidates = []
    scanned = 0
    for header in listed:
        scanned += 1
        try:
            stored = GraphSpec.from_dict(header["spec"])
            stored_target = Target.from_dict(header["target"])
        except (SpecError, TargetError, KeyError, TypeError):
            continue
        if stored.is_class and has_class(spec):
            # Compared as the class that would serve the call, not field by
            # field with a spec whose ``shapes`` the user never wrote.
            diffs = differences(stored, spec, class_of(spec, "pow2"), slack)
            if klass is None:  # the exact policy: no class serves, whatever its sizes
                diffs.insert(0, f"policy: {SHAPES_VAR} is exact here; a stored length class serves only under pow2")
        else:
            diffs = _field_differences(stored, spec, wanted_spec)
        diffs += [
            f"target.{name}: stored {value!r}, asked {wanted_target[name]!r}"
            for name, value in stored_target.to_dict().items()
            if value != wanted_target[name]
        ]
        if header.get("uids") != _default_uids(stored):
            diffs.append("uids: the stored entry uses another tensor UID map")
        candidates.append(Candidate(header.get("key", "?"), str(stored_target), stored, diffs))
    candidates.sort(key=lambda c: (len(c.differences), c.key))
    return Explanation(
        key, False, candidates[:top], scanned, klass, class_key, not_serving=not_serving, mechanism=mechanism
    )


def _field_differences(stored: GraphSpec, spec: GraphSpec, wanted: dict[str, Any]) -> list[str]:
    """Each field of ``stored`` that differs from the asked ``spec`` (its
    fields ``wanted``); a stored class against an exact spec no class serves
    says why rather than naming a ``shapes`` the user did not write."""
    diffs = []
    for name, value in _all_fields(stored).items():
        if value == wanted[name]:
            continue
        if name == "shapes" and stored.is_class and not spec.is_class:
            diffs.append("stored a length class: a spec like this one (ragged, paged or with dropout) has no class")
            continue
        diffs.append(f"spec.{name}: stored {shown(stored, name)}, asked {shown(spec, name)}")
    return diffs


def _all_fields(spec: GraphSpec) -> dict[str, Any]:
    """Every field, those to_dict leaves out (an exact spec's shapes) included."""
    return {name: getattr(spec, name) for name in GraphSpec.field_names()}


def _default_uids(spec: GraphSpec) -> dict[str, int]:
    """The map graphcache builds ``spec`` with (a thd spec's holds its offset
    and table roles too)."""
    from graphcache.spec.uids import UidMap

    return UidMap.default().for_spec(spec).to_dict()
