"""Waiting on an asyncio.Event with a timeout, without losing a cancellation; settling a
future from another thread that may find it cancelled already."""

from __future__ import annotations

import asyncio
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
