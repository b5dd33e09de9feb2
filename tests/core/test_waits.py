"""The loop's thread waiting for a job of a thread of one's own: a quick job called over and
over still lets the loop turn."""

from __future__ import annotations

import asyncio

import pytest

from pulse_core import wait_ended
from pulse_core._waits import JobThread
from tests.timing import LoopTurns


async def test_quick_jobs_waited_for_over_and_over_still_let_timers_fire() -> None:
    """A job the loop's thread waits for (a kept recall's quick selection) need not make the
    caller suspend; a caller that calls one after another still lets the loop turn before
    each, so a timer fires meanwhile."""
    thread = JobThread("pulse-test")
    try:
        async with LoopTurns(every=0.001) as timer:
            for _ in range(1_000):
                await thread.call_waiting(lambda: None, 1.0)
        assert timer.turns >= 3, f"a timer fired {timer.turns} times over 1,000 jobs"
    finally:
        await thread.stop()


async def test_waiting_for_a_task_to_end_lets_the_waiters_own_cancel_through() -> None:
    """wait_ended: a cancel of the waiter propagates at once (`await task` under
    suppress(CancelledError) swallowed it), the task ends on its own, and the failure it ends
    with is retrieved, never logged as unretrieved nor raised to the waiter."""
    release = asyncio.Event()

    async def cleanup() -> None:
        await release.wait()
        raise RuntimeError("the cleanup failed")

    task = asyncio.create_task(cleanup())
    waiter = asyncio.create_task(wait_ended(task))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not task.done()
    release.set()
    await wait_ended(task)  # returns, does not raise the task's failure
    assert task._log_traceback is False  # retrieved: asyncio will not log it
    assert isinstance(task.exception(), RuntimeError)
