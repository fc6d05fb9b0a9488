"""A server of several worker processes counts as one server.

`graphcache serve --workers N` runs N uvicorn worker processes on one port;
any of them may answer a request for the status page, /v1/stats or
/metrics, so each worker's own counters would be one worker's share, a
different one on every reload. The server gives its workers one folder
(prometheus-client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``):
every worker adds to its own file there as it counts, and whichever worker
answers sums every file, those of workers that died or were restarted
included, so a total never goes back. The folder is made fresh when the
server starts (the counters are the server's since then) and removed when
it stops; a folder the environment already names is used as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead

FOLDER_VAR = "PROMETHEUS_MULTIPROC_DIR"
SERVER_FILE = "graphcache-server.json"  # not *.db: prometheus-client reads only those


@dataclass(frozen=True)
class Server:
    """What the workers of one server share: the folder their counters are
    kept in, when the server started and how many workers it runs."""

    folder: Path
    started: float
    workers: int | None


def shared() -> Server | None:
    """The server this worker counts for, or None where this process counts
    alone (one worker, or a server started without a shared folder)."""
    folder = os.environ.get(FOLDER_VAR)
    # prometheus-client picks file-backed values when it is first imported,
    # from the same variable; a process that imported it before the variable
    # was set counts in memory, alone.
    if not folder or not getattr(values.ValueClass, "_multiprocess", False):
        return None
    path = Path(folder)
    try:
        facts = json.loads((path / SERVER_FILE).read_text())
        return Server(path, float(facts["started"]), int(facts["workers"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Server(path, path.stat().st_mtime if path.is_dir() else time.time(), None)


@contextlib.contextmanager
def counted_together(workers: int) -> Iterator[Path | None]:
    """Around a server of ``workers`` processes: their shared counter folder
    (a fresh one, removed on the way out, unless PROMETHEUS_MULTIPROC_DIR
    names one), set in the environment the workers inherit. Yields the
    folder; None for one worker, which counts alone and needs none."""
    if workers <= 1 and not os.environ.get(FOLDER_VAR):
        yield None
        return
    given = os.environ.get(FOLDER_VAR)
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="graphcache-serve-"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SERVER_FILE).write_text(json.dumps({"started": time.time(), "workers": workers, "pid": os.getpid()}))
    os.environ[FOLDER_VAR] = str(folder)
    try:
        yield folder
    finally:
        if not given:
            os.environ.pop(FOLDER_VAR, None)
            shutil.rmtree(folder, ignore_errors=True)


def forget_dead(folder: Path) -> None:
    """Drop the per-worker gauges (``live`` modes) of workers no longer
    running: a gauge such as a worker's memo size ends with its worker,
    where its counters stay in the totals."""
    for path in folder.glob("gauge_live*_*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            mark_process_dead(int(pid), str(folder))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
