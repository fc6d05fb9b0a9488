"""Manifests: the shapes a model serves, as families that expand to specs.

```yaml
defaults:            # applied to every family
  dtype: bfloat16
  layout: bshd
graphs:
  - name: llama3-8b-prefill
    heads_q: 32
    heads_kv: 8
    head_dim: 128
    mask: causal
    batch: [1, 2, 4, 8]                  # lists expand as a cross product
    seq_q: [128, 256, 512, 1024, 2048, 4096]
```
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError, ManifestTooLarge, SpecError
from graphcache.settings import DEFAULT_MAX_SPECS
from graphcache.spec import GraphSpec
from graphcache.spec.bounds import shown

TOP_LEVEL = {"defaults", "graphs"}
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(GraphSpec))
# Values (YAML nodes) a manifest may hold, its aliases expanded, per spec it
# may name (GRAPHCACHE_MAX_SPECS): a recorded manifest, one family per spec,
# holds about 10 per spec; a family of lists far fewer. A 420-byte manifest
# of nested aliases held 10**9, and PyYAML composes some 20,000 a second.
NODES_PER_SPEC = 32
MIN_NODES = 10_000
MAX_DEPTH = 64  # levels of nesting (a manifest uses four)
# Specs expanded (or 16 times that, YAML values read) between two looks at
# ``cancelled``: a few milliseconds of work, so a server's caller can also
# give way to its other requests there (service.scans paces on it).
CANCEL_EVERY = 16


def load(path: str | Path, *, max_specs: int = DEFAULT_MAX_SPECS) -> list[GraphSpec]:
    """Every spec the manifest names, in order, duplicates collapsed.

    Raises ManifestError naming the file, the entry and the field, and
    ManifestTooLarge (before expanding anything) for a manifest that names
    more than ``max_specs`` specs or holds more values than they need
    (``node_limit``), its aliases expanded.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return expand(parse(text, str(path), max_specs=max_specs), source=str(path), max_specs=max_specs)


def node_limit(max_specs: int) -> int:
    """The values (YAML nodes) a manifest of at most ``max_specs`` specs may hold."""
    return max(MIN_NODES, NODES_PER_SPEC * max_specs)


def parse(
    text: str,
    source: str = "<manifest>",
    *,
    max_specs: int = DEFAULT_MAX_SPECS,
    cancelled: Callable[[], bool] | None = None,
) -> Any:
    """The data of a manifest's YAML (or JSON) text, bounded before it is
    built: its parse events are read first, and reading stops at once where
    its values, every alias expanded, pass ``node_limit(max_specs)``
    (ManifestTooLarge), where it nests deeper than ``MAX_DEPTH``, at an
    alias to a node that holds it, or when ``cancelled`` says so; a number
    past Python's 4,300 digits is an error too.

    Raises ManifestError (ManifestTooLarge for the size) naming ``source``.
    """
    import yaml

    # libyaml where it is there (PyYAML's own parser reads some 20,000
    # values a second); its composer recurses on the C stack (100,000
    # levels crashed the process), so it builds only what passed the count.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _count(yaml.parse(text, Loader=loader), source, node_limit(max_specs), cancelled)
        return yaml.load(text, Loader=loader)
    except ManifestError:
        raise
    except yaml.YAMLError as exc:
        if "nesting depth" in str(getattr(exc, "problem", None)):
            # PyYAML 6.0.4's libyaml stops at its own depth (1,000) while
            # scanning ahead, before the count above sees level 65.
            raise ManifestError(f"{source}: not valid YAML: nested too deep (more than {MAX_DEPTH} levels)") from None
        raise ManifestError(parse_error_text(source, exc)) from exc
    except RecursionError:
        raise ManifestError(f"{source}: not valid YAML: nested too deep") from None
    except ValueError as exc:  # int() of a number past 4,300 digits
        raise ManifestError(f"{source}: not valid YAML: {str(exc)[:200]}") from None


def _count(events: Any, source: str, limit: int, cancelled: Callable[[], bool] | None) -> None:
    """Read ``events`` (a YAML parse), counting the values they make, each
    alias as the values its anchor names; ManifestError past ``limit``
    values (ManifestTooLarge), past MAX_DEPTH levels, at a recursive alias."""
    import yaml

    total = 0
    sizes: dict[str, int] = {}  # anchor -> the values its node holds, once it is whole
    open_: list[tuple[str | None, int]] = []  # (anchor, total before it) of each collection still open
    for seen, event in enumerate(events, 1):
        if cancelled is not None and seen % (16 * CANCEL_EVERY) == 0 and cancelled():
            raise ManifestError(f"{source}: reading abandoned after {total} values (the request ended)")
        if isinstance(event, yaml.AliasEvent):
            if event.anchor not in sizes:
                raise ManifestError(f"{source}: the YAML alias *{str(event.anchor)[:60]} names a node that holds it")
            total += sizes[event.anchor]
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            open_.append((event.anchor, total))
            total += 1
            if len(open_) > MAX_DEPTH:
                raise ManifestError(f"{source}: not valid YAML: nested too deep (more than {MAX_DEPTH} levels)")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, before = open_.pop()
            if anchor is not None:
                sizes[anchor] = total - before
        elif isinstance(event, yaml.ScalarEvent):
            total += 1
            if event.anchor is not None:
                sizes[event.anchor] = 1
        if total > limit:
            raise ManifestTooLarge(
                f"{source}: holds more than {limit} values, its YAML aliases expanded: more than the "
                f"{limit // NODES_PER_SPEC} specs GRAPHCACHE_MAX_SPECS allows need; write each family's fields "
                "once (fewer aliases), or split it",
                limit=limit,
                named=total,
            )


def parse_error_text(path: str | Path, exc: Exception) -> str:
    """One line naming the file, line and column of a YAML or JSON syntax error
    (PyYAML's own text spans several lines and names '<unicode string>')."""
    import json

    import yaml

    if isinstance(exc, json.JSONDecodeError):
        return f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        problem = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {problem}"
    return f"{path}: not valid YAML: {' '.join(str(exc).split())}"


def expand(
    data: Any,
    source: str = "<manifest>",
    *,
    max_specs: int = DEFAULT_MAX_SPECS,
    cancelled: Callable[[], bool] | None = None,
) -> list[GraphSpec]:
    """Expand an already parsed manifest (see ``load``).

    The specs it names (each family's cross product, before duplicates
    collapse) are counted first: past ``max_specs``, ManifestTooLarge names
    the cap and nothing is expanded. ``cancelled`` is asked every
    ``CANCEL_EVERY`` specs while they are made (a client that went away):
    when it says so, ManifestError ends the expansion.
    """
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: a manifest is a mapping with 'defaults' and 'graphs'")
    unknown = set(data) - TOP_LEVEL
    if unknown and unknown <= _SPEC_FIELDS:  # GraphSpec's own fields at the top: a spec file
        raise ManifestError(
            f"{source}: this is a spec file (one GraphSpec, its fields at the top level), and this verb takes a "
            "manifest: put the fields under 'graphs:' as one family, e.g. 'graphs: [{name: mine, batch: 1, ...}]' "
            "(docs/examples/README.md); key, explain, doctor --spec and bench --spec take a spec file as it is"
        )
    if unknown:
        listed = ", ".join(shown(k) for k in list(unknown)[:5])
        raise ManifestError(f"{source}: unknown top-level key(s) {listed}; allowed: defaults, graphs")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ManifestError(f"{source}: 'defaults' must be a mapping of spec fields")
    _check_fields(source, "defaults", defaults)
    graphs = data.get("graphs")
    if not isinstance(graphs, list) or not graphs:
        raise ManifestError(f"{source}: 'graphs' must be a non-empty list of families")
    families = []
    names: set[str] = set()
    named = 0
    for index, family in enumerate(graphs):
        entry = f"graphs[{index}]"
        if not isinstance(family, dict):
            raise ManifestError(f"{source}: {entry} must be a mapping with a name and spec fields")
        name = family.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{source}: {entry} needs a 'name'")
        entry = f"{entry} ({name if len(name) <= 64 else shown(name)})"
        if name in names:
            raise ManifestError(f"{source}: {entry}: the name {shown(name)} is used twice")
        names.add(name)
        fields = {k: v for k, v in family.items() if k != "name"}
        _check_fields(source, entry, fields)
        axes = []
        for field, value in {**defaults, **fields}.items():
            if isinstance(value, list):
                if not value:
                    raise ManifestError(f"{source}: {entry}: field '{field}' is an empty list")
                axes.append([(field, v) for v in value])
            else:
                axes.append([(field, value)])
        named += math.prod(len(axis) for axis in axes)
        if named > max_specs:
            raise ManifestTooLarge(
                f"{source}: names {named} or more specs (each family's lists multiplied, up to {entry}); "
                f"a manifest may name at most {max_specs} (GRAPHCACHE_MAX_SPECS): split it, or raise the cap",
                limit=max_specs,
                named=named,
            )
        families.append((entry, axes))
    specs: dict[str, GraphSpec] = {}
    made = 0
    for entry, axes in families:
        for combo in itertools.product(*axes):
            made += 1
            if cancelled is not None and made % CANCEL_EVERY == 0 and cancelled():
                raise ManifestError(f"{source}: expansion abandoned after {made} specs (the request ended)")
            try:
                spec = GraphSpec.from_dict(dict(combo))
            except SpecError as exc:
                where = f"field '{exc.field}'" if exc.field else "spec"
                raise ManifestError(f"{source}: {entry}: {where}: {exc}") from exc
            specs.setdefault(spec.canonical_json(), spec)
    return list(specs.values())


def _check_fields(source: str, entry: str, fields: dict[str, Any]) -> None:
    import difflib

    names = GraphSpec.field_names()
    for field in fields:
        if field not in names:
            text = field if isinstance(field, str) and len(field) <= 64 else shown(field)
            close = difflib.get_close_matches(str(text), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ManifestError(f"{source}: {entry}: unknown field '{text}'{hint}")
