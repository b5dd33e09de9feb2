"""How long the tests' waits may last: every bound on a wait only bounds a hang, never asserts
speed, and all of them scale with one factor.

`PULSE_TEST_SLOWNESS` (a number >= 1, default 1) multiplies every bound that goes through
`scaled`: the hard time limit of each test (tests/conftest.py), the waits of tests/e2e/support.py
and tests/fleet/fleet_support.py. Set it on a machine known to be slow or shared
(`PULSE_TEST_SLOWNESS=3 ./dev test`); a test that passes only with a large factor is waiting on
something that is not happening.

`until_progress` waits for work that is known to take long on a loaded machine (thousands of
reviews): it fails when the work stops moving for a while, not when it is slow.

`past_the_newest` waits for the wall clock to pass an event log's newest stamp, for a test
whose next write must be newer (stamps are in milliseconds: two writes in one of them tie).

`LoopTurns` counts the turns another coroutine gets, for a test of code that must let the
event loop turn while it waits (a lone append's commit, a kept recall's selection).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pulse_core import EventStore

ENV = "PULSE_TEST_SLOWNESS"


def _slowness() -> float:
    raw = os.environ.get(ENV, "1")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 1 <= value <= 100:
        raise ValueError(f"{ENV} must be a number from 1 to 100 (how many times slower this "
                         f"machine is than an idle one), got {raw!r}")
    return value


SLOWNESS = _slowness()
"""The factor every bound on a wait is multiplied by."""


def scaled(seconds: float) -> float:
    """`seconds`, as a bound on a wait on this machine (times PULSE_TEST_SLOWNESS)."""
    return seconds * SLOWNESS


async def eventually(condition: Callable[[], object], within: float = 10.0,
                     what: str = "the condition") -> None:
    """Poll `condition()` every 10 ms until it is truthy; fail after `within` seconds (scaled:
    the bound of a hang, not a speed)."""
    bound = scaled(within)
    deadline = time.monotonic() + bound
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {bound:g} s")
        await asyncio.sleep(0.01)


class Stalled(AssertionError):
    """Work a test waits for stopped moving: nothing changed for the whole stall bound."""


async def until_progress(done: Callable[[], Awaitable[bool]], progress: Callable[[], object],
                         stall_s: float, what: str, *, poll_s: float = 0.1,
                         check: Callable[[], None] | None = None) -> float:
    """Await `done()` until it is true, however long that takes while `progress()` keeps
    changing; raise Stalled once it has not changed for `stall_s` (scaled) seconds. `check`
    runs every poll and may raise (a child process died). Returns the seconds waited."""
    began = time.monotonic()
    bound = scaled(stall_s)
    last, moved = progress(), began
    while not await done():
        if check is not None:
            check()
        now, seen = time.monotonic(), progress()
        if seen != last:
            last, moved = seen, now
        elif now - moved > bound:
            raise Stalled(f"{what}: no progress for {bound:g} s (stuck at {seen!r}, "
                          f"{now - began:.0f} s in)")
        await asyncio.sleep(poll_s)
    return time.monotonic() - began


async def past_the_newest(store: EventStore) -> None:
    """Wait until the clock reads past the newest event's stamp (ms), so that the next write
    is newer: two writes in one millisecond tie, and a tie ranks by name."""
    (newest,) = await store.read(newest_first=True, limit=1)
    await asyncio.sleep(max((newest.ts + 2) / 1000 - time.time(), 0))
    assert time.time_ns() // 1_000_000 > newest.ts


class LoopTurns:
    """`async with LoopTurns() as loop:` runs a coroutine beside the block that counts, in
    `loop.turns`, the turns of the event loop it gets; cancelled when the block ends. With
    `every` (seconds), it counts the beats of a timer of that period instead: a loop that
    stops serving its timers stops the count."""

    def __init__(self, every: float = 0.0) -> None:
        self.turns = 0
        self.every = every
        self._task: asyncio.Task[None] | None = None

    async def _count(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            self.turns += 1

    async def __aenter__(self) -> LoopTurns:
        self._task = asyncio.create_task(self._count())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        assert self._task is not None
        self._task.cancel()
