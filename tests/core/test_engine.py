"""The Engine end to end in one process: watchers, ticks, effects, errors, restarts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pulse_core import (
    Decision,
    Effect,
    Engine,
    ExecutionContext,
    Executor,
    Inner,
    ManualClock,
    Projection,
    Snapshot,
    SurvivalLocked,
    Watcher,
)
from pulse_core._events import Event
from tests.e2e.support import read_events
from tests.timing import eventually


class Ping(Effect, tag="engine-ping"):
    n: int


class Orphan(Effect, tag="engine-orphan"):
    pass


class Counter(Watcher):
    name = "counter"
    interval = 0.01

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    async def collect(self) -> dict[str, int]:
        self.n += 1
        return {"n": self.n}

    def should_wake(self, window: Any) -> bool:
        return bool(window) and window[-1].data["n"] == 3


class Recorder(Executor):
    handles = (Ping,)
    timeout = 2.0

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    async def execute(self, effect: Ping, ctx: ExecutionContext) -> dict[str, int]:
        self.seen.append((effect.n, ctx.attempt))
        return {"echo": effect.n}


def ping_when(predicate: Any) -> Any:
    async def ping_rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick = await inner(prev, curr)
        if predicate(curr):
            effects = [*effects, Ping(n=curr.number)]
        return Decision(effects, tick)

    return ping_rule


async def test_step_senses_decides_and_acts(tmp_path: Path) -> None:
    executor = Recorder()
    engine = Engine(tmp_path, watchers=[Counter()], executors=[executor], clock=ManualClock(),
                    rules=[ping_when(lambda s: s.vital("counter") is not None)])
    await engine.open()
    await engine.step()
    assert executor.seen == [(1, 1)]
    (acked,) = await engine.events.read(kinds=["effect-acked"])
    assert acked.data["result"] == {"echo": 1}
    await engine.close()


async def test_a_quiet_tick_writes_nothing(tmp_path: Path) -> None:
    engine = Engine(tmp_path, clock=ManualClock())
    await engine.open()
    before = await engine.events.last_seq()
    await engine.tick()
    await engine.tick()
    assert await engine.events.last_seq() == before
    await engine.close()


async def test_effects_errors_and_tick_record_commit_together(tmp_path: Path) -> None:
    async def broken(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise RuntimeError("rule bug")

    engine = Engine(tmp_path, rules=[ping_when(lambda s: True), broken],
                    executors=[Recorder()], clock=ManualClock())
    await engine.open()
    start = await engine.events.last_seq()
    await engine.tick()
    written = await engine.events.read(start)
    assert [e.kind for e in written] == ["effect", "error", "tick"]
    assert len({e.tx for e in written}) == 1
    assert written[1].data["message"] == "rule bug" and written[1].origin == "rule:broken"
    assert written[2].data["effects"] == [written[0].key]
    await engine.close()


async def test_a_raising_user_rule_cannot_silence_the_rules_outside_it(tmp_path: Path) -> None:
    async def broken(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        raise RuntimeError("boom")

    executor = Recorder()
    outer = ping_when(lambda s: True)
    engine = Engine(tmp_path, rules=[broken], builtin_rules=[outer], executors=[executor],
                    clock=ManualClock())
    await engine.open()
    await engine.step()
    assert executor.seen == [(1, 1)]
    assert len(await engine.events.read(kinds=["error"])) == 1
    await engine.close()


async def test_an_effect_nobody_handles_fails_with_a_clear_error(tmp_path: Path) -> None:
    async def orphan(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Orphan()], 100)

    engine = Engine(tmp_path, rules=[orphan], executors=[Recorder()], clock=ManualClock())
    await engine.open()
    await engine.step()
    (failed,) = await engine.events.read(kinds=["effect-failed"])
    assert failed.data["final"] is True
    assert "no executor handles effect 'engine-orphan'" in failed.data["error"]
    assert "engine-ping" in failed.data["error"]
    await engine.close()


async def test_dedup_keeps_a_pending_effect_from_being_emitted_again(tmp_path: Path) -> None:
    class Same(Effect, tag="engine-same"):
        pass

    async def same(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Same(), Same()], 100)

    engine = Engine(tmp_path, rules=[same], clock=ManualClock())
    await engine.open()
    await engine.tick()
    await engine.tick()  # still pending: no executor loop ran
    assert len(await engine.events.read(kinds=["effect"])) == 1
    await engine.close()


async def test_watchers_that_raise_or_hang_are_recorded_and_keep_running(
    tmp_path: Path,
) -> None:
    class Flaky(Watcher):
        name = "flaky"
        interval = 0.01
        timeout = 0.05
        calls = 0

        async def collect(self) -> int:
            self.calls += 1
            if self.calls == 1:
                raise OSError("sensor unplugged")
            if self.calls == 2:
                await asyncio.sleep(10)
            return self.calls

    watcher = Flaky()
    engine = Engine(tmp_path, watchers=[watcher], default_tick_ms=60_000)
    async with engine:
        for _ in range(200):
            if len(await engine.vitals.window("flaky", 0)) >= 3:
                break
            await asyncio.sleep(0.02)
    samples = await _vitals(tmp_path, "flaky")
    assert "sensor unplugged" in (samples[0].error or "")
    assert "timed out after 0.05 s" in (samples[1].error or "")
    assert samples[2].ok and samples[2].data == 3


async def _vitals(home: Path, key: str) -> list[Any]:
    from pulse_core import VitalsStore

    vitals = await VitalsStore.open(home / "vitals.db")
    try:
        return await vitals.window(key, 0)
    finally:
        await vitals.close()


async def test_wakes_during_a_tick_coalesce_into_one_more_tick(tmp_path: Path) -> None:
    ticks: list[int] = []
    gate = asyncio.Event()

    async def slow(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        ticks.append(curr.number)
        if curr.number == 2:
            await gate.wait()
        return await inner(prev, curr)

    engine = Engine(tmp_path, rules=[slow], default_tick_ms=60_000)
    async with engine:
        await eventually(lambda: engine.ticks == 1)
        assert ticks == [1]
        engine.wake()
        await eventually(lambda: ticks == [1, 2])
        for _ in range(50):
            engine.wake()
        gate.set()
        await eventually(lambda: engine.ticks == 3)
        await asyncio.sleep(0.3)  # room for a fourth tick, if the wakes had not coalesced
        assert ticks == [1, 2, 3]


async def test_a_watcher_wakes_the_tick_early(tmp_path: Path) -> None:
    ticks: list[int] = []

    async def count(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        ticks.append(curr.number)
        return await inner(prev, curr)

    watcher = Counter()
    engine = Engine(tmp_path, watchers=[watcher], rules=[count], default_tick_ms=60_000)
    async with engine:
        await eventually(lambda: len(ticks) == 2 and watcher.n > 3)
    assert len(ticks) == 2  # the first tick, and the one the third sample asked for


async def test_a_second_engine_on_one_home_is_refused_in_process(tmp_path: Path) -> None:
    from pulse_core import HomeLocked

    first = Engine(tmp_path)
    await first.open()
    with pytest.raises(HomeLocked, match=str(tmp_path)):
        await Engine(tmp_path).open()
    await first.tick()
    await first.close()


class Appended(Projection[int]):
    name = "appended"
    kinds = frozenset({"tick", "error"})
    applied = 0

    def initial(self) -> int:
        return 0

    def apply(self, state: int, event: Event) -> int:
        Appended.applied += 1
        return state + 1


async def test_restart_resumes_projections_from_their_checkpoint(tmp_path: Path) -> None:
    from pulse_core import EventDraft

    engine = Engine(tmp_path, projections=[Appended()], clock=ManualClock())
    await engine.open()
    await engine.append([EventDraft("error", f"e{i}", {"i": i}) for i in range(50)])
    assert (await engine.snapshot()).projection("appended") == 50
    await engine.close()
    Appended.applied = 0
    again = Engine(tmp_path, projections=[Appended()], clock=ManualClock())
    await again.open()
    await again.append([EventDraft("error", "late", {})])
    assert (await again.snapshot()).projection("appended") == 51
    assert Appended.applied == 1
    await again.close()


async def test_shutdown_drains_or_leaves_effects_claimable(tmp_path: Path) -> None:
    class Slow(Effect, tag="engine-slow"):
        seconds: float

    class Sleeper(Executor):
        handles = (Slow,)
        timeout = 30.0
        runs: ClassVar[list[int]] = []
        slept: ClassVar[list[float]] = []

        async def execute(self, effect: Slow, ctx: ExecutionContext) -> None:
            Sleeper.runs.append(ctx.attempt)
            await asyncio.sleep(effect.seconds if ctx.attempt == 1 else 0)
            Sleeper.slept.append(effect.seconds)

    async def emit(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Slow(seconds=0.05), Slow(seconds=30)] if curr.number == 1 else [], 100)

    engine = Engine(tmp_path, rules=[emit], executors=[Sleeper()], drain_timeout=0.3)
    async with engine:  # closed with the short attempt done and the long one running
        await eventually(lambda: len(Sleeper.runs) == 2 and Sleeper.slept == [0.05],
                         what="both attempts started and the short one done")
    failed = read_events(tmp_path / "events.db", {"effect-failed"})
    assert [f.data["interrupted"] for f in failed] == [True]
    assert failed[0].data["final"] is False
    again = Engine(tmp_path, executors=[Sleeper()])
    await again.open()
    await again.executor_loop.run_until_idle()
    assert sorted(Sleeper.runs) == [1, 1, 2]
    assert len(await again.events.read(kinds=["effect-acked"])) == 2
    await again.close()


async def test_a_nameless_rule_object_that_raises_keeps_the_ticks_effects(
    tmp_path: Path,
) -> None:
    class Broken:
        async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
            raise RuntimeError("object rule bug")

    engine = Engine(tmp_path, rules=[ping_when(lambda s: True), Broken()],
                    executors=[Recorder()], clock=ManualClock())
    await engine.open()
    await engine.tick()
    (error,) = await engine.events.read(kinds=["error"])
    assert error.origin == "rule:Broken"
    assert len(await engine.events.read(kinds=["effect"])) == 1
    await engine.close()


async def test_business_rules_are_replaced_between_ticks_and_survival_stays(
    tmp_path: Path,
) -> None:
    executor = Recorder()
    engine = Engine(tmp_path, rules=[], executors=[executor], clock=ManualClock())
    await engine.open()
    await engine.step()
    assert executor.seen == []
    await engine.replace_rules([ping_when(lambda s: True)])
    assert engine.rule_names[-1] == "ping_rule" and engine.rule_names[0] == "panic_rollback"
    await engine.step()
    assert len(executor.seen) == 1
    from pulse_survival import RollbackPolicy
    from pulse_survival.rules import PanicRollback

    with pytest.raises(SurvivalLocked):
        await engine.replace_rules([PanicRollback(RollbackPolicy())])
    await engine.step()
    assert len(executor.seen) == 2  # the refused replacement left the running chain alone
    await engine.close()


async def test_the_engine_reports_its_ticks(tmp_path: Path) -> None:
    clock = ManualClock()
    engine = Engine(tmp_path, clock=clock, default_tick_ms=700)
    await engine.open()
    assert (engine.ticks, engine.last_tick_at, engine.last_tick_ms) == (0, None, 700)
    await engine.tick()
    clock.advance(50)
    await engine.tick()
    assert engine.ticks == 2 and engine.last_tick_at == clock.now_ms()
    await engine.close()
