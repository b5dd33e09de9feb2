"""The engines sharing a log, read from it: an engine records its start, a heartbeat (its
loops, its last tick) every heartbeat_s and its stop; the fleet fold says which are live,
stale (they missed MISSED_BEATS heartbeats without stopping) or stopped, and the claims each
holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pulse_core import (
    Effect,
    Engine,
    EngineHeartbeat,
    EngineInstance,
    Event,
    EventDraft,
    ExecutionContext,
    Executor,
    LoopBeat,
    PulseError,
    SqliteEventStore,
    read_fleet,
)
from pulse_core._effects import effect_draft
from pulse_core._fleet import MISSED_BEATS, STOPPED_KEPT, heartbeat_draft

OWNER_A = "host-a:101:aaaaaaaaaaaa"
OWNER_B = "host-b:202:bbbbbbbbbbbb"
EVERY_MS = 1_000


class Held(Effect, tag="fleet-test-held"):
    """An effect a test claims by hand."""

    n: int


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


def started(owner: str, pid: int, heartbeat_ms: int | None = EVERY_MS) -> EventDraft:
    data: dict[str, object] = {"pid": pid, "owner": owner}
    if heartbeat_ms is not None:
        data |= {"host": owner.split(":", maxsplit=1)[0], "heartbeat_ms": heartbeat_ms}
    return EventDraft("engine-started", "engine", data, origin="engine")


def beat(owner: str, pid: int, tick: int) -> EventDraft:
    return heartbeat_draft(EngineHeartbeat(
        owner, owner.split(":", maxsplit=1)[0], pid, EVERY_MS, tick, 1_000 + tick,
        [LoopBeat("tick", "running"), LoopBeat("watcher:w", "backoff", 2, "it broke")],
        "1.2.3", "abc123"))


def claim(effect: Event, owner: str, lease_until: int) -> EventDraft:
    return EventDraft("effect-executing", effect.key, {
        "attempt": 1, "lease_until": lease_until, "lease_ms": 30_000, "owner": owner,
        "pid": int(owner.split(":")[1]), "started": 0.0}, origin="executor:test",
        cause=effect.seq)


async def test_two_engines_are_live_with_their_own_tick_loops_and_leases(
        store: SqliteEventStore) -> None:
    await store.append([started(OWNER_A, 101), started(OWNER_B, 202)])
    effects = (await store.append([effect_draft(Held(n=n), "agent") for n in (1, 2)])).events
    await store.append([claim(effects[0], OWNER_A, 5_000), claim(effects[1], OWNER_B, 9_000)])
    await store.append([beat(OWNER_A, 101, 7), beat(OWNER_B, 202, 9)])
    last = (await store.read(newest_first=True, limit=1))[0].ts
    found = {e.owner: e for e in await read_fleet(store, last)}
    a, b = found[OWNER_A], found[OWNER_B]
    assert (a.state, a.host, a.pid, a.tick, a.last_tick_at) == ("live", "host-a", 101, 7, 1_007)
    assert (b.state, b.tick) == ("live", 9)
    assert [(x.effect_id, x.lease_until) for x in a.leases] == [(effects[0].key, 5_000)]
    assert [(x.effect_id, x.type) for x in b.leases] == [(effects[1].key, "fleet-test-held")]
    assert a.leases[0].expired  # 5000 ms after the epoch is long past
    assert a.loops[1] == LoopBeat("watcher:w", "backoff", 2, "it broke")
    assert (a.version, a.revision) == ("1.2.3", "abc123")
    # acked: the lease is no longer held
    await store.append([EventDraft("effect-acked", effects[0].key, {"attempt": 1},
                                   origin="executor:test", cause=effects[0].seq)])
    assert {e.owner: e.leases for e in await read_fleet(store, last)}[OWNER_A] == []


async def test_an_engine_that_misses_its_heartbeats_is_stale_and_one_that_stopped_is_stopped(
        store: SqliteEventStore) -> None:
    await store.append([started(OWNER_A, 101), started(OWNER_B, 202)])
    await store.append([beat(OWNER_A, 101, 1), beat(OWNER_B, 202, 1)])
    seen = (await store.read(newest_first=True, limit=1))[0].ts
    limit = seen + MISSED_BEATS * EVERY_MS
    assert {e.state for e in await read_fleet(store, limit)} == {"live"}
    assert {e.state for e in await read_fleet(store, limit + 1)} == {"stale"}
    await store.append([EventDraft("engine-stopped", "engine",
                                   {"pid": 202, "interrupted": 0, "owner": OWNER_B},
                                   origin="engine")])
    states = {e.owner: e.state for e in await read_fleet(store, limit + 1)}
    assert states == {OWNER_A: "stale", OWNER_B: "stopped"}


async def test_an_engine_that_recorded_no_heartbeat_period_is_stale_and_old_stops_are_cut(
        store: SqliteEventStore) -> None:
    await store.append([started("old:1:cccccccccccc", 1, heartbeat_ms=None)])
    assert [e.state for e in await read_fleet(store, 0)] == ["stale"]
    for n in range(STOPPED_KEPT + 2):
        owner = f"h:{n + 10}:dddddddddddd"
        await store.append([started(owner, n + 10)])
        await store.append([EventDraft("engine-stopped", "engine", {"pid": n + 10,
                                                                    "owner": owner},
                                       origin="engine")])
    listed = await read_fleet(store, 0)
    assert sum(e.state == "stopped" for e in listed) == STOPPED_KEPT
    assert listed[0].owner == f"h:{STOPPED_KEPT + 11}:dddddddddddd"  # newest start first


class Slow(Executor):
    handles = (Held,)
    timeout = 30.0

    async def execute(self, effect: Held, ctx: ExecutionContext) -> None:
        await asyncio.sleep(30)


async def test_a_running_engine_records_heartbeats_with_its_loops_tick_and_lease(
        tmp_path: Path) -> None:
    async with Engine(tmp_path / "home", executors=[Slow()], heartbeat_s=0.1,
                      default_tick_ms=100, drain_timeout=0.1) as engine:
        engine.revision = "rev-1"
        await engine.append([effect_draft(Held(n=1), "agent")])
        owner = engine.executor_loop.owner
        for _ in range(600):  # until a heartbeat shows a tick and the claim
            fleet = await read_fleet(engine.events, engine.clock.now_ms())
            mine = next(e for e in fleet if e.owner == owner)
            if mine.tick and mine.leases and mine.revision:
                break
            await asyncio.sleep(0.05)
        beats = await engine.events.read(kinds=["engine-heartbeat"], key=f"engine@{owner}")
    assert mine.state == "live" and mine.tick and mine.last_tick_at is not None
    assert mine.every_ms == 100 and mine.revision == "rev-1"
    assert {"tick", "executors", "heartbeat"} <= {loop.name for loop in mine.loops}
    assert [lease.type for lease in mine.leases] == ["fleet-test-held"]
    body = msgspec.convert(beats[-1].data, EngineHeartbeat)
    assert (body.owner, body.pid, body.every_ms) == (owner, mine.pid, 100)
    stopped = (await read_stopped(tmp_path / "home"))
    assert stopped.data["owner"] == owner
    after = {e.owner: e.state for e in await read_fleet_at(tmp_path / "home")}
    assert after[owner] == "stopped"


async def read_stopped(home: Path) -> Event:
    events = await SqliteEventStore.open(home / "events.db")
    try:
        return (await events.read(kinds=["engine-stopped"]))[-1]
    finally:
        await events.close()


async def read_fleet_at(home: Path) -> list[EngineInstance]:
    events = await SqliteEventStore.open(home / "events.db")
    try:
        return await read_fleet(events, 0)
    finally:
        await events.close()


def test_a_heartbeat_period_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PulseError, match="heartbeat_s=0"):
        Engine(tmp_path, heartbeat_s=0)
