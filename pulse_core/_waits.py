"""Waiting on an asyncio.Event with a timeout, without losing a cancellation; settling a
future from another thread that may find it cancelled already; a thread of one's own that runs
jobs in order (a SQLite file's writer, a kept recall's reads)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

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

    def stop_soon(self) -> None:
        """End the thread once the jobs already submitted are done, without waiting."""
        self._jobs.put(None)

    async def stop(self) -> None:
        """Let the jobs already submitted finish, then end the thread."""
        self.stop_soon()
        await asyncio.to_thread(self._thread.join)
