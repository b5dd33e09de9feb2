"""Leases on a shared log never compare two hosts' clocks: a claim says how long it holds,
and each loop counts that on its own clock from when it first saw the claim. Hosts whose
clocks disagree by a day still run one attempt at a time, and a dead claimer's effect is
still taken over once its lease has run out."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_core import (
    EventDraft,
    ExecutionContext,
    Executor,
    ExecutorLoop,
    SqliteEventStore,
    SystemClock,
    process_started,
    still_running,
)
from pulse_core._effects import effect_draft
from pulse_core.store import open_event_store
from tests.e2e.support import Child
from tests.fleet.engine_host import Work, read_journal
from tests.fleet.fleet_support import ready, until

TEST_TIME_LIMIT_S = 120
DAY_MS = 86_400_000


class SkewedClock:
    """This machine's wall clock, off by `skew_ms`: a host whose clock was never set."""

    def __init__(self, skew_ms: int) -> None:
        self.skew_ms = skew_ms

    def now_ms(self) -> int:
        return SystemClock().now_ms() + self.skew_ms


class Gate(Executor):
    """Runs `Work`: remembers (n, attempt), then waits at `gate` (when `hold`)."""

    handles = (Work,)
    timeout = 5.0

    def __init__(self, hold: bool = True) -> None:
        self.hold = hold
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.runs: list[tuple[int, int]] = []

    async def execute(self, effect: Work, ctx: ExecutionContext) -> None:
        self.runs.append((effect.n, ctx.attempt))
        self.entered.set()
        if self.hold:
            await self.gate.wait()


def test_a_process_start_is_read_on_the_clock_since_boot_which_no_step_of_the_wall_clock_moves(
) -> None:
    # psutil's start is the boot time, read on the wall clock when asked, plus the start
    # since boot: a step of the wall clock (NTP, a VM resumed) moved it, and a claim's owner
    # on this host, alive, no longer matched the start its claim holds
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        started = process_started(child.pid)
        assert since_boot - 0.011 <= started <= time.clock_gettime(time.CLOCK_BOOTTIME)
        assert still_running(child.pid, started)
        assert not still_running(child.pid, started + 0.01)  # another process, this pid
    finally:
        child.kill()
        child.wait()
    assert process_started(child.pid) == 0.0 and not still_running(child.pid, started)


@pytest.mark.parametrize("skew_ms", [DAY_MS, -DAY_MS], ids=["ahead", "behind"])
async def test_a_live_claim_holds_against_a_host_whose_clock_is_a_day_off(
        tmp_path: Path, skew_ms: int) -> None:
    # Two stores on one file: two processes' views of one log.
    claimer_store = await SqliteEventStore.open(tmp_path / "events.db")
    other_store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        held = Gate()
        claimer = ExecutorLoop(claimer_store, [held], host="host-b", lease_grace_ms=100)
        other = Gate(hold=False)
        skewed = ExecutorLoop(other_store, [other], host="host-a",
                              clock=SkewedClock(skew_ms))
        await claimer_store.append([effect_draft(Work(n=1), origin="agent")])
        running = asyncio.create_task(claimer.run_until_idle())
        await asyncio.wait_for(held.entered.wait(), 30)
        await skewed.run_until_idle()
        assert other.runs == []  # the claim's lease holds whatever host-a's clock says
        held.gate.set()
        await asyncio.wait_for(running, 30)
        await skewed.run_until_idle()
        assert other.runs == [] and held.runs == [(1, 1)]
        assert [e.kind for e in await other_store.read(kinds=["effect-acked"])] == [
            "effect-acked"]
    finally:
        await other_store.close()
        await claimer_store.close()


async def test_a_loop_on_the_system_clock_counts_a_lease_on_its_monotonic_clock(
        tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        (effect,) = (await store.append([effect_draft(Work(n=1), origin="agent")])).events
        await store.append([EventDraft(
            "effect-executing", effect.key,
            {"attempt": 1, "lease_until": 1, "lease_ms": 300, "owner": "elsewhere:1:x",
             "pid": 1, "started": 0.0}, origin="executor:other")], expect={effect.key: 1})
        runs = Gate(hold=False)
        loop = ExecutorLoop(store, [runs], host="host-a")  # the system clock
        first_seen = time.monotonic()
        await loop.run_until_idle()
        assert runs.runs == []  # its claimer's clock said it ended in 1970: not a reason
        deadline = time.monotonic() + 30
        while not runs.runs and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            await loop.run_until_idle()
        assert runs.runs == [(1, 2)]
        assert time.monotonic() - first_seen >= 0.3
    finally:
        await store.close()




# host-b's lease: a 6 s timeout (its first attempt would work 600 s) and 1 s of grace.
LEASE_MS = 7_000


@pytest.mark.parametrize("skew_ms", [DAY_MS, -DAY_MS], ids=["ahead", "behind"])
async def test_a_host_a_day_off_leaves_a_live_claim_and_takes_a_dead_ones_after_its_lease(
        store_url: str, spawn_host: Callable[..., Child], tmp_path: Path,
        skew_ms: int) -> None:
    host = spawn_host("host-b", store_url, "--first-attempt-seconds", "600", "--timeout", "6",
                      "--lease-grace-ms", "1000")
    await ready(host)
    store = await open_event_store(store_url)
    try:
        (effect,) = (await store.append([effect_draft(Work(n=1), origin="agent")])).events

        async def begun() -> bool:
            return bool(read_journal(tmp_path / "journal"))

        await until(begun, 30, "host-b to begin the effect", host)
        runs = Gate(hold=False)
        loop = ExecutorLoop(store, [runs], host="host-a", clock=SkewedClock(skew_ms))
        first_seen = time.monotonic()
        await loop.run_until_idle()
        assert runs.runs == []  # host-b is alive and its lease holds
        host.kill()

        async def taken_over() -> bool:
            await loop.run_until_idle()
            return bool(runs.runs)

        await until(taken_over, 60, "host-a to take the dead host's effect over")
        assert time.monotonic() - first_seen >= LEASE_MS / 1000  # not before its lease ended
        assert runs.runs == [(1, 2)]
        claims = await store.read(kinds=["effect-executing"], key=effect.key)
        assert [c.data["attempt"] for c in claims] == [1, 2]
        assert claims[0].data["lease_ms"] == LEASE_MS
        assert len(await store.read(kinds=["effect-acked"], key=effect.key)) == 1
    finally:
        await store.close()
