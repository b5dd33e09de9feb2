"""The event log in PostgreSQL: group commit, commit-ordered gap-free seq, LISTEN/NOTIFY wakes.

Opened by `open_event_store("postgresql://...")`; psycopg 3 is imported here, so only when
such a URL is opened.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import (
    AppendOutcomeUnknown,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._waits import reject, resolve
from pulse_core.store._pg_commit import (
    CommitUnknown,
    Known,
    LogSQL,
    Outcome,
    commit_group,
    copy_chunk,
)
from pulse_core.store._pg_ddl import COLUMNS
from pulse_core.store._pg_listen import Listener, advisory_lock, check_held
from pulse_core.store._pg_pool import ConnectionPool, NoAnswer
from pulse_core.store._pg_schema import (
    Connection,
    first_line,
    is_cancelled,
    is_disconnect,
    is_out_of_resources,
    pg_errors,
    prepare,
    store_error,
)
from pulse_core.store._recorder import (
    AppendResult,
    Page,
    PreparedAppend,
    Recorder,
    StoredRow,
    page_of,
)
from pulse_core.store._url import PostgresURL

COPY_CHUNK = 2_000  # rows per transaction of copy_rows
IDLE_IN_TRANSACTION_MS = 30_000
ENDING_S = 2.0  # how long a failed commit waits for its server session to end
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3}


@dataclass
class _Request:
    append: PreparedAppend
    future: asyncio.Future[AppendResult]


class PostgresRecorder(Recorder):
    """The log in one schema of a PostgreSQL database, shared by any number of processes.

    Appends from this process go into one transaction at a time (group commit); every
    writer locks the schema's `writer_lock` row first and keeps it to its commit, so seqs
    are given in commit order. Each commit NOTIFYs the schema's channel; `listen` hears
    other processes' commits on a dedicated connection.
    """

    def __init__(self, url: PostgresURL, *, read_only: bool = False,
                 clock: Clock | None = None, max_batch: int = 4096) -> None:
        self.url = url
        self.location = url.display()
        self.read_only = read_only
        self.clock: Clock = clock or SystemClock()
        self._max_batch = max_batch
        self._sql = LogSQL(url.schema)
        self._known = Known()
        self._s = self._sql.s
        self._pool = ConnectionPool(self._connect, url.pool_size, self.location,
                                    bound=url.operation_timeout)
        self._locks = ConnectionPool(self._connect, 64, self.location)
        self._listener = Listener(self._connect, self._sql.channel, self.location,
                                  probe=url.operation_timeout)
        self._pending: collections.deque[_Request] = collections.deque()
        self._committer: asyncio.Task[None] | None = None
        self._alone: asyncio.Future[None] | None = None  # set while a caller commits its own
        self._solo = True  # whether the last group was one append and none waited after it
        self._closed = False

    def __repr__(self) -> str:
        return f"PostgresRecorder({self.location!r}{', read-only' if self.read_only else ''})"

    @classmethod
    async def open(cls, url: PostgresURL, **options: Any) -> PostgresRecorder:
        """Connect, check the schema (creating it unless read-only) and return the recorder;
        a StoreError (StoreUnavailable when the server cannot be reached) otherwise."""
        recorder = cls(url, **options)
        try:
            async with recorder._pool.connection() as conn:
                await prepare(conn, url.schema, read_only=recorder.read_only,
                              location=recorder.location)
        except BaseException:
            await recorder.close()
            raise
        return recorder

    async def _connect(self) -> Connection:
        """A new session, with TCP keepalives so a silently dropped link is noticed:
        read-only ones refuse every write; in writable ones a transaction left idle (a
        stopped process holding the writer lock) is ended by the server, no statement
        or lock timeout set on the database or role cuts a wait for the writer lock or an
        exclusive lock (a wait is as long as the transaction before it), and a commit in
        one statement reads what the writer it waited for committed (READ COMMITTED, whatever
        the database's default)."""
        options = ("-c default_transaction_read_only=on" if self.read_only
                   else f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} "
                        "-c statement_timeout=0 -c lock_timeout=0 "
                        "-c default_transaction_isolation=read\\ committed")
        with pg_errors(self.location, "connecting"):
            given = conninfo_to_dict(self.url.dsn)  # keepalives set in the URL are kept
            conninfo = make_conninfo(self.url.dsn, **{k: v for k, v in KEEPALIVES.items()
                                                      if k not in given})
            conn: Connection = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True,
                connect_timeout=max(1, round(self.url.connect_timeout)), options=options)
        return conn

    # -- inserting -------------------------------------------------------------------------

    async def insert(self, append: PreparedAppend) -> AppendResult:
        if self.read_only:
            raise StoreReadOnly(f"{self.location}: opened read-only, so appends are refused "
                                "— open the home without read_only to write")
        if self._closed:
            raise StoreClosed(f"{self.location}: append after close")
        await check_held(self._locks)  # inside `exclusive`: never write under a lost lock
        if self._solo and self._committer is None and self._alone is None:
            return await self._commit_alone(append)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[AppendResult] = loop.create_future()
        self._pending.append(_Request(append, future))
        if self._committer is None and self._alone is None:
            self._committer = loop.create_task(self._commit_waiting())
        return await future

    async def _commit_alone(self, append: PreparedAppend) -> AppendResult:
        """A lone writer (no group being committed, and the last one was a lone append)
        commits its append itself: a group of one, without the hand-over to the committing
        task and back. Appends arriving meanwhile wait for the next group, as they would
        behind any group, and the appends after that are grouped again."""
        loop = asyncio.get_running_loop()
        alone = self._alone = loop.create_future()
        outcomes: list[Outcome] | Exception
        try:
            outcomes = await self._commit([append])
        except Exception as exc:
            outcomes = exc
        finally:
            self._alone = None
            self._solo = not self._pending
            alone.set_result(None)
            if self._pending and self._committer is None:
                self._committer = loop.create_task(self._commit_waiting())
        if self._closed and isinstance(outcomes, StoreUnavailable):
            self._refuse_waiting(outcomes)
        outcome = outcomes if isinstance(outcomes, Exception) else outcomes[0]
        if isinstance(outcome, Exception):
            raise outcome
        assert isinstance(outcome, AppendResult)
        return outcome

    async def _commit_waiting(self) -> None:
        """Commit the waiting appends, a group per transaction, until none wait."""
        try:
            while self._pending:
                batch: list[_Request] = []
                size = 0
                while self._pending and size < self._max_batch:
                    req = self._pending.popleft()
                    if not req.future.done():  # a cancelled append is never written
                        batch.append(req)
                        size += len(req.append.drafts)
                if not batch:
                    continue
                outcomes: list[Outcome] | Exception
                try:
                    outcomes = await self._commit([req.append for req in batch])
                except Exception as exc:
                    outcomes = exc
                self._solo = len(batch) == 1 and not self._pending
                if self._closed and isinstance(outcomes, StoreUnavailable):
                    self._refuse_waiting(outcomes)
                for index, req in enumerate(batch):
                    outcome = outcomes if isinstance(outcomes, Exception) else outcomes[index]
                    if isinstance(outcome, Exception):
                        reject(req.future, outcome)
                    else:
                        resolve(req.future, outcome)
        finally:
            self._committer = None

    def _refuse_waiting(self, failure: StoreUnavailable) -> None:
        """Closing while the server fails: the appends still waiting fail at once (nothing
        of them was sent), rather than each after its own deadline."""
        while self._pending:
            reject(self._pending.popleft().future, StoreUnavailable(
                f"{self.location}: not stored: the store was closed while the server failed "
                f"({failure}) — append it again once the server answers"))

    async def _commit(self, appends: list[PreparedAppend]) -> list[Outcome]:
        """One transaction for `appends`; once more on a new connection when the first was
        found dead before anything was sent for commit, or when its server session is known
        to have ended and the log shows the group was not stored."""
        for attempt in (1, 2):
            backend = 0
            try:
                async with self._pool.connection() as conn:
                    backend = conn.info.backend_pid
                    return await commit_group(self._pool.kept_cursor(conn), self._sql,
                                              appends, self.clock, self._known)
            except CommitUnknown as exc:
                await self._pool.discard_idle()
                ended = await self._ended(backend)
                stored = await self._stored(exc.key, exc.event_id)
                if stored:
                    return exc.settled(*stored)
                cause = exc.__cause__ or exc
                if ended and stored == ():  # rolled back with its session
                    if attempt == 1:
                        continue
                    raise StoreUnavailable(
                        f"{self.location}: not stored: the connection failed twice while "
                        f"the append was being committed ({first_line(cause)}) — append it "
                        "again once the server answers") from cause
                raise AppendOutcomeUnknown(
                    f"{self.location}: the connection failed while the append was being "
                    f"committed ({first_line(cause)}), so it may or may not be stored — "
                    "append the same drafts again once the server answers (an idem on each makes "
                    "that safe)") from cause
            except (psycopg.Error, OSError) as exc:
                if is_disconnect(exc):
                    await self._pool.discard_idle()
                    if attempt == 1 and not isinstance(exc, NoAnswer):
                        continue
                elif len(appends) > 1 and not (is_cancelled(exc) or is_out_of_resources(exc)):
                    return await self._one_by_one(appends)
                raise store_error(exc, self.location, "appending") from exc
        raise AssertionError("unreachable")

    async def _ended(self, backend: int) -> bool:
        """Whether the server session `backend` has ended, ending it (and waiting up to
        ENDING_S for that) if it still runs: once it has, whatever it committed is in the log
        and whatever it had not is rolled back. False when that cannot be known now."""
        if not backend:
            return False
        try:
            found = await self._fetch(
                "ending a session whose connection failed",
                "SELECT pg_terminate_backend(pid, %s) FROM pg_stat_activity WHERE pid = %s "
                "AND datname = current_database() AND usename = current_user",
                [int(ENDING_S * 1000), backend])
        except StoreError:
            return False
        return not found or found[0][0] is True

    async def _stored(self, key: str, event_id: str) -> tuple[int, int] | tuple[()] | None:
        """The seq and ts of the event `event_id` of `key` if it is stored, () if it is
        not, None when that cannot be read now."""
        try:
            found = await self._fetch(
                "checking a commit", f"SELECT seq, ts FROM {self._s}.events WHERE key = %s "
                "AND id = %s ORDER BY seq DESC LIMIT 1", [key, event_id])
        except StoreError:
            return None
        return (int(found[0][0]), int(found[0][1])) if found else ()

    async def _one_by_one(self, appends: list[PreparedAppend]) -> list[Outcome]:
        """Each append in its own transaction, after the database refused their group, so
        that what it refused fails alone."""
        outcomes: list[Outcome] = []
        for append in appends:
            try:
                outcomes.extend(await self._commit([append]))
            except StoreError as exc:
                outcomes.append(exc)
        return outcomes

    # -- selecting -------------------------------------------------------------------------

    async def _fetch(self, doing: str, sql: str, args: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows of one statement; once more on a new connection if the first was dead."""
        if self._closed:
            raise StoreClosed(f"{self.location}: read after close")
        for attempt in (1, 2):
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(sql, args)
                    return await cur.fetchall()
            except (psycopg.Error, OSError) as exc:
                if attempt == 2 or not is_disconnect(exc) or isinstance(exc, NoAnswer):
                    raise store_error(exc, self.location, doing) from exc
                await self._pool.discard_idle()
        raise AssertionError("unreachable")

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
        where = "seq > %s"
        args: list[Any] = [after_seq]
        if kinds is not None:
            where += " AND kind = ANY(%s)"
            args.append(list(kinds))
        if key is not None:
            where += " AND key = %s"
            args.append(key)
        if origin_prefix is not None:
            where += " AND starts_with(origin, %s)"
            args.append(origin_prefix)
        order = "seq DESC" if newest_first else "seq"
        cut = ""
        if limit is not None:
            cut = " LIMIT %s"
            args.append(limit)
        # One statement, so one snapshot for the rows and the newest seq.
        sql = (f"SELECT e.*, last.seq FROM (SELECT coalesce(max(seq), 0) AS seq FROM "
               f"{self._s}.events) last LEFT JOIN LATERAL (SELECT {COLUMNS} FROM "
               f"{self._s}.events WHERE {where} ORDER BY {order}{cut}) e ON true "
               f"ORDER BY e.{order}")
        found = await self._fetch("reading events", sql, args)
        last = int(found[0][12]) if found else 0
        return page_of([row for row in found if row[0] is not None], last)

    async def head(self, key: str) -> int:
        found = await self._fetch("reading a key's version", self._sql.head, [key])
        return int(found[0][0])

    async def last_seq(self) -> int:
        found = await self._fetch("reading the newest seq",
                                  f"SELECT coalesce(max(seq), 0) FROM {self._s}.events", [])
        return int(found[0][0])

    async def rows(self, after_seq: int, limit: int) -> list[StoredRow]:
        found = await self._fetch(
            "reading rows",
            f"SELECT {COLUMNS} FROM {self._s}.events WHERE seq > %s ORDER BY seq LIMIT %s",
            [after_seq, limit])
        return [StoredRow(*row) for row in found]

    # -- copying -----------------------------------------------------------------------------

    async def copy_rows(self, rows: Iterable[StoredRow]) -> int:
        """Store already-stored events exactly as given (seq, ids, versions, data bytes,
        hashes), in order, a few thousand per transaction; the number stored.

        StoreError, before anything of the offending chunk is written, unless the rows
        continue this log (the first seq is its newest seq + 1, or 1 into an empty log) and
        their seqs are consecutive.
        """
        if self.read_only:
            raise StoreReadOnly(f"{self.location}: opened read-only, so copying rows in is "
                                "refused — open it without read_only")
        copied = 0
        chunk: list[tuple[Any, ...]] = []
        for row in rows:
            chunk.append((row.seq, row.id, row.kind, row.key, row.version, row.ts,
                          row.origin, row.cause, row.tx, row.idem,
                          None if row.data is None else bytes(row.data), row.hash))
            if len(chunk) == COPY_CHUNK:
                copied += await self._copy_chunk(chunk)
                chunk = []
        if chunk:
            copied += await self._copy_chunk(chunk)
        return copied

    async def _copy_chunk(self, chunk: list[tuple[Any, ...]]) -> int:
        self._known.forget()
        async with self._pool.connection() as conn:
            with pg_errors(self.location, "copying rows"):
                await copy_chunk(conn, self._sql, chunk, self.location)
        return len(chunk)

    # -- sharing ---------------------------------------------------------------------------

    def listen(self, wake: Callable[[], None]) -> bool:
        if self._closed:
            raise StoreClosed(f"{self.location}: listen after close")
        self._listener.add(wake)
        return True

    def exclusive(self, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        return advisory_lock(self._locks, self.url.schema, name, self.location,
                             check_timeout=self.url.connect_timeout)

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while self._committer is not None or self._alone is not None:
            # appends already handed in are committed first
            await asyncio.shield(self._committer or self._alone)  # type: ignore[arg-type]
        await self._listener.close()
        await self._pool.close()
        await self._locks.close()
