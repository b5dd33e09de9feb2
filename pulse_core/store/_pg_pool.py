"""A small pool of PostgreSQL connections, and the deadline that bounds a block of work on
one: a server that stops answering without closing the connection fails the block as a
lost connection instead of holding it forever."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from types import TracebackType
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from pulse_core._errors import StoreClosed
from pulse_core.store._pg_schema import Connection, is_disconnect

RawCursor = psycopg.AsyncRawCursor[tuple[Any, ...]]


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the operation deadline (a storage stall, a paused
    machine, dropped packets), so its connection was dropped: a lost connection."""


def drop(conn: Connection) -> None:
    """Shut `conn`'s socket without a word to the server: whatever waits on it ends at once
    with a lost connection (closing it later sends nothing a stalled server must answer)."""
    with (contextlib.suppress(psycopg.Error, OSError),
          socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock):
        sock.shutdown(socket.SHUT_RDWR)


async def close_quietly(conn: Connection) -> None:
    """Close `conn`, ignoring that it may be broken already."""
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()


class Deadlines:
    """Blocks of work on connections, each bounded to `seconds`: past them the block's
    connection is dropped, so the block fails as on a lost connection, with NoAnswer as the
    cause.

    One timer keeps every block's bound: entering and leaving a block costs a dict entry
    (a timer of its own each, armed and cancelled, cost a fast commit a tenth of its time).
    The blocks share one length, so the oldest is always the first due; the timer is armed
    for it and, when it fires, drops what is due and is armed again for the next."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._open: dict[_Watch, None] = {}  # in the order entered: the first is due first
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def watch(self, conn: Connection) -> _Watch:
        """The bound of one block of work on `conn`: a context manager."""
        return _Watch(self, conn)

    def cancel(self) -> None:
        """Stop the timer: the blocks still open are no longer bounded."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _enter(self, watch: _Watch) -> None:
        loop = asyncio.get_running_loop()
        watch.due = loop.time() + self.seconds
        self._open[watch] = None
        if self._timer is None or self._loop is not loop:  # (a timer of a loop since gone)
            self._loop = loop
            self._timer = loop.call_at(watch.due, self._expire)

    def _expire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for watch in list(self._open):
            if watch.due > now:
                self._timer = loop.call_at(watch.due, self._expire)
                return
            del self._open[watch]
            watch.fired = True
            drop(watch.conn)


class _Watch:
    """One block's bound (see Deadlines)."""

    __slots__ = ("_deadlines", "conn", "due", "fired")

    def __init__(self, deadlines: Deadlines, conn: Connection) -> None:
        self._deadlines = deadlines
        self.conn = conn
        self.due = 0.0
        self.fired = False

    def __enter__(self) -> None:
        self._deadlines._enter(self)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._deadlines._open.pop(self, None)
        if not self.fired or not isinstance(exc, Exception):
            return
        stalled = NoAnswer(f"no answer from the server within {self._deadlines.seconds:g} s "
                           "(operation_timeout), so the connection was dropped")
        if isinstance(exc, psycopg.Error | OSError):
            raise stalled from exc
        exc.__cause__ = stalled  # CommitUnknown: it reports its cause


@contextlib.contextmanager
def deadline(conn: Connection, seconds: float | None) -> Iterator[None]:
    """Bound the block's work on `conn` to `seconds` (None: unbounded), as Deadlines does
    for a block of its own."""
    if seconds is None:
        yield
        return
    bounds = Deadlines(seconds)
    try:
        with bounds.watch(conn):
            yield
    finally:
        bounds.cancel()


class ConnectionPool:
    """Up to `size` connections made by `connect`, reused while they work.

    A connection that broke, or is left inside a transaction, is closed instead of reused;
    after a failure `discard_idle` drops the others too (a restarted server cut them all),
    so the next call connects afresh rather than finding each dead one in turn. With
    `bound`, each block's work on its connection is bounded to that many seconds
    (Deadlines).
    """

    def __init__(self, connect: Callable[[], Awaitable[Connection]], size: int,
                 location: str, *, bound: float | None = None) -> None:
        self._connect = connect
        self._deadlines = None if bound is None else Deadlines(bound)
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._cursors: dict[Connection, RawCursor] = {}
        self._location = location
        self._closed = False

    def connection(self) -> _Lease:
        """A working connection for the duration of an `async with` block."""
        return _Lease(self)

    def kept_cursor(self, conn: Connection) -> RawCursor:
        """A cursor of `conn` (a connection of this pool, in use) for statements written with
        PostgreSQL's own placeholders (`$1`), kept as long as the pool keeps `conn`: a call
        on it makes no cursor and converts no statement (together a tenth of the client's
        CPU in a one-row commit)."""
        cursor = self._cursors.get(conn)
        if cursor is None or cursor.closed:
            cursor = self._cursors[conn] = psycopg.AsyncRawCursor(conn)
        return cursor

    async def discard_idle(self) -> None:
        """Close every idle connection (after a failure that probably cut them all)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await self._close(conn)

    async def close(self) -> None:
        """Close the idle connections; connections in use are closed when handed back."""
        self._closed = True
        await self.discard_idle()

    async def _close(self, conn: Connection) -> None:
        self._cursors.pop(conn, None)
        await close_quietly(conn)

    async def _take(self) -> Connection:
        if self._closed:
            raise StoreClosed(f"{self._location}: used after close")
        await self._slots.acquire()
        try:
            return self._idle.pop() if self._idle else await self._connect()
        except BaseException:
            self._slots.release()
            raise

    async def _give_back(self, conn: Connection, reuse: bool) -> None:
        """Keep `conn` for the next block if it still works and is outside a transaction
        (a cancellation may leave the protocol mid-way), else close it."""
        try:
            if (reuse and not self._closed and not conn.broken and not conn.closed
                    and conn.pgconn.transaction_status == TransactionStatus.IDLE):
                self._idle.append(conn)
            else:
                await self._close(conn)
        finally:
            self._slots.release()


class _Lease:
    """One block's use of a pooled connection (see ConnectionPool.connection)."""

    __slots__ = ("_conn", "_pool", "_watch")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._watch: _Watch | None = None

    async def __aenter__(self) -> Connection:
        pool = self._pool
        conn = self._conn = await pool._take()
        if pool._deadlines is not None:
            self._watch = pool._deadlines.watch(conn)
            self._watch.__enter__()
        return conn

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        # kept unless its bound ran out (the connection was dropped), the block was cut
        # short (a cancellation may leave the protocol mid-way) or the connection failed
        reuse = not (self._watch is not None and self._watch.fired) and (
            exc is None or (isinstance(exc, Exception) and not is_disconnect(exc)))
        try:
            if self._watch is not None:
                self._watch.__exit__(kind, exc, tb)  # may raise NoAnswer
        finally:
            await self._pool._give_back(self._conn, reuse)
