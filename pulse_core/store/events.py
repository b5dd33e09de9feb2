"""events.db on SQLite: one writer thread with group commit, readers on their own connections."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pulse_core.clock import Clock, SystemClock
from pulse_core.errors import (
    IdempotencyConflict,
    InvalidEvent,
    StoreClosed,
    VersionConflict,
)
from pulse_core.events import Event, EventDraft, check_draft
from pulse_core.store.base import AppendResult, EventStore
from pulse_core.store.commit import COLUMNS, INSERT, UPSERT_HEAD, Batch, Request, row_event
from pulse_core.store.objects import ObjectStore
from pulse_core.store.sqlite import open_database, sqlite_errors

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq     INTEGER PRIMARY KEY,
    id      TEXT NOT NULL,
    kind    TEXT NOT NULL,
    key     TEXT NOT NULL,
    version INTEGER NOT NULL,
    ts      INTEGER NOT NULL,
    origin  TEXT NOT NULL,
    cause   INTEGER,
    tx      TEXT NOT NULL,
    idem    TEXT,
    data    BLOB,
    hash    TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS events_idem ON events(idem) WHERE idem IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_key ON events(key, seq);
CREATE TABLE IF NOT EXISTS heads (key TEXT PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS events_refuse_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'pulse events are append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS events_refuse_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'pulse events are append-only: DELETE refused'); END
"""

class SqliteEventStore(EventStore):
    """events.db: append-only, gap-free seq, per-key versions checked in a `heads` table.

    Appends from any number of coroutines are queued to one writer thread that commits them
    in groups: many drafts, one fsync. Reads use their own connections in worker threads.
    `busy_timeout` (seconds) is how long a write waits for another process's lock before
    StoreUnavailable.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        clock: Clock | None = None,
        objects: ObjectStore | None = None,
        max_batch: int = 4096,
        busy_timeout: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self.clock: Clock = clock or SystemClock()
        self.objects = objects
        self._synchronous = synchronous
        self._max_batch = max_batch
        self._writer_pool = ThreadPoolExecutor(1, thread_name_prefix="pulse-events-writer")
        self._reader_pool = ThreadPoolExecutor(2, thread_name_prefix="pulse-events-reader")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._wconn: sqlite3.Connection | None = None
        self._queue: asyncio.Queue[Request | None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._signals: set[asyncio.Event] = set()
        self._closed = False

    @classmethod
    async def open(cls, path: str | Path, **options: Any) -> SqliteEventStore:
        """Open (or create) events.db at `path`; raises a StoreError if it is not usable."""
        store = cls(path, **options)
        await store._start()
        return store

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wconn = await loop.run_in_executor(
            self._writer_pool,
            lambda: open_database(
                self.path, schema=SCHEMA, schema_version=SCHEMA_VERSION,
                synchronous=self._synchronous, purpose="event log",
                timeout=self.busy_timeout,
            ),
        )
        self._queue = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop(), name="pulse-events-writer")

    # -- appending -------------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[EventDraft], expect: Mapping[str, int] | None = None
    ) -> AppendResult:
        if self._closed or self._queue is None or self._writer is None or self._writer.done():
            raise StoreClosed(f"{self.path}: append after close (or after its writer stopped)")
        prepared: list[tuple[EventDraft, bytes, str | None]] = []
        idems: dict[str, int] = {}
        for index, draft in enumerate(drafts):
            raw = check_draft(draft, index)
            if draft.idem is not None:
                if draft.idem in idems:
                    raise InvalidEvent(
                        f"draft {index} repeats idempotency key {draft.idem!r} of draft "
                        f"{idems[draft.idem]} in the same append")
                idems[draft.idem] = index
            digest = None
            if draft.attachment is not None:
                if self.objects is None:
                    raise InvalidEvent(f"draft {index}: has an attachment but no object store")
                digest = await self.objects.put(draft.attachment)
            prepared.append((draft, raw, digest))
        for key, version in (expect or {}).items():
            if not isinstance(version, int) or version < 0:
                raise InvalidEvent(f"expect[{key!r}] = {version!r}: must be an int >= 0")
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(Request(prepared, dict(expect or {}), future))
        return await future

    async def _write_loop(self) -> None:
        try:
            await self._write_batches()
        finally:
            # Cancelled or closed: whoever still waits must hear so, not hang.
            assert self._queue is not None
            while not self._queue.empty():
                req = self._queue.get_nowait()
                if req is not None and not req.future.done():
                    req.future.set_exception(StoreClosed(f"{self.path}: the writer stopped"))

    async def _write_batches(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        closing = False
        while not closing:
            first = await self._queue.get()
            if first is None:
                break
            batch, size = [first], len(first.drafts)
            while size < self._max_batch and not self._queue.empty():
                nxt = self._queue.get_nowait()
                if nxt is None:
                    closing = True
                    break
                batch.append(nxt)
                size += len(nxt.drafts)
            try:
                outcomes = await loop.run_in_executor(self._writer_pool, self._commit, batch)
            except asyncio.CancelledError:
                for req in batch:  # the commit may still land; its outcome cannot be told
                    if not req.future.done():
                        req.future.set_exception(StoreClosed(
                            f"{self.path}: the writer stopped during this append; re-read "
                            "the log to see whether it was stored"))
                raise
            except Exception as exc:
                for req in batch:
                    if not req.future.done():
                        req.future.set_exception(exc)
                continue
            wrote = False
            for req, outcome in zip(batch, outcomes, strict=True):
                if req.future.done():
                    continue
                if isinstance(outcome, Exception):
                    req.future.set_exception(outcome)
                else:
                    wrote = wrote or not outcome.replayed
                    req.future.set_result(outcome)
            if wrote:
                for signal in self._signals:
                    signal.set()

    def _commit(self, batch: list[Request]) -> list[AppendResult | Exception]:
        conn = self._wconn
        assert conn is not None
        with sqlite_errors(self.path):
            conn.execute("BEGIN IMMEDIATE")
            try:
                next_seq = conn.execute("SELECT coalesce(max(seq), 0) + 1 FROM events").fetchone()
                staged = Batch(conn, next_seq[0])
                now = self.clock.now_ms()
                outcomes: list[AppendResult | Exception] = []
                for req in batch:
                    try:
                        outcomes.append(staged.apply(req, now))
                    except (VersionConflict, IdempotencyConflict) as exc:
                        outcomes.append(exc)
                if staged.rows:
                    conn.executemany(INSERT, staged.rows)
                    written = {r[3] for r in staged.rows}
                    conn.executemany(UPSERT_HEAD, [(k, staged.heads[k]) for k in written])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return outcomes

    # -- reading ---------------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise StoreClosed(f"{self.path}: read after close")
            with sqlite_errors(self.path):
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                       isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA query_only=ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read_sync(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        sql = f"SELECT {COLUMNS} FROM events WHERE seq > ?"
        args: list[Any] = [after_seq]
        if kinds is not None:
            kind_list = list(kinds)
            if not kind_list:
                return []
            sql += f" AND kind IN ({','.join('?' * len(kind_list))})"
            args.extend(kind_list)
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with sqlite_errors(self.path):
            rows = self._reader().execute(sql, args).fetchall()
        return [row_event(r) for r in rows]

    async def _in_reader(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closed:
            raise StoreClosed(f"{self.path}: read after close")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader_pool, lambda: fn(*args, **kwargs))

    async def read(
        self,
        after_seq: int = 0,
        *,
        kinds: Iterable[str] | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        events: list[Event] = await self._in_reader(
            self.read_sync, after_seq, kinds=None if kinds is None else list(kinds),
            key=key, limit=limit,
        )
        return events

    def head_sync(self, key: str) -> int:
        """`head` as a blocking call."""
        with sqlite_errors(self.path):
            row = self._reader().execute(
                "SELECT version FROM heads WHERE key = ?", (key,)
            ).fetchone()
        return int(row[0]) if row else 0

    async def head(self, key: str) -> int:
        version: int = await self._in_reader(self.head_sync, key)
        return version

    def last_seq_sync(self) -> int:
        with sqlite_errors(self.path):
            row = self._reader().execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
        return int(row[0])

    async def last_seq(self) -> int:
        seq: int = await self._in_reader(self.last_seq_sync)
        return seq

    # -- notification and lifecycle ----------------------------------------------------------

    def subscribe(self) -> asyncio.Event:
        signal = asyncio.Event()
        self._signals.add(signal)
        return signal

    def unsubscribe(self, signal: asyncio.Event) -> None:
        self._signals.discard(signal)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._queue is not None and self._writer is not None:
            self._queue.put_nowait(None)
            await self._writer
        loop = asyncio.get_running_loop()
        if self._wconn is not None:
            await loop.run_in_executor(self._writer_pool, self._wconn.close)
        self._writer_pool.shutdown(wait=True)
        self._reader_pool.shutdown(wait=True)
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
