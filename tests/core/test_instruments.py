"""The engine's instruments: each tick and each attempt is told to every attached listener,
with the right tag and outcome; a listener that raises breaks nothing and is detached."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from pulse_core import (
    Backoff,
    Decision,
    Effect,
    EffectOutcome,
    Engine,
    ExecutionContext,
    Executor,
    Inner,
    Instruments,
    ManualClock,
    PulseError,
    Snapshot,
)


class Job(Effect, tag="instrumented-job"):
    n: int
    fail_times: int = 0
    sleep_s: float = 0.0


class Jobs(Executor):
    handles = (Job,)
    timeout = 5.0
    max_attempts = 2
    backoff = Backoff(initial_ms=1_000, factor=2.0, max_ms=10_000, jitter=0.0)

    async def execute(self, effect: Job, ctx: ExecutionContext) -> dict[str, int]:
        await asyncio.sleep(effect.sleep_s)
        if ctx.attempt <= effect.fail_times:
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return {"n": effect.n}


class Heard(Instruments):
    """Everything the engine told it, in order."""

    def __init__(self) -> None:
        self.ticks: list[tuple[int, float]] = []
        self.dispatches: list[tuple[str, float]] = []
        self.attempts: list[tuple[str, EffectOutcome, float]] = []
        self.claimed = asyncio.Event()

    def tick(self, number: int, duration_s: float) -> None:
        self.ticks.append((number, duration_s))

    def dispatched(self, tag: str, latency_s: float) -> None:
        self.dispatches.append((tag, latency_s))
        self.claimed.set()

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        self.attempts.append((tag, outcome, duration_s))


class Broken(Instruments):
    """Raises from the method named `where`; counts its calls."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.calls = 0

    def _maybe_raise(self, method: str) -> None:
        self.calls += 1
        if method == self.where:
            raise RuntimeError(f"{method} is broken")

    def tick(self, number: int, duration_s: float) -> None:
        self._maybe_raise("tick")

    def dispatched(self, tag: str, latency_s: float) -> None:
        self._maybe_raise("dispatched")

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        self._maybe_raise("executed")


def emit_on_first_tick(*jobs: Job) -> Callable[[Snapshot, Snapshot, Inner], Any]:
    async def rule(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        return Decision([*effects, *jobs] if curr.number == 1 else effects, tick_ms)
    return rule


@pytest.fixture
async def make_engine(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    engines: list[Engine] = []

    async def make(*jobs: Job, drain_timeout: float = 10.0) -> tuple[Engine, ManualClock]:
        clock = ManualClock()
        engine = Engine(tmp_path / f"home{len(engines)}", rules=[emit_on_first_tick(*jobs)],
                        executors=[Jobs()], clock=clock, drain_timeout=drain_timeout)
        await engine.open()
        engines.append(engine)
        return engine, clock

    yield make
    for engine in engines:
        await engine.close()


async def test_each_tick_is_told_with_its_number_and_duration(make_engine: Any) -> None:
    engine, clock = await make_engine(Job(n=1))
    heard = Heard()
    engine.instrument(heard)
    await engine.tick()  # decides a job: an append
    clock.advance(5_000)
    await engine.tick()  # a quiet tick is a tick too
    assert [number for number, _ in heard.ticks] == [1, 2]
    assert all(duration > 0 for _, duration in heard.ticks)


async def test_an_attempt_is_told_when_claimed_and_when_it_ends(make_engine: Any) -> None:
    engine, clock = await make_engine(Job(n=1))
    heard = Heard()
    engine.instrument(heard)
    await engine.tick()
    clock.advance(1_500)  # the job waits 1.5 s (engine clock) for a slot
    await engine.executor_loop.run_until_idle()
    assert heard.dispatches == [("instrumented-job", 1.5)]
    ((tag, outcome, duration),) = heard.attempts
    assert (tag, outcome) == ("instrumented-job", EffectOutcome.ACKED) and duration > 0


async def test_a_retry_is_told_as_due_from_its_retry_time_not_its_commit(
    make_engine: Any,
) -> None:
    engine, clock = await make_engine(Job(n=1, fail_times=2))
    heard = Heard()
    engine.instrument(heard)
    await engine.tick()
    clock.advance(200)
    await engine.executor_loop.run_until_idle()  # fails; retry_at is 1 s later
    clock.advance(1_600)
    await engine.executor_loop.run_until_idle()  # the last attempt fails for good
    assert heard.dispatches == [("instrumented-job", 0.2), ("instrumented-job", 0.6)]
    assert [outcome for _, outcome, _ in heard.attempts] == [EffectOutcome.RETRY,
                                                             EffectOutcome.FAILED]


async def test_an_attempt_cut_by_shutdown_is_told_as_interrupted(make_engine: Any) -> None:
    engine, _ = await make_engine(Job(n=1, sleep_s=30), drain_timeout=0.05)
    heard = Heard()
    engine.instrument(heard)
    await engine.tick()
    await engine.executor_loop.refresh()
    assert engine.executor_loop.dispatch() == 1
    await heard.claimed.wait()  # the claim is written: the attempt runs
    await engine.close()
    assert [(tag, outcome) for tag, outcome, _ in heard.attempts] == [
        ("instrumented-job", EffectOutcome.INTERRUPTED)]


@pytest.mark.parametrize("where", ["tick", "dispatched", "executed"])
async def test_a_listener_that_raises_breaks_nothing_and_is_detached(
    make_engine: Any, where: str,
) -> None:
    engine, clock = await make_engine(Job(n=1))
    broken, heard = Broken(where), Heard()
    engine.instrument(broken)
    engine.instrument(heard)
    await engine.tick()
    await engine.executor_loop.run_until_idle()
    clock.advance(5_000)
    await engine.tick()
    # the tick and the attempt went on; the listener after the broken one heard everything
    assert [n for n, _ in heard.ticks] == [1, 2]
    assert [outcome for _, outcome, _ in heard.attempts] == [EffectOutcome.ACKED]
    assert [e.kind for e in await engine.events.read(kinds=["effect-acked", "tick"])] == [
        "tick", "effect-acked"]
    assert engine.instruments.listeners == (heard,)
    calls = broken.calls
    await engine.tick()
    assert broken.calls == calls  # detached: never called again
    await engine.supervisor.settle()
    (error,) = await engine.events.read(kinds=["error"])
    assert error.key == f"engine:instruments:Broken.{where}"
    assert error.data["message"] == f"{where} is broken"


async def test_a_detached_listener_hears_nothing_more(make_engine: Any) -> None:
    engine, clock = await make_engine()
    heard = Heard()
    detach = engine.instrument(heard)
    await engine.tick()
    detach()
    detach()  # a second call does nothing
    clock.advance(5_000)
    await engine.tick()
    assert [n for n, _ in heard.ticks] == [1]
    assert engine.instruments.listeners == ()


async def test_only_an_instruments_attaches_and_only_once(make_engine: Any) -> None:
    engine, _ = await make_engine()
    heard = Heard()
    engine.instrument(heard)
    with pytest.raises(PulseError, match="attached already"):
        engine.instrument(heard)
    with pytest.raises(PulseError, match=r"subclass pulse_core\.Instruments"):
        engine.instrument(object())  # type: ignore[arg-type]


async def test_next_tick_at_is_the_last_tick_plus_its_interval(make_engine: Any) -> None:
    engine, clock = await make_engine()
    assert engine.next_tick_at is None
    clock.advance(1_234)
    await engine.tick()
    assert engine.last_tick_at is not None
    assert engine.next_tick_at == engine.last_tick_at + engine.last_tick_ms
    assert engine.next_tick_at > engine.last_tick_at
