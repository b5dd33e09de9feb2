"""Waiting on an asyncio.Event with a timeout, without losing a cancellation."""

from __future__ import annotations

import asyncio


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
