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
from pathlib import Path
from typing import Any

from graphcache.errors import ManifestError, SpecError
from graphcache.spec import GraphSpec

TOP_LEVEL = {"defaults", "graphs"}
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(GraphSpec))


def load(path: str | Path) -> list[GraphSpec]:
    """Every spec the manifest names, in order, duplicates collapsed.

    Raises ManifestError naming the file, the entry and the field.
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ManifestError(parse_error_text(path, exc)) from exc
    return expand(data, source=str(path))


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


def expand(data: Any, source: str = "<manifest>") -> list[GraphSpec]:
    """Expand an already parsed manifest (see ``load``)."""
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
        raise ManifestError(f"{source}: unknown top-level key(s) {sorted(unknown)}; allowed: defaults, graphs")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ManifestError(f"{source}: 'defaults' must be a mapping of spec fields")
    _check_fields(source, "defaults", defaults)
    graphs = data.get("graphs")
    if not isinstance(graphs, list) or not graphs:
        raise ManifestError(f"{source}: 'graphs' must be a non-empty list of families")
    specs: dict[str, GraphSpec] = {}
    names: set[str] = set()
    for index, family in enumerate(graphs):
        entry = f"graphs[{index}]"
        if not isinstance(family, dict):
            raise ManifestError(f"{source}: {entry} must be a mapping with a name and spec fields")
        name = family.get("name")
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{source}: {entry} needs a 'name'")
        entry = f"{entry} ({name})"
        if name in names:
            raise ManifestError(f"{source}: {entry}: the name {name!r} is used twice")
        names.add(name)
        fields = {k: v for k, v in family.items() if k != "name"}
        _check_fields(source, entry, fields)
        merged = {**defaults, **fields}
        axes = []
        for field, value in merged.items():
            if isinstance(value, list):
                if not value:
                    raise ManifestError(f"{source}: {entry}: field '{field}' is an empty list")
                axes.append([(field, v) for v in value])
            else:
                axes.append([(field, value)])
        for combo in itertools.product(*axes):
            values = dict(combo)
            try:
                spec = GraphSpec.from_dict(values)
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
            close = difflib.get_close_matches(str(field), names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ManifestError(f"{source}: {entry}: unknown field '{field}'{hint}")
