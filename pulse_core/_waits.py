"""Waiting on an asyncio.Event with a timeout, without losing a cancellation; settling a
future from another thread that may find it cancelled already; a thread of one's own that runs
jobs in order (a SQLite file's writer, a kept recall's reads), which the loop's thread may wait
for a bounded time (a lone append's commit, a quick selection)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def wait_signal(signal: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `signal` is set or `seconds` pass (None: forever); True if it was set.

    Unlike `asyncio.timeout` around `signal.wait()`, a cancellation of the caller that
    arrives as the timeout expires is never taken for the timeout: it always propagates.
    """
    if signal.is_set():
        return True
    if seconds is not None and seconds <= 0:
        return False
    waiter = asyncio.ensure_future(signal.wait())
    try:
        done, _ = await asyncio.wait((waiter,), timeout=seconds)
    finally:
        waiter.cancel()
    return bool(done)


async def wait_ended(task: asyncio.Future[Any]) -> None:
    """Wait until `task` has ended, however it ends: its outcome is not raised here and never
    left unretrieved. A cancel of the caller propagates at once and leaves `task` to end on
    its own (awaiting `task` with its CancelledError suppressed would swallow that too)."""
    task.add_done_callback(_retrieve)
    await asyncio.wait({task})


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def resolve(future: asyncio.Future[T], result: T) -> None:
    """Set `future`'s result unless it is done (cancelled) already."""
    if not future.done():
        future.set_result(result)


def reject(future: asyncio.Future[Any], error: BaseException) -> None:
    """Set `future`'s exception unless it is done (cancelled) already."""
    if not future.done():
        future.set_exception(error)


def _settle(loop: asyncio.AbstractEventLoop, settle: Callable[[asyncio.Future[T], Any], None],
            future: asyncio.Future[T], value: Any) -> None:
    """`settle(future, value)` on `loop`, from another thread; nothing once the loop is
    closed (no one waits for `future` any more)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(settle, future, value)


class Handoff(Generic[T]):
    """A job's outcome handed from its thread to the loop's thread, which waits for it only
    so long: the job's thread hands it over to the waiting loop thread, or, once that has
    stopped waiting, to the loop (the job's own way to settle its future)."""

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()  # released when the outcome is here for the waiting loop thread
        self.outcome: T | None = None
        self._guard = threading.Lock()
        self._abandoned = False

    def deliver(self, outcome: T) -> bool:
        """In the job's thread: hand `outcome` to the waiting loop thread; False when it
        stopped waiting (the loop must be told)."""
        with self._guard:
            if self._abandoned:
                return False
            self.outcome = outcome
            self.done.release()
            return True

    def abandon(self) -> bool:
        """On the loop, its wait over: stop waiting; False if the outcome is not here (the
        job's thread then delivers it to the loop), True if it just came."""
        with self._guard:
            if self.done.acquire(blocking=False):
                return True
            self._abandoned = True
            return False


class JobThread:
    """One daemon thread that runs jobs in order. A daemon, so that a program which ends
    without stopping it still exits (a SQLite commit cut short is never acknowledged, and
    SQLite's journal leaves the file as it was before it). Awaiting a job through it costs
    less than `asyncio.to_thread`: no pool, the same thread each time, and the loop is woken
    as the job's last step."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
            del job  # a job done holds nothing (its caller) while the thread waits

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` in the thread after the jobs before it."""
        self._jobs.put(job)

    async def call(self, fn: Callable[[], T]) -> T:
        """`fn()` in the thread, awaited."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting coroutine
                _settle(loop, reject, future, exc)
            else:
                _settle(loop, resolve, future, result)

        self.submit(job)
        return await future

    async def call_waiting(self, fn: Callable[[], T], seconds: float) -> T:
        """`fn()` in the thread, awaited; once the loop has turned (other coroutines run
        while the job starts), the loop's thread waits for it blocked, at most `seconds`, and
        only then awaits it as `call` does. A quick job so saves what `call` costs beyond it:
        waking the loop from its selector and a turn of it to resume the caller. A slow one
        (a stalled disk) holds the loop `seconds` at most."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        handoff: Handoff[tuple[bool, Any]] = Handoff()

        def job() -> None:
            outcome: tuple[bool, Any]
            try:
                outcome = (True, fn())
            except BaseException as exc:  # handed to the awaiting coroutine
                outcome = (False, exc)
            if not handoff.deliver(outcome):
                _settle(loop, resolve if outcome[0] else reject, future, outcome[1])

        self.submit(job)
        try:
            await asyncio.sleep(0)
            came = handoff.done.acquire(timeout=seconds) or handoff.abandon()
        except BaseException:  # cancelled or interrupted: no one takes the outcome
            handoff.abandon()
            future.cancel()
            raise
        if not came:
            return await future  # slower than `seconds`: the job settles it through the loop
        assert handoff.outcome is not None
        ok, value = handoff.outcome
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def stop_soon(self) -> None:
        """End the thread once the jobs already submitted are done, without waiting."""
        self._jobs.put(None)

    async def stop(self) -> None:
        """Let the jobs already submitted finish, then end the thread."""
        self.stop_soon()
        await asyncio.to_thread(self._thread.join)
