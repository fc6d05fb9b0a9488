"""What ops run at deploy: warm a cache from a manifest, gate on coverage,
and explain a miss. The CLI prints what these return."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from graphcache.artifact import Artifact
from graphcache.cache import GraphCache
from graphcache.classindex import ClassIndex, check_slack, differences, slack_from_env
from graphcache.compilers.cudnn.releases import refused
from graphcache.errors import CorruptArtifact, GraphCacheError, KnownBad, SpecError, TargetError, UnsupportedSpec
from graphcache.key import key_for
from graphcache.spec import GraphSpec
from graphcache.spec.classes import ENV_VAR as SHAPES_VAR
from graphcache.spec.classes import check_policy, class_of, has_class, policy_from_env
from graphcache.spec.layouts import shown
from graphcache.stores import stored_header, stored_headers
from graphcache.stores.base import Store
from graphcache.target import Target

Progress = Callable[[], None]


@dataclass
class WarmRow:
    spec: GraphSpec
    key: str
    status: str  # present | built | unsupported | refused | failed
    detail: str = ""
    seconds: float = 0.0
    serves: tuple[GraphSpec, ...] = ()  # the manifest's exact specs this class graph serves


def warm(
    specs: list[GraphSpec],
    cache: GraphCache,
    *,
    jobs: int = 1,
    pin: bool = True,
    progress: Progress | None = None,
) -> list[WarmRow]:
    """Build what is missing for this host's target and store it.

    Under the cache's class policy each class is built once, for all the
    manifest's specs it covers (a class spec in the manifest is its own
    class); where a class is unsupported on this target, the exact specs it
    would have served are warmed instead, after it. Specs already stored are
    ``present``; a spec cuDNN cannot cache here is ``unsupported`` (recorded
    once as a negative entry, so the next run reports it without
    rebuilding); a spec a known-bad window of the release table forbids
    here is ``refused``, its reason and source the row's detail, and stored
    as that key's negative entry (over any plan stored before the window was
    known, so that workers of older releases stop loading it); any other
    error is ``failed`` with its reason. Warmed entries are pinned where the
    store can pin. ``progress`` is called once per row.
    """
    target = cache.target()
    groups: dict[GraphSpec, list[GraphSpec]] = {}
    for spec in specs:
        groups.setdefault(class_of(spec, cache.shape_classes), []).append(spec)

    def one(spec: GraphSpec) -> WarmRow:
        key = key_for(spec, target, cache.uids)
        start = time.perf_counter()
        try:
            artifact, built = cache.ensure(spec, target)
            row = WarmRow(spec, key, "built" if built else "present", seconds=time.perf_counter() - start)
            if built:
                row.detail = f"built in {artifact.build_seconds:.2f}s"
            if pin and hasattr(cache.store, "pin"):
                cache.store.pin(key)
        except KnownBad as exc:
            row = WarmRow(spec, key, "refused", str(exc) + _stored_refusal(cache, spec, target, key, exc))
        except UnsupportedSpec as exc:  # NotSerializable included
            row = WarmRow(spec, key, "unsupported", str(exc))
        except GraphCacheError as exc:
            row = WarmRow(spec, key, "failed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - one bad spec must not stop the deploy's warm
            row = WarmRow(spec, key, "failed", f"{type(exc).__name__}: {exc}")
        row.serves = tuple(s for s in groups.get(spec, ()) if s != spec)
        if row.serves and row.status in ("built", "present"):
            row.detail = f"{row.detail}; " if row.detail else ""
            row.detail += f"serves {len(row.serves)} spec(s) of the manifest"
        if progress:
            progress()
        return row

    rows = list(_map(one, list(groups), jobs))
    exact = [s for row in rows if row.status == "unsupported" for s in row.serves]
    return rows + list(_map(one, exact, jobs))


def _stored_refusal(cache: GraphCache, spec: GraphSpec, target: Target, key: str, exc: KnownBad) -> str:
    """Store ``exc`` as ``key``'s negative entry unless one is stored; '' or why it could not be."""
    try:
        stored = cache.lookup(spec, target)
        if stored is None or stored.refusal() is None:
            negative = Artifact.negative(spec, target, cache.uids, exc)
            cache.store.put(key, (negative.signed(cache.signing_key) if cache.signing_key else negative).encode())
    except GraphCacheError as err:
        return f" (its negative entry was not stored: {err})"
    return ""


@dataclass
class CheckRow:
    spec: GraphSpec
    key: str
    present: bool
    served_by: GraphSpec | None = None  # the class whose stored graph serves this exact spec
    refused: str = ""  # why a known-bad window of the release table forbids the spec on the target


def check(
    specs: list[GraphSpec],
    target: Target,
    store: Store,
    *,
    jobs: int = 8,
    progress: Progress | None = None,
    shape_classes: str | None = None,
    class_slack: float | None = None,
) -> list[CheckRow]:
    """Coverage of ``specs`` on ``target`` in ``store``; needs no GPU.

    Under the class policy (``shape_classes``, default
    GRAPHCACHE_SHAPE_CLASSES) an exact spec is present when its class's graph
    is stored and not a negative entry, or, where it is not, a larger stored
    class within ``class_slack`` (default GRAPHCACHE_CLASS_SLACK) covers it
    (``served_by`` names the class, as ``GraphCache.load`` would pick it;
    the store is listed once, at the first such spec), else when its own
    entry is stored. A spec a known-bad window forbids on ``target`` is
    ``refused`` (the reason and its source), never present: no door serves it."""
    policy = policy_from_env() if shape_classes is None else check_policy(shape_classes, "shape_classes")
    slack = slack_from_env() if class_slack is None else check_slack(class_slack)
    index: list[ClassIndex] = []  # the store's classes on target, listed at the first class not stored
    # Each class asked once: over HTTP its header is the whole artifact, and
    # a decode loop's exact specs share a handful of classes (asked under the
    # lock, one at a time: there are few).
    serving: dict[GraphSpec, bool] = {}
    lock = threading.Lock()

    def serves(klass: GraphSpec) -> bool:
        with lock:
            if klass not in serving:
                serving[klass] = _serves(store, key_for(klass, target))
            return serving[klass]

    def larger(spec: GraphSpec, klass: GraphSpec) -> GraphSpec | None:
        with lock:
            if not index:
                index.append(ClassIndex.listed(stored_headers(store), target))
        chosen = index[0].choose(spec, klass, target, slack)
        return chosen if chosen != klass else None

    def one(spec: GraphSpec) -> CheckRow:
        key = key_for(spec, target)
        klass = class_of(spec, policy)
        if (refusal := refused(spec, target)) is not None:
            row = CheckRow(spec, key, False, refused=str(refusal))
        elif klass != spec and serves(klass):
            row = CheckRow(spec, key, True, klass)
        elif klass != spec and (bigger := larger(spec, klass)) is not None:
            row = CheckRow(spec, key, True, bigger)
        else:
            row = CheckRow(spec, key, store.exists(key))
        if progress:
            progress()
        return row

    return list(_map(one, specs, jobs))


def _serves(store: Store, key: str) -> bool:
    """Whether ``key`` is stored and is a graph (not a negative entry)."""
    if not store.exists(key):
        return False
    try:
        header = stored_header(store, key)
    except CorruptArtifact:
        return False
    return header is not None and not header.get("unsupported")


def _map(fn: Callable[[GraphSpec], Any], items: list[GraphSpec], jobs: int) -> Iterator[Any]:
    if jobs <= 1:
        yield from map(fn, items)
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(fn, items)


# -- retention --------------------------------------------------------------------------


def purge(store: Store, target: Target | None = None, *, unsupported: bool = False, dry_run: bool = False) -> list[str]:
    """Remove entries, pinned or not: every entry built for ``target`` (a
    retired cuDNN, frontend or GPU), and with ``unsupported`` only the
    negative entries (of ``target``, or of every target when it is None).
    Returns the keys removed (or that would be).

    Raises ValueError when neither a target nor ``unsupported`` is given.
    """
    if target is None and not unsupported:
        raise ValueError("purge needs a target, or unsupported=True to clear negative entries")
    remote = getattr(store, "purge", None)
    if remote is not None:
        return list(remote(None if target is None else str(target), unsupported=unsupported, dry_run=dry_run))
    wanted = None if target is None else target.to_dict()
    removed = []
    for key in list(store.keys()):
        try:
            header = stored_header(store, key)
        except CorruptArtifact:
            continue  # not ours to judge here; a read quarantines it
        if header is None:
            continue
        if wanted is not None and header.get("target") != wanted:
            continue
        if unsupported and not header.get("unsupported"):
            continue
        if not dry_run:
            store.delete(key)
        removed.append(key)
    return removed


# -- explain --------------------------------------------------------------------------


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
    served = klass is not None and _serves(store, class_key)
    if served or store.exists(key):
        return Explanation(
            key, store.exists(key), [], 0, klass, class_key, served, klass if served else None, class_key
        )
    listed = list(headers if headers is not None else stored_headers(store))
    not_serving: list[str] = []
    slack = slack_from_env() if class_slack is None else check_slack(class_slack)
    if klass is not None:
        index = ClassIndex.listed(listed, target)
        chosen, not_serving = index.why(spec, klass, target, slack)
        if chosen != klass:
            return Explanation(
                key, False, [], len(listed), klass, class_key, False, chosen, key_for(chosen, target), not_serving
            )
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
    return Explanation(key, False, candidates[:top], scanned, klass, class_key, not_serving=not_serving)


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
