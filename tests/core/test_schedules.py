"""Schedules: due times folded from the log survive restarts, jitter is fixed, DailyAt keeps
local time across DST, and concurrent fires of one due time make one event."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_core._clock import ManualClock
from pulse_core._errors import InvalidEvent
from pulse_core._events import EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._projector import Projector
from pulse_core.maintenance._schedules import (
    MAX_MS,
    AfterEvents,
    DailyAt,
    Every,
    LastFire,
    Schedules,
    SchedulesState,
    fire_schedule,
    is_due,
    jitter_ms,
    ms_until_due,
    next_due,
)
from pulse_core.store import SqliteEventStore
from pulse_core.store._base import EventStore

register_kind("schedule-note", "a note the schedule tests write")
register_kind("schedule-other", "another kind the schedule tests write")
H = 3_600_000


async def note(store: EventStore, kind: str = "schedule-note", n: int = 1) -> None:
    await store.append([EventDraft(kind, "notes", {"i": i}) for i in range(n)])


async def state_of(store: EventStore) -> SchedulesState:
    states = await Projector(store, [Schedules()]).catch_up()
    result: SchedulesState = states["schedules"]
    return result


async def test_a_restart_keeps_the_due_time(tmp_path: Path) -> None:
    clock = ManualClock()
    every = Every("sweep", 12 * 3600, 24 * 3600)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    due = next_due(every, await state_of(store), clock.now_ms())
    assert due is not None and due <= clock.now_ms()  # never fired: due at the log's start
    fired = await fire_schedule(store, every, due, clock.advance(1_000))
    assert fired is not None
    after = next_due(every, await state_of(store), clock.now_ms())
    assert 12 * H <= after - fired.data["fired_at"] <= 24 * H
    checkpointed = Projector(store, [Schedules()], checkpoints=tmp_path / "checkpoints")
    await checkpointed.catch_up()
    await checkpointed.checkpoint()
    await store.close()

    clock.advance(5 * H)
    reopened = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    assert next_due(every, await state_of(reopened), clock.now_ms()) == after
    assert not is_due(every, await state_of(reopened), clock.now_ms())
    resumed = Projector(reopened, [Schedules()], checkpoints=tmp_path / "checkpoints")
    assert resumed.seq == fired.seq  # resumed from the checkpoint, not from seq 0
    assert next_due(every, (await resumed.catch_up())["schedules"], clock.now_ms()) == after
    await reopened.close()


async def test_first_after_s_delays_the_first_fire_from_the_logs_start(tmp_path: Path
                                                                        ) -> None:
    clock = ManualClock()
    every = Every("sweep", 60, 120, first_after_s=600)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    start = clock.now_ms()
    clock.advance(100_000)
    state = await state_of(store)
    assert next_due(every, state, clock.now_ms()) == start + 600_000
    assert ms_until_due([every], state, clock.now_ms()) == 500_000
    assert await fire_schedule(store, every, start + 600_000, clock.now_ms()) is None  # not yet
    clock.advance(500_000)
    assert await fire_schedule(store, every, start + 600_000, clock.now_ms()) is not None
    await store.close()


@given(st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and
                                               not any(c.isspace() for c in s)),
       st.integers(0, 10_000), st.integers(1, 10**6), st.integers(0, 10**6))
def test_jitter_is_deterministic_and_within_min_and_max(name: str, count: int, low: int,
                                                        spread: int) -> None:
    every = Every(name, low, low + spread)
    ms = jitter_ms(every, count)
    assert ms == jitter_ms(Every(name, low, low + spread), count)
    assert low * 1000 <= ms <= (low + spread) * 1000


def test_jitter_varies_with_the_fire_count() -> None:
    every = Every("sweep", 12 * 3600, 24 * 3600)
    assert len({jitter_ms(every, count) for count in range(20)}) > 10


async def test_daily_at_keeps_local_time_across_a_dst_change(tmp_path: Path) -> None:
    lisbon = ZoneInfo("Europe/Lisbon")
    # 2026-03-29 01:00 UTC Lisbon moves from UTC+0 to UTC+1.
    start = int(dt.datetime(2026, 3, 27, 12, 0, tzinfo=lisbon).timestamp() * 1000)
    clock = ManualClock(start)
    daily = DailyAt("nightly", "03:00", tz="Europe/Lisbon")
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    fires, dues = [], []
    for _ in range(3):
        due = next_due(daily, await state_of(store), clock.now_ms())
        assert due is not None
        clock.advance(due - clock.now_ms() + 5)
        assert await fire_schedule(store, daily, due, clock.now_ms()) is not None
        fires.append(dt.datetime.fromtimestamp(due / 1000, lisbon))
        dues.append(due)
    assert [(f.day, f.hour, f.minute) for f in fires] == [(28, 3, 0), (29, 3, 0), (30, 3, 0)]
    assert [(b - a) / H for a, b in itertools.pairwise(dues)] == [23.0, 24.0]
    await store.close()


async def test_a_daily_slot_fired_at_its_exact_millisecond_is_next_due_a_day_later(
    tmp_path: Path,
) -> None:
    three_am = int(dt.datetime(2026, 5, 4, 3, 0, tzinfo=dt.UTC).timestamp() * 1000)
    clock = ManualClock(three_am)  # the home is born on the slot: it is due at once
    daily = DailyAt("nightly", "03:00")
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    assert next_due(daily, await state_of(store), three_am) == three_am
    assert await fire_schedule(store, daily, three_am, three_am) is not None
    state = await state_of(store)
    assert next_due(daily, state, three_am) == three_am + 24 * H
    assert not is_due(daily, state, three_am)
    assert await fire_schedule(store, daily, three_am, three_am) is None
    assert len(await store.read(kinds=["schedule-fired"])) == 1
    await store.close()


async def test_two_concurrent_fires_of_one_due_time_make_one_event(tmp_path: Path) -> None:
    one = await SqliteEventStore.open(tmp_path / "events.db")
    two = await SqliteEventStore.open(tmp_path / "events.db")
    every = Every("sweep", 60, 120)
    await note(one)
    for store in (one, two):
        assert is_due(every, await state_of(store), 2**60)
    due = next_due(every, await state_of(one), 0)
    assert due is not None
    now = due + 1
    results = await asyncio.gather(
        *(fire_schedule(s, every, due, now) for s in (one, two, one, two)))
    assert sum(r is not None for r in results) == 1
    assert len(await one.read(kinds=["schedule-fired"])) == 1
    # a cycle still holding the old state cannot fire it again
    assert await fire_schedule(two, every, due, now + 10**9) is None
    await one.close()
    await two.close()


async def test_after_events_is_due_after_n_new_events_of_its_kinds(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    notes = AfterEvents("backlog", 3, kinds=("schedule-note",))
    anything = AfterEvents("busy", 4)
    await note(store, n=2)
    await note(store, "schedule-other", n=2)
    state = await state_of(store)
    assert not is_due(notes, state, clock.now_ms()) and is_due(anything, state, 0)
    assert next_due(notes, state, clock.now_ms()) is None
    assert await fire_schedule(store, notes, clock.now_ms(), clock.now_ms()) is None  # 2 < 3
    await note(store)
    state = await state_of(store)
    assert is_due(notes, state, clock.now_ms())
    assert await fire_schedule(store, notes, clock.now_ms(), clock.now_ms()) is not None
    # counted anew
    assert await fire_schedule(store, notes, clock.now_ms(), clock.advance(1)) is None
    state = await state_of(store)
    assert not is_due(notes, state, clock.now_ms())
    assert is_due(anything, state, 0)  # its own count is untouched by the other's fire
    await note(store, n=3)
    assert is_due(notes, await state_of(store), clock.now_ms())
    await store.close()


def test_bad_rhythms_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="min_s <= max_s"):
        Every("x", 10, 5)
    with pytest.raises(ValueError, match="HH:MM"):
        DailyAt("x", "3am")
    with pytest.raises(ValueError, match="n must be"):
        AfterEvents("x", 0)
    with pytest.raises(Exception, match="Nowhere"):
        DailyAt("x", "03:00", tz="Nowhere/City")


def test_daily_at_is_25_hours_apart_when_the_clocks_fall_back() -> None:
    lisbon = ZoneInfo("Europe/Lisbon")  # 2026-10-25 02:00 local goes back to 01:00
    daily = DailyAt("nightly", "03:00", tz="Europe/Lisbon")
    fired = int(dt.datetime(2026, 10, 24, 3, 0, 7, tzinfo=lisbon).timestamp() * 1000)
    state = SchedulesState(fires=PersistentMap(
        {"nightly": LastFire(fired - 7_000, fired, 1, 1, 2)}), start_ms=0)
    due = next_due(daily, state, fired)
    local = dt.datetime.fromtimestamp(due / 1000, lisbon)
    assert (local.day, local.hour, local.minute) == (25, 3, 0)
    assert due - (fired - 7_000) == 25 * H


async def test_a_forged_fire_far_in_the_future_does_not_freeze_the_schedule(tmp_path: Path
                                                                            ) -> None:
    """fired_at and due_at are taken as at most the event's own ts: a fire claiming to be
    from the year 9999 counts as a fire now, and the rhythm goes on."""
    clock = ManualClock()
    every = Every("sweep", 3600, 3600)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    forged_at = clock.now_ms()
    await store.append([EventDraft("schedule-fired", "schedule:sweep",
                                   {"due_at": MAX_MS, "fired_at": MAX_MS, "seq": 0},
                                   origin="engine")])
    fire = (await state_of(store)).fires.get("sweep")
    assert fire is not None and (fire.due_at, fire.fired_at) == (forged_at, forged_at)
    clock.advance(H + 1)
    due = next_due(every, await state_of(store), clock.now_ms())
    assert due == forged_at + H and is_due(every, await state_of(store), clock.now_ms())
    assert await fire_schedule(store, every, due, clock.now_ms()) is not None
    await store.close()


async def test_schedule_fires_with_absurd_values_are_refused_at_append(tmp_path: Path
                                                                       ) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    for data in ({"due_at": -2**62, "fired_at": 0, "seq": 0},
                 {"due_at": 0, "fired_at": -1, "seq": 0},
                 {"due_at": 0, "fired_at": 0, "seq": -1},
                 {"due_at": 2**62, "fired_at": 0, "seq": 0}):
        with pytest.raises(InvalidEvent):
            await store.append([EventDraft("schedule-fired", "schedule:sweep", data,
                                           origin="engine")])
    await store.close()


async def test_a_fire_written_by_an_agent_or_a_human_does_not_count(tmp_path: Path) -> None:
    """Only the machinery that runs schedules (engine, executor, rule, survival, cli) records
    their fires: an agent's schedule-fired cannot postpone maintenance."""
    clock = ManualClock()
    every = Every("sweep", 3600, 3600)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    start = clock.now_ms()
    clock.advance(10)
    for origin in ("agent", "human:ana", "watcher:x"):
        await store.append([EventDraft("schedule-fired", "schedule:sweep", {
            "due_at": clock.now_ms(), "fired_at": clock.now_ms(), "seq": 0}, origin=origin)])
    assert "sweep" not in (await state_of(store)).fires
    assert next_due(every, await state_of(store), clock.now_ms()) == start
    fired = await fire_schedule(store, every, start, clock.now_ms(), origin="executor:m")
    assert fired is not None and fired.version == 4  # expects the key's head, not the count
    with pytest.raises(InvalidEvent, match="origin"):
        await fire_schedule(store, every, start, clock.now_ms(), origin="agent")
    await store.close()


async def test_a_foreign_event_on_a_schedule_key_does_not_block_its_fires(tmp_path: Path
                                                                          ) -> None:
    clock = ManualClock()
    every = Every("sweep", 60, 60)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    due = next_due(every, await state_of(store), clock.now_ms())
    assert await fire_schedule(store, every, due, clock.now_ms()) is not None
    await store.append([EventDraft("schedule-note", "schedule:sweep", {}, origin="agent")])
    clock.advance(61_000)
    due = next_due(every, await state_of(store), clock.now_ms())
    assert await fire_schedule(store, every, due, clock.now_ms()) is not None
    await store.close()


async def test_a_squatted_idempotency_key_does_not_block_a_due_fire(tmp_path: Path) -> None:
    """Another event holding `schedule:<name>:<due_at>` as its idem does not stop the fire."""
    clock = ManualClock()
    every = Every("sweep", 60, 60)
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await note(store)
    due = next_due(every, await state_of(store), clock.now_ms())
    await store.append([EventDraft("schedule-note", "notes", {"x": 1}, origin="agent",
                                   idem=f"schedule:sweep:{due}")])
    assert await fire_schedule(store, every, due, clock.now_ms()) is not None
    assert "sweep" in (await state_of(store)).fires
    await store.close()
