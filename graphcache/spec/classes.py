"""Length classes: which class spec serves an exact spec. The one place the
class policy is applied (its names and their check, read at start with the
other settings, are ``graphcache.settings``'s, re-exported here).

A class spec (``shapes="class"``) declares maxima for ``batch``, ``seq_q``
and ``seq_kv``; its graph is built once (cuDNN's execute-time shape
override, with the padding mask) and serves every real shape up to them.
A cache keyed by exact shapes misses on every decode step (``seq_kv`` grows
by one a token) and on every new prompt length; under a class policy a whole
``generate`` run needs a handful of graphs.

Policies (``GRAPHCACHE_SHAPE_CLASSES``):

``pow2`` (the default)
    ``seq_q == 1`` stays 1: cuDNN cannot override a graph across
    ``s_q == 1`` in either direction, so decode has classes of its own
    (cudnn-frontend#1087, #1148). Every other ``seq_q``, and every
    ``seq_kv``, rounds up to a power of two, at least 128, so lengths up to
    128 and above it never share a declaration: cuDNN's heuristic picks
    another engine between a declared 128 and 256, and a long declaration
    runs short rows up to 2.3x slower (#1087, measured on B200). ``batch``
    rounds up to a power of two. At most 2x the real length is declared, so
    the padded work a graph may do stays bounded, and the number of classes
    grows with the log of the longest length.
``exact``
    No classes: every spec is its own graph (the behaviour before classes).
"""

from __future__ import annotations

from graphcache.errors import SpecError
from graphcache.settings import DEFAULT_POLICY, ENV_VAR, POLICIES, check_policy, policy_from_env
from graphcache.spec import GraphSpec

# The policy names and their check live in graphcache.settings (read at start
# with the other settings); re-exported here, where callers look for them.
__all__ = [
    "DEFAULT_POLICY",
    "ENV_VAR",
    "MIN_LENGTH",
    "POLICIES",
    "check_policy",
    "class_of",
    "declared",
    "has_class",
    "policy_from_env",
]

# The shortest declared length of a class (other than decode's seq_q of 1).
MIN_LENGTH = 128


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _length(n: int) -> int:
    return max(MIN_LENGTH, _pow2(n))


def class_of(spec: GraphSpec, policy: str | None = None) -> GraphSpec:
    """The spec whose graph serves ``spec`` under ``policy`` (default: the
    environment's, see ``policy_from_env``).

    Under ``pow2`` an exact spec maps to a class spec that ``covers`` it; a
    class spec is already its own class. Under ``exact`` the spec is returned
    as it is, and so is a spec no class serves (``has_class``). Raises
    SettingsError for an unknown policy.
    """
    policy = policy_from_env() if policy is None else check_policy(policy, "policy")
    if policy == "exact" or not has_class(spec):
        return spec
    try:
        return spec.replace(shapes="class", **_rounded(spec))
    except SpecError:
        return spec  # rounded up past what cuDNN holds (spec/bounds.py): the exact graph serves it


def declared(spec: GraphSpec, policy: str | None = None) -> GraphSpec:
    """The thd (ragged or paged) spec whose graph serves a call's exact thd
    spec under ``policy`` (default: the environment's). A thd graph serves
    every call of up to ``batch`` sequences and ``seq_q`` / ``seq_kv`` tokens
    (its offsets and the padding mask place and end each sequence; no shape
    override), so under ``pow2`` its sizes round up as ``class_of`` rounds a
    dense class; under ``exact`` the call's own sizes. Raises SettingsError
    for an unknown policy."""
    policy = policy_from_env() if policy is None else check_policy(policy, "policy")
    if policy == "exact":
        return spec
    try:
        return spec.replace(**_rounded(spec))
    except SpecError:
        return spec  # rounded up past what cuDNN holds (spec/bounds.py): the call's own sizes


def _rounded(spec: GraphSpec) -> dict[str, int]:
    """The policy's sizes: ``seq_q`` of 1 stays 1 (decode), other lengths to a
    power of two of at least MIN_LENGTH, batch to a power of two."""
    assert spec.seq_kv is not None
    seq_q = 1 if spec.seq_q == 1 else _length(spec.seq_q)
    # A paged spec's seq_kv is its block table's reach, fixed by the engine's
    # pool and table width, not a length to round: the table serves them all.
    seq_kv = spec.seq_kv if spec.page_size is not None else _length(spec.seq_kv)
    return {"batch": _pow2(spec.batch), "seq_q": seq_q, "seq_kv": seq_kv}


def has_class(spec: GraphSpec) -> bool:
    """Whether a class can serve ``spec``: a dense (any tensor layouts, unpaged)
    exact spec without dropout. Dropout graphs stay exact because nothing
    could guard their overrides: the build-time check compares a graph with
    the float32 reference, and a dropout graph's output has no reference to
    compare with. Ragged and paged (thd) graphs serve many lengths through
    their offsets and page tables already, with no override
    (``declared`` rounds them)."""
    dense = spec.layout != "thd" and getattr(spec, "page_size", None) is None
    return dense and not spec.is_class and not spec.dropout
