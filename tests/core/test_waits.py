"""The loop's thread waiting for a job of a thread of one's own: a quick job called over and
over still lets the loop turn."""

from __future__ import annotations

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
