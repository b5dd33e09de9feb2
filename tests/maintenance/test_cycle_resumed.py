"""A cycle killed mid-sweep and resumed: its report counts what every attempt wrote, as the
log holds it, and its budgets are the cycle's, not each attempt's."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import msgspec

from pulse_adapters.maintenance import MaintenanceSettings, run_cycle
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_adapters.maintenance._work import CycleTally, CycleWork
from pulse_core import EventDraft, identity_key
from pulse_core.maintenance._activities import read_activity
from tests.maintenance.conftest import OpenStore

RECORDS = 60
LIMIT = 5  # elements per sweep batch: 12 batches would decay everything
BUDGET = 8  # appends the cycle may make: 8 batches, 40 decays
HANG_AT = 4  # the killed attempt writes 3 batches, then hangs before its 4th
SETTINGS = {"decay": {"limit": LIMIT}, "budgets": {"max_transactions": BUDGET}}

ATTEMPT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path

    import msgspec

    from pulse_adapters.maintenance import MaintenanceSettings, run_cycle
    from pulse_core.maintenance._authority import Authority
    from pulse_core.store import open_event_store

    url, marker, hang_at, settings = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


    class Hangs(Authority):
        # the sweep checks its grant before every batch: the hang_at-th check never returns
        checks = 0

        async def check(self, principal: str, permission: str, action: str) -> int:
            if action == "decay memory strength":
                Hangs.checks += 1
                if Hangs.checks == hang_at:
                    marker.write_text("hung")
                    await asyncio.Event().wait()
            return await super().check(principal, permission, action)


    async def main() -> None:
        store = await open_event_store(url)
        config = msgspec.json.decode(settings, type=MaintenanceSettings)
        await run_cycle(store, config, cycle="night-1",
                        authority=Hangs(store, {"maintenance": config.grants}))


    asyncio.run(main())
""")


async def until(condition: object, what: str, deadline_s: float = 60.0) -> None:
    """Wait until `condition()` holds; the deadline only bounds a hang."""
    assert callable(condition)
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def test_a_cycle_killed_mid_sweep_reports_every_attempts_work_within_one_budget(
    tmp_path: Path, store_url: str, open_store: OpenStore,
) -> None:
    store = await open_store()
    await store.append([EventDraft("human-exchange", identity_key("ana"),
                                   {"record": f"x-{i}", "text": "hi", "role": "human"},
                                   origin="human") for i in range(RECORDS)])
    settings = msgspec.json.encode(SETTINGS).decode()
    marker = tmp_path / "hung"
    attempt = await asyncio.create_subprocess_exec(  # a real process, SIGKILLed mid-sweep
        sys.executable, "-c", ATTEMPT, store_url, str(marker), str(HANG_AT), settings,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    try:
        await until(lambda: marker.exists() or attempt.returncode is not None,
                    "the sweep to hang")
        assert attempt.returncode is None, "the attempt ended instead of hanging mid-sweep"
    finally:
        if attempt.returncode is None:
            attempt.send_signal(signal.SIGKILL)
        await asyncio.wait_for(attempt.wait(), 60)

    running = await read_activity(store, "night-1")
    assert running is not None and running.status == "running"
    assert len(await store.read(kinds=["memory-metabolized"])) == HANG_AT - 1  # 3 batches

    report = await run_cycle(store, msgspec.convert(SETTINGS, MaintenanceSettings),
                             cycle="night-1")
    assert report.status == "completed"
    decays = [e for e in await store.read(kinds=["memory-metabolized"])
              if e.origin == ORIGIN and e.data["cycle_start"] == report.cycle_start]
    logged = sum(len(e.data["strengths"]) for e in decays)
    assert report.changes["decayed"] == logged  # both attempts' decays, as the log holds them
    assert logged == BUDGET * LIMIT  # within the cycle's budget, not a fresh one per attempt
    caused = [e for e in await store.read(running.seq)
              if e.cause == running.seq and e.origin == ORIGIN]
    assert report.writes == len(caused) and report.transactions == len({e.tx for e in caused})
    assert report.transactions <= BUDGET
    assert any("metabolism" in d for d in report.deferred)
    await store.close()


async def test_the_tally_counts_each_append_once_reading_only_what_came_before_it(
    open_store: OpenStore,
) -> None:
    """A cycle's writes are counted from each append's result (not read back) after the
    events before it are read: the counts a read of the whole log gives, each event once."""
    store = await open_store()

    def exchange(who: str, n: int) -> EventDraft:
        return EventDraft("human-exchange", identity_key(who),
                          {"record": f"x-{n}", "text": "hi", "role": "human"}, origin="human")

    began = (await store.append([exchange("ana", 0)])).last_seq  # stands for the cycle's start

    def decay(n: int) -> EventDraft:
        return EventDraft("memory-metabolized", identity_key("ana"),
                          {"cycle_start": 1, "factor": 0.5, "strengths": {f"x-{n}": 0.5}},
                          origin=ORIGIN, cause=began)

    tally = CycleTally(store, began)
    assert await tally.current() == CycleWork()
    await store.append([decay(0)])  # before the append handed over: read
    await store.append([exchange("bo", 1)])  # another writer's: read, not counted
    taken = await store.append([decay(1), decay(2)])
    await tally.take(taken.events)
    await tally.take(taken.events)  # handed over twice: counted once
    assert tally.cursor == taken.last_seq
    await store.append([decay(3)])  # after it: read at the next current()
    work = await tally.current()
    assert work == await CycleTally(store, began).current()
    assert (work.writes, work.transactions, work.changes) == (4, 3, {"decayed": 4})
    await store.close()
