"""Settings: one object, read once from GRAPHCACHE_* environment variables."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from graphcache.errors import GraphCacheError

MiB = 1024**2
UPLOAD_BUDGET_UPLOADS = 4  # the default GRAPHCACHE_UPLOAD_BUDGET, in largest uploads
DEFAULT_BODY_BUDGET = 16 * MiB  # read-route bodies (manifests of 1 MiB, batches, specs) one worker holds
log = logging.getLogger(__name__)
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_SEND_TIMEOUT = 30.0
# Specs one manifest may name, counted before it is expanded. The largest
# real deploy measured (`graphcache manifest docs/examples/configs/llama-3-8b
# --max-batch 64 --max-seq 8192`) names 616 by default (both cache kinds,
# eager and compiled code; 182 with --cache dynamic --no-compiled): this
# holds six such models in one manifest.
DEFAULT_MAX_SPECS = 4096
# The server's time a manifest's coverage may take (the status page, open
# wherever reads are): one 1 KB manifest of 4,096 exact specs costs about
# 0.5 s of CPU per target stored; a real deploy's manifest (200 to 300
# specs) about 0.05 s.
DEFAULT_MANIFEST_SECONDS = 2.0
DEFAULT_CLIENT_SECONDS = 10.0  # per client address, a minute


class SettingsError(GraphCacheError, ValueError):
    """An environment variable holds a value graphcache cannot use."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "graphcache"


@dataclass(frozen=True)
class Settings:
    """Everything configurable, with the environment variable that sets it.

    cache_dir        GRAPHCACHE_DIR            the DiskStore folder
    store            GRAPHCACHE_STORE          '' (DiskStore in cache_dir), redis://..., http://...
                     GRAPHCACHE_STORE_FILE     or a file holding it (a secret's mount): a password never on a
                                               command line
    size_limit       GRAPHCACHE_SIZE_LIMIT     DiskStore bytes before LRU eviction
    max_upload       GRAPHCACHE_MAX_UPLOAD     largest accepted upload, bytes
    max_artifact     GRAPHCACHE_MAX_ARTIFACT   largest answer (an artifact, a batch record, a listing page) a
                                               client reads from a server (default: max_upload)
    upload_budget    GRAPHCACHE_UPLOAD_BUDGET  upload bytes one server worker takes in at once (4 x max_upload)
    body_budget      GRAPHCACHE_BODY_BUDGET    bytes of other request bodies (batch, resolve, a manifest) it holds
    hot_cache_bytes  GRAPHCACHE_HOT_CACHE      memory for small verified entries the server keeps hot (0: off)
    quarantine_size  GRAPHCACHE_QUARANTINE_SIZE bytes the server's quarantine folder keeps, oldest dropped first
    write_tokens     GRAPHCACHE_WRITE_TOKENS   comma-separated bearer tokens for PUT/build
    read_tokens      GRAPHCACHE_READ_TOKENS    tokens for reads; reads are open when unset
    admin_tokens     GRAPHCACHE_ADMIN_TOKENS   tokens for DELETE and purge
    signing_key      GRAPHCACHE_SIGNING_KEY    HMAC key(s), comma-separated: the first signs, every one verifies
    signing_keys                               all of them (``verify_keys``: what a signature is checked against)
    require_signed   GRAPHCACHE_REQUIRE_SIGNED clients and the server refuse unsigned artifacts (1/0; 1 with a key)
    server           GRAPHCACHE_SERVER         service URL the CLI and workers use
    token            GRAPHCACHE_TOKEN          bearer token the CLI and workers send
    timeout          GRAPHCACHE_TIMEOUT        client timeout in seconds; the server's bound on each store call
    upload_timeout   GRAPHCACHE_UPLOAD_TIMEOUT seconds a client may take to send an upload or a batch body (then 408)
    header_timeout   GRAPHCACHE_HEADER_TIMEOUT seconds a connection may take to send a request head (then closed)
    send_timeout     GRAPHCACHE_SEND_TIMEOUT   seconds a client may leave the server's buffer of its answer undrained
                                               (then the connection is closed; service.transport)
    canary           GRAPHCACHE_CANARY         run each loaded cuDNN plan once on the canary input (1/0, default 1)
    max_batch        GRAPHCACHE_MAX_BATCH      most keys one POST /v1/batch may ask for (then 413)
    max_specs        GRAPHCACHE_MAX_SPECS      most specs one manifest may name, counted before it is expanded
                                               (then 413, or a one-line CLI error; default 4096)
    manifest_seconds GRAPHCACHE_MANIFEST_SECONDS  CPU seconds the server may spend checking one posted or named
                                               manifest's coverage (then 413; default 2)
    client_seconds   GRAPHCACHE_CLIENT_SECONDS CPU seconds of such checks one client address may take a minute,
                                               each reserving manifest_seconds (then 429; default 10)
    http_max_age     GRAPHCACHE_HTTP_MAX_AGE   seconds HTTP caches may keep an artifact when reads are open
    shape_classes    GRAPHCACHE_SHAPE_CLASSES  length-class policy: pow2 (default) or exact (graphcache.spec.classes)
    class_slack      GRAPHCACHE_CLASS_SLACK    a larger stored class serves a call when it declares at most this
                                               many times the work of the call's own class (default 4; classindex)
    compiler         GRAPHCACHE_COMPILER       cudnn (default), reference or module:Class (graphcache.compilers.named)
    manifests        GRAPHCACHE_MANIFESTS      folder of manifests the status page may name (GET /?manifest=NAME)
    reference_cudnn  GRAPHCACHE_REFERENCE_CUDNN    the cuDNN the reference compiler stands in for (default 0.0.0:
                                                   none, every feature); its builds apply the release table
    reference_frontend GRAPHCACHE_REFERENCE_FRONTEND  likewise the cudnn-frontend (default 0.0.0: none)
    """

    cache_dir: Path = field(default_factory=default_cache_dir)
    store: str = ""
    size_limit: int = 10 * 1024 * MiB
    max_upload: int = 64 * MiB
    max_artifact: int = 0  # 0: max_upload, the largest artifact a server of the same settings stores
    upload_budget: int = 0  # 0: UPLOAD_BUDGET_UPLOADS x max_upload
    body_budget: int = DEFAULT_BODY_BUDGET
    hot_cache_bytes: int = 64 * MiB
    quarantine_size: int = 1024 * MiB
    write_tokens: tuple[str, ...] = ()
    read_tokens: tuple[str, ...] = ()
    admin_tokens: tuple[str, ...] = ()
    signing_key: bytes | None = None
    signing_keys: tuple[bytes, ...] = ()
    require_signed: bool = False
    server: str = ""
    token: str | None = None
    timeout: float = 5.0
    upload_timeout: float = 60.0
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    send_timeout: float = DEFAULT_SEND_TIMEOUT
    build: bool = True
    canary: bool = True
    max_batch: int = 1024
    max_specs: int = DEFAULT_MAX_SPECS
    manifest_seconds: float = DEFAULT_MANIFEST_SECONDS
    client_seconds: float = DEFAULT_CLIENT_SECONDS
    http_max_age: int = 86400
    shape_classes: str = "pow2"
    class_slack: float = 4.0
    compiler: str = ""
    manifests: Path | None = None
    reference_cudnn: str = "0.0.0"
    reference_frontend: str = "0.0.0"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read GRAPHCACHE_* variables; ``overrides`` (non-None) win.

        Raises SettingsError naming the variable and the expected form.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get("GRAPHCACHE_" + name)
            return value if value not in (None, "") else None

        values: dict[str, object] = {}
        if (v := get("DIR")) is not None:
            values["cache_dir"] = Path(v).expanduser()
        if (v := get("STORE")) is not None:
            values["store"] = v
        if (v := get("STORE_FILE")) is not None:
            values["store"] = _store_file(v, given=get("STORE") is not None)
        if (v := get("HOT_CACHE")) is not None:
            values["hot_cache_bytes"] = _int("GRAPHCACHE_HOT_CACHE", v, allow_zero=True)
        for name in ("SIZE_LIMIT", "MAX_UPLOAD", "MAX_ARTIFACT", "UPLOAD_BUDGET", "BODY_BUDGET", "QUARANTINE_SIZE"):
            if (v := get(name)) is not None:
                values[name.lower()] = _int("GRAPHCACHE_" + name, v)
        if (v := get("MAX_BATCH")) is not None:
            values["max_batch"] = _int("GRAPHCACHE_MAX_BATCH", v, unit="keys")
        if (v := get("MAX_SPECS")) is not None:
            values["max_specs"] = _int("GRAPHCACHE_MAX_SPECS", v, unit="specs")
        if (v := get("HTTP_MAX_AGE")) is not None:
            values["http_max_age"] = _int("GRAPHCACHE_HTTP_MAX_AGE", v, allow_zero=True, unit="seconds")
        for name in ("WRITE_TOKENS", "READ_TOKENS", "ADMIN_TOKENS"):
            if (v := get(name)) is not None:
                values[name.lower()] = tuple(t.strip() for t in v.split(",") if t.strip())
        if (v := get("SIGNING_KEY")) is not None:
            # Several keys during a rotation: the first signs, all verify.
            keys = tuple(k.strip().encode("utf-8") for k in v.split(",") if k.strip())
            if not keys:
                raise SettingsError(f"GRAPHCACHE_SIGNING_KEY={v!r} holds no key; give KEY or NEW,OLD")
            values["signing_key"], values["signing_keys"] = keys[0], keys
            # A key set protects clients by default: unsigned artifacts are refused.
            values["require_signed"] = True
        for name in ("REQUIRE_SIGNED", "BUILD", "CANARY"):
            if (v := get(name)) is not None:
                values[name.lower()] = _bool("GRAPHCACHE_" + name, v)
        if (v := get("MANIFESTS")) is not None:
            values["manifests"] = Path(v).expanduser()
        if (v := get("COMPILER")) is not None:
            values["compiler"] = check_compiler_name(v, "GRAPHCACHE_COMPILER")
        for name, example in (("REFERENCE_CUDNN", "9.19.0"), ("REFERENCE_FRONTEND", "1.28.0")):
            if (v := get(name)) is not None:
                values[name.lower()] = check_version(v, "GRAPHCACHE_" + name, example)
        if (v := get("SERVER")) is not None:
            values["server"] = v.rstrip("/")
        if (v := get("TOKEN")) is not None:
            values["token"] = v
        for name in (
            "TIMEOUT",
            "UPLOAD_TIMEOUT",
            "HEADER_TIMEOUT",
            "SEND_TIMEOUT",
            "MANIFEST_SECONDS",
            "CLIENT_SECONDS",
        ):
            if (v := get(name)) is not None:
                try:
                    values[name.lower()] = float(v)
                except ValueError:
                    raise SettingsError(f"GRAPHCACHE_{name}={v!r} must be seconds, e.g. 5") from None
                if not float(v) > 0:
                    raise SettingsError(f"GRAPHCACHE_{name}={v!r} must be more than 0 seconds, e.g. 5")
                if name in ("MANIFEST_SECONDS", "CLIENT_SECONDS") and float(v) == float("inf"):
                    # A budget, not a wait: an endless one would leave every check unbounded.
                    raise SettingsError(f"GRAPHCACHE_{name}={v!r} must be a finite number of CPU seconds, e.g. 2")
        # Checked here, at start, so a typo fails the worker before its first call.
        values["shape_classes"] = policy_from_env(env)
        values["class_slack"] = slack_from_env(env)
        values.update({k: val for k, val in overrides.items() if val is not None})
        settings = cls(**values)  # type: ignore[arg-type]
        if settings.require_signed and not settings.signing_key:
            raise SettingsError("GRAPHCACHE_REQUIRE_SIGNED=1 needs GRAPHCACHE_SIGNING_KEY")
        if settings.upload_budget < settings.max_upload:
            raise SettingsError(
                f"GRAPHCACHE_UPLOAD_BUDGET={settings.upload_budget} is below GRAPHCACHE_MAX_UPLOAD="
                f"{settings.max_upload}: no upload of the largest size could ever be taken in; raise it"
            )
        if settings.client_seconds < settings.manifest_seconds:
            raise SettingsError(
                f"GRAPHCACHE_CLIENT_SECONDS={settings.client_seconds:g} is below GRAPHCACHE_MANIFEST_SECONDS="
                f"{settings.manifest_seconds:g}: each manifest check reserves the latter from a client's share, "
                "so none could ever run; raise it"
            )
        if settings.signing_key and not settings.require_signed:
            log.warning(
                "GRAPHCACHE_REQUIRE_SIGNED=0 with GRAPHCACHE_SIGNING_KEY set: unsigned and wrongly signed "
                "artifacts are loaded and served (uploads are still checked)"
            )
        return settings

    def __post_init__(self) -> None:
        if not self.upload_budget:
            object.__setattr__(self, "upload_budget", UPLOAD_BUDGET_UPLOADS * self.max_upload)
        if not self.max_artifact:
            object.__setattr__(self, "max_artifact", self.max_upload)
        if self.signing_key and not self.signing_keys:
            object.__setattr__(self, "signing_keys", (self.signing_key,))

    @property
    def verify_keys(self) -> tuple[bytes, ...]:
        """Every key a signature may be made with (empty: no signing)."""
        return self.signing_keys


# The length-class policies (graphcache.spec.classes maps a spec to its class under
# them). Read here, with the other settings, so that checking the environment
# at start needs no spec code: classes imports settings, never the reverse.
POLICIES = ("pow2", "exact")
DEFAULT_POLICY = "pow2"
ENV_VAR = "GRAPHCACHE_SHAPE_CLASSES"


def check_policy(policy: str, source: str = "shape_classes") -> str:
    """``policy`` if it is one of POLICIES; else SettingsError naming
    ``source`` and the allowed values."""
    if policy not in POLICIES:
        raise SettingsError(
            f"{source}={policy!r} is not a shape-class policy; allowed: pow2 (one graph per power-of-two "
            "length class, the default), exact (one graph per exact shape)"
        )
    return policy


def policy_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The policy GRAPHCACHE_SHAPE_CLASSES names (``pow2`` when unset).

    Raises SettingsError listing the allowed values for any other text.
    """
    env = os.environ if environ is None else environ
    value = (env.get(ENV_VAR) or "").strip().lower() or DEFAULT_POLICY
    return check_policy(value, ENV_VAR)


# How much larger than a call's own class a stored class may be and still
# serve it (graphcache.classindex applies it).
SLACK_VAR = "GRAPHCACHE_CLASS_SLACK"
DEFAULT_SLACK = 4.0


def check_slack(value: object, source: str = "class_slack") -> float:
    """``value`` as a slack (a finite number >= 1); else SettingsError naming ``source``."""
    try:
        slack = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        slack = float("nan")
    if isinstance(value, bool) or not 1.0 <= slack < float("inf"):
        raise SettingsError(
            f"{source}={value!r} is not a class slack: give a number >= 1, the most work (batch x seq_q x "
            f"seq_kv) a stored larger class may declare, as a multiple of the call's own class "
            f"(default {DEFAULT_SLACK:g}; 1: only the call's own class serves)"
        )
    return slack


def slack_from_env(environ: Mapping[str, str] | None = None) -> float:
    """The slack GRAPHCACHE_CLASS_SLACK names (4 when unset); SettingsError for a bad value."""
    env = os.environ if environ is None else environ
    value = (env.get(SLACK_VAR) or "").strip()
    return check_slack(value, SLACK_VAR) if value else DEFAULT_SLACK


# The compilers known by name (graphcache.compilers.named makes them).
COMPILER_NAMES = ("cudnn", "reference")
COMPILER_HELP = "cudnn (the default), reference (no GPU: torch SDPA under a target of its own), or module:Class"


def check_compiler_name(name: str, source: str = "compiler") -> str:
    """``name`` stripped, if it is one of COMPILER_NAMES or looks like
    module:Class; else SettingsError naming ``source`` and the allowed values."""
    text = name.strip()
    module, sep, attr = text.partition(":")
    if text in COMPILER_NAMES or (sep and module and attr):
        return text
    raise SettingsError(f"{source}={name!r} names no compiler; give {COMPILER_HELP}")


def check_version(value: str, source: str, example: str) -> str:
    """``value`` stripped if it is a release number (two to four dot-separated
    numbers); else SettingsError naming ``source`` with an example."""
    text = value.strip()
    parts = text.split(".")
    if not 2 <= len(parts) <= 4 or not all(p.isdigit() and p.isascii() and len(p) <= 6 for p in parts):
        raise SettingsError(f"{source}={value!r} is not a release number; write it as {example} (0.0.0: no limit)")
    return text


def _store_file(path: str, *, given: bool) -> str:
    """The store location GRAPHCACHE_STORE_FILE's file holds (its first line,
    stripped): where a URL's password is kept out of every command line and
    environment listing, as a container's secret is mounted."""
    if given:
        raise SettingsError(
            "GRAPHCACHE_STORE and GRAPHCACHE_STORE_FILE are both set: give the store's location in one of them"
        )
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SettingsError(
            f"GRAPHCACHE_STORE_FILE={path!r} cannot be read ({why}): name a file holding the store's location, "
            "e.g. redis://:PASSWORD@host:6379/0"
        ) from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise SettingsError(
            f"GRAPHCACHE_STORE_FILE={path!r} is empty: write the store's location in it, e.g. redis://:PASSWORD@host:6379/0"
        )
    return lines[0].strip()


def _int(name: str, value: str, allow_zero: bool = False, unit: str = "bytes") -> int:
    try:
        number = int(value)
    except ValueError:
        raise SettingsError(f"{name}={value!r} must be a whole number of {unit}") from None
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        example = f", e.g. {name}=67108864 (64 MiB)" if unit == "bytes" else ""
        raise SettingsError(f"{name}={value!r} must be {bound} {unit}{example}")
    return number


def _bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name}={value!r} must be 1 or 0")
