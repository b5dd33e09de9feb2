"""pulse inside another program's process: an Engine on a thread of its own, with its own
asyncio loop, that the host's hooks hand work to without waiting for it.

The bridge opens an Engine on the home (the survival layer and the built-in rules, at their
defaults: its watchers, ticks and notices run while the host runs). When another engine holds
the home (the pulse daemon, or another Hermes), it opens the home's stores instead and writes
into the log that engine runs on. Work runs one job at a time, in the order it was handed
over; a job that fails is logged and recorded as an `error` event, never raised to the host.
A wait of the host's that runs out puts the bridge behind: until the jobs handed over by then
have ended, or one of them has done its work (a slow home, not a stuck one), the host's waits
return at once, so a locked or dead home costs the host one bounded wait, not one per turn;
and a wait for a job that does not move gives up after `stall_s` even within its bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pulse_core import (
    Clock,
    Engine,
    EventStore,
    HomeLocked,
    HomeStores,
    Principal,
    SystemClock,
    error_draft,
    open_home,
)

log = logging.getLogger("pulse.hermes")

T = TypeVar("T")
Job = Callable[[EventStore], Awaitable[T]]


class PulseBridge:
    """A home's engine (or, when the home is taken, its stores) served from a thread.

    `mode` is "opening", then "engine" or "client" ("failed" while the home cannot be
    opened: jobs are skipped, and the first job `reopen_after_s` after a failed opening tries
    again), and "closed" after `close`. `embed=False` never starts an engine: the bridge is a
    client of whichever engine runs the home. `flush` and `close` stop waiting after
    `stall_s` in which no job did its work. `store` and `side_store` are the home's store
    URLs (None: the embedded SQLite files in the home), as its config.json names them.
    """

    def __init__(self, home: Path, *, principal: Principal, embed: bool = True,
                 name: str = "pulse", reopen_after_s: float = 30.0, stall_s: float = 0.5,
                 store: str | None = None, side_store: str | None = None) -> None:
        self.home = home
        self.store = store
        self.side_store = side_store
        self.principal = principal
        self.embed = embed
        self.name = name
        self.reopen_after_s = reopen_after_s
        self.stall_s = stall_s
        self._reopen_at = 0.0
        self._problem: str | None = None
        self.mode = "new"
        self.clock: Clock = SystemClock()
        self._engine: Engine | None = None
        self._stores: HomeStores | None = None
        self._store: EventStore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"{name}-bridge")
        self._serial = asyncio.Lock()
        self._guard = threading.Lock()
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._behind: set[concurrent.futures.Future[Any]] = set()  # what a wait ran out on
        self._worked = 0  # jobs (and openings) that did their work so far
        self._worked_then = 0  # ... when a wait last ran out
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
        wait = self._wait_s(timeout_s)
        future = self._schedule(self._guarded(job, what))
        try:
            return future.result(wait)
        except concurrent.futures.TimeoutError:
            if late is not None:
                future.add_done_callback(lambda f: _hand_late(f, late))
            self._ran_out(what, wait)
            return None

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every job handed over so far, while they move (see
        `stall_s`); whether they all ended."""
        wait = self._wait_s(timeout_s)
        with self._guard:
            pending = set(self._pending)
        return not pending or self._await(pending, wait, "what was handed over")

    def close(self, timeout_s: float = 5.0) -> None:
        """Let the jobs handed over end, close the engine (or the stores) and stop the
        thread, waiting at most `timeout_s`, and no longer than `stall_s` once no job is
        doing its work (even when behind: the last chance to write them). What it stops
        waiting for (a job that does not move, and the jobs queued behind it) is cancelled,
        and the thread ends once that is over: nothing is left pending for the host's exit
        to tear down."""
        if self._closing or self.mode == "new":
            self._closing = True
            return
        self._closing = True
        future = self._schedule(self._close())
        if not self._await({future}, timeout_s, "close"):
            if self.mode == "opening":
                log.info("%s: closed before the pulse home %s opened", self.name, self.home)
            log.warning("%s: close did not finish; the jobs still waiting are dropped",
                        self.name)
        asyncio.run_coroutine_threadsafe(self._wind_down(), self._loop)
        self._thread.join(self.stall_s)

    def _await(self, futures: set[concurrent.futures.Future[Any]], timeout_s: float,
               what: str) -> bool:
        """Wait for `futures` at most `timeout_s`, giving up after a `stall_s` in which no
        job did its work; whether they all ended."""
        started = time.monotonic()
        deadline = started + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            with self._guard:
                worked = self._worked
            _, left = concurrent.futures.wait(futures, min(self.stall_s, left_s))
            if not left:
                return True
            with self._guard:
                if self._worked == worked:
                    break  # stuck, not slow
        self._ran_out(what, time.monotonic() - started)
        return False

    def _wait_s(self, timeout_s: float) -> float:
        """`timeout_s`, or 0 while the jobs a wait ran out on have not all ended."""
        with self._guard:
            if self._behind & self._pending and self._worked == self._worked_then:
                return 0.0
            if self._behind:
                self._behind = set()
                log.info("%s: caught up with the jobs handed over; waiting again", self.name)
        return timeout_s

    def _ran_out(self, what: str, wait: float) -> None:
        with self._guard:
            self._behind |= self._pending
            self._worked_then = self._worked
        if wait > 0:
            log.warning("%s: %s not done within %.2f s; not waited for until the bridge "
                        "catches up (is the home %s locked or slow?)", self.name, what, wait,
                        self.home)

    # -- on the bridge's loop ----------------------------------------------------------------

    def _serve(self) -> None:
        """The bridge's thread: its loop, until close stops it, then closed (its selector's
        files with it)."""
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _wind_down(self) -> None:
        """Cancel every other task of the loop, and stop the loop once they have ended (a
        cancelled job may take its time: an opening waits out its lock in a thread)."""
        me = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not me]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
        asyncio.get_running_loop().stop()

    def _schedule(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        future = asyncio.run_coroutine_threadsafe(self._in_turn(work), self._loop)
        with self._guard:
            self._pending.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._guard:
            self._pending.discard(future)

    async def _in_turn(self, work: Coroutine[Any, Any, T]) -> T:
        try:
            await self._serial.acquire()
        except BaseException:  # cancelled in the queue: `work` never starts
            work.close()
            raise
        try:
            return await work
        finally:
            self._serial.release()

    async def _guarded(self, job: Job[T], what: str) -> T | None:
        if self.mode == "failed" and time.monotonic() >= self._reopen_at:
            await self._open()
        store = self._store
        if store is None:
            return None  # the home is not open: said at the failed opening
        try:
            result = await job(store)
        except Exception as exc:
            log.warning("%s: %s failed: %s: %s", self.name, what, type(exc).__name__, exc)
            await self._record(what, exc)
            return None
        self._did_work()
        return result

    def _did_work(self) -> None:
        with self._guard:
            self._worked += 1

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
            else:
                self._stores = await open_home(self.home, store=self.store,
                                               side_store=self.side_store, clock=self.clock,
                                               principal=self.principal)
                self._store = self._stores.events
                self.mode = "client"
        except Exception as exc:
            if self._closing:  # given up by close (or torn down at exit): no more tries
                log.info("%s: closed before the pulse home %s opened (%s: %s)", self.name,
                         self.home, type(exc).__name__, exc)
                return
            self.mode = "failed"
            self._reopen_at = time.monotonic() + self.reopen_after_s
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._problem:
                log.error("%s: cannot open the pulse home %s: %s — nothing is recorded until "
                          "it opens (tried again every %g s)", self.name, self.home, problem,
                          self.reopen_after_s)
            self._problem = problem
            return
        self._did_work()
        if self._problem is not None:
            log.warning("%s: the pulse home %s is open (%s) after all", self.name, self.home,
                        self.mode)
            self._problem = None

    async def _open_engine(self) -> bool:
        engine = Engine(self.home, store=self.store, side_store=self.side_store,
                        principal=Principal.engine())
        try:
            await engine.open()
        except HomeLocked:
            return False
        try:
            await engine.start()
        except BaseException:
            await engine.close()
            raise
        self._engine, self.clock = engine, engine.clock
        self._store = engine.events.as_principal(self.principal)
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
