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

The folder is the server's own (``checked_folder``: mode 0700, owned by the
server's user, not a symlink; the server refuses to start otherwise) and
the file (0600) is opened once: what is verified is read back, or renamed
into the store, through that one descriptor, never by its path again, so
what is published is exactly the bytes that were verified. No file
outlives its upload (a small one, which the store copies into its index,
included); ``sweep`` removes what a killed server left, at start and while
the server runs, never a file a live server still holds (``claim``: another
server sharing the folder may allow a slow upload longer than this one
would).

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
import errno
import os
import secrets
import tempfile
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

from graphcache.artifact import Artifact
from graphcache.envelope_check import CheckedEnvelope, EnvelopeCheck
from graphcache.errors import StoreError, StoreFull
from graphcache.settings import Settings
from graphcache.stores import Store, disk_folder
from graphcache.stores.disk import INCOMING
from graphcache.stores.space import ORPHAN_AGE, SPOOL_PREFIX, claim, free_bytes, human, is_full, sweep_spool
from graphcache.stores.valuefile import private_folder

SPOOL_CHUNK = 1024 * 1024  # bytes held in memory before they are written (in a worker thread)
PREFIX = SPOOL_PREFIX
UPLOAD = "graphcache.upload"  # the scope key under which service.intake hands the route its Upload


def folder_for(store: Store) -> Path:
    """Where uploads to ``store`` are written while they arrive."""
    incoming = getattr(store, "incoming", None)
    if incoming is not None:
        return Path(incoming)
    return _temporary()


def checked_folder(store: Store) -> Path:
    """``folder_for(store)``, made or checked as this server's own
    (graphcache.stores.valuefile.private_folder); StoreError saying what
    is wrong and what to do otherwise."""
    elsewhere = "GRAPHCACHE_DIR" if getattr(store, "incoming", None) is not None else "TMPDIR"
    return private_folder(folder_for(store), "uploads on their way in", elsewhere)


def checked_location(settings: Settings, location: str | None = None) -> Path:
    """``checked_folder`` of the store ``location`` names, without opening
    it (`graphcache serve`, before its workers start)."""
    folder = disk_folder(settings, location)
    if folder is None:
        return private_folder(_temporary(), "uploads on their way in", "TMPDIR")
    return private_folder(folder / INCOMING, "uploads on their way in", "GRAPHCACHE_DIR")


def _temporary() -> Path:
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
        self.checked: CheckedEnvelope | None = None

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
            try:
                checked_folder(self.store)  # a folder removed or replaced since the start is made or refused again
            except StoreError as exc:
                raise OSError(errno.EACCES, str(exc)) from exc
            path = self.folder / f"{PREFIX}{secrets.token_hex(8)}"
            # Readable: its bytes are read back (or checked) through this
            # descriptor. Private: no one else's to read or replace.
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self._fd = os.open(path, flags, 0o600)
            claim(self._fd)  # in flight while this server holds it: no server sharing the folder sweeps it
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
        checked = self.check.finish(expected_key=key)
        if signing_keys:
            checked.verify_signature(signing_keys)
        if self.error is not None:
            raise self.error
        self.checked = checked
        return checked

    def publish(self) -> bool:
        """Hand the verified file to the store (blocking: a store call), through
        the descriptor it was written with; True when it was stored, False
        when identical bytes were already there. The file is the caller's to
        remove (``discard``) whatever this returns."""
        put_file = getattr(self.store, "put_file", None)
        path, fd = self.path, self._fd
        if path is None or fd is None or self.checked is None:  # an empty body verifies as nothing: never here
            raise StoreError("no upload file to store")
        if put_file is not None and path.parent == Path(getattr(self.store, "incoming", "")):
            return bool(put_file(self.key, path, fd=fd))
        data = _read_back(fd, self.checked.size)
        if len(data) != self.checked.size or Artifact.decode(data, expected_key=self.key).payload_sha256 != (
            self.checked.payload_sha256
        ):
            raise StoreError("the upload's file changed after it was verified; nothing was stored")
        return self.store.put(self.key, data)

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


def _read_back(fd: int, size: int) -> bytes:
    """The ``size`` bytes of the upload's file, read through its descriptor."""
    parts, done = [], 0
    while done < size:
        chunk = os.pread(fd, min(SPOOL_CHUNK * 8, size - done), done)
        if not chunk:
            break
        parts.append(chunk)
        done += len(chunk)
    return b"".join(parts)


def sweep(store: Store, min_age: float = ORPHAN_AGE) -> int:
    """Remove upload files not written for ``min_age`` seconds from
    ``store``'s upload folder (left by an upload that died, or a server
    killed mid-upload); how many."""
    return sweep_spool(folder_for(store), min_age)[0]


def spool_age(upload_timeout: float, store_timeout: float) -> float:
    """How long an upload file may go unwritten before it is an orphan: an
    upload writes its file as it arrives, within GRAPHCACHE_UPLOAD_TIMEOUT,
    and stores it within GRAPHCACHE_TIMEOUT after (twice that, and at least
    two minutes, for another server on the same folder with other settings)."""
    return max(120.0, 2 * (upload_timeout + store_timeout))


def handed(scope: MutableMapping[str, Any]) -> Upload | None:
    """The upload service.intake took in for this request, if any."""
    found = scope.get(UPLOAD)
    return found if isinstance(found, Upload) else None
