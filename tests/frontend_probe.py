"""Run graphcache's dialect chain inside whichever cudnn-frontend is importable.

tests/test_frontend_versions.py runs this file in a subprocess whose
PYTHONPATH puts one old frontend (scripts/tools/old_frontends.sh) first, and reads
the JSON it prints. The real binding's ``pygraph`` is subclassed only to
record what each call received and how it ended; every call still goes to the
binding. Usage: python tests/frontend_probe.py '{"specs": [SPEC, ...], "lower": false, "future": false}'
"""

from __future__ import annotations

import json
import re
import sys
import types
from typing import Any


def describe(cudnn: Any) -> dict[str, Any]:
    """The release's module attributes and sdpa keywords, from the binding itself."""
    compiled = getattr(cudnn, "_compiled_module", None)
    backend = getattr(compiled, "backend_graph", None)
    # 1.27+: pygraph is Python and takes **kwargs; the keywords are the C++ node's.
    doc = (backend.sdpa if backend is not None else cudnn.pygraph.sdpa).__doc__ or ""
    match = re.search(r"sdpa\((.*?)\)\s*->", doc, re.S)
    params = re.split(r",\s*(?=\w+:)", match.group(1)) if match else []
    names = [p.split(":")[0].strip() for p in params]
    # deserialize's overloads, from the C++ binding (1.27+: behind a Python passthrough).
    graph = backend if backend is not None and hasattr(backend, "deserialize") else cudnn.pygraph
    deserialize = " ".join((graph.deserialize.__doc__ or "").split())
    return {
        "version": cudnn.__version__,
        "deserialize_takes_handle": "handle_" in deserialize,
        "deserialize_enforce": "enforce_precompiled" in deserialize,
        "attrs": sorted(a for a in dir(cudnn) if not a.startswith("__")),
        "sdpa_keywords": [n for n in names if n != "self"],
        "required": [p.split(":")[0].strip() for p in params if "=" not in p and not p.startswith("self")],
    }


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    name = getattr(value, "name", None)  # pybind enums (diagonal_alignment.TOP_LEFT)
    return name if isinstance(name, str) else type(value).__name__


def recording_module(cudnn: Any, log: list[dict[str, Any]]) -> Any:
    """The real module with a pygraph subclass that logs sdpa() and validate()."""

    class Recorded(cudnn.pygraph):  # type: ignore[misc, name-defined]
        def sdpa(self, *args: Any, **kwargs: Any) -> Any:
            entry: dict[str, Any] = {
                "kwargs": {
                    k: _plain(v) for k, v in kwargs.items() if k not in ("q", "k", "v", "seq_len_q", "seq_len_kv")
                }
            }
            log.append(entry)
            try:
                result = super().sdpa(*args, **kwargs)
            except Exception as exc:
                entry["sdpa"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                raise
            entry["sdpa"] = "ok"
            self._entry = entry
            return result

        def _step(self, step: str, *args: Any) -> Any:
            entry = getattr(self, "_entry", {})
            try:
                result = getattr(super(), step)(*args)
            except Exception as exc:
                entry[step] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                raise
            entry[step] = "ok"
            return result

        def validate(self) -> Any:
            return self._step("validate")

        def build_operation_graph(self) -> Any:
            return self._step("build_operation_graph")

        def create_execution_plans(self, *args: Any) -> Any:
            return self._step("create_execution_plans", *args)

    attrs = {name: getattr(cudnn, name) for name in dir(cudnn) if not name.startswith("__")}
    return types.SimpleNamespace(**{**attrs, "pygraph": Recorded, "__version__": cudnn.__version__})


def build(cudnn: Any, spec_json: str, lower: bool, future: bool) -> dict[str, Any]:
    from graphcache.compilers.cudnn import DIALECTS, Dialect, build_graph
    from graphcache.spec import GraphSpec

    spec = GraphSpec.from_dict(json.loads(spec_json))
    log: list[dict[str, Any]] = []
    dialects = DIALECTS
    if future:
        # A dialect with a keyword no release has: where does the binding refuse it?
        newest = DIALECTS[0]
        dialects = (
            Dialect(
                "future", "none", lambda c, s: {**(newest.kwargs(c, s) or {}), "future_keyword": 1}, newest.requires
            ),
            *DIALECTS,
        )
    out: dict[str, Any] = {"version": cudnn.__version__, "calls": log}
    try:
        built = build_graph(recording_module(cudnn, log), spec, lower=lower, dialects=dialects)
    except Exception as exc:  # noqa: BLE001 - the test asserts on the type and text
        out.update(outcome="error", error_type=type(exc).__name__, error=str(exc))
        out["error_types"] = [t.__name__ for t in type(exc).__mro__]
        out["cause_type"] = type(exc.__cause__).__name__ if exc.__cause__ is not None else None
    else:
        out.update(outcome="built", dialect=built.dialect, skipped=built.skipped, steps=sorted(built.timings))
    return out


def main() -> None:
    import cudnn  # type: ignore[import-not-found]

    job = json.loads(sys.argv[1])
    lower, future = bool(job.get("lower")), bool(job.get("future"))
    results = [build(cudnn, json.dumps(spec), lower, future) for spec in job["specs"]]
    print(json.dumps({"describe": describe(cudnn), "results": results}))


if __name__ == "__main__":
    main()
