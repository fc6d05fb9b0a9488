"""A manifest's coverage, checked in a process of its own.

Checking a manifest (the status page's ``POST /`` and ``GET /?manifest=``,
open wherever reads are) is CPU work in Python: a 1 KB manifest of 4,096
specs is about 0.5 s of it per target stored. Done in one of the worker's
threads, it shares the interpreter's lock with the event loop: 16 such
manifests at once took the worker's GETs from a p99 of 8.5 ms to 136 ms.
Paced (``service.scans``), the thread gives the loop its turns, but on a
host short of CPU a thread that holds the lock while the kernel runs
something else still stalls the loop. So in a server made from its
environment (``graphcache serve``: ``create_app_from_env``) the check runs
in a helper process instead, which opens the store the environment names,
started at the first check and kept: its own interpreter,
at a lower CPU priority (``SCAN_NICE``), one check at a time (the others
wait, within the scans' deadline: 503 ``busy`` past it). A check stops at
its budget of CPU seconds (``service.quota``) or its deadline; a client
that goes away, or a deadline passed while it waits for the answer, ends
the process (the next check starts another). Elsewhere (an app made by
``create_app`` in a process of the caller's) the check runs in a scan
thread, paced.

The process is ``python -m service.checker``: one JSON line in on stdin
per check, one JSON line out on its own stdout. It exits when stdin closes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

import anyio

from graphcache.errors import GraphCacheError, ManifestError, ManifestTooLarge
from graphcache.stores import Store
from graphcache.target import Target
from service.errors import ServiceError
from service.scans import SCAN_DEADLINE, SCAN_NICE, OverBudget, Stop, Stopped, watch_client

log = logging.getLogger("graphcache.service")
Rows = list[tuple[str, int, int]]


def coverage(text: str, targets: Iterable[str], store: Store, max_specs: int, shape_classes: str, stop: Stop) -> Rows:
    """(target, present, specs) of the manifest ``text`` for each target:
    parsed and expanded within bounds (its aliases, ``max_specs``:
    ManifestTooLarge before anything is expanded), abandoned when ``stop``
    says so (its deadline, its client gone, its budget spent), which is
    asked every few specs. One thread: its CPU time is the check's cost."""
    from graphcache import ops
    from graphcache.ops import manifest

    data = manifest.parse(text, "the manifest", max_specs=max_specs, cancelled=stop)
    specs = manifest.expand(data, source="the manifest", max_specs=max_specs, cancelled=stop)
    rows = []
    for target in sorted(targets):
        stop.check()
        try:
            tgt = Target.parse(target)
        except GraphCacheError:
            continue
        checked = ops.check(specs, tgt, store, shape_classes=shape_classes, jobs=1, progress=stop.check)
        rows.append((target, sum(r.present for r in checked), len(checked)))
    return rows


class Checker:
    """The helper process of one server worker (one event loop)."""

    def __init__(self, available: bool) -> None:
        self.available = available  # the worker's store is the one its environment names: the helper opens it too
        self._proc: subprocess.Popen[bytes] | None = None
        self._ended: list[subprocess.Popen[bytes]] = []  # killed, not yet reaped
        self._lock = anyio.Lock()

    async def check(
        self, text: str, targets: list[str], max_specs: int, shape_classes: str, stop: Stop, watch: Any = None
    ) -> Rows:
        """``coverage`` in the helper process, bounded by ``stop``'s budget
        (OverBudget) and deadline (503 ``busy``, waiting for the process
        included); ``watch``: the request whose client going away ends it.
        ``stop.spent`` is set to what the check cost (its whole budget when
        the process was ended before it answered)."""
        job = {
            "text": text,
            "targets": targets,
            "max_specs": max_specs,
            "shape_classes": shape_classes,
            "budget": stop.budget,
            "deadline": SCAN_DEADLINE,
        }
        answer: dict[str, Any] | None = None
        async with anyio.create_task_group() as tasks:
            if watch is not None:
                tasks.start_soon(watch_client, watch, stop, tasks.cancel_scope)
            with anyio.move_on_after(SCAN_DEADLINE):
                async with self._lock:
                    try:
                        answer = await self._ask(job)
                    finally:
                        if answer is None:
                            # Cancelled while the process works on this check (the deadline, the
                            # client gone): it is ended here, before the next check may use it.
                            self._end(wait=False)
            tasks.cancel_scope.cancel()
        if answer is None:
            stop.spent = stop.budget or 0.0  # what it spent is unknown: its whole budget
            if stop.event.is_set():
                raise ServiceError(499, "client_gone", "the client went away")
            raise ServiceError(
                503,
                "busy",
                f"checking the manifest did not end within {SCAN_DEADLINE:g}s (it waits for the checks before it, "
                "one at a time); it was stopped: retry later",
                {"retry-after": "5"},
            )
        stop.spent = float(answer.get("spent", stop.budget or 0.0))
        error = answer.get("error")
        if error is None:
            return [(str(t), int(p), int(n)) for t, p, n in answer["rows"]]
        if error == "budget":
            raise OverBudget(stop.spent, float(stop.budget or 0.0))
        if error == "too_many_specs":
            raise ManifestTooLarge(answer["detail"], limit=int(answer["limit"]), named=int(answer["named"]))
        if error == "problem":
            raise ManifestError(answer["detail"])
        raise ServiceError(503, "busy", f"checking the manifest failed: {answer.get('detail', error)}")

    async def _ask(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send ``job`` to the process (started if need be), and its answer."""
        self._ended = [old for old in self._ended if old.poll() is None]
        proc = self._started()
        line = json.dumps(job).encode() + b"\n"
        try:
            reply = await anyio.to_thread.run_sync(_exchange, proc, line, abandon_on_cancel=True)
        except OSError as exc:
            reply = b""
            log.warning("the manifest checker process failed: %s", exc)
        if not reply:
            self._end()
            return {"error": "ended", "detail": "its process ended before it answered (see the server's log)"}
        parsed: dict[str, Any] = json.loads(reply)
        return parsed

    def _started(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "service.checker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                close_fds=True,
            )
        return self._proc

    def _end(self, *, wait: bool = True) -> None:
        """Kill the process (``wait``: and reap it; else the next start, or
        the subprocess module, reaps it: a kill is not waited for on the event loop)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            if wait:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        if proc is not None and not wait:
            self._ended.append(proc)
        self._ended = [old for old in self._ended if old.poll() is None]  # reaped once they have exited

    def close(self) -> None:
        """End the helper process (the app is shutting down)."""
        self._end()


def _exchange(proc: subprocess.Popen[bytes], line: bytes) -> bytes:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(line)
    proc.stdin.flush()
    return proc.stdout.readline()


# -- the helper process ----------------------------------------------------------------------------


def _one(job: dict[str, Any], store: Store) -> dict[str, Any]:
    stop = Stop(float(job["deadline"]), budget=job["budget"], pace=False)
    stop.begin()
    try:
        rows = coverage(job["text"], job["targets"], store, job["max_specs"], job["shape_classes"], stop)
        answer: dict[str, Any] = {"rows": rows}
    except Stopped:
        answer = {}
    except ManifestTooLarge as exc:
        answer = {"error": "too_many_specs", "detail": str(exc), "limit": exc.limit, "named": exc.named}
    except GraphCacheError as exc:
        answer = {"error": "problem", "detail": str(exc)}
    stop.tally()
    if "rows" not in answer and stop.over_budget:
        answer = {"error": "budget"}
    elif "rows" not in answer and time.monotonic() > stop.until:
        answer = {"error": "deadline", "detail": f"it did not end within {SCAN_DEADLINE:g}s"}
    answer["spent"] = stop.spent
    return answer


def main() -> None:
    """The helper process: checks from stdin, answers on its own stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to the log, never into the answers
    with contextlib.suppress(OSError):
        os.nice(SCAN_NICE)
    from graphcache.settings import Settings
    from graphcache.stores import open_store

    store = open_store(Settings.from_env())  # the worker's own, as its environment names it (create_app_from_env)
    for line in sys.stdin.buffer:
        try:
            answer = _one(json.loads(line), store)
        except Exception as exc:  # noqa: BLE001 - said to the server, which answers 503
            answer = {"error": "failed", "detail": f"{type(exc).__name__}: {exc}"[:500]}
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
