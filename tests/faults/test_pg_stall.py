"""A PostgreSQL server that stops answering without closing its connections (a storage stall,
a paused VM, dropped packets): every round trip is bounded by the store's operation_timeout,
a stalled one fails typed (StoreUnavailable), close() returns, ticks carry on failing and
retrying, and once the server answers again the engine carries on.

The stall is real: a loopback TCP proxy in front of a real server stops forwarding (its
connections stay open), as a paused machine between them would."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from pulse_core import Engine, EventDraft, StoreUnavailable
from pulse_core.store import open_event_store
from pulse_core.store._pg_pool import ConnectionPool, Deadlines, NoAnswer
from tests.servers import LOOPBACK, PostgresServer
from tests.timing import scaled

TEST_TIME_LIMIT_S = 120
BOUND_S = 1.0  # the operation_timeout of these tests
T = TypeVar("T")


class StallingProxy:
    """Forwards 127.0.0.1:`port` to a PostgreSQL server, one thread per direction of each
    connection. `pause()` holds everything it receives (connections stay open); `resume()`
    lets it through again. `lose_commit_reply` drops the connection once the server has the
    next COMMIT, before its reply reaches the client; `lose_commit` drops it before the
    server gets the COMMIT, calling `between()` once the server side is gone; either lets
    `pass_commits` commits through first."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.flowing = threading.Event()
        self.flowing.set()
        self.refusing = False
        self.lose_commit_reply = False
        self.lose_commit = False
        self.pass_commits = 0
        self.between: Callable[[], None] | None = None
        self.cuts = 0
        self._listener = socket.create_server((LOOPBACK, 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str, **options: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in options.items())
        return f"postgresql://pulse@{LOOPBACK}:{self.port}/{database}" + (
            f"?{query}" if query else "")

    def lose_next(self, *, reply: bool = True, passing: int = 0) -> None:
        """Lose the reply of the commit after `passing` more (`reply`; else the commit itself
        before the server has it), and refuse new connections from the cut on, so the
        client cannot ask the server what became of it (until `refusing` is cleared)."""

        def refuse() -> None:
            self.refusing = True

        self.between = refuse
        self.pass_commits = passing
        if reply:
            self.lose_commit_reply = True
        else:
            self.lose_commit = True

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            server = socket.create_connection((LOOPBACK, self.target))
            self._sockets += [client, server]
            doomed = threading.Event()
            threading.Thread(target=self._pipe, args=(client, server, doomed, True),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, doomed, False),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, doomed: threading.Event,
              upstream: bool) -> None:
        commits = Commits()
        try:
            while data := src.recv(65536):
                self.flowing.wait()
                committing = upstream and commits.found_in(data)  # (it learns names too)
                if committing and (self.lose_commit or self.lose_commit_reply):
                    if self.pass_commits:
                        self.pass_commits -= 1
                    elif self.lose_commit:
                        self.lose_commit = False
                        doomed.set()
                        self._cut(dst, src)  # the server never gets the COMMIT
                        return
                    else:
                        self.lose_commit_reply = False
                        doomed.set()
                elif not upstream and doomed.is_set():
                    self._cut(src, dst)  # the server has committed; its reply is lost
                    return
                dst.sendall(data)
        except OSError:
            pass
        if not doomed.is_set():  # else the thread cutting the connection closes it
            for sock in (src, dst):
                _shut(sock)

    def _cut(self, server: socket.socket, client: socket.socket) -> None:
        _shut(server)
        if self.between is not None:
            self.between()
        self.cuts += 1
        _shut(client)

    def close(self) -> None:
        self.resume()
        self._listener.close()
        for sock in self._sockets:
            _shut(sock)


class Commits:
    """Tells the messages a client sends on one connection that commit: a COMMIT, or a call
    of the log's one-statement commit (`commit_if_heads`), by its text or, once the driver
    has prepared it, by the name it was prepared under."""

    PREPARED = re.compile(rb"P[\s\S]{4}([^\x00]+)\x00[^\x00]*commit_if_heads")

    def __init__(self) -> None:
        self.names: list[bytes] = []

    def found_in(self, data: bytes) -> bool:
        self.names += self.PREPARED.findall(data)
        return b"COMMIT\x00" in data or b"commit_if_heads" in data or any(
            b"\x00" + name + b"\x00" in data for name in self.names)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.fixture
def proxy(postgres_server: PostgresServer) -> Iterator[StallingProxy]:
    found = StallingProxy(postgres_server.port)
    yield found
    found.close()


def database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database().rsplit("/", 1)[1]


async def within(seconds: float, what: str, work: Awaitable[T]) -> T:
    """`work` awaited; fail naming `what` if it has not ended within `seconds` (a hang)."""
    try:
        return await asyncio.wait_for(work, seconds)
    except TimeoutError:
        raise AssertionError(f"{what} did not end within {seconds:g} s") from None


async def test_appends_and_reads_on_a_stalled_server_fail_typed_and_close_returns(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    url = proxy.url(database(postgres_server), operation_timeout=str(BOUND_S),
                    connect_timeout="1")
    store = await open_event_store(url)
    await store.append([EventDraft("tick", "n", {"i": 0})])
    proxy.pause()
    # Generous limits: they only catch a hang; the bound is a few operation_timeouts.
    with pytest.raises(StoreUnavailable, match="operation_timeout"):
        await within(30, "an append on a stalled server",
                     store.append([EventDraft("tick", "n", {"i": 1})]))
    with pytest.raises(StoreUnavailable):
        await within(30, "a read on a stalled server", store.read())
    pending = asyncio.ensure_future(store.append([EventDraft("tick", "n", {"i": 2})]))
    await asyncio.sleep(0)
    began = time.monotonic()
    await within(30, "close() on a stalled server", store.close())
    closed_in = time.monotonic() - began
    with pytest.raises(StoreUnavailable):
        await within(5, "the append handed in before close", pending)
    assert closed_in < 20, closed_in
    proxy.resume()
    again = await open_event_store(url)
    try:
        await again.append([EventDraft("tick", "n", {"i": 3})])
        numbers = [e.data["i"] for e in await again.read(kinds=["tick"])]
        # What the stall cut off was not stored; nothing was stored twice.
        assert numbers[0] == 0 and numbers[-1] == 3 and len(set(numbers)) == len(numbers)
    finally:
        await again.close()


async def test_the_listen_connection_of_a_stalled_server_is_replaced(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    url = proxy.url(database(postgres_server), operation_timeout=str(BOUND_S),
                    connect_timeout="1")
    store = await open_event_store(url)
    writer = await open_event_store(postgres_server.url(url.rsplit("/", 1)[1].split("?")[0]))
    try:
        woken = asyncio.Event()
        recorder = store.recorder
        listener = recorder._listener  # type: ignore[attr-defined]
        assert recorder.listen(woken.set)
        await _until(lambda: listener.connections >= 1)
        proxy.pause()
        await asyncio.sleep(3 * BOUND_S)  # the probe finds no answer and reconnects meanwhile
        proxy.resume()
        await _until(lambda: listener.connections >= 2)  # a new LISTEN connection
        woken.clear()
        await writer.append([EventDraft("tick", "n", {"i": 1})])
        await within(30, "a wake after another process's commit", woken.wait())
    finally:
        await within(30, "close()", store.close())
        await writer.close()


async def test_a_close_cancelled_while_a_hung_listen_connect_ends_is_cancelled_not_finished(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a listener whose connect never answered cancels the connect and waits for it;
    a cancel of the close itself meanwhile (an engine stop bounded by a timeout) ends the
    close with CancelledError, never lost while the connect takes its moment to end."""
    from pulse_core.store import _pg_listen

    monkeypatch.setattr(_pg_listen, "CLOSE_WAIT", 0.01)
    ending = asyncio.Event()

    async def hung_connect() -> Any:
        try:
            await asyncio.Event().wait()  # a server that never answers
        except asyncio.CancelledError:
            ending.set()
            await asyncio.sleep(scaled(30))  # the attempt takes a moment to end
            raise

    listener = _pg_listen.Listener(hung_connect, "pulse_test", "test", probe=1.0)
    listener.add(lambda: None)
    listening = listener._task
    assert listening is not None
    closing = asyncio.create_task(listener.close())
    await within(30, "the close cancelling the connect", ending.wait())
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not listening.done()
    await within(30, "a second close", listener.close())  # it ends what the first left
    assert listening.done()


async def test_a_listener_ended_by_an_unexpected_error_says_so(
        caplog: pytest.LogCaptureFixture) -> None:
    """Listening that ends by an error it does not expect (a bug) is logged, never silent:
    readers fall back to polling."""
    from pulse_core.store import _pg_listen

    async def broken_connect() -> Any:
        raise RuntimeError("a bug in the connect")

    listener = _pg_listen.Listener(broken_connect, "pulse_test", "test", probe=1.0)
    listener.add(lambda: None)
    listening = listener._task
    assert listening is not None
    await asyncio.wait({listening})
    assert "stopped hearing other processes' commits (RuntimeError: a bug in the connect)" \
        in caplog.text
    await listener.close()


async def test_an_engine_on_a_stalled_server_keeps_ticking_and_carries_on_after(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    url = proxy.url(database(postgres_server), operation_timeout=str(BOUND_S),
                    connect_timeout="1")
    engine = Engine(tmp_path / "home", store=url, default_tick_ms=100)
    async with engine:
        await engine.tick()
        proxy.pause()
        for _ in range(2):  # each tick fails within the bound, none hangs
            with pytest.raises(StoreUnavailable):
                await within(30, "a tick on a stalled server", engine.tick())
        proxy.resume()
        await within(30, "a tick once the server answers", _retry_tick(engine))


async def _retry_tick(engine: Engine) -> None:
    while True:
        try:
            await engine.tick()
            return
        except StoreUnavailable:
            await asyncio.sleep(0.1)


async def _until(check: Callable[[], bool], seconds: float = 30) -> None:
    """Wait until `check()` holds; fail after `seconds` (a hang)."""
    seconds = scaled(seconds)
    give_up = time.monotonic() + seconds
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up after {seconds:g} s")
        await asyncio.sleep(0.05)


async def test_engine_close_returns_while_the_server_is_stalled(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    url = proxy.url(database(postgres_server), operation_timeout=str(BOUND_S),
                    connect_timeout="1")
    engine = Engine(tmp_path / "home", store=url, default_tick_ms=100)
    await engine.open()
    await engine.tick()
    proxy.pause()
    try:
        await within(60, "Engine.close() on a stalled server", engine.close())
    finally:
        proxy.resume()


async def test_one_timer_cuts_each_stalled_block_at_its_own_bound_and_no_other(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    """The pool's blocks share one timer (Deadlines): set for the oldest block, it is set
    again for the next when it fires. A block that stalls after an earlier one ended is cut
    a whole bound after it began, not when the earlier block's bound ran out; the earlier
    block's connection, handed back, is never dropped by its spent bound."""
    dsn = proxy.url(database(postgres_server), connect_timeout="1")
    first = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    second = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    bounds = Deadlines(BOUND_S)
    try:
        with bounds.watch(first):
            await first.execute("SELECT 1")  # the timer is set for this block's bound
        await asyncio.sleep(BOUND_S / 2)
        proxy.pause()
        began = time.monotonic()
        with pytest.raises(NoAnswer, match="operation_timeout"), bounds.watch(second):
            await within(30, "a stalled round trip", second.execute("SELECT 1"))
        assert time.monotonic() - began >= BOUND_S * 0.95
        proxy.resume()
        await first.execute("SELECT 1")  # still connected: its block's bound was let go
    finally:
        proxy.resume()
        await first.close()
        await second.close()


async def test_a_connection_whose_bound_ran_out_in_a_block_that_ended_cleanly_is_not_kept(
        postgres_server: PostgresServer) -> None:
    """The bound can run out after a block's last answer came and before it ends: the block
    ends without an error, but its connection was dropped, so the pool must not keep it."""
    dsn = postgres_server.url(database(postgres_server))

    async def connect() -> psycopg.AsyncConnection[tuple[object, ...]]:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=True)

    pool = ConnectionPool(connect, 1, "test", bound=0.05)
    try:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
            await asyncio.sleep(0.5)  # the bound runs out here, with nothing waiting on it
        async with pool.connection() as again:
            assert again is not conn, "the dropped connection was handed out again"
            await again.execute("SELECT 1")
    finally:
        await pool.close()


def test_the_pool_bounds_blocks_on_a_second_event_loop_after_the_first_closed(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    """The one timer belongs to the loop it was set on: a block on another loop (the first
    closed with the timer still set) gets a timer of its own loop, so a stall is still cut."""
    dsn = proxy.url(database(postgres_server), connect_timeout="1")
    bounds = Deadlines(BOUND_S)

    async def block(stall: bool) -> None:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            if stall:
                proxy.pause()
            with bounds.watch(conn):
                await within(30, "a round trip", conn.execute("SELECT 1"))
        finally:
            proxy.resume()
            await conn.close()

    asyncio.run(block(stall=False))  # leaves the timer set on a loop that then closes
    with pytest.raises(NoAnswer, match="operation_timeout"):
        asyncio.run(block(stall=True))
