"""What ``GraphCache.prefetch`` does: fetch the artifacts of many specs, and
their classes', in as few store requests as the store allows; where a spec's
own class is not stored, the larger stored class that would serve it
(``GraphCache.serving_class``, within GRAPHCACHE_CLASS_SLACK), found in the
store's listing of headers (asked once, only then)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from graphcache.artifact import Artifact
from graphcache.classindex import ClassIndex
from graphcache.compilers.cudnn.releases import forms
from graphcache.counters import PrefetchReport
from graphcache.errors import StoreUnavailable
from graphcache.key import key_for
from graphcache.spec import GraphSpec
from graphcache.spec.classes import class_of
from graphcache.spec.uids import UidMap
from graphcache.stores import stored_headers
from graphcache.stores.base import Store, get_many
from graphcache.target import Target


def fetch_all(
    store: Store,
    specs: Iterable[GraphSpec],
    target: Target,
    uids: UidMap,
    policy: str,
    decoded: Callable[[str, bytes], Artifact | None],
    progress: Callable[[str], None] | None = None,
    slack: float | None = None,
) -> PrefetchReport:
    """Fetch ``specs`` and the class of each under ``policy`` from ``store``;
    ``decoded(key, data)`` verifies each answer (the cache's, which counts
    and removes a corrupt one and notes the classes it sees). A spec whose
    own class and own entry are not stored is present through the smallest
    stored class covering it within ``slack`` times its own class's work
    (None: none), fetched too. See ``GraphCache.prefetch``."""
    start = time.perf_counter()
    wanted: dict[str, GraphSpec] = {}
    classes: dict[str, GraphSpec] = {}  # the class key of each exact spec under the policy
    for spec in specs:
        key = key_for(spec, target, uids)
        wanted.setdefault(key, spec)
        klass = class_of(spec, policy)
        if klass != spec:
            classes[key] = klass
    class_keys = {key_for(k, target, uids): k for k in classes.values()}
    failures = getattr(store, "remote_errors", 0)
    # progress counts the specs' own keys (a caller's bar has one step per
    # spec); the classes fetched beside them are not steps of it.
    step = None if progress is None else (lambda key: progress(key) if key in wanted else None)
    found = get_many(store, list(wanted) + [k for k in class_keys if k not in wanted], step)
    _failed(store, failures)
    present = size = corrupt = 0
    missing: list[GraphSpec] = []
    serving: set[GraphSpec] = set()  # classes stored as graphs (not negative entries)
    refused: list[GraphSpec] = []  # classes whose entry is negative: their padded form may serve
    for key, klass in class_keys.items():
        data = found.get(key)
        artifact = decoded(key, data) if data is not None else None
        if artifact is not None and not artifact.unsupported:
            serving.add(klass)
            size += len(data or b"") if key not in wanted else 0
        elif artifact is not None:
            refused.append(klass)
    padded = {key_for(form, target, uids): klass for klass in refused for form in forms(klass, target)[1:]}
    if padded:  # override refused for these classes: the padded form load() takes next (releases.forms)
        size += _fetch_classes(store, padded, failures, decoded, serving)
    served_by: dict[GraphSpec, GraphSpec] = {}
    for key, spec in wanted.items():
        if classes.get(key) in serving:
            present += 1
            served_by[spec] = classes[key]
            continue
        data = found.get(key)
        if data is not None and decoded(key, data) is not None:
            present += 1
            size += len(data)
            continue
        corrupt += data is not None
        missing.append(spec)
    unclassed = [spec for spec in missing if spec != class_of(spec, policy)]
    if slack is not None and unclassed:
        larger = _larger(store, unclassed, policy, target, slack)
        larger_keys = {key_for(k, target, uids): k for k in set(larger.values())}
        size += _fetch_classes(store, larger_keys, failures, decoded, serving)
        for spec, klass in larger.items():
            if klass in serving:
                present += 1
                served_by[spec] = klass
                missing.remove(spec)
    return PrefetchReport(present, tuple(missing), size, time.perf_counter() - start, target, corrupt, served_by)


def _fetch_classes(
    store: Store,
    keys: dict[str, GraphSpec],
    failures: int,
    decoded: Callable[[str, bytes], Artifact | None],
    serving: set[GraphSpec],
) -> int:
    """Fetch the class graphs ``keys`` names (key -> the class it serves)
    in one request, add each stored as a graph (not a negative entry) to
    ``serving``; the bytes fetched. Raises StoreUnavailable as ``_failed``."""
    found = get_many(store, list(keys))
    _failed(store, failures)
    size = 0
    for key, klass in keys.items():
        data = found.get(key)
        artifact = decoded(key, data) if data is not None else None
        if artifact is not None and not artifact.unsupported:
            serving.add(klass)
            size += len(data or b"")
    return size


def _failed(store: Store, failures: int) -> None:
    """Raise StoreUnavailable when the remote tier failed since ``failures``
    was read: what it holds is unknown, not missing."""
    if getattr(store, "remote_errors", 0) != failures:
        error = getattr(store, "remote_error", None)
        raise StoreUnavailable(f"prefetch failed: {error}") from error


def _larger(
    store: Store, specs: list[GraphSpec], policy: str, target: Target, slack: float
) -> dict[GraphSpec, GraphSpec]:
    """For each exact spec, the larger stored class that would serve it
    (``ClassIndex.choose``), listed from the store (its remote tier's, where
    it has one) once; specs no stored class serves are left out."""
    index = ClassIndex.listed(stored_headers(getattr(store, "remote", store)), target)
    chosen = {spec: index.choose(spec, class_of(spec, policy), target, slack) for spec in specs}
    return {spec: klass for spec, klass in chosen.items() if klass != class_of(spec, policy)}
