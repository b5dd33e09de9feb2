"""PostgreSQL restarted (pg_ctl restart) under engines running effects and a producer
appending: every engine reconnects, nothing is lost or doubled, the outage is recorded in
the log, and no loop ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec

from pulse_core import StoreUnavailable
from pulse_core._effects import effect_draft
from pulse_core.store import EventStore, open_event_store
from tests.e2e.support import Child
from tests.fleet.engine_host import HostWork, Work, read_journal
from tests.fleet.fleet_support import acked_work, check_effects, ready, until
from tests.servers import PostgresServer

TEST_TIME_LIMIT_S = 90

EFFECTS = 600
PER_APPEND = 5
HOSTS = ("host-a", "host-b", "host-c")
# The engines never read the log on a timer here (the scan interval outlasts the test): an
# idle engine learns of a new effect only from a NOTIFY on its LISTEN connection. Each runs
# 4 effects at once for 0.05 s each, 240 a second for the three, fewer than the producer
# offers: every engine is busy when the server goes down (an idle one meets no outage to
# record, and the test asserts each recorded one).
OPTIONS = ("--concurrency", "4", "--work-seconds", "0.05", "--timeout", "5",
           "--lease-grace-ms", "1000", "--scan-interval", "600")



async def produce(store: EventStore, failed: Counter[str]) -> None:
    """Append EFFECTS Work effects, PER_APPEND to an append, each with an idempotency key; an
    append the store refuses as unavailable is made again, the same drafts (ids and keys),
    until it is stored (counted in `failed`)."""
    for first in range(0, EFFECTS, PER_APPEND):
        drafts = [msgspec.structs.replace(effect_draft(Work(n=n), origin="agent"),
                                          idem=f"produce-{n}")
                  for n in range(first, first + PER_APPEND)]
        while True:
            try:
                await store.append(drafts)
                break
            except StoreUnavailable:
                failed["appends"] += 1
                await asyncio.sleep(0.1)
        await asyncio.sleep(0.01)  # a steady stream rather than one burst


async def test_engines_ride_out_a_postgresql_restart_under_load_losing_and_doubling_nothing(
    restartable: PostgresServer, spawn_host: Callable[..., Child], tmp_path: Path
) -> None:
    url = restartable.create_database()
    hosts = {name: spawn_host(name, url, *OPTIONS) for name in HOSTS}
    await ready(*hosts.values())
    owners = {name: host.wait_for_line("ready", 1).split()[2] for name, host in hosts.items()}
    store = await open_event_store(url)
    failed: Counter[str] = Counter()
    producer = asyncio.create_task(produce(store, failed))
    try:
        async def under_load() -> bool:
            return await acked_work(store) >= EFFECTS // 4

        await until(under_load, 60, "a quarter of the effects to be acked", *hosts.values())
        await asyncio.to_thread(restartable.restart)
        await asyncio.wait_for(producer, 60)

        async def all_acked() -> bool:
            with contextlib.suppress(StoreUnavailable):
                return await acked_work(store) >= EFFECTS
            return False

        await until(all_acked, 60, "every effect to be acked after the restart",
                    *hosts.values())
        # Now every engine is idle: one effect bound to each host runs only if that host's
        # LISTEN connection came back after the restart.
        await store.append([effect_draft(HostWork(n=n), origin="agent", host=name)
                            for n, name in enumerate(HOSTS)])

        async def each_host_woke() -> bool:
            return await acked_work(store) >= EFFECTS + len(HOSTS)

        await until(each_host_woke, 30, "each idle host to run the effect bound to it",
                    *hosts.values())
        for host in hosts.values():
            assert host.stop() == 0, host.describe()
        events = await store.read()
    finally:
        producer.cancel()
        with contextlib.suppress(BaseException):
            await producer
        await store.close()

    assert failed["appends"] > 0, "the restart cut no append short: it was not under load"
    executions = read_journal(tmp_path / "journal")
    run = check_effects(events, executions)
    assert run.effects == EFFECTS + len(HOSTS)
    bound = {e.key: e.data["host"] for e in events
             if e.kind == "effect" and e.data["effect"]["type"] == HostWork.tag()}
    assert {(x.effect_id, x.host) for x in executions if x.effect_id in bound} == set(
        bound.items()), "an effect bound to a host ran elsewhere"
    idems = Counter(e.idem for e in events if e.idem and e.idem.startswith("produce-"))
    assert sorted(idems) == sorted(f"produce-{n}" for n in range(EFFECTS))
    assert set(idems.values()) == {1}, "an append made again was stored twice"
    outages = [e for e in events if e.kind == "error" and "was unavailable for" in
               str(e.data.get("message"))]
    for name, owner in owners.items():
        assert any(owner in str(e.data["message"]) for e in outages), (
            f"{name} recorded no outage: {[e.data for e in events if e.kind == 'error']}")
    for name, host in hosts.items():
        loops = json.loads(host.wait_for_line("loops", 1).removeprefix("loops "))
        assert loops and all(loop["state"] == "running" for loop in loops), (name, loops)
    print(f"\n{failed['appends']} appends made again; {run.claims} claims, {run.executions} "
          f"executions ({run.repeated} repeated; attempts abandoned: {dict(run.abandoned)}); "
          f"{len(outages)} outage reports")
