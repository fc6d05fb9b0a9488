"""An upload on its way in: written to a temporary file while its envelope
is verified (graphcache.envelope_check), then handed to the store; never
held whole in memory (bazel-remote's verify-on-put).

The file is made in the store's own ``incoming`` folder where it has one (a
DiskStore: ``put_file`` then renames it into place, on the same filesystem),
else in a folder of the system's temporary directory; a store without a
file put (Redis) is given the verified file's bytes, read into memory at put
time. The upload budget (service.intake) so bounds the disk an upload takes
while it arrives, not memory: per upload the server holds one
``SPOOL_CHUNK`` of it.

A full disk while the file is written: a DiskStore first makes room as a
put does (least recently used entries under GRAPHCACHE_SIZE_LIMIT) and the
write is tried once more; else the file is removed at once and the store's
StoreFull (507) is the answer, after the body was read (as before: a client
is not cut off mid-body). The file is removed on every other way out too:
a refused or corrupt upload, a client that goes away, the deadline, a store
that fails (``discard``, which service.intake always calls). Files a killed
server left are removed at the next start (``sweep``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import time
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

from graphcache.envelope_check import CheckedEnvelope, EnvelopeCheck
from graphcache.errors import StoreError, StoreFull
from graphcache.stores import Store
from graphcache.stores.space import ORPHAN_AGE, free_bytes, human, is_full

SPOOL_CHUNK = 1024 * 1024  # bytes held in memory before they are written (in a worker thread)
PREFIX = ".upload-"
UPLOAD = "graphcache.upload"  # the scope key under which service.intake hands the route its Upload


def folder_for(store: Store) -> Path:
    """Where uploads to ``store`` are written while they arrive."""
    incoming = getattr(store, "incoming", None)
    if incoming is not None:
        return Path(incoming)
    return Path(tempfile.gettempdir()) / f"graphcache-uploads-{os.getuid()}"


class Upload:
    """One upload's file and its envelope check (``write`` from one thread at a time)."""

    def __init__(self, store: Store, key: str, declared: int | None) -> None:
        self.store = store
        self.key = key
        self.declared = declared or 0
        self.folder = folder_for(store)
        self.path: Path | None = None
        self.check = EnvelopeCheck()
        self.error: StoreError | None = None  # the file could not be written (the body is still read)
        self._fd: int | None = None
        self._written = 0

    def write(self, chunks: Sequence[bytes]) -> None:
        """The next bytes of the body, checked and written (blocking: run it
        in a worker thread)."""
        for chunk in chunks:
            self.check.feed(chunk)
            if self.error is None:
                self._write_or_fail(chunk)

    def _write_or_fail(self, data: bytes) -> None:
        start = self._written
        try:
            self._write(data)
        except OSError as exc:
            make_room = getattr(self.store, "make_room", None)
            if make_room is None or not is_full(exc, self.folder):
                self._fail(exc)
                return
            # What a put does first, done before the file can be written.
            make_room(self.key, max(self.declared, self._written + len(data)))
            try:
                self._write(memoryview(data)[self._written - start :])
            except OSError as again:
                self._fail(again)

    def _write(self, data: bytes | memoryview) -> None:
        if self._fd is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{PREFIX}{secrets.token_hex(8)}"
            # Mode 0666 less the umask, as diskcache's own value files.
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            self.path = path
        view = memoryview(data)
        while view:
            done = os.write(self._fd, view)
            view = view[done:]
            self._written += done

    def _fail(self, exc: OSError) -> None:
        needed = max(self.declared, self.check.size)
        if is_full(exc, self.folder):
            no_room = getattr(self.store, "no_room", None)
            if no_room is not None:
                self.error = no_room(needed, exc)
            else:
                self.error = StoreFull(
                    f"no room for an upload of {human(needed)} in {self.folder} ({exc}); free space there",
                    needed=needed,
                    free=free_bytes(self.folder),
                )
        else:
            self.error = StoreError(f"could not write the upload to {self.folder}: {exc}")
        self.discard()  # its room goes back at once; the rest of the body is only checked

    def verify(self, key: str, signing_keys: tuple[bytes, ...]) -> CheckedEnvelope:
        """The checked envelope, once the whole body was written: CorruptArtifact
        (SignatureError) for what is refused, as ``Artifact.decode`` refuses it;
        then the error that stopped the file being written (StoreFull, StoreError)."""
        self._close()
        checked = self.check.finish(expected_key=key)
        if signing_keys:
            checked.verify_signature(signing_keys)
        if self.error is not None:
            raise self.error
        return checked

    def publish(self) -> bool:
        """Hand the verified file to the store (blocking: a store call); True
        when it was stored, False when identical bytes were already there."""
        put_file = getattr(self.store, "put_file", None)
        path = self.path
        if path is None:  # an empty body verifies as nothing: never here
            raise StoreError("no upload file to store")
        if put_file is None or path.parent != Path(getattr(self.store, "incoming", "")):
            return self.store.put(self.key, path.read_bytes())
        created = bool(put_file(self.key, path))
        if created:
            self.path = None  # renamed into the store: no longer this upload's to remove
        return created

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def discard(self) -> None:
        """Remove the file, if it is still there (idempotent)."""
        self._close()
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
            self.path = None


def sweep(store: Store, min_age: float = ORPHAN_AGE) -> int:
    """Remove upload files older than ``min_age`` seconds from ``store``'s
    upload folder (left by a server killed mid-upload); how many."""
    folder = folder_for(store)
    cutoff = time.time() - min_age
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        with contextlib.suppress(OSError):
            if entry.name.startswith(PREFIX) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                os.remove(entry.path)
                removed += 1
    return removed


def handed(scope: MutableMapping[str, Any]) -> Upload | None:
    """The upload service.intake took in for this request, if any."""
    found = scope.get(UPLOAD)
    return found if isinstance(found, Upload) else None
