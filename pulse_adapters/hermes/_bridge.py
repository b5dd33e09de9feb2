"""pulse inside another program's process: an Engine on a thread of its own, with its own
asyncio loop, that the host's hooks hand work to without waiting for it.

The bridge opens an Engine on the home (the survival layer and the built-in rules, at their
defaults: its watchers, ticks and notices run while the host runs). When another engine holds
the home (the pulse daemon, or another Hermes), it opens the home's stores instead and writes
into the log that engine runs on. Work runs one job at a time, in the order it was handed
over; a job that fails is logged and recorded as an `error` event, never raised to the host.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pulse_core import (
    Clock,
    Engine,
    EventStore,
    HomeLocked,
    HomeStores,
    SystemClock,
    error_draft,
    open_home,
)

log = logging.getLogger("pulse.hermes")

T = TypeVar("T")
Job = Callable[[EventStore], Awaitable[T]]


class PulseBridge:
    """A home's engine (or, when the home is taken, its stores) served from a thread.

    `mode` is "opening", then "engine" or "client" ("failed" when the home could not be
    opened at all: every job is then skipped), and "closed" after `close`. `embed=False`
    never starts an engine: the bridge is a client of whichever engine runs the home.
    """

    def __init__(self, home: Path, *, embed: bool = True, name: str = "pulse") -> None:
        self.home = home
        self.embed = embed
        self.name = name
        self.mode = "new"
        self.clock: Clock = SystemClock()
        self._engine: Engine | None = None
        self._stores: HomeStores | None = None
        self._store: EventStore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"{name}-bridge")
        self._serial = asyncio.Lock()
        self._guard = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._closing = False

    @property
    def engine(self) -> Engine | None:
        """The embedded engine (None in client mode, or before it opened)."""
        return self._engine

    def start(self) -> None:
        """Start the thread and open the home on it (returns at once)."""
        if self.mode != "new":
            return
        self.mode = "opening"
        self._thread.start()
        self._schedule(self._open())

    def submit(self, job: Job[Any], what: str) -> None:
        """Run `job(events)` on the bridge's loop after the jobs handed over before it; does
        not wait. A failure is logged and recorded as an error at `agent:<name>:<what>`."""
        if self._closing:
            log.debug("%s: %s after close, skipped", self.name, what)
            return
        self._schedule(self._guarded(job, what))

    def report(self, what: str, exc: Exception) -> None:
        """Record `exc`, raised in the host's thread at `what`, as an error (not waited for)."""
        if not self._closing:
            self._schedule(self._record(what, exc))

    def call(self, job: Job[T], what: str, *, timeout_s: float,
             late: Callable[[T], None] | None = None) -> T | None:
        """`job(events)`'s result, waited for at most `timeout_s` (None past it, or when the
        job failed). A result that comes too late is handed to `late`."""
        if self._closing:
            return None
        future = self._schedule(self._guarded(job, what))
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            if late is not None:
                future.add_done_callback(lambda f: _hand_late(f, late))
            log.info("%s: %s took longer than %.2f s; not waited for", self.name, what,
                     timeout_s)
            return None

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every job handed over so far; whether they all ended."""
        with self._guard:
            pending = set(self._pending)
        if not pending:
            return True
        _, left = concurrent.futures.wait(pending, timeout_s)
        return not left

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the jobs handed over end, close the engine (or the stores) and stop the
        thread, waiting at most `timeout_s` overall."""
        if self._closing or self.mode == "new":
            self._closing = True
            return
        self._closing = True
        future = self._schedule(self._close())
        try:
            future.result(timeout_s)
        except (concurrent.futures.TimeoutError, Exception) as exc:
            log.warning("%s: close did not finish within %.1f s (%s)", self.name, timeout_s,
                        type(exc).__name__)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)

    # -- on the bridge's loop ----------------------------------------------------------------

    def _schedule(self, work: Awaitable[T]) -> concurrent.futures.Future[T]:
        future = asyncio.run_coroutine_threadsafe(self._in_turn(work), self._loop)
        with self._guard:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._guard:
            self._pending.discard(future)

    async def _in_turn(self, work: Awaitable[T]) -> T:
        async with self._serial:
            return await work

    async def _guarded(self, job: Job[T], what: str) -> T | None:
        store = self._store
        if store is None:
            return None  # the home did not open: said once, at open
        try:
            return await job(store)
        except Exception as exc:
            log.warning("%s: %s failed: %s: %s", self.name, what, type(exc).__name__, exc)
            await self._record(what, exc)
            return None

    async def _record(self, what: str, exc: Exception) -> None:
        if self._store is None:
            return
        try:
            await self._store.append([error_draft(f"agent:{self.name}:{what}", exc)])
        except Exception as again:
            log.warning("%s: the error of %s could not be recorded either: %s", self.name,
                        what, again)

    async def _open(self) -> None:
        try:
            if self.embed and await self._open_engine():
                self.mode = "engine"
                return
            self._stores = await open_home(self.home, clock=self.clock)
            self._store = self._stores.events
            self.mode = "client"
        except Exception as exc:
            self.mode = "failed"
            log.error("%s: cannot open the pulse home %s: %s: %s — the plugin records "
                      "nothing until Hermes restarts", self.name, self.home,
                      type(exc).__name__, exc)

    async def _open_engine(self) -> bool:
        engine = Engine(self.home)
        try:
            await engine.open()
        except HomeLocked:
            return False
        try:
            await engine.start()
        except BaseException:
            await engine.close()
            raise
        self._engine, self._store, self.clock = engine, engine.events, engine.clock
        return True

    async def _close(self) -> None:
        engine, stores = self._engine, self._stores
        self._engine = self._stores = self._store = None
        self.mode = "closed"
        if engine is not None:
            await engine.close()
        if stores is not None:
            await stores.close()


def _hand_late(future: concurrent.futures.Future[T | None], late: Callable[[T], None]
               ) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    result = future.result()
    if result is not None:
        late(result)
