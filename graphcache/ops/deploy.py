"""What ops run at deploy: warm a cache from a manifest, gate on coverage,
purge (explaining a miss is ``explain``). The CLI prints what these return."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from graphcache.artifact import Artifact
from graphcache.cache import GraphCache
from graphcache.classindex import ClassIndex, check_slack, slack_from_env
from graphcache.compilers.cudnn.releases import class_mechanism, refused
from graphcache.errors import CorruptArtifact, GraphCacheError, KnownBad, UnsupportedSpec
from graphcache.key import key_for
from graphcache.ops.explain import Candidate, Explanation, explain
from graphcache.ops.served import mechanism_name, padded_form, served_form
from graphcache.spec import GraphSpec
from graphcache.spec.classes import check_policy, class_of, policy_from_env
from graphcache.stores import stored_header, stored_headers
from graphcache.stores.base import Store
from graphcache.target import Target

# ``explain`` has a room of its own (graphcache.ops.explain); its names are this module's too, as they were.
__all__ = ["Candidate", "CheckRow", "Explanation", "WarmRow", "check", "explain", "purge", "warm"]

Progress = Callable[[], None]


@dataclass
class WarmRow:
    spec: GraphSpec
    key: str
    status: str  # present | built | unsupported | refused | failed
    detail: str = ""
    seconds: float = 0.0
    serves: tuple[GraphSpec, ...] = ()  # the manifest's exact specs this class graph serves
    mechanism: str = ""  # a class row's: override or padded (releases.class_mechanism), the one it was stored in


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
        chosen = class_mechanism(spec, target)
        try:
            try:
                artifact, built = cache.ensure(spec, target)
                refusal = ""
            except UnsupportedSpec as exc:  # override refused for this spec: its padded form, where the target has it
                padded = padded_form(spec, target)
                if padded is None or isinstance(exc, KnownBad):
                    raise
                key, refusal = key_for(padded, target, cache.uids), f"; execute-time override refused: {exc}"
                artifact, built = cache.ensure(padded, target)
                chosen = class_mechanism(padded, target)
            row = WarmRow(spec, key, "built" if built else "present", seconds=time.perf_counter() - start)
            if built:
                row.detail = f"built in {artifact.build_seconds:.2f}s"
            if chosen is not None:
                row.mechanism = chosen.name
                row.detail = f"{chosen.name}{'; ' if row.detail else ''}{row.detail}{refusal}"
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
    mechanism: str = ""  # how ``served_by`` serves it on the target: override or padded


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
    serving: dict[GraphSpec, GraphSpec | None] = {}
    lock = threading.Lock()

    def serves(klass: GraphSpec) -> GraphSpec | None:
        """The form of ``klass`` stored as a graph on ``target`` (its target's
        mechanism, else its padded form where override was refused), or None."""
        with lock:
            if klass not in serving:
                serving[klass] = served_form(store, klass, target)
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
        elif klass != spec and (form := serves(klass)) is not None:
            row = CheckRow(spec, key, True, form, mechanism=mechanism_name(form, target))
        elif klass != spec and (bigger := larger(spec, klass)) is not None:
            form = serves(bigger) or bigger
            row = CheckRow(spec, key, True, form, mechanism=mechanism_name(form, target))
        else:
            row = CheckRow(spec, key, store.exists(key))
        if progress:
            progress()
        return row

    return list(_map(one, specs, jobs))


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
