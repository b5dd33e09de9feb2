"""The supervisor: every long-running loop of an engine runs under it.

A loop that raises is reported (an `error` event, through the engine's reporter) and started
again after the shared Backoff; a loop that returns is finished. No task the engine starts
can fail unobserved: one-shot background tasks go through `spawn`, whose failures are logged
(they are most often the reports themselves, failing with the store), at most one line per
BACKGROUND_LOG_EVERY_S; a close shared by many callers runs through `Once`. A loop that rides
out a store outage reports it once more, with its length, when the store answers again
(`StoreOutage`).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec

from pulse_core._backoff import Backoff
from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import StoreUnavailable
from pulse_core._redact import redact_urls
from pulse_core._waits import wait_signal

__all__ = ["BACKGROUND_LOG_EVERY_S", "LOOP_BACKOFF", "STABLE_S", "LoopState", "LoopStatus",
           "Once", "Reporter", "StoreOutage", "Supervisor", "wait_signal"]

log = logging.getLogger("pulse")

Reporter = Callable[[str, BaseException], None]
"""Hears of an error a loop survives: where it happened, and the exception."""

LOOP_BACKOFF = Backoff(initial_ms=200, factor=2.0, max_ms=30_000, jitter=0.1)
"""How long a failed loop waits before its next start (doubling per failure in a row)."""

STABLE_S = 60.0
"""A loop that ran this long before failing starts its backoff over."""

BACKGROUND_LOG_EVERY_S = 60.0
"""Background tasks that fail within this many seconds of a logged one are counted, not
logged: a full disk fails every report, and would otherwise fill the log with the same line."""


class LoopState(enum.Enum):
    """Where a supervised loop is, as supervisorctl would say it."""

    RUNNING = "running"
    BACKOFF = "backoff"
    EXITED = "exited"
    STOPPED = "stopped"


class LoopStatus(msgspec.Struct):
    """One supervised loop: its state, restarts so far, when it last started, its last error."""

    name: str
    state: LoopState
    restarts: int = 0
    started_at: int = 0
    last_error: str | None = None


class StoreOutage:
    """A store outage (StoreUnavailable, until the store answers again) as the loop `where`,
    run by `who`, lives through it: every error goes to `report`, and the outage once more,
    with its length, when the store answers again, so that it reaches the log."""

    def __init__(self, where: str, who: str, report: Reporter) -> None:
        self.where = where
        self.who = who
        self.report = report
        self._since: tuple[float, StoreUnavailable] | None = None  # when, the first error

    def failed(self, where: str, exc: BaseException) -> None:
        """Report `exc` (at `where`); remember the first of an outage (StoreUnavailable)."""
        if isinstance(exc, StoreUnavailable) and self._since is None:
            self._since = (time.monotonic(), exc)
        self.report(where, exc)

    def answered(self) -> None:
        """The store answered: report the outage that ends here, if one was going on."""
        if self._since is not None:
            (since, first), self._since = self._since, None
            self.report(self.where, StoreUnavailable(
                f"{self.who}: the store was unavailable for {time.monotonic() - since:.1f} s "
                f"(first error: {first}); it answers again and the loop carries on"))


class Once:
    """One run shared by every caller that comes while it goes on: a caller cancelled while it
    waits leaves it running, and a failure that no caller is left to see is logged (as
    `what`). Once a run has ended, the next call starts another."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._run: asyncio.Future[None] | None = None

    async def __call__(self, begin: Callable[[], Awaitable[None] | None]) -> None:
        """Wait for the run going on, or else for a new one of what `begin()` returns (None:
        nothing to run)."""
        if self._run is None:
            work = begin()
            if work is None:
                return
            self._run = asyncio.ensure_future(work)
            self._run.add_done_callback(self._observe)
        run = self._run
        try:
            await asyncio.shield(run)
        finally:
            if run.done() and self._run is run:
                self._run = None

    def _observe(self, run: asyncio.Future[None]) -> None:
        if not run.cancelled() and run.exception() is not None:
            log.warning("pulse: %s failed: %s", self.what, run.exception())


class Supervisor:
    """Runs named loops, restarts them when they raise, and stops them all together.

    A loop waits `backoff` before each restart, longer after each failure in a row; one
    that ran `stable_s` seconds or more before it failed starts its backoff over."""

    def __init__(self, report: Reporter, *, clock: Clock | None = None,
                 backoff: Backoff = LOOP_BACKOFF, stable_s: float = STABLE_S) -> None:
        self._report = report
        self.clock: Clock = clock or SystemClock()
        self.backoff = backoff
        self.stable_s = stable_s
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._status: dict[str, LoopStatus] = {}
        self._spawned: set[asyncio.Task[Any]] = set()
        self._unlogged = 0  # background failures since the last line logged
        self._log_after = 0.0  # (time.monotonic) when the next one may be logged

    def start(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run `body()` as the loop `name`, restarting it after each exception."""
        if name in self._loops:
            raise ValueError(f"a loop named {name!r} is already supervised")
        self._status[name] = LoopStatus(name, LoopState.RUNNING, started_at=self.clock.now_ms())
        self._loops[name] = asyncio.create_task(self._keep(name, body), name=f"pulse-{name}")

    async def _keep(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        status = self._status[name]
        me = asyncio.current_task()
        failures = 0
        try:
            while True:
                began = loop.time()
                status.state, status.started_at = LoopState.RUNNING, self.clock.now_ms()
                try:
                    await body()
                except asyncio.CancelledError as exc:
                    if me is not None and me.cancelling():
                        raise  # stop() (or our own canceller) asked: we end
                    failure: BaseException = exc  # a cancel the body caught from elsewhere
                except Exception as exc:
                    failure = exc
                else:
                    status.state = LoopState.EXITED
                    return
                if me is not None and me.cancelling():
                    # stop() asked and the body turned the cancel into an error (a cleanup
                    # that failed): we end all the same, never start it again
                    raise asyncio.CancelledError
                failures = 1 if loop.time() - began >= self.stable_s else failures + 1
                status.state = LoopState.BACKOFF
                status.last_error = redact_urls(f"{type(failure).__name__}: {failure}")
                status.restarts += 1
                self._report(name, failure)
                await asyncio.sleep(self.backoff.delay_ms(failures) / 1000)
        except asyncio.CancelledError:
            status.state = LoopState.STOPPED
            raise

    def spawn(self, name: str, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run one-shot `work` in the background; an exception in it is logged (at most a line
        per BACKGROUND_LOG_EVERY_S, the rest counted), never left unretrieved."""
        task = asyncio.create_task(work, name=f"pulse-{name}")
        self._spawned.add(task)
        task.add_done_callback(lambda t: self._settled(name, t))
        return task

    def _settled(self, name: str, task: asyncio.Task[Any]) -> None:
        self._spawned.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        # Reporting may itself fail (the store is what failed): log, never recurse.
        now = time.monotonic()
        if now < self._log_after:
            self._unlogged += 1
            return
        self._log_after = now + BACKGROUND_LOG_EVERY_S
        count, self._unlogged = self._unlogged, 0
        log.error("pulse: background %s failed: %s: %s%s", name, type(exc).__name__,
                  redact_urls(str(exc)), f" ({count} more failed unlogged before it)" * bool(count))

    def status(self) -> list[LoopStatus]:
        """Every supervised loop, in start order."""
        return [msgspec.structs.replace(s) for s in self._status.values()]

    async def settle(self) -> None:
        """Wait for every spawned one-shot task to finish (and log how many failed unlogged)."""
        while self._spawned:
            await asyncio.gather(*list(self._spawned), return_exceptions=True)
        if self._unlogged:
            log.error("pulse: %d more background tasks failed unlogged", self._unlogged)
            self._unlogged = 0

    async def stop(self) -> None:
        """Cancel every loop and wait until each has ended; then settle spawned tasks."""
        loops = list(self._loops.values())
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        self._loops.clear()
        await self.settle()
