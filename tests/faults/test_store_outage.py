"""The store goes away under a running engine (its PostgreSQL server stopped for a few seconds):
the errors reported meanwhile reach the log once the server is back, marked late, and none is
lost silently — past what an outage keeps, one more error says how many were not kept, and
what the store never takes is logged with its count at close."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from pulse_core import (
    Decision,
    Engine,
    Event,
    Inner,
    LoopState,
    Snapshot,
    StoreUnavailable,
    _error_reports,
)
from pulse_core.store import open_event_store
from tests.servers import PostgresServer

TEST_TIME_LIMIT_S = 120

BROKE = "the rule broke while the store was down"
OUTAGE_S = 3.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class StoreStopper:
    """A business rule that, once `armed`, stops the PostgreSQL server in the middle of a tick
    and then raises: its error is in the tick's append, which the store can no longer take."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.armed = False
        self.stopped = asyncio.Event()
        self.name = "store_stopper"

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        decision = await inner(prev, curr)
        if self.armed and not self.stopped.is_set():
            await asyncio.to_thread(self.server.stop)
            self.stopped.set()
            raise RuntimeError(BROKE)
        return decision


def outage_engine(home: Path, url: str, stopper: StoreStopper) -> Engine:
    # The executor loop reads the log every 50 ms, so it reports the outage as well.
    return Engine(home, store=url, rules=[stopper], default_tick_ms=100, rule_timeout=30.0,
                  executor_scan_interval=0.05)


async def until(check: Callable[[], Awaitable[bool]], seconds: float, what: str) -> None:
    """Wait until `check()` holds, looking every 50 ms; fail naming `what` after `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"gave up after {seconds:g} s waiting for {what}")
        await asyncio.sleep(0.05)


async def errors_in(engine: Engine) -> list[Event]:
    """The error events of the engine's log; none while the store cannot be read."""
    with contextlib.suppress(StoreUnavailable):
        return await engine.events.read(kinds=["error"])
    return []


async def an_outage(engine: Engine, stopper: StoreStopper, server: PostgresServer
                    ) -> tuple[int, int]:
    """Let the engine stop its own store mid-tick, keep it down OUTAGE_S seconds while the
    engine's loops fail, then start it again; (when it went down, when it was back), ms."""
    began = now_ms()
    stopper.armed = True
    engine.wake()
    await asyncio.wait_for(stopper.stopped.wait(), 60)
    await asyncio.sleep(OUTAGE_S)  # the outage itself: reports pile up meanwhile
    await asyncio.to_thread(server.start)
    return began, now_ms()


async def test_errors_reported_while_postgresql_is_down_are_recorded_late_once_it_is_back(
    restartable: PostgresServer, pg_url: str, tmp_path: Path
) -> None:
    stopper = StoreStopper(restartable)
    async with outage_engine(tmp_path / "home", pg_url, stopper) as engine:
        down, back = await an_outage(engine, stopper, restartable)

        async def the_rules_error_is_recorded() -> bool:
            return any(e.data.get("message") == BROKE for e in await errors_in(engine))

        await until(the_rules_error_is_recorded, 30, "the rule's error to be recorded")

        async def every_loop_runs() -> bool:  # none ended: each failed loop came back
            return all(loop.state is LoopState.RUNNING for loop in engine.loops())

        await until(every_loop_runs, 40, f"every loop to run again: {engine.loops()}")

    store = await open_event_store(pg_url, read_only=True)
    try:
        errors = await store.read(kinds=["error"])
    finally:
        await store.close()
    late = [e for e in errors if e.data.get("late") is True]
    (broke,) = [e for e in errors if e.data.get("message") == BROKE]
    assert broke in late and broke.key == "rule:store_stopper"
    assert down <= broke.data["reported_at"] <= back
    failed_ticks = [e for e in late if e.key == "engine:tick"
                    and e.data["type"] == "StoreUnavailable"
                    and down <= e.data["reported_at"] <= back]
    assert failed_ticks, f"no failed tick of the outage was recorded: {[e.data for e in late]}"
    assert len({e.idem for e in late}) == len(late), "a late error was recorded twice"
    assert not [e for e in errors if e.key == _error_reports.NOT_KEPT], "nothing was dropped"


async def test_an_outage_keeps_a_bounded_number_of_reports_and_records_how_many_more_there_were(
    restartable: PostgresServer, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_error_reports, "KEEP_AT_MOST", 3)
    stopper = StoreStopper(restartable)
    async with outage_engine(tmp_path / "home", pg_url, stopper) as engine:
        await an_outage(engine, stopper, restartable)

        async def the_count_is_recorded() -> bool:
            return any(e.key == _error_reports.NOT_KEPT for e in await errors_in(engine))

        await until(the_count_is_recorded, 30, "the count of the reports not kept")
        errors = await engine.events.read(kinds=["error"])

    late = [e for e in errors if e.data.get("late") is True]
    # Most often one count; one more for reports counted while the first was being appended
    # (a loop's stale connection failing just after the restart), or after its reply was
    # lost: each report is in one count (tests/faults/test_pg_lost_reply.py).
    counts = [e for e in late if e.key == _error_reports.NOT_KEPT]
    assert counts, [e.data for e in late]
    kept = [e for e in late if e.key != _error_reports.NOT_KEPT and e.seq < counts[0].seq]
    assert len(kept) == 3, [e.data for e in late]  # recorded together, before the count
    for count in counts:
        assert count.data["not_kept"] >= 1
        assert f"{count.data['not_kept']} more error reports" in count.data["message"]
    # each report is in one count: a later count counts only reports made after the earlier
    # one's first (counting the same reports again would give it the same first report)
    since = [c.data["reported_at"] for c in counts]
    assert since == sorted(set(since)), since


async def test_reports_the_store_never_takes_are_logged_with_their_count_at_close(
    restartable: PostgresServer, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stopper = StoreStopper(restartable)
    async with outage_engine(tmp_path / "home", pg_url, stopper) as engine:
        stopper.armed = True
        engine.wake()
        await asyncio.wait_for(stopper.stopped.wait(), 60)

        async def a_report_waits() -> bool:
            return any("kept, to be recorded" in r.getMessage() for r in caplog.records)

        await until(a_report_waits, 30, "a report to be kept")
    # closed while the server is still down (the fixture starts it again)
    (line,) = [r.getMessage() for r in caplog.records
               if "could not be recorded" in r.getMessage()]
    found = re.match(r"pulse: (\d+) error reports made while the store was unavailable", line)
    # at least the rule's error (kept from the tick's append) and the failed tick itself
    assert found is not None and int(found[1]) >= 2, line
    assert re.search(r"; the first: (engine|rule):\S+: \w+: \S", line), line  # named
