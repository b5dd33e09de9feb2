"""Executors on several hosts sharing one log: a claim from another host is judged by its
lease only (counted from when this host saw it), one from this host also by its process;
engines in processes of their own (each standing in for a host: its own home folder and host
name, the same PostgreSQL store URL) run every effect to exactly one ack while two of them are
SIGKILLed. (PostgreSQL restarted
under such engines: test_postgres_restart.py.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_core import Event, ExecutionContext, Executor, ExecutorLoop, ManualClock, PulseError
from pulse_core._effects import effect_draft
from pulse_core._lease import owner_host
from pulse_core.store import EventStore, open_event_store
from tests.e2e.support import Child
from tests.fleet.engine_host import Work, read_journal
from tests.fleet.fleet_support import (
    acked_work,
    append_work,
    check_effects,
    ready,
    until,
)

TEST_TIME_LIMIT_S = 90




class Runs(Executor):
    """Runs `Work` in the test's own loop and remembers (n, attempt) of each run."""

    handles = (Work,)
    timeout = 5.0

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []

    async def execute(self, effect: Work, ctx: ExecutionContext) -> None:
        self.runs.append((effect.n, ctx.attempt))


async def _claim_of_killed_host(store: EventStore, spawn_host: Callable[..., Child],
                                url: str, tmp_path: Path) -> Event:
    """An effect claimed by host `host-b`, whose process was then SIGKILLed mid-effect;
    returns the claim."""
    host = spawn_host("host-b", url, "--first-attempt-seconds", "600", "--timeout", "900")
    await ready(host)
    (effect,) = (await store.append([effect_draft(Work(n=1), origin="agent")])).events

    async def begun() -> bool:
        return bool(read_journal(tmp_path / "journal"))

    await until(begun, 30, "host-b to begin the effect", host)
    host.kill()
    (claim,) = await store.read(kinds=["effect-executing"], key=effect.key)
    assert owner_host(claim.data["owner"]) == "host-b" and claim.data["pid"] == host.pid
    return claim


async def test_a_claim_of_a_killed_process_on_another_host_is_taken_only_once_its_lease_ends(
    store_url: str, spawn_host: Callable[..., Child], tmp_path: Path
) -> None:
    store = await open_event_store(store_url)
    try:
        claim = await _claim_of_killed_host(store, spawn_host, store_url, tmp_path)
        clock = ManualClock(int(time.time() * 1000))
        runs = Runs()
        loop = ExecutorLoop(store, [runs], clock=clock, host="host-a")
        await loop.run_until_idle()  # host-a sees the claim: its lease counts from now
        assert runs.runs == []  # its process is dead, but host-a cannot know that
        clock.advance(claim.data["lease_ms"] - 1)
        await loop.run_until_idle()
        assert runs.runs == []  # a millisecond before the lease ends
        clock.advance(1)
        await loop.run_until_idle()
        assert runs.runs == [(1, 2)]
    finally:
        await store.close()


async def test_a_claim_of_a_killed_process_on_the_same_host_is_taken_at_once(
    store_url: str, spawn_host: Callable[..., Child], tmp_path: Path
) -> None:
    store = await open_event_store(store_url)
    try:
        await _claim_of_killed_host(store, spawn_host, store_url, tmp_path)
        runs = Runs()
        await ExecutorLoop(store, [runs], clock=ManualClock(int(time.time() * 1000)),
                           host="host-b").run_until_idle()
        assert runs.runs == [(1, 2)]  # its lease runs for 15 more minutes
    finally:
        await store.close()


async def test_a_host_name_that_cannot_name_a_machine_is_refused(tmp_path: Path) -> None:
    store = await open_event_store(f"sqlite://{tmp_path / 'events.db'}")
    try:
        for bad in ("", "two words", "tab\there", "x" * 256):
            with pytest.raises(PulseError, match="host name must be"):
                ExecutorLoop(store, [], host=bad)
        assert ExecutorLoop(store, [], host="x" * 255).host == "x" * 255
    finally:
        await store.close()


def test_the_host_of_a_claim_is_read_back_whole_even_when_it_holds_colons() -> None:
    assert owner_host("rack-7:db:4242:0123456789ab") == "rack-7:db"
    assert owner_host("node-1:4242:0123456789ab") == "node-1"
    assert owner_host("elsewhere") == ""


# -- four hosts, two of them killed --------------------------------------------------------

EFFECTS = 1_000
HOSTS = ("host-a", "host-b", "host-c", "host-d")
KILLED = HOSTS[:2]
# A lease of 3 s (executor timeout 2 s + 1 s grace): a killed host's attempts are claimed
# again within seconds. Each execution takes 200 ms, so 32 slots need 6 s or more for them
# all: a kill when a quarter have begun finds each host busy with several.
FLEET_OPTIONS = ("--concurrency", "8", "--work-seconds", "0.2", "--timeout", "2",
                 "--lease-grace-ms", "1000", "--scan-interval", "0.5")


async def test_four_hosts_ack_every_effect_exactly_once_while_two_of_them_are_killed(
    pg_url: str, spawn_host: Callable[..., Child], tmp_path: Path
) -> None:
    hosts = {name: spawn_host(name, pg_url, *FLEET_OPTIONS) for name in HOSTS}
    await ready(*hosts.values())
    store = await open_event_store(pg_url)
    try:
        await append_work(store, EFFECTS)
        journal = tmp_path / "journal"

        async def quarter_begun() -> bool:
            return len(read_journal(journal)) >= EFFECTS // 4

        await until(quarter_begun, 60, "a quarter of the effects to begin", *hosts.values())
        for name in KILLED:  # each killed while it runs an attempt not yet acked

            async def busy(name: str = name) -> bool:
                begun = {x.effect_id for x in read_journal(journal) if x.host == name}
                acked = {e.key for e in await store.read(kinds=["effect-acked"])}
                return bool(begun - acked)

            await until(busy, 60, f"{name} to run an attempt", hosts[name],
                        *(hosts[n] for n in HOSTS if n not in KILLED))
            hosts[name].kill()
        survivors = [hosts[name] for name in HOSTS if name not in KILLED]

        async def all_acked() -> bool:
            return await acked_work(store) >= EFFECTS

        await until(all_acked, 60, "every effect to be acked", *survivors)
        for host in survivors:
            assert host.stop() == 0, host.describe()
        events = await store.read()
    finally:
        await store.close()
    executions = read_journal(journal)
    run = check_effects(events, executions)
    assert run.effects == EFFECTS
    assert set(run.abandoned) <= set(KILLED), run  # only the killed hosts left attempts
    assert all(run.abandoned[name] for name in KILLED), f"a kill caught nothing: {run}"
    executed_by = {x.host for x in executions}
    assert executed_by == set(HOSTS), executed_by
    print(f"\n{EFFECTS} effects, {run.claims} claims, {run.executions} executions: "
          f"{run.repeated} repeated after the kills (attempts abandoned: "
          f"{dict(run.abandoned)})")
