"""``graphcache run``: an unchanged program with graphcache at both doors,
the way ``opentelemetry-instrument`` or ``ddtrace-run`` wrap one.

The verb runs COMMAND as a child process with ``run_site/`` first on
PYTHONPATH, where a ``sitecustomize`` module calls ``bootstrap()`` in every
Python process the command starts (then runs whatever ``sitecustomize`` the
environment had). ``bootstrap`` waits for the program to import torch (an
import hook: a process that never does pays nothing), then ``start``s:
``graphcache.torch.install()`` (PyTorch's own door) and ``enable()`` (the
``patch()`` door) for the life of the process; a cache of the chosen compiler
(GRAPHCACHE_COMPILER: for ``reference``, on the tensors' device); and with
``--record``, a recorder. At exit each process writes what it saw (its
``stats()`` and its recording) to ``<pid>.json`` in the run's folder
(GRAPHCACHE_RUN_DIR), and the verb sums them: ``totals`` and, from the
recordings of every process, one manifest (``write_manifest``).

Imports no torch here; ``start`` and ``write_manifest`` import graphcache.torch.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RUN_DIR = "GRAPHCACHE_RUN_DIR"  # the run's folder: each process writes <pid>.json there at exit
RUN_RECORD = "GRAPHCACHE_RUN_RECORD"  # 1: record every call
RUN_DTYPE = "GRAPHCACHE_RUN_DTYPE"  # the dtype a recording writes its specs in
RUN_BACKWARD = "GRAPHCACHE_RUN_BACKWARD"  # 1: record each call's backward spec too (a training step)
SITE = Path(__file__).parent / "run_site"


def child_env(
    run_dir: str, compiler: str | None, record: bool, dtype: str | None, backward: bool = False
) -> dict[str, str]:
    """The environment COMMAND runs in: this one, ``run_site`` first on
    PYTHONPATH, and the run's settings."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    env[RUN_DIR] = run_dir
    if compiler:
        env["GRAPHCACHE_COMPILER"] = compiler
    if record:
        env[RUN_RECORD] = "1"
    if dtype:
        env[RUN_DTYPE] = dtype
    if backward:
        env[RUN_BACKWARD] = "1"
    return env


class _AfterTorch(importlib.abc.MetaPathFinder):
    """Finds torch as the other finders do, and runs ``start`` once its module has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            start()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def bootstrap() -> None:
    """In a process ``graphcache run`` started: ``start`` once torch is
    imported (at once where it already is)."""
    if "torch" in sys.modules:
        start()
    elif not any(isinstance(f, _AfterTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorch())


_STARTED: list[Any] = []  # the recorder (or None) once started


def start() -> None:
    """Both doors for the life of this process, the chosen compiler's cache,
    a recorder with --record, and ``<pid>.json`` written at exit. Never
    raises into the program: a failure is one line on stderr."""
    if _STARTED:
        return
    try:
        import torch

        import graphcache.torch as gt
        from graphcache.cache import GraphCache
        from graphcache.settings import Settings

        recorder = None
        compiler = Settings.from_env().compiler or "cudnn"
        if compiler != "cudnn":  # cudnn: the runtime's own cache, made at the first CUDA call
            device = "cuda" if torch.cuda.is_available() else "cpu"
            gt.configure(GraphCache.from_env(compiler=compiler), device=device)
        gt.install()
        gt.enable()
        if os.environ.get(RUN_RECORD) == "1":
            recorder = gt.Recorder(os.environ.get(RUN_DTYPE) or None, backward=os.environ.get(RUN_BACKWARD) == "1")
            gt.RUNTIME.recorders.append(recorder)
        _STARTED.append(recorder)
        atexit.register(_write_part)
    except Exception as exc:  # noqa: BLE001 - the program runs on, without graphcache
        print(f"graphcache run: not serving this process ({type(exc).__name__}: {exc})", file=sys.stderr)


def _write_part() -> None:
    folder = os.environ.get(RUN_DIR)
    if not folder or not _STARTED:
        return
    import graphcache.torch as gt

    recorder = _STARTED[0]
    part: dict[str, Any] = {"pid": os.getpid(), "argv": sys.argv, "stats": gt.stats(), "recording": None}
    if recorder is not None:
        part["recording"] = {
            "backend": recorder.backend,
            "specs": [[spec.to_dict(), n] for spec, n in recorder.specs.items()],
            "ineligible": [[code, message, n] for (code, message), n in recorder.ineligible.items()],
            "training": recorder.training,
            "backwards": [[spec.to_dict(), n] for spec, n in recorder.backwards.items()],
            "no_backward": [[code, message, n] for (code, message), n in recorder.no_backward.items()],
            "dropped": recorder.dropped(),  # what its bounded records left out (Recorder.dropped)
        }
    try:
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(part, default=str))
    except OSError as exc:
        print(f"graphcache run: could not write this process's counters: {exc}", file=sys.stderr)


# -- the verb's side: what the processes wrote -----------------------------------------------


def parts(run_dir: str | Path) -> list[dict[str, Any]]:
    """What each process of the run wrote at exit, by pid."""
    found = []
    for path in sorted(Path(run_dir).glob("*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a process killed while writing: its counters are lost, not the run's
    return found


def totals(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's counters summed over its processes: calls, hits (served
    from the store), built_here (served by graphs a process built on a miss),
    ``served`` (the share of calls either served), fallbacks by reason, and
    per door calls, hits, built_here and fallbacks (graphcache.torch.counts)."""
    calls = sum(p["stats"].get("calls", 0) for p in found)
    hits = sum(p["stats"].get("hits", 0) for p in found)
    built = sum(p["stats"].get("built_here", 0) for p in found)
    fallbacks: Counter[str] = Counter()
    doors: dict[str, dict[str, Any]] = {}
    for p in found:
        fallbacks.update(p["stats"].get("fallbacks", {}))
        for name, seen in p["stats"].get("doors", {}).items():
            door = doors.setdefault(
                name, {"calls": 0, "hits": 0, "built_here": 0, "relayed": 0, "fallbacks": Counter()}
            )
            for field in ("calls", "hits", "built_here", "relayed"):
                door[field] += seen.get(field, 0)
            door["fallbacks"].update(seen.get("fallbacks", {}))
    return {
        "processes": len(found),
        "calls": calls,
        "hits": hits,
        "served_from_store": hits,
        "built_here": built,
        "served": round((hits + built) / calls, 4) if calls else 0.0,
        "fallbacks": dict(fallbacks),
        "doors": {name: {**d, "fallbacks": dict(d["fallbacks"])} for name, d in doors.items()},
    }


def write_manifest(
    found: list[dict[str, Any]], output: str | Path, dtype: str | None = None, shape_classes: str | None = None
) -> Any:
    """One manifest from the recordings of every process (``Recorder``'s
    form: classes under the policy, the calls that cannot be graphs in
    comments). Returns the Recorder; raises ManifestError (nothing written)
    where no call could be a graph, or no process recorded (imported torch)."""
    from graphcache.errors import ManifestError
    from graphcache.spec import GraphSpec
    from graphcache.torch.recording import Recorder

    recordings = [p["recording"] for p in found if p.get("recording") is not None]
    if not recordings:
        raise ManifestError(
            "no process of the command imported torch, so nothing was recorded: is COMMAND a Python program "
            "(run with the same python, not python -I / -S, which skip graphcache's start-up hook)?"
        )
    recorder = Recorder(dtype, shape_classes, backward=any(rec.get("training") for rec in recordings))
    for rec in recordings:
        recorder.backend = recorder.backend or bool(rec.get("backend"))
        for specs, into in ((rec["specs"], recorder.specs), (rec.get("backwards", []), recorder.backwards)):
            for data, n in specs:
                spec = GraphSpec.from_dict(data)
                into[spec] = into.get(spec, 0) + int(n)
        for reasons, counts in (
            (rec["ineligible"], recorder.ineligible),
            (rec.get("no_backward", []), recorder.no_backward),
        ):
            for code, message, n in reasons:
                counts[(code, message)] = counts.get((code, message), 0) + int(n)
        for name, n in (rec.get("dropped") or {}).items():  # each process's own records' drops
            record = getattr(recorder, name, None)
            if name in ("specs", "backwards", "ineligible", "no_backward") and record is not None:
                record.dropped += int(n)
    recorder.write(output, source="graphcache run")
    return recorder
