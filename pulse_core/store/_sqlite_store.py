"""The EventStore over SQLite's recorder: the short way to open a log file directly."""

from __future__ import annotations

from pathlib import Path

from pulse_core._clock import Clock
from pulse_core.store._base import EventStore
from pulse_core.store._objects import ObjectStore
from pulse_core.store._sqlite_recorder import INLINE_COMMIT, SqliteRecorder


class SqliteEventStore(EventStore):
    """The EventStore over a SqliteRecorder at `path`: what `open_home` opens for a
    `sqlite://` store URL, and the short way to open a log file directly."""

    recorder: SqliteRecorder

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        synchronous: str = "FULL",
        clock: Clock | None = None,
        objects: ObjectStore | None = None,
        max_batch: int = 4096,
        busy_timeout: float = 10.0,
        inline_commit: float = INLINE_COMMIT,
    ) -> None:
        super().__init__(
            SqliteRecorder(path, read_only=read_only, synchronous=synchronous, clock=clock,
                           max_batch=max_batch, busy_timeout=busy_timeout,
                           inline_commit=inline_commit),
            objects=objects)

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        read_only: bool = False,
        synchronous: str = "FULL",
        clock: Clock | None = None,
        objects: ObjectStore | None = None,
        max_batch: int = 4096,
        busy_timeout: float = 10.0,
        inline_commit: float = INLINE_COMMIT,
    ) -> SqliteEventStore:
        """Open events.db at `path` (created unless `read_only`); raises a StoreError if it
        is not usable. `inline_commit` bounds committing a lone append on the loop's thread
        (see SqliteRecorder; 0 commits every append in the writer thread)."""
        store = cls(path, read_only=read_only, synchronous=synchronous, clock=clock,
                    objects=objects, max_batch=max_batch, busy_timeout=busy_timeout,
                    inline_commit=inline_commit)
        await store.recorder.start()
        return store

    @property
    def path(self) -> Path:
        """The events.db file."""
        return self.recorder.path
