"""Seed 004, section 37, invariant 20: maintenance improves future cognition without falsifying
the past. A full cycle over a home with something for every step only appends: each row stored
before it is byte for byte what it was, and what memory said is still said."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse_adapters.maintenance import run_cycle
from pulse_core import Event, EventDraft, ManualClock, MemoryBoard, SqliteEventStore
from pulse_core.maintenance._beliefs import BeliefBoard
from pulse_core.maintenance._sleep import SleepBoard
from pulse_core.maintenance._watches import WatchArmed, WatchCondition, arm_watch
from pulse_core.memory import Memory, identity_key
from pulse_core.store._base import EventStore

DAY = 86_400_000
HOUR = 3_600_000


def raw_rows(path: Path) -> list[tuple[Any, ...]]:
    """Every stored row as SQLite holds it, bytes and all."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT * FROM events ORDER BY seq").fetchall()


async def memory_said(store: EventStore) -> dict[str, Any]:
    """What the Memory projection holds per identity: state items, exchanges, observations."""
    projection = Memory()
    state = projection.initial()
    for event in await store.read(kinds=projection.kinds):
        state = projection.apply(state, event)
    return {i: (m.state, m.exchanges, m.facts, m.unresolved) for i, m in state.items()}


async def busy_home(store: EventStore, clock: ManualClock) -> None:
    board = MemoryBoard(store)
    old = [(await board.exchange("ana", f"old {i}")).data["record"] for i in range(4)]
    await board.set_state("ana", "city", "Lisbon", confidence=0.6)
    await board.fact("ana", "works nights")
    clock.advance(40 * DAY)
    key = identity_key("ana")
    await store.append([
        EventDraft("insight-recorded", key, {"record": "i-1", "text": "Lisbon",
                                             "derived_from": ["city", old[1]],
                                             "activity": "seed"}, origin="agent"),
        EventDraft("element-consolidated", key, {"records": old[:2], "to": "ana/i-1"},
                   origin="agent"),
        EventDraft("memory-reinforced", key, {"record": old[0], "strength": 0.05},
                   origin="agent"),
        EventDraft("commitment-made", key, {"record": "c-1", "text": "call back",
                                            "due_at": clock.now_ms() - HOUR}, origin="agent"),
    ])
    await BeliefBoard(store, "agent").assert_("ana", "mood", "calm")
    await BeliefBoard(store, "human:ana").assert_("ana", "mood", "tense")
    await SleepBoard(store, "agent").create("review_derived", subject="ana/i-1",
                                            assigned_to="maintenance")
    await arm_watch(store, "w", WatchArmed(watch_class="silence", condition=WatchCondition(
        key_prefix="identity:bob"), due_at=clock.now_ms() + HOUR), origin="agent")
    await board.set_state("ana", "city", "Porto", confidence=0.9)
    clock.advance(2 * HOUR)


async def test_invariant_20_maintenance_improves_future_cognition_without_falsifying_the_past(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path, clock=clock)
    await busy_home(store, clock)
    rows_before = await store.read_rows()
    raw_before = raw_rows(path)
    said_before = await memory_said(store)

    report = await run_cycle(store, clock=clock)
    clock.advance(DAY)
    await run_cycle(store, clock=clock)

    rows_after = await store.read_rows()
    raw_after = raw_rows(path)
    assert rows_after[:len(rows_before)] == rows_before
    assert raw_after[:len(raw_before)] == raw_before  # byte for byte, every column
    added = rows_after[len(rows_before):]
    assert added and [r.seq for r in added] == list(
        range(len(rows_before) + 1, len(rows_after) + 1))  # only additions, in order
    # it did improve something: decayed, flagged, archived, fired, surfaced
    assert {"decayed", "stale_flagged", "archived", "watches_fired",
            "overdue_surfaced"} <= report.changes.keys()
    said_after = await memory_said(store)
    state_before, exchanges_before, facts_before, _ = said_before["ana"]
    state_after, exchanges_after, facts_after, _ = said_after["ana"]
    assert state_after == state_before  # values and confidences as they were
    assert exchanges_after == exchanges_before and facts_after == facts_before
    await store.close()


OPS = st.lists(st.one_of(
    st.tuples(st.just("exchange"), st.sampled_from(["ana", "bob"])),
    st.tuples(st.just("state"), st.sampled_from(["ana", "bob"]),
              st.floats(min_value=0.0, max_value=1.0)),
    st.tuples(st.just("commitment"), st.sampled_from(["ana", "bob"]),
              st.integers(min_value=-3, max_value=3)),
    st.tuples(st.just("advance"), st.integers(min_value=1, max_value=20)),
    st.tuples(st.just("cycle"),),
), min_size=1, max_size=14)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_any_run_of_cycles_over_any_home_only_appends_and_keeps_what_memory_said(
    tmp_path: Path, ops: list[tuple[Any, ...]],
) -> None:
    asyncio.run(_only_appends(tmp_path, ops))


async def _only_appends(tmp_path: Path, ops: list[tuple[Any, ...]]) -> None:
    clock = ManualClock()
    with tempfile.TemporaryDirectory(dir=tmp_path) as home:
        store = await SqliteEventStore.open(Path(home) / "events.db", clock=clock)
        board = MemoryBoard(store)
        for n, op in enumerate([*ops, ("cycle",)]):
            if op[0] == "exchange":
                await board.exchange(op[1], f"message {n}")
            elif op[0] == "state":
                await board.set_state(op[1], "mood", f"m{n}", confidence=op[2])
            elif op[0] == "commitment":
                await store.append([EventDraft("commitment-made", identity_key(op[1]), {
                    "record": f"c-{n}", "text": "do it",
                    "due_at": clock.now_ms() + op[2] * HOUR}, origin="agent")])
            elif op[0] == "advance":
                clock.advance(op[1] * HOUR)
            else:
                before = await store.read_rows()
                said = await memory_said(store)
                await run_cycle(store, clock=clock)
                after = await store.read_rows()
                assert after[:len(before)] == before
                assert all(r.origin.startswith("executor:maintenance")
                           for r in after[len(before):] if isinstance(r, Event))
                now_said = await memory_said(store)
                for identity, (state, exchanges, _, _) in said.items():
                    assert now_said[identity][0] == state  # confidence and values as they were
                    assert now_said[identity][1] == exchanges
        await store.close()
