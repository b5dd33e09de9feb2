"""objects/: content-addressed payloads, written atomically, stored once however often put."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path

from pulse_core._errors import ObjectMissing, StoreReadOnly, StoreUnavailable
from pulse_core._homelock import private_folder

_DIGEST = re.compile(r"[0-9a-f]{64}")


def digest_of(data: bytes) -> str:
    """The SHA-256 hex digest that names `data` in the object store."""
    return hashlib.sha256(data).hexdigest()


class ObjectStore:
    """Blobs under `root/ab/cdef...` named by their SHA-256.

    A put writes a temporary file, fsyncs it and renames it into place, so a reader never
    sees half an object. Purging deletes the bytes; the events that name the digest stay
    (see `RetentionLadder.purge_payload` in pulse_core.maintenance). Read-only, the folder
    is neither created nor written.
    """

    def __init__(self, root: str | Path, *, read_only: bool = False) -> None:
        self.root = Path(root)
        self.read_only = read_only
        if not read_only:
            private_folder(self.root)

    def _refuse_if_read_only(self, digest: str) -> None:
        if self.read_only:
            raise StoreReadOnly(f"{self.root}: opened read-only, so object {digest} cannot be "
                             "written or deleted — open the home without read_only")

    def path_of(self, digest: str) -> Path:
        """Where the object named `digest` lives (whether or not it exists)."""
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise ValueError(f"{digest!r} is not a SHA-256 hex digest")
        return self.root / digest[:2] / digest[2:]

    def put_sync(self, data: bytes) -> str:
        """Store `data` (once) and return its digest."""
        digest = digest_of(data)
        target = self.path_of(digest)
        if target.exists():
            return digest
        self._refuse_if_read_only(digest)
        try:
            target.parent.mkdir(mode=0o700, exist_ok=True)  # umask only clears bits
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, target)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise StoreUnavailable(f"{self.root}: cannot write object {digest}: {exc}") from exc
        return digest

    def get_sync(self, digest: str) -> bytes:
        """The bytes named `digest`; ObjectMissing if never stored or purged."""
        try:
            return self.path_of(digest).read_bytes()
        except FileNotFoundError:
            raise ObjectMissing(
                f"object {digest} is not in {self.root} (never stored, or purged)"
            ) from None

    def exists(self, digest: str) -> bool:
        """Whether the bytes named `digest` are present."""
        return self.path_of(digest).exists()

    def delete_sync(self, digest: str) -> bool:
        """Remove the bytes named `digest`; False when they were already gone."""
        self._refuse_if_read_only(digest)
        try:
            self.path_of(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    async def put(self, data: bytes) -> str:
        """`put_sync` off the event loop."""
        return await asyncio.to_thread(self.put_sync, data)

    async def get(self, digest: str) -> bytes:
        """`get_sync` off the event loop."""
        return await asyncio.to_thread(self.get_sync, digest)

