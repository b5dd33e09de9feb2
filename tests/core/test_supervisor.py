"""The supervisor: loops that raise are reported and restarted; cancellation always wins."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from pulse_core import Backoff, Engine, LoopState, ManualClock, StoreUnavailable, Supervisor
from pulse_core._supervisor import StoreOutage, wait_signal
from tests.timing import scaled


async def test_a_cancel_that_arrives_as_the_wait_expires_is_never_swallowed() -> None:
    # The hang the issue found: a watcher loop cancelled as its sleep expired kept looping.
    async def sleeper() -> None:
        signal = asyncio.Event()
        while True:
            await wait_signal(signal, 0.001)

    loop = asyncio.get_running_loop()
    for i in range(300):
        task = asyncio.create_task(sleeper())
        await asyncio.sleep(0.001 * (i % 3))
        loop.call_at(loop.time() + 0.001, task.cancel)  # lands on or near an expiry
        done, _ = await asyncio.wait({task}, timeout=2)
        assert done, f"run {i}: the cancel was swallowed and the loop kept running"
        assert task.cancelled()


async def test_wait_signal_says_whether_the_signal_was_set() -> None:
    signal = asyncio.Event()
    assert await wait_signal(signal, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, signal.set)
    assert await wait_signal(signal, 5) is True
    assert await wait_signal(signal, 0) is True


async def test_a_loop_that_raises_is_reported_and_restarted_with_backoff() -> None:
    reports: list[tuple[str, str]] = []
    runs = 0
    again = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise OSError(f"transient {runs}")
        again.set()
        await asyncio.sleep(3600)

    supervisor = Supervisor(lambda where, exc: reports.append((where, str(exc))),
                            backoff=Backoff(initial_ms=1, max_ms=5, jitter=0))
    supervisor.start("flaky", flaky)
    await asyncio.wait_for(again.wait(), 5)
    (status,) = supervisor.status()
    assert reports == [("flaky", "transient 1"), ("flaky", "transient 2")]
    assert status.restarts == 2 and status.state is LoopState.RUNNING
    assert status.last_error == "OSError: transient 2"
    await supervisor.stop()
    assert supervisor.status()[0].state is LoopState.STOPPED


async def test_a_failed_background_task_is_observed_not_lost() -> None:
    supervisor = Supervisor(lambda where, exc: None)

    async def boom() -> None:
        raise RuntimeError("append failed")

    task = supervisor.spawn("report", boom())
    await supervisor.settle()
    assert task.done() and isinstance(task.exception(), RuntimeError)


async def test_failed_background_tasks_log_one_line_and_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = Supervisor(lambda where, exc: None)

    async def report(n: int) -> None:
        raise OSError(f"disk full at http://u:pw@hooks.example/T0KEN ({n})")

    for n in range(50):
        supervisor.spawn(f"report:{n}", report(n))
    await supervisor.settle()
    lines = [r.getMessage() for r in caplog.records if "background" in r.getMessage()]
    assert lines == ["pulse: background report:0 failed: OSError: disk full at "
                     "http://hooks.example (0)",
                     "pulse: 49 more background tasks failed unlogged"]


async def test_an_engine_loop_that_dies_becomes_an_error_event_and_runs_again(
    tmp_path: Path,
) -> None:
    engine = Engine(tmp_path, clock=ManualClock(), default_tick_ms=10)
    engine.supervisor.backoff = Backoff(initial_ms=1, max_ms=5, jitter=0)
    failures = 0
    real_tick = engine.tick

    async def tick() -> object:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise OSError("disk hiccup")
        return await real_tick()

    engine.tick = tick  # type: ignore[method-assign]
    async with engine:
        for _ in range(500):
            if engine.ticks >= 2:
                break
            await asyncio.sleep(0.01)
        assert engine.ticks >= 2, "the tick loop did not come back after it raised"
        status = {s.name: s for s in engine.loops()}
        assert status["tick"].restarts == 2
        await engine.supervisor.settle()
        errors = await engine.events.read(kinds=["error"])
    assert [e.data["message"] for e in errors if e.key == "engine:tick"] == ["disk hiccup"] * 2


async def test_a_cancel_the_loop_did_not_ask_for_is_a_failure_not_a_stop() -> None:
    reports: list[str] = []
    runs = 0

    async def exporter() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            helper = asyncio.create_task(asyncio.sleep(3600))
            asyncio.get_running_loop().call_soon(helper.cancel)
            await helper  # someone else cancelled what this loop waits on
        await asyncio.sleep(3600)

    supervisor = Supervisor(lambda where, exc: reports.append(type(exc).__name__),
                            backoff=Backoff(initial_ms=1, max_ms=1, jitter=0))
    supervisor.start("exporter", exporter)
    for _ in range(200):
        if runs >= 2:
            break
        await asyncio.sleep(0.01)
    assert runs == 2 and reports == ["CancelledError"]
    assert supervisor.status()[0].state is LoopState.RUNNING
    await supervisor.stop()


async def test_a_loop_that_turns_its_stop_into_an_error_is_stopped_not_restarted() -> None:
    """A body whose cleanup fails as it is cancelled raises an error, not CancelledError:
    stop() still ends the loop (it waited forever, the loop restarted after each backoff)."""
    runs = 0

    async def exporter() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if runs == 1:  # (a restarted one ends when cancelled: the test cannot hang)
                raise RuntimeError("the exporter's socket would not close") from None
            raise

    supervisor = Supervisor(lambda where, exc: None,
                            backoff=Backoff(initial_ms=1, max_ms=1, jitter=0))
    supervisor.start("exporter", exporter)
    await asyncio.sleep(0)
    stopping = asyncio.create_task(supervisor.stop())
    done, _ = await asyncio.wait({stopping}, timeout=scaled(30))
    try:
        assert done, f"stop() still waits; the loop ran {runs} times"
        assert runs == 1
        assert supervisor.status()[0].state is LoopState.STOPPED
    finally:
        if not done:
            await supervisor.stop()  # a second cancel ends the restarted body
            await stopping


async def test_a_loop_stopped_during_its_backoff_reads_stopped() -> None:
    async def failing() -> None:
        raise OSError("down")

    supervisor = Supervisor(lambda where, exc: None,
                            backoff=Backoff(initial_ms=60_000, max_ms=60_000, jitter=0))
    supervisor.start("flaky", failing)
    await asyncio.sleep(0.05)
    assert supervisor.status()[0].state is LoopState.BACKOFF
    await supervisor.stop()
    assert supervisor.status()[0].state is LoopState.STOPPED


async def test_a_watcher_that_fails_outside_collect_backs_off_and_says_so(
    tmp_path: Path,
) -> None:
    from typing import Any

    from pulse_core import Watcher

    class Judgy(Watcher):
        name = "judgy"
        interval = 0.01

        async def collect(self) -> int:
            return 1

        def should_wake(self, window: Any) -> bool:
            raise ValueError("cannot judge")

    engine = Engine(tmp_path, watchers=[Judgy()], default_tick_ms=60_000)
    engine.supervisor.backoff = Backoff(initial_ms=100, max_ms=100, jitter=0)
    async with engine:
        await asyncio.sleep(0.5)
        status = {s.name: s for s in engine.loops()}["watcher:judgy"]
        await engine.supervisor.settle()
        errors = [e for e in await engine.events.read(kinds=["error"])
                  if e.key == "watcher:judgy"]
    # Without the backoff this loop would fail every 10 ms: about 50 errors in 0.5 s.
    assert 2 <= len(errors) <= 8
    assert status.restarts >= 2 and status.last_error == "ValueError: cannot judge"


async def test_a_loop_that_ran_healthily_for_a_while_starts_its_backoff_over() -> None:
    asked: list[int] = []  # the failure count each restart's delay was asked for

    class Recorded(Backoff, frozen=True):
        def delay_ms(self, attempt: int) -> int:
            asked.append(attempt)
            return 1

    runs = 0
    done = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            await asyncio.sleep(0.6)  # a healthy run longer than stable_s, then a failure
        if runs == 5:
            done.set()
            await asyncio.sleep(3600)
        raise OSError(f"failure {runs}")

    supervisor = Supervisor(lambda where, exc: None, backoff=Recorded(), stable_s=0.5)
    supervisor.start("flaky", flaky)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await supervisor.stop()
    assert asked == [1, 2, 1, 2]


def _outage_length(report: BaseException) -> float:
    found = re.search(r"unavailable for ([0-9.]+) s", str(report))
    assert found is not None, report
    return float(found.group(1))


async def test_an_outage_is_reported_with_its_length_from_its_first_error() -> None:
    reports: list[BaseException] = []
    outage = StoreOutage("executor-loop", "host:1:x", lambda where, exc: reports.append(exc))
    began = time.monotonic()
    outage.failed("executor-loop", StoreUnavailable("database is locked"))
    await asyncio.sleep(0.3)
    outage.failed("executor-loop", StoreUnavailable("still locked"))
    await asyncio.sleep(0.3)
    outage.answered()
    first = time.monotonic() - began
    await asyncio.sleep(0.3)  # the store answers; a second, shorter outage follows
    began = time.monotonic()
    outage.failed("executor-loop", StoreUnavailable("locked again"))
    outage.answered()
    second = time.monotonic() - began
    outage.answered()  # no outage going on: nothing more to report
    assert len(reports) == 5
    assert 0.55 <= _outage_length(reports[2]) <= first + 0.05
    assert "first error: database is locked" in str(reports[2])
    assert _outage_length(reports[4]) <= second + 0.05
    assert "first error: locked again" in str(reports[4])
