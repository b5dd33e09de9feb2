"""The EventStore over SQLite's recorder: the short way to open a log file directly."""

from __future__ import annotations

from pathlib import Path

from pulse_core._clock import Clock
from pulse_core.store._base import EventStore
from pulse_core.store._objects import ObjectStore
from pulse_core.store._sqlite_recorder import SqliteRecorder


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
    ) -> None:
        super().__init__(
            SqliteRecorder(path, read_only=read_only, synchronous=synchronous, clock=clock,
                           max_batch=max_batch, busy_timeout=busy_timeout),
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
    ) -> SqliteEventStore:
        """Open events.db at `path` (created unless `read_only`); raises a StoreError if it
        is not usable."""
        store = cls(path, read_only=read_only, synchronous=synchronous, clock=clock,
                    objects=objects, max_batch=max_batch, busy_timeout=busy_timeout)
        await store.recorder.start()
        return store

    @property
    def path(self) -> Path:
        """The events.db file."""
        return self.recorder.path
