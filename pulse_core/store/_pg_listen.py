"""What PostgreSQL shares between processes and hosts beside the log itself: wakes after
commits (LISTEN/NOTIFY on a dedicated connection) and exclusive sections (session advisory
locks)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg

from pulse_core._backoff import Backoff
from pulse_core._errors import LockLost, StoreError
from pulse_core._waits import wait_ended
from pulse_core.store._pg_ddl import quoted
from pulse_core.store._pg_pool import ConnectionPool, close_quietly, deadline, drop
from pulse_core.store._pg_schema import (
    Connection,
    first_line,
    is_disconnect,
    lock_key,
    pg_errors,
    store_error,
)

log = logging.getLogger("pulse.events")

#: between attempts to get the LISTEN connection back
RECONNECT = Backoff(initial_ms=100, factor=2.0, max_ms=5_000, jitter=0.2)
#: how long close waits for the LISTEN task to end by itself before cancelling it
CLOSE_WAIT = 1.0


class Listener:
    """Calls `wake()` on each notification on `channel`, and once after each (re)connect,
    since commits made while it was not listening were announced to nobody.

    After `probe` seconds without a notification it checks that the server still answers
    (within `probe` seconds too): a server that stopped answering without closing the
    connection is left for a new connection, not waited on forever.
    """

    def __init__(self, connect: Callable[[], Awaitable[Connection]], channel: str,
                 location: str, *, probe: float) -> None:
        self._connect = connect
        self._channel = channel
        self._location = location
        self._probe = probe
        self._wakes: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._conn: Connection | None = None
        self._stop = asyncio.Event()
        #: connections made so far (the first, then one per reconnect)
        self.connections = 0

    def add(self, wake: Callable[[], None]) -> None:
        """Call `wake` too from now on; starts listening on the first call."""
        self._wakes.append(wake)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"pulse-listen {self._location}")
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Say so when listening ends by an error `_run` does not expect (never silently)."""
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("pulse: %s: stopped hearing other processes' commits (%s: %s); "
                      "readers poll from now on", self._location, type(exc).__name__,
                      first_line(exc))

    def _wake(self) -> None:
        for wake in self._wakes:
            wake()

    async def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._conn = conn = await self._connect()
                with deadline(conn, self._probe):
                    await conn.execute(f"LISTEN {quoted(self._channel)}")
                self.connections += 1
                if failures:
                    log.info("pulse: %s: listening for commits again", self._location)
                failures = 0
                self._wake()
                while True:
                    async for _ in conn.notifies(timeout=self._probe):
                        self._wake()
                    with deadline(conn, self._probe):
                        await conn.execute("SELECT 1")
            except (psycopg.Error, OSError, StoreError) as exc:
                if self._stop.is_set():
                    return
                failures += 1
                if failures == 1:
                    log.warning("pulse: %s: lost the connection that hears other processes' "
                                "commits (%s); reconnecting, readers poll meanwhile",
                                self._location, first_line(exc))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RECONNECT.delay_ms(failures) / 1000):
                        await self._stop.wait()
            finally:
                used, self._conn = self._conn, None
                if used is not None:
                    await close_quietly(used)

    async def close(self) -> None:
        """Stop listening, without waiting on the server: the connection is dropped."""
        self._stop.set()
        task = self._task
        if task is None:
            return
        if self._conn is not None:
            drop(self._conn)  # its wait ends with a lost connection, and the task with it
        done, _ = await asyncio.wait({task}, timeout=CLOSE_WAIT)
        if not done:  # connecting: nothing to drop yet
            task.cancel()
            await wait_ended(task)  # not `await task`: a cancel of this close propagates
        self._task = None  # (kept until it ended: a close cut short leaves it to the next)


class _Held:
    """One exclusive lock held on its own session: `lost` says why once it is known gone."""

    def __init__(self, pool: ConnectionPool, conn: Connection, name: str, location: str,
                 timeout: float) -> None:
        self.pool, self.conn, self.name = pool, conn, name
        self.location, self.timeout = location, timeout
        self.lost: str | None = None
        self.released = False

    def error(self, what: str) -> LockLost:
        return LockLost(
            f"{self.location}: the exclusive lock {self.name!r} was lost while held (the "
            f"connection holding it dropped: {self.lost}), so {what}")

    async def check(self) -> None:
        """LockLost unless the lock's session still answers (one round trip): a
        session advisory lock goes only with its session."""
        if self.lost is None:
            try:
                async with asyncio.timeout(self.timeout):
                    await self.conn.execute("SELECT 1")
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if isinstance(exc, psycopg.Error) and not is_disconnect(exc):
                    raise store_error(exc, self.location, "checking an exclusive lock") from exc
                self.lost = first_line(exc) if str(exc) else "no answer in time"
                await close_quietly(self.conn)
        if self.lost is not None:
            raise self.error("this append is refused: another holder may be inside — leave "
                             "the block and take the lock again")


_HELD: contextvars.ContextVar[tuple[_Held, ...]] = contextvars.ContextVar(
    "pulse_exclusive_held", default=())


async def check_held(pool: ConnectionPool) -> None:
    """LockLost if an exclusive lock of `pool` that the caller is inside was lost
    (one round trip per lock held; none when it holds none)."""
    held = [h for h in _HELD.get() if h.pool is pool and not h.released]
    if held:
        await asyncio.gather(*(h.check() for h in held))


@contextlib.asynccontextmanager
async def advisory_lock(pool: ConnectionPool, schema: str, name: str, location: str, *,
                        check_timeout: float) -> AsyncIterator[None]:
    """Hold PostgreSQL's session advisory lock for (`schema`, `name`) while inside: at most
    one holder among every process and host on this database.

    The lock lives in one session: should that connection drop while inside, the server
    lets the lock go. Then `check_held` (the recorder's appends inside the block call it)
    raises LockLost (a StoreUnavailable), so nothing is written under a lock another holder
    may have taken, and leaving the block raises LockLost saying the lock was lost.
    """
    key = lock_key("pulse-exclusive", schema, name)
    async with pool.connection() as conn:
        try:
            with pg_errors(location, f"taking the exclusive lock {name!r}"):
                await conn.execute("SELECT pg_advisory_lock(%s)", (key,))
        except BaseException:
            # Cut short while waiting (or failed): make sure the lock is never left held.
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.cancel_safe()
            await close_quietly(conn)
            raise
        held = _Held(pool, conn, name, location, check_timeout)
        token = _HELD.set((*_HELD.get(), held))
        try:
            yield
        finally:
            held.released = True
            with contextlib.suppress(ValueError):  # left in another context: nothing to undo
                _HELD.reset(token)
            await _release(held, key)


async def _release(held: _Held, key: int) -> None:
    """Unlock `held`; LockLost if it was lost meanwhile."""
    if held.lost is None:
        try:
            with deadline(held.conn, held.timeout):
                cur = await held.conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
                row = await cur.fetchone()
            if not (row and row[0]):
                held.lost = "the server no longer knew it"
        except (psycopg.Error, OSError) as exc:
            if not is_disconnect(exc):
                await close_quietly(held.conn)
                raise store_error(exc, held.location,
                                  f"releasing the exclusive lock {held.name!r}") from exc
            held.lost = first_line(exc)
    if held.lost is not None:
        await close_quietly(held.conn)
        raise held.error("another holder may have overlapped — check what ran under it")
