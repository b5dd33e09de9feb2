"""process_watchdog and llm_watchdog when several samples, or none, arrive between two ticks.

On a loaded machine the watchers sample more often than the engine ticks, or a tick comes
before a fresh sample; here that is done by hand, without load: samples are recorded with a
ManualClock, then one tick judges them all. The restarts are decided, never run.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse_core import Engine, ManualClock
from pulse_survival import Essential, LlmPolicy, ProcessPolicy, SurvivalConfig, SurvivalLedger

SLEEPER = "import time; time.sleep(120)"
UNIQUE = uuid.uuid4().hex  # a command line no other process has: none is adopted as `w`
NAME = "w"


def watched(**policy: Any) -> SurvivalConfig:
    """One essential process `w` nothing on this machine matches, under `policy`."""
    spec = Essential(name=NAME, argv=(sys.executable, "-c", SLEEPER, UNIQUE),
                     match_name="no-such-w")
    defaults: dict[str, Any] = {"startsecs": 1, "startretries": 3, "budget_per_hour": 50,
                                "backoff_initial_s": 1, "backoff_max_s": 60}
    return SurvivalConfig(processes=(spec,), process=ProcessPolicy(**{**defaults, **policy}))


class Watched:
    """An engine on a ManualClock, and the process-alive samples a test records by hand."""

    def __init__(self, engine: Engine, clock: ManualClock) -> None:
        self.engine, self.clock = engine, clock

    async def sample(self, after_ms: int, alive: bool, uptime_s: float = 0.0) -> None:
        self.clock.advance(after_ms)
        await self.engine.vitals.record("process-alive", {NAME: {
            "alive": alive, "pid": 4242 if alive else None, "uptime_s": uptime_s,
            "restarts_seen": 0}})

    async def tick(self, after_ms: int = 0) -> int:
        """One tick; the tick (ms) the chain asked for."""
        self.clock.advance(after_ms)
        return (await self.engine.tick()).tick_ms

    async def seen(self, after_ms: int, alive: bool, uptime_s: float = 0.0) -> int:
        await self.sample(after_ms, alive, uptime_s)
        return await self.tick()

    async def tags(self) -> list[str]:
        return [e.data["mark"]["type"] if e.kind == "mark" else e.data["effect"]["type"]
                for e in await self.engine.events.read(kinds=["mark", "effect"])]


async def watching(open_engine: Callable[..., Any], home: Path, config: SurvivalConfig
                   ) -> Watched:
    clock = ManualClock()
    return Watched(await open_engine(home, clock=clock, survival=config), clock)


async def test_a_start_that_held_then_died_between_two_ticks_backs_off_as_a_first_failure(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    """Within one tick, a start seen held clears the failed starts before the next sample is
    judged: the crash after it waits the first backoff (1 s), not the second (2 s)."""
    w = await watching(open_engine, tmp_path / "home", watched())
    await w.seen(0, False)                  # restart 1 at 0
    await w.seen(100, False)                # restart 1 failed: 1 in a row
    await w.seen(1_900, False)              # 2 s after restart 1: restart 2 at 2,000
    await w.sample(100, True, 5.0)          # restart 2 held ...
    await w.sample(1_100, False)            # ... then died, before any tick saw either
    await w.tick()                          # 3,200: 1.2 s after restart 2, past 1 s
    tags = await w.tags()
    assert tags.count("process-start-held") == 1
    assert tags.count("restart-process") == 3
    assert (await w.engine.snapshot()).state(SurvivalLedger).process(NAME).failed_starts == 0


async def test_one_restart_seen_dead_by_several_samples_between_two_ticks_fails_once(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    w = await watching(open_engine, tmp_path / "home", watched(startretries=2))
    await w.seen(0, False)                  # restart 1
    for _ in range(3):
        await w.sample(100, False)          # three samples of the same failed start
    await w.tick()
    tags = await w.tags()
    assert tags.count("process-start-failed") == 1
    assert "process-gave-up" not in tags
    assert (await w.engine.snapshot()).state(SurvivalLedger).process(NAME).failed_starts == 1


async def test_a_start_that_held_is_marked_held_once_however_many_ticks_see_it_up(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    w = await watching(open_engine, tmp_path / "home", watched())
    await w.seen(0, False)                  # restart 1
    for _ in range(4):
        await w.seen(1_000, True, 5.0)
    assert (await w.tags()).count("process-start-held") == 1


async def test_no_second_restart_until_a_sample_taken_after_the_first_says_dead(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    """Ticks that come before the watcher sampled again judge nothing, however long the
    backoff has run."""
    w = await watching(open_engine, tmp_path / "home", watched())
    await w.seen(0, False)                  # restart 1
    for _ in range(3):
        await w.tick(5_000)                 # past any backoff, still no new sample
    assert (await w.tags()).count("restart-process") == 1
    await w.seen(100, False)                # now: a failed start, and a restart after it
    assert (await w.tags()).count("restart-process") == 2


async def test_restarts_older_than_an_hour_leave_the_hourly_budget(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    w = await watching(open_engine, tmp_path / "home", watched(budget_per_hour=2))
    for _ in range(2):
        await w.seen(0, False)              # a restart ...
        await w.seen(100, True, 5.0)        # ... that held
        await w.sample(1_000, False)        # then a crash
    await w.tick(3_600_000)                 # an hour later: the budget is free again
    tags = await w.tags()
    assert "process-gave-up" not in tags
    assert tags.count("restart-process") == 3


async def test_the_process_watchdog_asks_for_a_tick_when_its_backoff_ends(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    w = await watching(open_engine, tmp_path / "home", watched())  # default tick 5 s
    assert await w.seen(0, False) <= 1_000      # restart 1: judged within its 1 s backoff
    assert await w.seen(100, False) <= 1_900    # failed: restart 2 is due 2 s after restart 1


async def test_samples_taken_before_a_restart_but_stored_after_it_judge_nothing(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    """A watcher's thread that read the process before the restart and stored the reading
    after it (a slow sample) neither fails that start nor restarts again."""
    w = await watching(open_engine, tmp_path / "home", watched())
    await w.seen(0, False)                      # restart 1, now
    restart = w.clock.now_ms()
    w.clock.advance(5_000)                      # past the backoff
    for ts in (restart - 500, restart):
        await w.engine.vitals.record("process-alive", {NAME: {
            "alive": False, "pid": None, "uptime_s": 0.0, "restarts_seen": 0}}, ts=ts)
    await w.tick()
    assert await w.tags() == ["restart-process"]


async def test_a_process_back_by_itself_after_a_failed_start_clears_the_failed_starts(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    w = await watching(open_engine, tmp_path / "home", watched())
    await w.seen(0, False)                      # restart 1
    await w.seen(100, False)                    # failed: 1 in a row
    await w.seen(100, True, 5.0)                # up (started by someone else) for startsecs
    tags = await w.tags()
    assert tags.count("process-start-held") == 1
    assert (await w.engine.snapshot()).state(SurvivalLedger).process(NAME).failed_starts == 0


async def llm_probe(w: Watched, ok: bool) -> list[str]:
    w.clock.advance(1_000)
    await w.engine.vitals.record("llm-route", {"ok": ok})
    await w.engine.tick()
    return [t for t in await w.tags() if t == "notify"]


async def test_after_an_llm_restart_the_next_needs_as_many_new_failures_in_a_row(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine = await open_engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        llm=LlmPolicy(failures=3, backoff_initial_s=1)))
    w = Watched(engine, clock)
    for _ in range(3):
        notices = await llm_probe(w, False)
    assert len(notices) == 1                # 3 failures: a restart (a notice, no proxy)
    clock.advance(10_000)                   # past the backoff
    assert len(await llm_probe(w, False)) == 1  # one failure is not 3 in a row
    await llm_probe(w, False)
    assert len(await llm_probe(w, False)) == 2


async def test_a_healthy_route_starts_the_llm_restart_backoff_over(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    clock = ManualClock()
    engine = await open_engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        llm=LlmPolicy(failures=1, backoff_initial_s=10)))
    w = Watched(engine, clock)
    await llm_probe(w, False)               # restart 1: the next one 10 s later at the soonest
    clock.advance(10_000)
    await llm_probe(w, False)               # restart 2: the next one 20 s later
    await llm_probe(w, True)                # healthy: the count starts over
    clock.advance(20_000)                   # past restart 2's backoff
    assert len(await llm_probe(w, False)) == 3
    llm = (await w.engine.snapshot()).state(SurvivalLedger).llm
    assert (llm.restarts, llm.next_allowed_at - clock.now_ms()) == (1, 10_000)


async def test_a_healthy_probe_and_a_failed_one_between_two_ticks_restart_as_the_first(
    tmp_path: Path, open_engine: Callable[..., Any]
) -> None:
    """Within one tick, the healthy probe starts the count over before the failure after it
    is judged: the restart waits the first backoff again."""
    clock = ManualClock()
    engine = await open_engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        llm=LlmPolicy(failures=1, backoff_initial_s=10)))
    w = Watched(engine, clock)
    await llm_probe(w, False)                   # restart 1
    clock.advance(10_000)
    for ok in (True, False):
        clock.advance(1_000)
        await engine.vitals.record("llm-route", {"ok": ok})
    await engine.tick()
    llm = (await engine.snapshot()).state(SurvivalLedger).llm
    assert (llm.restarts, llm.next_allowed_at - clock.now_ms()) == (1, 10_000)
