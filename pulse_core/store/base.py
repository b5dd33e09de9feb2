"""The EventStore contract that every backend honours (SQLite now, PostgreSQL later)."""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

import msgspec

from pulse_core.events import Event, EventDraft


class AppendResult(msgspec.Struct, frozen=True):
    """What one append call stored.

    `events` holds one stored event per draft, in draft order: newly written, or the earlier
    event an idempotency key names. `replayed` is true when nothing new was written.
    """

    tx: str
    events: tuple[Event, ...]
    replayed: bool

    @property
    def last_seq(self) -> int:
        """The highest seq among the returned events (0 for an empty append)."""
        return max((e.seq for e in self.events), default=0)


class EventStore(abc.ABC):
    """The append-only log: one writer, a change cursor, per-key versions, idempotency keys.

    Contract (tests/core/store_contract.py checks it for every backend):
    - `seq` is gap-free and increases by one per stored event, across processes.
    - `version` counts events per key from 1; `expect={key: v}` refuses the whole append with
      VersionConflict unless the key is at version v (0 = no events yet) when it commits.
    - A draft whose `idem` is already stored with the same kind, key and data returns that
      event and writes nothing; with other content it raises IdempotencyConflict.
    - An append is one transaction: all its drafts are stored, or none.
    - Stored events are never changed or deleted.
    """

    @abc.abstractmethod
    async def append(
        self, drafts: Sequence[EventDraft], expect: Mapping[str, int] | None = None
    ) -> AppendResult:
        """Store `drafts` in one transaction, checking `expect` at commit time."""

    @abc.abstractmethod
    async def read(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Stored events with seq > after_seq, oldest first, optionally filtered."""

    @abc.abstractmethod
    def read_sync(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """`read` as a blocking call, for worker threads that fold large histories."""

    @abc.abstractmethod
    async def head(self, key: str) -> int:
        """The current version of `key` (0 when it has no events)."""

    @abc.abstractmethod
    async def last_seq(self) -> int:
        """The seq of the newest stored event (0 for an empty log)."""

    @abc.abstractmethod
    def last_seq_sync(self) -> int:
        """`last_seq` as a blocking call, for worker threads."""

    @abc.abstractmethod
    def subscribe(self) -> asyncio.Event:
        """An asyncio.Event set after every commit in this process; clear it after waking."""

    @abc.abstractmethod
    def unsubscribe(self, signal: asyncio.Event) -> None:
        """Stop setting a signal returned by `subscribe`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish pending appends and release the database."""

    async def changes(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        poll_interval: float = 1.0,
        batch: int = 1000,
    ) -> AsyncIterator[Event]:
        """Every event after `after_seq`, then each new one as it commits, forever.

        Commits in this process wake the cursor at once; commits by other processes are seen
        within `poll_interval` seconds.
        """
        kinds_list = list(kinds) if kinds is not None else None
        signal = self.subscribe()
        try:
            cursor = after_seq
            while True:
                signal.clear()
                top = await self.last_seq() if kinds_list is not None else 0
                page = await self.read(cursor, kinds=kinds_list, limit=batch)
                for event in page:
                    cursor = event.seq
                    yield event
                if len(page) == batch:
                    continue
                # Every event up to `top` was visible to that read: skip past filtered ones.
                cursor = max(cursor, top)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_interval):
                        await signal.wait()
        finally:
            self.unsubscribe(signal)
