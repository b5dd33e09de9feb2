"""The ExecutorLoop: claims, retries, timeouts, leases, concurrency."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from pulse_core import (
    Backoff,
    Effect,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    ManualClock,
    PulseError,
    SqliteEventStore,
    StoreUnavailable,
    process_started,
)
from pulse_core._effects import effect_draft
from pulse_core._projector import INLINE_FOLD
from pulse_core._supervisor import wait_signal
from pulse_core.store import AppendResult, Page, PreparedAppend, SqliteRecorder
from tests.timing import eventually
from tests.write_lock import WriteLock


class Task(Effect, tag="loop-task"):
    n: int
    fail_times: int = 0
    sleep: float = 0.0


class Worker(Executor):
    handles = (Task,)
    timeout = 0.2
    max_attempts = 3
    backoff = Backoff(initial_ms=1_000, factor=3.0, max_ms=60_000, jitter=0.0)

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, str]] = []
        self.running = 0
        self.peak = 0

    async def execute(self, effect: Task, ctx: ExecutionContext) -> object:
        self.calls.append((effect.n, ctx.attempt, ctx.idempotency_key))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(effect.sleep)
            if ctx.attempt <= effect.fail_times:
                raise ConnectionError(f"attempt {ctx.attempt} failed")
            return object() if effect.n < 0 else {"n": effect.n}
        finally:
            self.running -= 1


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    store = await SqliteEventStore.open(tmp_path / "events.db", synchronous="NORMAL")
    yield store
    await store.close()


async def add(store: EventStore, *tasks: Task) -> list[str]:
    result = await store.append([effect_draft(t, origin="agent") for t in tasks])
    return [e.key for e in result.events]


async def test_failures_retry_with_backoff_until_acked(store: SqliteEventStore) -> None:
    clock = ManualClock()
    worker = Worker()
    loop = ExecutorLoop(store, [worker], clock=clock)
    (effect_id,) = await add(store, Task(n=1, fail_times=2))
    await loop.run_until_idle()
    (failed,) = await store.read(kinds=["effect-failed"])
    assert failed.data["retry_at"] == clock.now_ms() + 1_000 and not failed.data["final"]
    clock.advance(999)
    await loop.run_until_idle()
    assert len(worker.calls) == 1
    clock.advance(1)
    await loop.run_until_idle()
    clock.advance(3_000)
    await loop.run_until_idle()
    assert [c[1] for c in worker.calls] == [1, 2, 3]
    assert [c[2] for c in worker.calls] == [f"{effect_id}:{a}" for a in (1, 2, 3)]
    kinds = [e.kind for e in await store.read(key=effect_id)]
    assert kinds == ["effect", *["effect-executing", "effect-failed"] * 2,
                     "effect-executing", "effect-acked"]


async def test_attempts_stop_at_max_attempts_with_a_final_failure(
    store: SqliteEventStore,
) -> None:
    clock = ManualClock()
    worker = Worker()
    loop = ExecutorLoop(store, [worker], clock=clock)
    await add(store, Task(n=1, fail_times=99))
    for _ in range(6):
        await loop.run_until_idle()
        clock.advance(100_000)
    failures = await store.read(kinds=["effect-failed"])
    assert [f.data["final"] for f in failures] == [False, False, True]
    assert "attempt 3 failed" in failures[-1].data["error"]
    assert len(worker.calls) == 3 and loop.unfinished == 0


async def test_a_slow_attempt_times_out_and_is_retried(store: SqliteEventStore) -> None:
    clock = ManualClock()
    loop = ExecutorLoop(store, [Worker()], clock=clock)
    await add(store, Task(n=1, sleep=5.0))
    await loop.run_until_idle()
    (failed,) = await store.read(kinds=["effect-failed"])
    assert "timed out after 0.2 s" in failed.data["error"] and not failed.data["final"]


async def test_a_result_that_cannot_be_stored_fails_the_attempt(store: SqliteEventStore) -> None:
    loop = ExecutorLoop(store, [Worker()], clock=ManualClock())
    await add(store, Task(n=-1))
    await loop.run_until_idle()
    (failed,) = await store.read(kinds=["effect-failed"])
    assert "cannot encode" in failed.data["error"]


async def test_concurrency_is_limited(store: SqliteEventStore) -> None:
    worker = Worker()
    loop = ExecutorLoop(store, [worker], concurrency=3)
    await add(store, *[Task(n=i, sleep=0.02) for i in range(10)])
    await loop.run_until_idle()
    assert worker.peak == 3
    assert len(await store.read(kinds=["effect-acked"])) == 10


async def test_an_expired_lease_is_reclaimed_with_the_next_attempt(
    store: SqliteEventStore,
) -> None:
    clock = ManualClock()
    (effect_id,) = await add(store, Task(n=7))
    await store.append([EventDraft(
        "effect-executing", effect_id,
        {"attempt": 1, "lease_until": clock.now_ms() + 10_000, "lease_ms": 10_000,
         "owner": "elsewhere:1:x", "pid": 1, "started": 0.0},
        origin="executor:other")], expect={effect_id: 1})
    worker = Worker()
    loop = ExecutorLoop(store, [worker], clock=clock)
    await loop.run_until_idle()
    assert worker.calls == []  # another host's live lease is respected
    clock.advance(9_999)
    await loop.run_until_idle()
    assert worker.calls == []
    clock.advance(1)
    await loop.run_until_idle()
    assert worker.calls == [(7, 2, f"{effect_id}:2")]


async def test_a_claim_written_before_claims_said_their_length_holds_until_its_lease_end(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "old.db", clock=clock)  # stamps ts
    try:
        (effect_id,) = await add(store, Task(n=7))
        await store.append([EventDraft(
            "effect-executing", effect_id,
            {"attempt": 1, "lease_until": clock.now_ms() + 10_000, "owner": "elsewhere:1:x",
             "pid": 1, "started": 0.0},
            origin="executor:other")], expect={effect_id: 1})
        worker = Worker()
        loop = ExecutorLoop(store, [worker], clock=clock)
        await loop.run_until_idle()
        clock.advance(9_999)
        await loop.run_until_idle()
        assert worker.calls == []  # its length: lease_until less the claim's own time
        clock.advance(1)
        await loop.run_until_idle()
        assert worker.calls == [(7, 2, f"{effect_id}:2")]
    finally:
        await store.close()


async def test_the_loop_sees_effects_written_by_another_process_on_its_scan(
    tmp_path: Path, store: SqliteEventStore
) -> None:
    worker = Worker()
    loop = ExecutorLoop(store, [worker], scan_interval=0.05)
    runner = asyncio.create_task(loop.run())
    other = await SqliteEventStore.open(tmp_path / "events.db")  # a second writer
    await other.append([effect_draft(Task(n=9), origin="agent")])
    await other.close()
    try:
        await eventually(lambda: worker.calls, what="the other writer's effect run")
    finally:
        runner.cancel()
    assert worker.calls[0][0] == 9


def test_two_executors_for_one_effect_type_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PulseError, match="loop-task"):
        ExecutorLoop(None, [Worker(), Worker()])  # type: ignore[arg-type]


TEARDOWN = '''
import asyncio, sys, tempfile
from pathlib import Path
from pulse_core import Effect, ExecutionContext, Executor, ExecutorLoop, SqliteEventStore
from pulse_core._effects import effect_draft

class Slow(Effect, tag="slow"):
    n: int

class SlowExec(Executor):
    handles = (Slow,)
    def __init__(self):
        self.entered = asyncio.Event()
    async def execute(self, effect, ctx):
        self.entered.set()
        await asyncio.sleep(30)

async def main():
    store = await SqliteEventStore.open(Path(tempfile.mkdtemp()) / "e.db")
    ex = SlowExec()
    asyncio.create_task(ExecutorLoop(store, [ex]).run())
    await store.append([effect_draft(Slow(n=1), origin="engine:tick")])
    await ex.entered.wait()
    raise RuntimeError("the program failed without closing anything")

asyncio.run(main())
'''


async def test_a_program_that_dies_mid_effect_without_closing_still_exits(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    child = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", TEARDOWN], check=False, capture_output=True,
        text=True, timeout=20)
    assert child.returncode == 1
    assert "the program failed without closing anything" in child.stderr


async def test_a_loop_that_leaves_unhandled_effects_to_others_still_goes_idle(
    store: SqliteEventStore,
) -> None:
    class Other(Effect, tag="loop-other"):
        pass

    worker = Worker()
    loop = ExecutorLoop(store, [worker], fail_unhandled=False)
    await store.append([effect_draft(Other(), origin="agent"),
                        effect_draft(Task(n=1), origin="agent")])
    await asyncio.wait_for(loop.run_until_idle(), 5)
    assert [c[0] for c in worker.calls] == [1]
    assert loop.unfinished == 1  # the other effect is left for a process that handles it
    assert await store.read(kinds=["effect-failed"]) == []


class Job(Effect, tag="loop-job"):
    n: int


class GatedWorker(Executor):
    """Odd jobs fail their first attempt (a retry comes due); every job then waits at `gate`."""

    handles = (Job,)
    timeout = 30.0
    max_attempts = 5
    backoff = Backoff(initial_ms=800, factor=1.0, max_ms=800, jitter=0.0)

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.runs: list[tuple[int, int]] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> object:
        self.runs.append((effect.n, ctx.attempt))
        if ctx.attempt == 1 and effect.n % 2:
            raise ConnectionError("first attempt fails")
        await self.gate.wait()
        return {"n": effect.n}


async def _until(store: EventStore, check: Callable[[], Awaitable[bool]],
                 seconds: float = 20.0) -> None:
    """Wait until `check()` holds, looking again after each commit (and every 50 ms)."""
    signal = store.subscribe()
    try:
        async with asyncio.timeout(seconds):
            while not await check():
                await wait_signal(signal, 0.05)
                signal.clear()
    finally:
        store.unsubscribe(signal)


async def test_a_write_lock_held_by_another_process_leaves_every_effect_acked_once(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    unobserved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unobserved.append(context))
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path, synchronous="NORMAL", busy_timeout=0.2)
    reported: list[tuple[str, BaseException]] = []
    worker = GatedWorker()
    executors = ExecutorLoop(store, [worker], scan_interval=0.05,
                             on_error=lambda where, exc: reported.append((where, exc)))
    runner = asyncio.create_task(executors.run())
    try:
        result = await store.append([effect_draft(Job(n=n), origin="agent") for n in range(6)])
        ids = [e.key for e in result.events]

        async def settled_first_attempts() -> bool:
            return (len(await store.read(kinds=["effect-failed"])) == 3
                    and len(await store.read(kinds=["effect-executing"])) >= 6)

        await _until(store, settled_first_attempts)
        lock = await asyncio.to_thread(WriteLock, path, 2.0)  # another process's, for 2 s
        worker.gate.set()  # acks are due now, and the odd jobs' retries come due in 800 ms

        async def all_acked() -> bool:
            return len(await store.read(kinds=["effect-acked"])) >= 6 and not executors._inflight

        await _until(store, all_acked)
        await asyncio.to_thread(lock.ended)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    acked = [e.key for e in await store.read(kinds=["effect-acked"])]
    assert sorted(acked) == sorted(ids)  # every effect acked, each exactly once
    await executors.refresh()
    assert executors.unfinished == 0
    assert sorted(worker.runs) == sorted([(n, 1) for n in range(6)] + [(n, 2) for n in (1, 3, 5)])
    assert any(isinstance(exc, StoreUnavailable) and "locked" in str(exc)
               and "effect-acked" in where for where, exc in reported)
    assert any(isinstance(exc, StoreUnavailable) and "attempt 2" in where
               for where, exc in reported)
    await store.close()
    gc.collect()
    await asyncio.sleep(0)
    assert unobserved == []


class FlakyReads(SqliteRecorder):
    """A real recorder whose next `failures` reads of effects (the loop's reads) fail as a busy
    database would. (SQLite in WAL mode never blocks a reader, so a transient read error
    cannot be provoked from outside.)"""

    failures = 0

    async def select(self, *args: Any, **kwargs: Any) -> Page:
        if self.failures and "effect" in (kwargs.get("kinds") or ()):
            self.failures -= 1
            raise StoreUnavailable(f"{self.path}: database is locked")
        return await super().select(*args, **kwargs)


async def test_the_loop_reports_a_failed_read_and_keeps_running(tmp_path: Path) -> None:
    recorder = await FlakyReads.open(tmp_path / "events.db")
    store = EventStore(recorder)
    reported: list[tuple[str, BaseException]] = []
    worker = Worker()
    executors = ExecutorLoop(store, [worker], scan_interval=0.05,
                             on_error=lambda where, exc: reported.append((where, exc)))
    runner = asyncio.create_task(executors.run())
    try:
        await add(store, Task(n=1))
        await _until(store, lambda: _acked(store, 1))
        recorder.failures = 3
        await _until(store, lambda: _is(len(reported) == 3))
        assert not runner.done()
        await add(store, Task(n=2))
        await _until(store, lambda: _acked(store, 2))
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await store.close()
    assert [n for n, _, _ in worker.calls] == [1, 2]
    assert len(reported) == 4  # three failed reads, then the outage they made, once it ended
    assert all(where == "executor-loop" and isinstance(exc, StoreUnavailable)
               for where, exc in reported)
    assert "was unavailable for" in str(reported[3][1])


async def _acked(store: EventStore, count: int) -> bool:
    return len(await store.read(kinds=["effect-acked"])) >= count


async def test_an_unreported_loop_error_goes_to_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = await FlakyReads.open(tmp_path / "events.db")
    recorder.failures = 1
    store = EventStore(recorder)
    executors = ExecutorLoop(store, [Worker()], scan_interval=0.05)
    runner = asyncio.create_task(executors.run())
    try:
        await _until(store, lambda: _is(recorder.failures == 0))  # logged in that same step
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await store.close()
    assert "executor-loop" in caplog.text and "database is locked" in caplog.text


async def _is(value: bool) -> bool:
    return value


async def test_a_long_backlog_is_folded_off_the_loop_and_all_of_it_runs(
    store: SqliteEventStore,
) -> None:
    worker = Worker()
    executors = ExecutorLoop(store, [worker], concurrency=64)
    await add(store, *[Task(n=i) for i in range(INLINE_FOLD * 3)])
    await executors.run_until_idle()
    assert len(await store.read(kinds=["effect-acked"])) == INLINE_FOLD * 3
    assert executors.unfinished == 0 and len(worker.calls) == INLINE_FOLD * 3


class Gated(Executor):
    """Attempts wait at `gate` while `hold(attempt)`; then `outcome` decides: ack or raise."""

    handles = (Job,)
    timeout = 30.0
    max_attempts = 5
    backoff = Backoff(initial_ms=0, factor=1.0, max_ms=0, jitter=0.0)

    def __init__(self, hold: Callable[[int], bool] = lambda attempt: True,
                 outcome: str = "ack") -> None:
        self.hold = hold
        self.outcome = outcome
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.runs: list[tuple[int, int]] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> object:
        self.runs.append((effect.n, ctx.attempt))
        self.entered.set()
        if self.hold(ctx.attempt):
            await self.gate.wait()
        if self.outcome == "fail":
            raise ConnectionError(f"attempt {ctx.attempt} failed")
        return {"attempt": ctx.attempt}


async def test_of_two_loops_that_judged_one_effect_claimable_only_one_claims(
    store: SqliteEventStore,
) -> None:
    worker = Gated(hold=lambda attempt: False)
    first, second = (ExecutorLoop(store, [worker], clock=ManualClock()) for _ in range(2))
    (effect_id,) = [e.key for e in (await store.append(
        [effect_draft(Job(n=1), origin="agent")])).events]
    await first.refresh()
    await second.refresh()  # both see the effect pending at version 1
    assert first.dispatch() == 1 and second.dispatch() == 1
    await asyncio.gather(first.run_until_idle(), second.run_until_idle())
    assert worker.runs == [(1, 1)]  # the claim expecting version 1 commits once
    kinds = [e.kind for e in await store.read(key=effect_id)]
    assert kinds == ["effect", "effect-executing", "effect-acked"]


def started_on_the_wall_clock(pid: int) -> float:
    """A process's start as claims written by earlier versions of pulse hold it."""
    import psutil

    return float(psutil.Process(pid).create_time())


@pytest.mark.parametrize("started", [process_started, started_on_the_wall_clock])
async def test_a_claim_whose_owner_process_died_is_taken_over_before_its_lease_ends(
    store: SqliteEventStore, started: Callable[[int], float]
) -> None:
    import socket

    clock = ManualClock()
    result = await store.append([effect_draft(Job(n=n), origin="agent") for n in (1, 2)])
    dead_id, live_id = (e.key for e in result.events)
    children = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; sys.stdin.read()", stdin=asyncio.subprocess.PIPE)
        for _ in range(2)]
    try:
        for effect_id, child in zip((dead_id, live_id), children, strict=True):
            await store.append([EventDraft(
                "effect-executing", effect_id,
                {"attempt": 1, "lease_until": clock.now_ms() + 3_600_000, "lease_ms": 3_600_000,
                 "owner": f"{socket.gethostname()}:{child.pid}:abc", "pid": child.pid,
                 "started": started(child.pid)},
                origin="executor:other")], expect={effect_id: 1})
        children[0].kill()
        await children[0].wait()  # reaped: its pid names no process now
        worker = Gated(hold=lambda attempt: False)
        await ExecutorLoop(store, [worker], clock=clock).run_until_idle()
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
            await child.wait()
    assert worker.runs == [(1, 2)]  # the live owner's claim is left alone
    (acked,) = await store.read(kinds=["effect-acked"])
    assert acked.key == dead_id and acked.data["attempt"] == 2


async def test_every_event_of_an_effect_records_its_attempt_number(
    store: SqliteEventStore,
) -> None:
    clock = ManualClock()
    worker = Worker()
    loop = ExecutorLoop(store, [worker], clock=clock)
    (effect_id,) = await add(store, Task(n=1, fail_times=2))
    for _ in range(3):
        await loop.run_until_idle()
        clock.advance(60_000)
    events = (await store.read(key=effect_id))[1:]
    assert [(e.kind, e.data["attempt"]) for e in events] == [
        ("effect-executing", 1), ("effect-failed", 1), ("effect-executing", 2),
        ("effect-failed", 2), ("effect-executing", 3), ("effect-acked", 3)]
    assert [c[1] for c in worker.calls] == [1, 2, 3]


@pytest.mark.parametrize("outcome", ["ack", "fail"])
async def test_a_late_attempt_whose_lease_was_taken_over_records_nothing(
    store: SqliteEventStore, outcome: str
) -> None:
    clock = ManualClock()
    worker = Gated(hold=lambda attempt: attempt == 1, outcome=outcome)
    worker.max_attempts = 2  # attempt 2 is the last: it acks or fails for good
    late, takeover = (ExecutorLoop(store, [worker], clock=clock) for _ in range(2))
    (effect_id,) = [e.key for e in (await store.append(
        [effect_draft(Job(n=1), origin="agent")])).events]
    first = asyncio.create_task(late.run_until_idle())
    await asyncio.wait_for(worker.entered.wait(), 5)
    await takeover.refresh()  # it sees attempt 1's claim: its lease counts from now
    clock.advance(int(worker.timeout * 1000) + late.lease_grace_ms)  # attempt 1's lease ends
    await takeover.run_until_idle()  # attempt 2 claims and finishes
    worker.gate.set()  # now attempt 1 ends too, late
    await asyncio.wait_for(first, 5)
    events = await store.read(key=effect_id)
    assert worker.runs == [(1, 1), (1, 2)]
    assert [(e.kind, e.data.get("attempt")) for e in events][1:] == [
        ("effect-executing", 1), ("effect-executing", 2), (f"effect-{outcome}ed", 2)]


async def test_claims_never_outnumber_free_slots_and_stop_when_draining(
    store: SqliteEventStore,
) -> None:
    worker = Gated()
    loop = ExecutorLoop(store, [worker], concurrency=2, scan_interval=0.05)
    await store.append([effect_draft(Job(n=n), origin="agent") for n in range(6)])
    runner = asyncio.create_task(loop.run())
    try:
        await _until(store, lambda: _is(len(worker.runs) == 2))
        assert len(await store.read(kinds=["effect-executing"])) == 2
        asyncio.get_running_loop().call_soon(worker.gate.set)
        assert await loop.drain(30) == 0  # drain stops claiming at once
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    assert len(worker.runs) == 2
    assert len(await store.read(kinds=["effect-executing"])) == 2
    assert len(await store.read(kinds=["effect-acked"])) == 2
    await loop.refresh()
    assert loop.unfinished == 4  # left pending for the next engine, never claimed


async def test_on_a_log_only_this_process_wakes_every_wake_reads_at_once(
        store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # The gap between reads that a shared log's wakes storm needs must not apply here: with
    # an hour's gap, the second effect would wait an hour for its read.
    monkeypatch.setattr("pulse_core._executor_loop.SCAN_GAP_S", 3600.0)
    ran = asyncio.Event()

    class Signalling(Worker):
        async def execute(self, effect: Task, ctx: ExecutionContext) -> object:
            ran.set()
            return await super().execute(effect, ctx)

    worker = Signalling()
    loop = ExecutorLoop(store, [worker], scan_interval=3600)
    running = asyncio.create_task(loop.run())
    try:
        for n in (1, 2):
            ran.clear()
            await add(store, Task(n=n))
            await asyncio.wait_for(ran.wait(), 10)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
    assert [n for n, _, _ in worker.calls] == [1, 2]


class SlowReads(SqliteRecorder):
    """A real recorder whose first read of effects once `gate` is given lets the attempts
    waiting on it finish before the read returns: the read's snapshot is older than their
    outcomes, as a read on a busy machine may be."""

    gate: asyncio.Event | None = None

    async def select(self, *args: Any, **kwargs: Any) -> Page:
        page = await super().select(*args, **kwargs)
        gate = self.gate
        if gate is not None and "effect" in (kwargs.get("kinds") or ()) and not gate.is_set():
            gate.set()  # the others finish (their acks commit) while this read "takes" long
            for _ in range(50):
                await asyncio.sleep(0.002)
        return page


async def test_run_until_idle_returns_only_with_every_outcome_folded(tmp_path: Path) -> None:
    recorder = await SlowReads.open(tmp_path / "events.db")
    store = EventStore(recorder)
    gate = asyncio.Event()

    class Waits(Executor):
        handles = (Task,)

        async def execute(self, effect: Task, ctx: ExecutionContext) -> None:
            if effect.n:
                await gate.wait()
            else:
                recorder.gate = gate  # the read after this one finishing is the slow one

    executors = ExecutorLoop(store, [Waits()], concurrency=16)
    try:
        await add(store, *[Task(n=n) for n in range(8)])
        await executors.run_until_idle()
        assert len(await store.read(kinds=["effect-acked"])) == 8
        assert executors.unfinished == 0
    finally:
        await store.close()


async def test_an_attempt_dispatched_just_before_claims_stop_never_claims(
        store: SqliteEventStore) -> None:
    await add(store, Task(n=1), Task(n=2))
    worker = Worker()
    loop = ExecutorLoop(store, [worker], clock=ManualClock())
    await loop.refresh()
    assert loop.dispatch() == 2  # both attempts created, neither has run yet
    assert await loop.drain(30) == 0  # drain begins before they claim
    assert worker.calls == []
    assert await store.read(kinds=["effect-executing"]) == []
    await loop.refresh()
    assert loop.unfinished == 2  # left pending for the next engine


def _other_hosts_claim(effect_id: str, clock: ManualClock) -> EventDraft:
    return EventDraft(
        "effect-executing", effect_id,
        {"attempt": 1, "lease_until": clock.now_ms() + 60_000, "lease_ms": 60_000,
         "owner": "elsewhere:1:x", "pid": 1, "started": 0.0}, origin="executor:other")


async def test_a_claim_that_lost_its_race_is_not_tried_again_before_its_backoff(
        store: SqliteEventStore) -> None:
    clock = ManualClock()
    (effect_id,) = await add(store, Task(n=1))
    loop = ExecutorLoop(store, [Worker()], clock=clock)
    await loop.refresh()  # judges it pending at version 1
    await store.append([_other_hosts_claim(effect_id, clock)], expect={effect_id: 1})
    assert loop.dispatch() == 1
    await asyncio.gather(*loop._inflight.values())  # its claim conflicted
    # Before a read shows why, the loop must not claim again at once: a read that cannot
    # show it (a lagging replica, a row it cannot fold) would make that a busy loop.
    assert loop.dispatch() == 0


class RefusedClaims(SqliteRecorder):
    """A real recorder that refuses the next `failures` claims as a locked database would."""

    failures = 0

    async def insert(self, append: PreparedAppend) -> AppendResult:
        if self.failures and any(d.kind == "effect-executing" for d in append.drafts):
            self.failures -= 1
            raise StoreUnavailable(f"{self.path}: database is locked")
        return await super().insert(append)


async def test_a_claim_the_store_refused_is_not_tried_again_before_its_backoff(
        tmp_path: Path) -> None:
    recorder = await RefusedClaims.open(tmp_path / "events.db")
    store = EventStore(recorder)
    reported: list[tuple[str, BaseException]] = []
    try:
        await add(store, Task(n=1))
        worker = Worker()
        loop = ExecutorLoop(store, [worker], clock=ManualClock(),
                            on_error=lambda where, exc: reported.append((where, exc)))
        recorder.failures = 1
        await loop.refresh()
        assert loop.dispatch() == 1
        await asyncio.gather(*loop._inflight.values())  # the store refused its claim
        assert [type(exc) for _, exc in reported] == [StoreUnavailable]
        await loop.refresh()
        assert loop.dispatch() == 0  # held back for READ_BACKOFF, not claimed at once
        await _until(store, lambda: _is(loop.dispatch() == 1))  # and claimed after it
        await asyncio.gather(*loop._inflight.values())
        assert [n for n, _, _ in worker.calls] == [1]
    finally:
        await store.close()
