"""The loop's thread waiting for a job of a thread of one's own: a quick job called over and
over still lets the loop turn."""

from __future__ import annotations

import asyncio

from pulse_core._waits import JobThread
from tests.timing import eventually


async def test_quick_jobs_waited_for_over_and_over_still_let_timers_fire() -> None:
    """A job the loop's thread waits for (a kept recall's quick selection) may end without
    the caller suspending; a caller that calls one after another still lets the loop turn
    at least every TURN_GAP, so a timer fires meanwhile."""
    thread = JobThread("pulse-test")
    beats = 0

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            await asyncio.sleep(0.001)
            beats += 1

    beating = asyncio.create_task(heartbeat())
    try:
        await eventually(lambda: beats > 0, what="the heartbeat")
        before = beats
        for _ in range(1_000):
            await thread.call_waiting(lambda: None, 1.0)
        assert beats - before >= 3, f"a timer fired {beats - before} times over 1,000 jobs"
    finally:
        beating.cancel()
        await thread.stop()
