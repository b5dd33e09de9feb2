"""What a tick sees: every sample since the last tick, nothing from before this engine, and
the last run's snapshot as the first `prev` after a restart."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pulse_core import Decision, Engine, Inner, ManualClock, Snapshot, open_home


@contextlib.asynccontextmanager
async def opened(engine: Engine) -> AsyncIterator[Engine]:
    """The engine open, without its loops: every tick is the test's own."""
    await engine.open()
    try:
        yield engine
    finally:
        await engine.close()


class Seen:
    """A rule that remembers what each tick showed it."""

    def __init__(self) -> None:
        self.ticks: list[tuple[Snapshot, Snapshot]] = []

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        self.ticks.append((prev, curr))
        return await inner(prev, curr)


async def test_a_tick_sees_every_sample_recorded_since_the_previous_tick(tmp_path: Path) -> None:
    clock, seen = ManualClock(), Seen()
    engine = Engine(tmp_path, rules=[seen], clock=clock)
    async with opened(engine):
        for n in range(3):
            clock.advance(10)
            await engine.vitals.record("log", {"line": n}, error=None)
        await engine.tick()
        clock.advance(10)
        await engine.vitals.record("log", {"line": 3})
        await engine.tick()
        await engine.tick()
    (_, first), (_, second), (_, third) = seen.ticks
    assert [s.data["line"] for s in first.since_last_tick("log")] == [0, 1, 2]
    assert first.vital("log") is not None and first.vital("log").sample.data == {"line": 2}
    assert [s.data["line"] for s in second.since_last_tick("log")] == [3]
    assert third.since_last_tick("log") == ()


async def test_a_sample_from_before_this_engine_started_never_reaches_a_rule(
    tmp_path: Path,
) -> None:
    clock, seen = ManualClock(), Seen()
    stores = await open_home(tmp_path, clock=clock)
    await stores.vitals.record("process-alive", {"agent": {"alive": False}})
    await stores.close()
    clock.advance(1_000)
    engine = Engine(tmp_path, rules=[seen], clock=clock)
    async with opened(engine):
        await engine.tick()
        clock.advance(10)
        await engine.vitals.record("process-alive", {"agent": {"alive": True}})
        await engine.tick()
    (_, first), (_, second) = seen.ticks
    assert first.vital("process-alive") is None
    assert first.since_last_tick("process-alive") == ()
    assert second.vital("process-alive") is not None
    assert second.vital("process-alive").sample.data == {"agent": {"alive": True}}


async def test_after_a_restart_ticks_carry_on_and_prev_is_the_last_runs_snapshot(
    tmp_path: Path,
) -> None:
    clock, seen = ManualClock(), Seen()
    async with opened(Engine(tmp_path, rules=[seen], clock=clock)) as engine:
        await engine.vitals.record("load", 0.5)
        for _ in range(3):
            clock.advance(100)
            await engine.tick()
        last_before = seen.ticks[-1][1]
    clock.advance(5_000)
    again = Seen()
    async with opened(Engine(tmp_path, rules=[again], clock=clock)) as engine:
        await engine.tick()
        assert engine.ticks == 4
    prev, curr = again.ticks[0]
    assert curr.number == 4
    assert prev.number == 3 and prev.at == last_before.at and prev.seq == last_before.seq
    assert prev.at < curr.started_at, "a rule can tell the prev came from an earlier run"
    assert prev.vital("load") is not None and prev.vital("load").sample.data == 0.5


async def test_the_first_tick_ever_has_an_empty_prev(tmp_path: Path) -> None:
    seen = Seen()
    async with opened(Engine(tmp_path, rules=[seen], clock=ManualClock())) as engine:
        await engine.tick()
    prev, curr = seen.ticks[0]
    assert prev.number == 0 and curr.number == 1 and prev.vitals == {}


async def test_a_restart_does_not_make_prev_look_empty_before_the_first_fresh_sample(
    tmp_path: Path,
) -> None:
    # The template's inbox rule compared prev and curr counts and fired again on every
    # restart: the first tick (no fresh sample yet) became the second tick's empty prev.
    clock = ManualClock()
    async with opened(Engine(tmp_path, rules=[Seen()], clock=clock)) as engine:
        await engine.vitals.record("inbox", {"count": 3})
        await engine.tick()
    clock.advance(1_000)
    seen = Seen()
    async with opened(Engine(tmp_path, rules=[seen], clock=clock)) as engine:
        await engine.tick()  # no fresh inbox sample yet
        clock.advance(10)
        await engine.vitals.record("inbox", {"count": 3})
        await engine.tick()
    (_, first), (prev, second) = seen.ticks
    assert first.vital("inbox") is None
    assert prev.vital("inbox") is not None and prev.vital("inbox").sample.data == {"count": 3}
    assert second.vital("inbox") is not None


CRASHING_CHILD = """
import asyncio, os, signal, sys
from pulse_core import Decision, Engine, Mark


class Beat(Mark, tag="test-beat"):
    n: int


async def beat(prev, curr, inner):
    effects, tick_ms = await inner(prev, curr)
    return Decision([*effects, Beat(n=curr.number)], tick_ms)


async def main():
    engine = Engine(sys.argv[1], rules=[beat])
    await engine.open()
    for _ in range(5):
        await engine.tick()
    os.kill(os.getpid(), signal.SIGKILL)  # no close: no memo written


asyncio.run(main())
"""


async def test_tick_numbers_carry_on_after_a_crash_that_left_no_memo(tmp_path: Path) -> None:
    import asyncio
    import sys

    home = tmp_path / "home"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CRASHING_CHILD, str(home), stderr=asyncio.subprocess.PIPE)
    _, stderr = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -9, stderr.decode()
    async with opened(Engine(home)) as engine:
        await engine.tick()
        assert engine.ticks == 6


async def test_closing_an_engine_that_was_never_started_still_checkpoints_everything(
    tmp_path: Path,
) -> None:
    # A reopen must not fold the whole log again: the effect index is checkpointed at close
    # whether or not the loops ran.
    async with opened(Engine(tmp_path, clock=ManualClock())) as engine:
        await engine.tick()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "executor-loop.ckpt" in names and "tick.ckpt" in names


@pytest.mark.parametrize("blob", [object(), float("nan"), float("-inf")],
                         ids=["not-encodable", "nan", "infinity"])
async def test_a_mark_that_cannot_be_encoded_costs_no_other_effect(
    tmp_path: Path, blob: object
) -> None:
    """Also what the log refuses to store (NaN, infinities): dropped, not the whole tick."""
    from pulse_core import Effect, Mark

    class Fine(Effect, tag="ticks-fine"):
        pass

    class Broken(Mark, tag="ticks-broken"):
        blob: Any

    async def both(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        return Decision([*effects, Broken(blob=blob), Fine()], tick_ms)

    async with opened(Engine(tmp_path, rules=[both], clock=ManualClock())) as engine:
        await engine.tick()
        await engine.tick()
        assert engine.ticks == 2
        effects = await engine.events.read(kinds=["effect"])
        errors = await engine.events.read(kinds=["error"])
    # Fine is recorded once (dedup keeps working past the broken mark), and the broken mark
    # becomes an error on each tick, never a dead tick.
    assert [e.data["effect"]["type"] for e in effects] == ["ticks-fine"]
    assert [e.key for e in errors] == ["engine:tick", "engine:tick"]
    assert all("Broken ('ticks-broken') was dropped" in e.data["message"] for e in errors)


async def test_a_second_close_waits_for_the_first(tmp_path: Path) -> None:
    import asyncio

    from pulse_core import HomeLocked

    engine = Engine(tmp_path, clock=ManualClock())
    await engine.open()
    first = asyncio.create_task(engine.close())
    await asyncio.sleep(0)
    await engine.close()  # must not return while the home is still held
    again = Engine(tmp_path, clock=ManualClock())
    try:
        await again.open()
    except HomeLocked as exc:
        raise AssertionError("close() returned while the first close held the home") from exc
    await again.close()
    await first
