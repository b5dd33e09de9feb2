"""The Recorder: what one storage backend does for the event log, and nothing more.

The EventStore (pulse_core.store._base) checks drafts, encodes them, stores attachments and
wakes subscribers once, for every backend; a recorder only inserts a prepared append in one
transaction and selects what is stored. SQLite has one (pulse_core.store._sqlite_recorder),
PostgreSQL another (pulse_core.store._postgres); each runs the same contract suite
(tests/core/store_contract.py).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from pulse_core._events import Event, decode_data


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


class PreparedDraft(msgspec.Struct, frozen=True, gc=False):
    """A checked draft as a recorder stores it: its event `id` (a new UUIDv7), `data` already
    encoded (JSON bytes), `hash` the digest of its attachment (already in the object store)."""

    id: str
    kind: str
    key: str
    origin: str
    cause: int | None
    idem: str | None
    data: bytes
    hash: str | None


class PreparedAppend(msgspec.Struct, frozen=True, gc=False):
    """One append call, checked and encoded: its drafts, the versions it expects, its tx id.

    Within one append no two drafts share an idempotency key, and every expected version
    is an int >= 0: the EventStore makes sure of both before a recorder sees it.
    """

    tx: str
    drafts: tuple[PreparedDraft, ...]
    expect: Mapping[str, int]


class UnreadableEvent(msgspec.Struct, frozen=True, gc=False):
    """A stored row whose data cannot be decoded (a corrupt row): everything of it but its
    data, and the decoder's `reason`."""

    seq: int
    id: str
    kind: str
    key: str
    version: int
    ts: int
    origin: str
    tx: str
    reason: str


class StoredRow(msgspec.Struct, frozen=True, gc=False):
    """One stored event exactly as a recorder keeps it, `data` undecoded (the JSON bytes as
    stored): what `upulse migrate` copies from one backend to another and verifies."""

    seq: int
    id: str
    kind: str
    key: str
    version: int
    ts: int
    origin: str
    cause: int | None
    tx: str
    idem: str | None
    data: bytes | None
    hash: str | None

    def event(self) -> Event:
        """The Event this row stands for, its data decoded (msgspec.DecodeError when it
        cannot be)."""
        return row_event(msgspec.structs.astuple(self))


class Page(msgspec.Struct, frozen=True, gc=False):
    """Events of one read, and the seq of the log's newest event in that same read.

    Every event with seq <= `last_seq` was visible to the read, so a reader filtering by kind
    can move its cursor to `last_seq` once the page holds fewer rows than the limit it asked
    for. A recorder lists rows it cannot decode in `unreadable` instead of `events` (they
    count against the limit); an EventStore's pages never hold any (see EventStore).
    """

    events: list[Event]
    last_seq: int
    unreadable: list[UnreadableEvent] = []

    @classmethod
    def of(cls, rows: Iterable[StoredRow], last_seq: int) -> Page:
        """The Page of stored `rows` (in the selection's order) read when the log's newest
        seq was `last_seq`: each row as an Event, or as an UnreadableEvent when its data
        cannot be decoded."""
        return page_of([msgspec.structs.astuple(row) for row in rows], last_seq)


def row_event(row: Sequence[Any]) -> Event:
    """The Event a stored (or staged) row stands for."""
    return Event(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                 row[9], decode_data(row[10]), row[11])


def page_of(rows: Sequence[Sequence[Any]], last_seq: int) -> Page:
    """The Page of selected rows: each row as an Event, or, when its data cannot be decoded,
    as an UnreadableEvent."""
    events: list[Event] = []
    unreadable: list[UnreadableEvent] = []
    for row in rows:
        try:
            events.append(row_event(row))
        except (msgspec.DecodeError, RecursionError, TypeError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            unreadable.append(UnreadableEvent(row[0], row[1], row[2], row[3], row[4], row[5],
                                              row[6], row[8], f"data: {reason}"))
    return Page(events, last_seq, unreadable)



class Recorder(abc.ABC):
    """One backend's storage of the log: insert prepared appends, select stored events.

    Contract (tests/core/store_contract.py checks it through an EventStore):
    - `insert` stores all of an append's drafts in one transaction, or none of them.
    - `seq` is gap-free and increases by one per stored event, across processes; `version`
      counts events per key from 1; every event of one append shares its `tx` and `ts`.
    - `expect={key: v}` is checked when the transaction commits: unless `key` is at version
      v (0 = no events yet), the append is refused with VersionConflict.
    - A draft whose `idem` is already stored with the same kind, key and data stands for that
      stored event and writes nothing (an append of nothing else but such drafts returns
      `replayed=True` and skips the version check); other content under that `idem` refuses
      the append with IdempotencyConflict.
    - Stored events are never changed or deleted.
    - `select` never raises for a row whose data cannot be decoded: it lists the row in
      `Page.unreadable` (in the selection's order, counted against `limit`).
    - A recorder opened read-only refuses `insert` with a StoreError saying so.
    - `rows` returns stored rows as they are (data undecoded), for copying a log elsewhere;
      `copy_rows` stores such rows exactly as given (seq, id, version, ts, tx, data bytes),
      each key then at the version of its last copied row, and refuses with a StoreError,
      writing nothing of the refused rows, rows that do not continue the log (the first seq
      is not its newest seq + 1, or the seqs are not consecutive).
    - Backend failures are StoreErrors (StoreUnavailable for a lock held too long, a full
      disk, a server that cannot be reached or a connection lost; StoreClosed after close).
      No method blocks the event loop.
    - `listen` and `exclusive` have defaults for a backend used by one process (no wakes
      from elsewhere: readers poll; a lock per name in this recorder); a backend shared by
      processes or hosts overrides them.
    """

    #: where the log lives, for messages (a path, or a URL without its password)
    location: str
    #: whether `insert` is refused
    read_only: bool

    @abc.abstractmethod
    async def insert(self, append: PreparedAppend) -> AppendResult:
        """Store `append` in one transaction (see the class contract)."""

    @abc.abstractmethod
    async def select(
        self,
        after_seq: int = 0,
        *,
        kinds: Sequence[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
        origin_prefix: str | None = None,
    ) -> Page:
        """Stored events with seq > after_seq, oldest first (newest first with
        `newest_first`), optionally filtered (`origin_prefix`: origins that start with it),
        and the log's newest seq as that same read saw it."""

    @abc.abstractmethod
    async def head(self, key: str) -> int:
        """The current version of `key` (0 when it has no events)."""

    @abc.abstractmethod
    async def last_seq(self) -> int:
        """The seq of the newest stored event (0 for an empty log)."""

    def last_seq_blocking(self) -> int | None:
        """The seq of the newest stored event, read on the calling thread (blocking: for a
        caller already on a worker thread, never the event loop); None (this default) where
        the backend reads only asynchronously."""
        return None

    @abc.abstractmethod
    async def rows(self, after_seq: int, limit: int) -> list[StoredRow]:
        """Up to `limit` stored rows with seq > after_seq, oldest first, data undecoded."""

    @abc.abstractmethod
    async def copy_rows(self, rows: Iterable[StoredRow]) -> int:
        """Store `rows` (another log's, as `rows` returned them) exactly as given, in order;
        the number stored (see the class contract). What `upulse migrate` writes with."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish the inserts already started and release the backend."""

    def listen(self, wake: Callable[[], None]) -> bool:
        """From now on call `wake()` (on the event loop) whenever events committed elsewhere
        (another process or host) may be there to read; True if this backend does so, False
        (this default) when readers must poll for them."""
        return False

    def exclusive(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        """Held by at most one holder at a time among everything sharing this log (this
        default: only within this recorder, by an asyncio.Lock per name)."""
        locks: dict[str, asyncio.Lock] = self.__dict__.setdefault("_exclusive_locks", {})
        return locks.setdefault(name, asyncio.Lock())
