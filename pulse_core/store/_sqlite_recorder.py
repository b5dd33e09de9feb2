"""events.db on SQLite: one writer thread with group commit, readers on their own connections."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import (
    IdempotencyConflict,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    VersionConflict,
)
from pulse_core._waits import Handoff, JobThread, reject, resolve
from pulse_core.store._commit import COLUMNS, HEAD, Batch, copy_chunk
from pulse_core.store._recorder import (
    AppendResult,
    Page,
    PreparedAppend,
    Recorder,
    StoredRow,
    page_of,
)
from pulse_core.store._sqlite import (
    ReadOnlyConnection,
    classify,
    open_database,
    sqlite_errors,
)

T = TypeVar("T")

SCHEMA_VERSION = 3
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
CREATE INDEX IF NOT EXISTS events_kind ON events(kind, seq);
CREATE TRIGGER IF NOT EXISTS events_refuse_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'pulse events are append-only: UPDATE refused'); END;
CREATE TRIGGER IF NOT EXISTS events_refuse_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'pulse events are append-only: DELETE refused'); END
"""
UPGRADES: dict[int, tuple[str, ...]] = {
    1: ("CREATE INDEX IF NOT EXISTS events_kind ON events(kind, seq)",),
    2: ("DROP TABLE IF EXISTS heads",),
}
"""The statements that take an events.db from schema v to v + 1 (run when the writer opens
it). 2: the index a kind-filtered read walks newest first (the Events page's kind= filter,
a rare kind found without reading the whole log). 3: no `heads` table: a key's version is
its newest event's, found through the `(key, seq)` index (a table of versions written beside
every commit cost a commit more pages to write and fsync than its rows)."""

INLINE_COMMIT = 0.005  # seconds the loop's thread may wait for a lone append's commit
COPY_CHUNK = 2_000  # rows per transaction of copy_rows
_KNOWN_HEADS = 16_384  # key versions the writer remembers between transactions
_Outcome = AppendResult | Exception


@dataclass
class _Request:
    append: PreparedAppend
    future: asyncio.Future[AppendResult]


class SqliteRecorder(Recorder):
    """events.db: append-only, gap-free seq, a key's version that of its newest event.

    Inserts from any number of coroutines go to one writer thread that commits them in
    groups: many appends, one fsync. A lone append (no other append waiting once the loop
    has run the coroutines ready beside it) is written on the loop's own thread instead, the
    write lock taken without waiting (another process holding it sends the append to the
    thread, which waits for it), and only its COMMIT, where the disk is met, goes to the
    writer thread, which the loop's thread waits for, at most `inline_commit` seconds: a
    commit slower than that (a stalled disk) is delivered to the loop like a thread commit,
    so the loop never waits longer for a disk, and after it appends go to the thread until
    a commit is quick again. The wait saves the two hops through the loop that a thread
    commit costs (a wake-up of the loop and a turn of it). `inline_commit=0` sends every
    append to the thread. Selects use their own connections in worker threads.
    `busy_timeout` (seconds) is how long a write waits for another process's lock before
    StoreUnavailable. Read-only, the file is opened for reading only and never created.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        synchronous: str = "FULL",
        clock: Clock | None = None,
        max_batch: int = 4096,
        busy_timeout: float = 10.0,
        inline_commit: float = INLINE_COMMIT,
    ) -> None:
        if not inline_commit >= 0:
            raise ValueError(f"inline_commit must be a number of seconds >= 0, not "
                             f"{inline_commit!r}")
        self.path = Path(path)
        self.location = str(self.path)
        self.read_only = read_only
        self.busy_timeout = busy_timeout
        self.clock: Clock = clock or SystemClock()
        self._synchronous = synchronous
        self._max_batch = max_batch
        self._inline_commit = inline_commit
        self._slow = False  # the last commit took longer than inline_commit
        self._copying = 0  # copy_rows chunks under way in the writer thread
        self._writer: JobThread | None = None
        self._reader_pool = ThreadPoolExecutor(2, thread_name_prefix="pulse-events-reader")
        self._local = threading.local()
        self._readers: list[sqlite3.Connection | ReadOnlyConnection] = []
        self._readers_lock = threading.Lock()
        self._prober: sqlite3.Connection | ReadOnlyConnection | None = None
        self._prober_lock = threading.Lock()  # held while the prober reads, and to close it
        self._closed = False
        # The writer connection and what it remembers: touched by one commit at a time, in
        # the writer thread or (inline) on the loop, never both at once.
        self._wconn: sqlite3.Connection | None = None
        self._data_version = -1
        self._next_seq = 0
        self._heads: dict[str, int] = {}
        self._heads_complete = False  # _heads holds every key of the log (found empty)
        # Appends waiting for the writer; touched only on the event loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: collections.deque[_Request] = collections.deque()
        self._committing = False
        self._idle: asyncio.Event | None = None

    @classmethod
    async def open(cls, path: str | Path, **options: Any) -> SqliteRecorder:
        """Open events.db at `path` (creating it unless read-only); raises a StoreError if it
        is not usable. `options` are the constructor's."""
        recorder = cls(path, **options)
        await recorder.start()
        return recorder

    async def start(self) -> None:
        """Open the file: the writer connection, or (read-only) a first checked reader."""
        loop = asyncio.get_running_loop()
        if self.read_only:
            if not self.path.is_file():
                raise StoreError(f"{self.path} does not exist: there is no event log to read")
            await loop.run_in_executor(self._reader_pool, self._read, lambda conn: None)
            return
        writer = JobThread("pulse-events-writer")
        try:
            self._wconn = await writer.call(lambda: open_database(
                self.path, schema=SCHEMA, schema_version=SCHEMA_VERSION,
                synchronous=self._synchronous, purpose="event log", timeout=self.busy_timeout,
                upgrades=UPGRADES))
            # The connection never waits for a lock unless a thread commit asks it to.
            await writer.call(lambda: self._set_wait(False))
        except BaseException:
            await writer.stop()
            raise
        self._writer = writer
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()

    # -- inserting -------------------------------------------------------------------------

    async def insert(self, append: PreparedAppend) -> AppendResult:
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so appends are refused — open "
                             "the home without read_only to write")
        if self._closed or self._loop is None:
            raise StoreClosed(f"{self.path}: append after close (or before open)")
        future: asyncio.Future[AppendResult] = self._loop.create_future()
        request = _Request(append, future)
        self._pending.append(request)
        if self._committing:
            return await future  # it goes in the next group
        if not self._inline_commit or self._slow or self._copying:
            self._submit()
            return await future
        # Let the coroutines ready beside this one run first: if they append too, all go
        # to the thread as one group; if none does, this append is alone.
        assert self._idle is not None
        self._committing = True
        self._idle.clear()
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            future.cancel()
            self._submit()
            raise
        if len(self._pending) == 1 and self._pending[0] is request:
            self._pending.popleft()
            outcomes = self._commit_waiting(request)
            if outcomes is None:
                return await future  # slower than inline_commit: the thread delivers it
            self._submit()  # nothing waits: marks the recorder idle
            outcome = outcomes if isinstance(outcomes, Exception) else outcomes[0]
            if isinstance(outcome, Exception):
                raise outcome
            return outcome
        self._submit()
        return await future

    def _commit_waiting(self, request: _Request) -> list[_Outcome] | Exception | None:
        """On the loop: take the write lock without waiting and write `request`, then hand
        its COMMIT to the writer thread and wait for it, at most `inline_commit` seconds.
        Its outcomes (or the error that refused it); None when the lock was held (the append
        went to the thread, which waits for it) or the wait ran out (the thread delivers the
        outcomes to the request's future, as for any thread commit)."""
        assert self._writer is not None
        try:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                if exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
                    self._writer.submit(lambda: self._commit_and_deliver([request]))
                    return None
                return classify(exc, self.path)
            staged, outcomes = self._stage(conn, [request.append])
        except Exception as exc:
            return exc
        except BaseException:  # interrupted before the hand-off: nothing is under way
            self._submit()
            raise
        handoff: Handoff[list[_Outcome] | Exception] = Handoff()
        self._writer.submit(lambda: self._finish_and_deliver(request, staged, outcomes, handoff))
        try:
            if handoff.done.acquire(timeout=self._inline_commit):
                return handoff.outcome
        except BaseException:  # interrupted while waiting: the loop settles the append
            if handoff.abandon():
                assert handoff.outcome is not None
                self._deliver([request], handoff.outcome)
            raise
        return handoff.outcome if handoff.abandon() else None

    def _finish_and_deliver(self, request: _Request, staged: Batch, outcomes: list[_Outcome],
                            handoff: Handoff[list[_Outcome] | Exception]) -> None:
        """In the writer thread: commit what the loop wrote for `request`, then hand the
        outcomes to the loop's thread if it still waits for them, or else to the loop."""
        result: list[_Outcome] | Exception = outcomes
        started = time.perf_counter()
        try:
            self._finish(staged)
        except Exception as exc:
            result = exc
        self._slow = time.perf_counter() - started > self._inline_commit
        if not handoff.deliver(result):
            self._deliver_on_loop([request], result)

    def _submit(self) -> None:
        """Hand the next group of waiting appends to the writer thread (on the loop)."""
        batch: list[_Request] = []
        size = 0
        while self._pending and size < self._max_batch:
            req = self._pending.popleft()
            if not req.future.done():  # a cancelled append is never written
                batch.append(req)
                size += len(req.append.drafts)
        assert self._idle is not None and self._writer is not None
        self._committing = bool(batch)
        if not batch:
            self._idle.set()
            return
        self._idle.clear()
        self._writer.submit(lambda: self._commit_and_deliver(batch))

    def _commit_and_deliver(self, batch: list[_Request]) -> None:
        """In the writer thread: commit `batch`, then hand the outcomes to the loop."""
        outcomes: list[_Outcome] | Exception
        started = time.perf_counter()
        try:
            outcomes = self._commit([req.append for req in batch])
        except Exception as exc:
            outcomes = exc
        # Read on the loop, one commit at a time: whether the next lone append may wait for
        # its commit there (a wait for another process's lock counts as slow).
        self._slow = time.perf_counter() - started > self._inline_commit
        self._deliver_on_loop(batch, outcomes)

    def _deliver_on_loop(self, batch: list[_Request], outcomes: list[_Outcome] | Exception
                         ) -> None:
        """In the writer thread: have the loop settle `batch` with `outcomes`."""
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self._loop.call_soon_threadsafe(self._deliver, batch, outcomes)

    def _deliver(self, batch: list[_Request], outcomes: list[_Outcome] | Exception) -> None:
        """On the loop: settle the futures of one commit and start the next."""
        for index, req in enumerate(batch):
            outcome = outcomes if isinstance(outcomes, Exception) else outcomes[index]
            if isinstance(outcome, Exception):
                reject(req.future, outcome)
            else:
                resolve(req.future, outcome)
        self._submit()

    def _commit(self, appends: list[PreparedAppend]) -> list[_Outcome]:
        """In the writer thread: commit `appends` in one transaction, waiting up to
        busy_timeout for the write lock."""
        conn = self._connection()
        try:
            self._set_wait(True)
            try:
                conn.execute("BEGIN IMMEDIATE")
            finally:
                self._set_wait(False)
        except sqlite3.Error as exc:
            raise classify(exc, self.path) from exc
        staged, outcomes = self._stage(conn, appends)
        self._finish(staged)
        return outcomes

    def _connection(self) -> sqlite3.Connection:
        """The writer connection (StoreClosed once it is closed)."""
        if self._wconn is None:
            raise StoreClosed(f"{self.path}: the writer is closed")
        return self._wconn

    def _stage(self, conn: sqlite3.Connection, appends: list[PreparedAppend]
               ) -> tuple[Batch, list[_Outcome]]:
        """Stage and write `appends` in the transaction begun on `conn`, uncommitted (rolled
        back when this raises)."""
        try:  # (not sqlite_errors: a try costs less than a context manager per commit)
            try:
                # Another connection's commit changes data_version: then seq and heads are
                # read again; otherwise what this writer knows is still the truth.
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != self._data_version:
                    self._next_seq = conn.execute(
                        "SELECT coalesce(max(seq), 0) + 1 FROM events").fetchone()[0]
                    self._heads.clear()
                    # Found empty, the log's keys are those this writer commits from now on.
                    self._heads_complete = self._next_seq == 1
                    self._data_version = version
                staged = Batch(conn, self._next_seq, self._heads, self._heads_complete)
                now = self.clock.now_ms()
                outcomes: list[_Outcome] = []
                for append in appends:
                    try:
                        outcomes.append(staged.apply(append, now))
                    except (VersionConflict, IdempotencyConflict) as exc:
                        outcomes.append(exc)
                staged.write()
            except BaseException:
                self._data_version = -1  # read everything again next time
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise classify(exc, self.path) from exc
        return staged, outcomes

    def _finish(self, staged: Batch) -> None:
        """Commit the transaction `staged` was written in, and remember what it moved."""
        conn = staged.conn
        try:
            try:
                conn.execute("COMMIT")
            except BaseException:
                self._data_version = -1
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise classify(exc, self.path) from exc
        self._next_seq = staged.next_seq
        if len(self._heads) + len(staged.heads) > _KNOWN_HEADS:
            self._heads.clear()
            self._heads_complete = False
        self._heads.update(staged.heads)

    def _set_wait(self, wait: bool) -> None:
        """Let the writer connection wait busy_timeout for a lock, or not wait at all."""
        assert self._wconn is not None
        ms = int(self.busy_timeout * 1000) if wait else 0
        self._wconn.execute(f"PRAGMA busy_timeout={ms}")

    # -- selecting -------------------------------------------------------------------------

    def _connect_reader(self) -> sqlite3.Connection | ReadOnlyConnection:
        """A new reading connection, closed with the recorder."""
        if self._closed:
            raise StoreClosed(f"{self.path}: read after close")
        reader: sqlite3.Connection | ReadOnlyConnection
        if self.read_only:
            reader = ReadOnlyConnection(self.path, schema_version=SCHEMA_VERSION,
                                        purpose="event log", timeout=self.busy_timeout)
        else:
            with sqlite_errors(self.path):
                reader = sqlite3.connect(self.path, timeout=self.busy_timeout,
                                         isolation_level=None, check_same_thread=False)
                reader.execute("PRAGMA query_only=ON")
        with self._readers_lock:
            self._readers.append(reader)
        return reader

    def _read_on(self, reader: sqlite3.Connection | ReadOnlyConnection,
                 fn: Callable[[sqlite3.Connection], T]) -> T:
        if isinstance(reader, ReadOnlyConnection):
            return reader.read(fn)
        with sqlite_errors(self.path):
            return fn(reader)

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)` on this reader thread's own connection."""
        reader: sqlite3.Connection | ReadOnlyConnection | None = getattr(
            self._local, "reader", None)
        if reader is None:
            reader = self._local.reader = self._connect_reader()
        return self._read_on(reader, fn)

    def _select(self, after_seq: int, *, kinds: Sequence[str] | None, key: str | None,
                limit: int | None, newest_first: bool, origin_prefix: str | None = None
                ) -> Page:
        sql = f"SELECT {COLUMNS} FROM events WHERE seq > ?"
        args: list[Any] = [after_seq]
        if kinds is not None:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args.extend(kinds)
        if key is not None:
            sql += " AND key = ?"
            args.append(key)
        if origin_prefix is not None:  # no index: a prefix scan walks seq order, stops early
            sql += " AND substr(origin, 1, ?) = ?"
            args.extend((len(origin_prefix), origin_prefix))
        sql += " ORDER BY seq DESC" if newest_first else " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)

        def rows_and_last(conn: sqlite3.Connection) -> tuple[list[Any], int]:
            conn.execute("BEGIN")  # one snapshot for the rows and the newest seq
            try:
                rows = conn.execute(sql, args).fetchall()
                last = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
            finally:
                conn.execute("COMMIT")
            return rows, int(last)

        rows, last = self._read(rows_and_last)
        return page_of(rows, last)

    def _head(self, key: str) -> int:
        row = self._read(lambda conn: conn.execute(HEAD, (key,)).fetchone())
        return int(row[0]) if row else 0

    def _last_seq(self) -> int:
        row = self._read(lambda conn: conn.execute(
            "SELECT coalesce(max(seq), 0) FROM events").fetchone())
        return int(row[0])

    async def _in_reader(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise StoreClosed(f"{self.path}: read after close")
        return await asyncio.get_running_loop().run_in_executor(self._reader_pool, fn, *args)

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
        page: Page = await self._in_reader(functools.partial(
            self._select, after_seq, kinds=None if kinds is None else tuple(kinds), key=key,
            limit=limit, newest_first=newest_first, origin_prefix=origin_prefix))
        return page

    async def head(self, key: str) -> int:
        version: int = await self._in_reader(self._head, key)
        return version

    async def last_seq(self) -> int:
        seq: int = await self._in_reader(self._last_seq)
        return seq

    def last_seq_blocking(self) -> int:
        # one connection of its own, used by one caller at a time: the calling threads
        # are not the recorder's
        with self._prober_lock:
            if self._prober is None:
                self._prober = self._connect_reader()
            row = self._read_on(self._prober, lambda conn: conn.execute(
                "SELECT coalesce(max(seq), 0) FROM events").fetchone())
        return int(row[0])

    def _rows(self, after_seq: int, limit: int) -> list[StoredRow]:
        found = self._read(lambda conn: conn.execute(
            f"SELECT {COLUMNS} FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit)).fetchall())
        return [StoredRow(*row) for row in found]

    async def rows(self, after_seq: int, limit: int) -> list[StoredRow]:
        found: list[StoredRow] = await self._in_reader(self._rows, after_seq, limit)
        return found

    # -- copying -----------------------------------------------------------------------------

    async def copy_rows(self, rows: Iterable[StoredRow]) -> int:
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so copying rows in is "
                                "refused — open it without read_only")
        if self._closed or self._writer is None:
            raise StoreClosed(f"{self.path}: copy after close (or before open)")
        writer, copied = self._writer, 0
        chunk: list[StoredRow] = []
        self._copying += 1  # no inline commit while the thread holds the connection
        try:
            for row in rows:
                chunk.append(row)
                if len(chunk) == COPY_CHUNK:
                    copied += await writer.call(functools.partial(self._copy_chunk, chunk))
                    chunk = []
            if chunk:
                copied += await writer.call(functools.partial(self._copy_chunk, chunk))
        finally:
            self._copying -= 1
        return copied

    def _copy_chunk(self, chunk: Sequence[StoredRow]) -> int:
        """In the writer thread: `chunk` in one transaction, if it continues the log."""
        if self._wconn is None:
            raise StoreClosed(f"{self.path}: the writer is closed")
        self._data_version = -1  # seq and heads move outside _commit: read them again
        with sqlite_errors(self.path):
            self._set_wait(True)
            try:
                copy_chunk(self._wconn, chunk, str(self.path))
            finally:
                self._set_wait(False)
        return len(chunk)

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._idle is not None:
            await self._idle.wait()  # appends already handed in are committed first
        if self._writer is not None:
            conn, self._wconn = self._wconn, None
            if conn is not None:
                await self._writer.call(conn.close)
            await self._writer.stop()
        self._reader_pool.shutdown(wait=True)
        with self._prober_lock, self._readers_lock:
            for reader in self._readers:
                reader.close()
            self._readers.clear()
            self._prober = None

