"""GraphCache: the controller between specs, a store and a compiler."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from graphcache.artifact import Artifact
from graphcache.classindex import ClassIndex, check_slack, local_headers, slack_from_env, work
from graphcache.compilers.base import LoadedGraph
from graphcache.compilers.cudnn.releases import forms, refused
from graphcache.compilers.named import Named, resolve
from graphcache.counters import PrefetchReport, Stats
from graphcache.errors import (
    BuildError,
    CorruptArtifact,
    GraphCacheError,
    KnownBad,
    NoGpu,
    NotFound,
    NotSerializable,
    PlanRejected,
    StoreFull,
    StoreUnavailable,
    UnsupportedGpu,
    UnsupportedSpec,
)
from graphcache.key import key_for
from graphcache.prefetch import fetch_all
from graphcache.settings import Settings
from graphcache.spec import GraphSpec
from graphcache.spec.classes import check_policy, class_of, policy_from_env
from graphcache.spec.uids import UidMap
from graphcache.stores.base import Store
from graphcache.stores.lease import Leases, build_once
from graphcache.target import Target

log = logging.getLogger(__name__)
Loaded = tuple[LoadedGraph, bool]  # a graph, and whether the call that loaded it built it here


class GraphCache:
    """key -> store -> verify -> (load); on a miss, one build per key at a time.

    ``store`` holds artifact bytes; ``compiler`` (or its name, as in graphcache.compilers.named) builds and loads
    (None: read only). ``signing_key`` signs builds; ``require_signed`` refuses unsigned or wrongly signed artifacts
    (treated as corrupt). ``torch_fallback`` lets ``load`` run torch's SDPA where cuDNN cannot serve a spec here.
    ``shape_classes`` is the length-class policy ``load`` follows (``pow2`` or ``exact``; default
    GRAPHCACHE_SHAPE_CLASSES, see graphcache.spec.classes); ``class_slack`` bounds the larger stored class that may
    serve a call whose own class is not stored (default GRAPHCACHE_CLASS_SLACK, see graphcache.classindex).
    """

    def __init__(
        self,
        store: Store,
        compiler: Named | None = None,
        *,
        uids: UidMap | None = None,
        signing_key: bytes | None = None,
        require_signed: bool = False,
        verify_keys: tuple[bytes, ...] = (),
        torch_fallback: bool = False,
        lease_ttl: float = 30.0,
        lease_wait: float = 900.0,
        shape_classes: str | None = None,
        class_slack: float | None = None,
    ) -> None:
        if require_signed and not signing_key:
            raise ValueError("require_signed needs a signing_key (GRAPHCACHE_SIGNING_KEY)")
        self.store = store
        self.compiler = resolve(compiler)
        self.uids = uids or UidMap.default()
        self.signing_key = signing_key
        self.require_signed = require_signed
        # Every key a signature may be made with (a rotation: new and old); default the signing key.
        self.verify_keys = verify_keys or ((signing_key,) if signing_key else ())
        self.torch_fallback = torch_fallback
        self.shape_classes = policy_from_env() if shape_classes is None else check_policy(shape_classes)
        self.class_slack = slack_from_env() if class_slack is None else check_slack(class_slack)
        self._classes = ClassIndex()
        self._indexed = False  # the local store's classes read into it (at the first load)
        self._stats = Stats()
        self._unserved: set[tuple[GraphSpec, Target | None]] = set()  # classes whose build or load failed here
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Artifact]] = {}
        # A shared store lends build leases: processes and replicas that miss one key build it once.
        make_leases = getattr(store, "leases", None)
        self._leases: Leases | None = make_leases() if make_leases is not None else None
        self.lease_ttl = lease_ttl
        self.lease_wait = lease_wait

    @classmethod
    def from_env(cls, compiler: Named | None = None, settings: Settings | None = None, **options: Any) -> GraphCache:
        """A cache configured the way a worker is: GRAPHCACHE_SERVER (a service, with the local DiskStore in
        front), else GRAPHCACHE_STORE or the DiskStore in GRAPHCACHE_DIR; GRAPHCACHE_SIGNING_KEY signs,
        GRAPHCACHE_REQUIRE_SIGNED=1 refuses unsigned artifacts; GRAPHCACHE_COMPILER names one not given."""
        from graphcache.stores import worker_store

        settings = settings or Settings.from_env()
        return cls(
            worker_store(settings),
            compiler if compiler is not None else settings.compiler or None,
            signing_key=settings.signing_key,
            require_signed=settings.require_signed,
            verify_keys=settings.verify_keys,
            **{"shape_classes": settings.shape_classes, "class_slack": settings.class_slack, **options},
        )

    def target(self, target: Target | None = None) -> Target:
        if target is not None:
            return target
        if self.compiler is None:
            raise NoGpu("no target given and no compiler to detect one: pass target=Target.parse(...)")
        return self.compiler.target()

    def key(self, spec: GraphSpec, target: Target | None = None) -> str:
        return key_for(spec, self.target(target), self.uids)

    # reads ----------------------------------------------------------------

    def lookup(self, spec: GraphSpec, target: Target | None = None) -> Artifact | None:
        """The verified stored artifact, or None (absent, or corrupt and removed)."""
        return self._fetch(self.key(spec, target))

    def _fetch(self, key: str) -> Artifact | None:
        try:
            data = self.store.get(key)
        except StoreUnavailable as exc:
            self._stats.bump("store_errors")
            log.warning("store unavailable, treating %s as a miss: %s", key[:12], exc)
            return None
        except CorruptArtifact as exc:  # a value the store cannot read (UnreadableEntry): dropped like corrupt bytes
            self._dropped(key, exc)
            return None
        if data is None:
            return None
        return self._decoded(key, data)

    def _decoded(self, key: str, data: bytes) -> Artifact | None:
        """The verified artifact in ``data``, or None after counting and
        dropping a corrupt (or, where signatures are required, unsigned or
        wrongly signed) entry. Dropped here only: a store shared with others
        (a server, Redis) is asked to ``discard`` it, which leaves their copy
        alone (a client's own keys may be wrong, as during a key rotation;
        the server quarantines what it finds corrupt itself)."""
        try:
            artifact = Artifact.decode(data, expected_key=key)
            if self.require_signed:
                artifact.verify_signature(self.verify_keys)
        except CorruptArtifact as exc:
            self._dropped(key, exc)
            return None
        if artifact.spec.is_class and not artifact.unsupported:
            self._classes.add(artifact.spec, artifact.target)  # what prefetch, warm and remote hits bring
        return artifact

    def _dropped(self, key: str, exc: CorruptArtifact) -> None:
        self._stats.bump("corrupt")
        log.warning("entry %s failed verification here (%s), dropped locally: %s", key, exc.reason, exc)
        with contextlib.suppress(GraphCacheError):
            getattr(self.store, "discard", self.store.delete)(key)

    def index(self) -> ClassIndex:
        """The class specs the local store holds: read from it at the first
        load, and kept current by every fetch and build of a class."""
        if not self._indexed:
            with self._lock:
                if not self._indexed:
                    self._classes.fill(local_headers(self.store))
                    self._indexed = True
        return self._classes

    def serving_class(self, spec: GraphSpec, target: Target | None = None) -> GraphSpec:
        """The spec whose graph ``load`` tries first for ``spec``: its class
        under the policy when that is stored (or nothing stored may serve),
        else the smallest stored class covering it within ``class_slack``
        (graphcache.classindex). Asks no store: one index lookup."""
        own = class_of(spec, self.shape_classes)
        if own == spec:
            return own
        try:
            resolved = self.target(target)
        except NoGpu:
            return own
        skip = {k for k, t in self._unserved if t in (target, resolved)}
        return self.index().choose(spec, own, resolved, self.class_slack, skip)

    def get(self, spec: GraphSpec, target: Target | None = None, *, build: bool = True) -> Artifact:
        """The verified artifact for ``spec``, building it on a miss.

        Raises NotFound on a miss with no compiler or with ``build=False``,
        UnsupportedSpec (or NotSerializable) for a spec recorded as
        unsupported on this target, and whatever the compiler raises.
        """
        return self.ensure(spec, target, build=build)[0]

    def ensure(self, spec: GraphSpec, target: Target | None = None, *, build: bool = True) -> tuple[Artifact, bool]:
        """Like ``get``, and whether this call built the artifact (False when it was stored, or another caller or
        replica built it). A known-bad window (the release table) raises KnownBad before any store is asked."""
        target = self.target(target)
        key = key_for(spec, target, self.uids)
        if (refusal := refused(spec, target)) is not None:  # a known-bad window (release table): no stored plan
            self._stats.bump("unsupported")
            raise refusal
        artifact = self._fetch(key)
        if artifact is not None:
            self._stats.bump("hits")
            self._stats.bump("build_seconds_saved", artifact.build_seconds)
            return self._positive(artifact), False
        self._stats.bump("misses")
        if self.compiler is None or not build:
            why = "and no compiler to build it" if self.compiler is None else "(not built: build=False)"
            raise NotFound(f"no artifact for {spec.summary()} on {target} (key {key[:12]}) {why}")
        artifact, built = self._single_flight(key, spec, target)
        return self._positive(artifact), built

    def _positive(self, artifact: Artifact) -> Artifact:
        refusal = artifact.refusal()
        if refusal is not None:
            self._stats.bump("unsupported")
            raise refusal
        return artifact

    def _single_flight(self, key: str, spec: GraphSpec, target: Target) -> tuple[Artifact, bool]:
        with self._lock:
            future = self._inflight.get(key)
            leader = future is None
            if future is None:
                future = Future()
                self._inflight[key] = future
        if not leader:
            return future.result(), False
        try:
            fetched = self._fetch(key)
            artifact, built = (fetched, False) if fetched is not None else self._build_once(key, spec, target)
            future.set_result(artifact)
            return artifact, built
        except BaseException as exc:
            future.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def _build_once(self, key: str, spec: GraphSpec, target: Target) -> tuple[Artifact, bool]:
        """Build under the store's lease (graphcache.stores.lease.build_once)."""
        return build_once(
            self._leases, key, ttl=self.lease_ttl, wait=self.lease_wait, fetch=self._fetch,
            build=lambda: self._build(key, spec, target), waiting=lambda: self._stats.bump("lease_waits"),
        )  # fmt: skip

    def _build(self, key: str, spec: GraphSpec, target: Target) -> Artifact:
        assert self.compiler is not None
        preflight = False
        try:
            artifact = self.compiler.build(spec, target, self.uids)
        except UnsupportedSpec as exc:
            # Deterministic for this target (cuDNN, frontend and GPU are in the key): remember it, so the
            # next request answers at once instead of rebuilding. NotSerializable is one kind of it.
            # Failures of this host (BuildError) are not caught here: they are never stored.
            artifact = Artifact.negative(spec, target, self.uids, exc)
            preflight = exc.step == "preflight"  # refused before any graph was made: not a build
        finally:
            self._stats.bump("builds", not preflight)
        if self.signing_key:
            artifact = artifact.signed(self.signing_key)
        if spec.is_class and not artifact.unsupported:
            self._classes.add(spec, target)
        if artifact.key != key:
            raise GraphCacheError(f"compiler returned an artifact for {artifact.key[:12]}, asked for {key[:12]}")
        try:
            self.store.put(key, artifact.encode())
        except (StoreUnavailable, StoreFull) as exc:
            # The build is used all the same (a worker's full disk keeps no copy).
            self._stats.bump("store_errors")
            log.warning("could not store %s: %s", key[:12], exc)
        return artifact

    def load(self, spec: GraphSpec, target: Target | None = None, *, build: bool = True) -> LoadedGraph:
        """A runnable graph for ``spec`` on this machine (``ensure_loaded``
        also says whether this call built it); with ``build=False``
        a miss raises NotFound instead of building (a worker that must not
        spend its start-up on a build).

        Under a class policy an exact spec gets its class's graph (whose
        ``execute`` takes real tensors of any shape the class covers; bind it
        with ``graphcache.compilers.classgraph.bind``) when that is stored or,
        with ``build``, built; where the class cannot be served on this target
        (a negative entry, a build that failed: not tried again by this cache)
        or is missing with ``build=False``, the exact graph, as under policy ``exact``.

        With ``torch_fallback``, a spec cuDNN cannot serve here (no GPU,
        old GPU or cuDNN, a mask the frontend cannot express, a plan that
        cannot be cached, a plan rejected twice, a build or load this host
        failed) runs on torch's SDPA instead, with a warning and the
        ``fallbacks`` counter.
        """
        return self.ensure_loaded(spec, target, build=build)[0]

    def ensure_loaded(self, spec: GraphSpec, target: Target | None = None, *, build: bool = True) -> Loaded:
        """Like ``load``, and whether this call built the graph here (False:
        the store held it, another caller or replica built it, or torch's
        SDPA serves it): what tells a warm start from a cold one."""
        klass = self.serving_class(spec, target)
        if klass != spec and (klass, target) not in self._unserved:  # the target resolved in _load, as NoGpu may be
            for form in self._forms(klass, target):
                try:
                    loaded = self._load(form, target, build, fallback=False)
                    self._stats.served(work(klass), work(spec), larger=klass != class_of(spec, self.shape_classes))
                    return loaded
                except NotFound:  # build=False: the exact graph's lookup counts this load's miss
                    self._stats.bump("misses", -1)
                    break
                except KnownBad as exc:  # a window of the release table refuses the call, not a mechanism
                    log.debug("class %s does not serve %s here: %s", form.summary(), spec.summary(), exc)
                    break
                except UnsupportedSpec as exc:  # recorded for the target: its padded form, else the exact graph
                    log.debug("class %s does not serve %s here: %s", form.summary(), spec.summary(), exc)
                except GraphCacheError as exc:  # the exact graph serves instead
                    if isinstance(exc, (BuildError, PlanRejected)):  # costly and no negative entry: once per process
                        self._unserved.add((klass, target))
                    log.debug("class %s does not serve %s here: %s", form.summary(), spec.summary(), exc)
                    break
        return self._load(spec, target, build)

    def _forms(self, klass: GraphSpec, target: Target | None) -> list[GraphSpec]:
        """The class graphs ``load`` tries for ``klass`` (``releases.forms``:
        its target's mechanism, then padded where override was refused)."""
        try:
            return forms(klass, self.target(target))
        except NoGpu:
            return [klass]

    def _load(self, spec: GraphSpec, target: Target | None, build: bool, fallback: bool = True) -> Loaded:
        """``spec``'s own graph, and whether it was built here; no class
        looked for; ``fallback=False`` raises where ``torch_fallback`` would
        serve torch's SDPA."""
        try:
            if self.compiler is None:
                raise NoGpu("no compiler configured")
            try:
                artifact, built = self.ensure(spec, target, build=build)
                return self.compiler.load(artifact), built
            except PlanRejected as exc:
                # The bytes verified but the plan cannot be used as it is (it
                # would recompile, does not deserialize, or failed its canary):
                # drop it, so neither this worker nor the next one loads it
                # again, and build it afresh once.
                self._reject(spec, target, exc)
                artifact, built = self.ensure(spec, target, build=build)
                return self.compiler.load(artifact), built
        except (NoGpu, UnsupportedGpu, UnsupportedSpec, NotSerializable, PlanRejected, BuildError) as exc:
            if not (self.torch_fallback and fallback):
                raise
            from graphcache.compilers.torch_backward import fallback_graph

            self._stats.bump("fallbacks")
            return fallback_graph(spec, reason=str(exc)), False

    def _reject(self, spec: GraphSpec, target: Target | None, exc: PlanRejected) -> None:
        key = self.key(spec, target)
        self._classes.discard(spec, self.target(target))
        self._stats.bump("rejected")
        if exc.reason == "canary_mismatch":
            self._stats.bump("canary_failures")
        log.error("stored plan %s rejected (%s), removing it: %s", key[:12], exc.reason, exc)
        try:
            self.store.delete(key)
        except GraphCacheError as err:
            log.warning("could not remove rejected entry %s: %s", key[:12], err)

    def prefetch(
        self, specs: Iterable[GraphSpec], target: Target | None = None, *, progress: Callable[[str], None] | None = None
    ) -> PrefetchReport:
        """Fetch every spec's artifact for ``target`` (default: this
        machine's) in as few requests as the store allows, so the loads that
        follow read the local tier only. Through a TieredStore (a worker with
        GRAPHCACHE_SERVER) the local tier is filled. Each artifact is verified
        as ``lookup`` verifies it; a corrupt one is removed and counted
        missing. ``progress(key)`` is called as each key is answered.

        Raises StoreUnavailable when the remote tier failed (down, or its
        store unavailable): what it holds is unknown, not missing."""
        tgt, slack = self.target(target), self.class_slack
        return fetch_all(self.store, specs, tgt, self.uids, self.shape_classes, self._decoded, progress, slack)

    def stats(self) -> dict[str, Any]:
        """Counters, each named in graphcache.counters.Stats: ``hits`` (=
        ``served_from_store``), ``built_here`` (= ``builds``), ``fallbacks``, ..."""
        return self._stats.as_dict()
