"""tests/timing.py: waits that bound a hang, never speed."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.timing import SLOWNESS, Stalled, eventually, scaled, until_progress


def test_a_bound_scales_with_the_slowness_factor() -> None:
    assert scaled(2.0) == 2.0 * SLOWNESS >= 2.0


async def test_work_that_keeps_moving_is_waited_for_past_its_stall_bound() -> None:
    stall_s = 0.2
    began = time.monotonic()
    done_at = began + 3 * scaled(stall_s)  # three stall bounds in all, moving all along

    async def done() -> bool:
        return time.monotonic() >= done_at

    waited = await until_progress(done, lambda: int((time.monotonic() - began) * 20),
                                  stall_s, "moving work", poll_s=0.01)
    assert waited >= 3 * scaled(stall_s)


async def test_work_that_stops_moving_fails_once_the_stall_bound_passed() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(Stalled, match=r"stuck work: no progress for .* \(stuck at 7"):
        await until_progress(never, lambda: 7, 0.1, "stuck work", poll_s=0.01)


async def test_a_check_that_raises_ends_the_wait_at_once() -> None:
    async def never() -> bool:
        return False

    def died() -> None:
        raise AssertionError("a child died")

    with pytest.raises(AssertionError, match="a child died"):
        await until_progress(never, lambda: 0, 60, "work", check=died)


async def test_eventually_returns_once_the_condition_holds_and_fails_when_it_never_does() -> None:
    seen: list[int] = []
    asyncio.get_running_loop().call_later(0.05, seen.append, 1)
    await eventually(lambda: seen, within=10)
    with pytest.raises(AssertionError, match=r"never did not hold within"):
        await eventually(lambda: False, within=0.05, what="never")
