"""Watches: delta watches fire on a matching committed change, silence watches when due_at
passes without one, each exactly once however many evaluators race."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pulse_core._clock import ManualClock
from pulse_core._errors import InvalidEvent, InvalidTransition
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._projector import Projector
from pulse_core.maintenance._activities import read_activity
from pulse_core.maintenance._sleep import SleepTasks
from pulse_core.maintenance._watches import (
    DecisionConflict,
    Watch,
    WatchArmed,
    WatchCondition,
    Watches,
    arm_watch,
    decide_watch,
    delta_fires,
    disarm_watch,
    evaluate_watches,
    matches,
    past_due,
    read_watch,
)
from pulse_core.store import SqliteEventStore
from pulse_core.store._base import EventStore

register_kind("watch-test-note", "a note the watch tests write")
ORIGIN = "executor:maintenance"
ON_ANA = WatchCondition(key_prefix="identity:ana", kinds=("watch-test-note",))


async def note(store: EventStore, key: str = "identity:ana", *, record: str = "r1",
               origin: str = "agent") -> int:
    result = await store.append([EventDraft("watch-test-note", key, {"record": record},
                                            origin=origin)])
    return result.events[0].seq


async def watches(store: EventStore) -> PersistentMap[str, Watch]:
    state: PersistentMap[str, Watch] = (await Projector(store, [Watches()]).catch_up())[
        "watches"]
    return state


async def test_a_delta_watch_fires_on_the_first_matching_change_and_makes_a_task(
        tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await note(store)  # before the watch: never a trigger
    await arm_watch(store, "w1", WatchArmed(watch_class="delta", condition=ON_ANA,
                                      reason="ana changed"), origin=ORIGIN)
    await note(store, "identity:bob")
    seq = await note(store)
    head = await note(store)
    result = await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)
    assert [(f.watch_id, f.trigger_seq, f.operation) for f in result.fired] == [
        ("w1", seq, f"watch_fire:w1:{seq}")]
    assert result.consumed_through == head  # the log as it was read; the fire came after
    task = (await Projector(store, [SleepTasks()]).catch_up())["sleep-tasks"][
        result.fired[0].produced]
    assert (task.task_class, task.subject, task.reason) == ("watch_review", "w1", "ana changed")
    activity = await read_activity(store, f"watch_fire:w1:{seq}")
    assert activity is not None and activity.activity_class == "watch_fire"
    assert activity.inputs == ("watch:w1", f"event:{seq}")
    again = await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)
    assert again.fired == ()
    await store.close()


async def test_condition_fields_all_have_to_match(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    condition = WatchCondition(key_prefix="identity:", record="r2", origin_prefix="human")
    await arm_watch(store, "w1", WatchArmed(watch_class="delta", condition=condition),
                    origin=ORIGIN)
    await note(store, record="r2", origin="agent")
    await note(store, record="r1", origin="human:ana")
    await note(store, "notes", record="r2", origin="human:ana")
    assert (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired == ()
    seq = await note(store, "identity:bob", record="r2", origin="human:ana")
    fired = (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired
    assert [f.trigger_seq for f in fired] == [seq]
    await store.close()


async def test_the_watch_machinery_never_triggers_a_watch(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    anything = WatchArmed(watch_class="delta")  # the empty condition matches any change
    await arm_watch(store, "w1", anything, origin=ORIGIN)
    await arm_watch(store, "w2", anything, origin=ORIGIN)
    assert (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired == ()
    await note(store)
    fired = (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired
    assert sorted(f.watch_id for f in fired) == ["w1", "w2"]
    await arm_watch(store, "w3", anything, origin=ORIGIN)  # w1's fire and task come after: no match
    assert (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired == ()
    await store.close()


async def test_a_silence_watch_fires_only_after_due_at_with_no_matching_change(
        tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    due = clock.now_ms() + 60_000
    await arm_watch(store, "quiet", WatchArmed(watch_class="silence", condition=ON_ANA, due_at=due,
                                         produces="wake"), origin=ORIGIN)
    await note(store, "identity:bob")
    early = await evaluate_watches(store, await watches(store), 0, clock.now_ms(), origin=ORIGIN)
    assert early.fired == () and early.satisfied == ()
    assert past_due(await watches(store), due) != []
    clock.advance(60_001)
    result = await evaluate_watches(store, await watches(store), early.consumed_through,
                            clock.now_ms(), origin=ORIGIN)
    assert [(f.watch_id, f.operation, f.produced) for f in result.fired] == [
        ("quiet", f"watch_fire:quiet:silence:{due}", "wake")]
    assert await store.read(kinds=["sleep-task-created"]) == []  # a wake makes no task
    assert (await read_watch(store, "quiet")).status == "fired"  # type: ignore[union-attr]
    await store.close()


async def test_a_change_by_due_at_satisfies_a_silence_watch(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    due = clock.now_ms() + 60_000
    await arm_watch(store, "quiet", WatchArmed(watch_class="silence", condition=ON_ANA, due_at=due),
              origin=ORIGIN)
    clock.advance(30_000)
    await note(store)
    clock.advance(60_000)  # past due, but the change came in time
    result = await evaluate_watches(store, await watches(store), 0, clock.now_ms(), origin=ORIGIN)
    assert (result.fired, result.satisfied) == ((), ("quiet",))
    assert (await read_watch(store, "quiet")).status == "satisfied"  # type: ignore[union-attr]
    await store.close()


async def test_silence_is_decided_only_after_the_log_is_consumed_through_due_at(
        tmp_path: Path) -> None:
    """A cursor behind the log must read the matching change before deciding: a state and a
    cursor from before the change never make a silence fire."""
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    due = clock.now_ms() + 60_000
    await arm_watch(store, "quiet", WatchArmed(watch_class="silence", condition=ON_ANA, due_at=due),
              origin=ORIGIN)
    stale, cursor = await watches(store), await store.last_seq()
    clock.advance(59_000)
    await note(store)
    clock.advance(10_000)
    result = await evaluate_watches(store, stale, cursor, clock.now_ms(), origin=ORIGIN)
    assert (result.fired, result.satisfied) == ((), ("quiet",))
    await store.close()


async def test_a_change_after_due_at_does_not_save_a_silence_watch(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    due = clock.now_ms() + 1_000
    await arm_watch(store, "quiet", WatchArmed(watch_class="silence", condition=ON_ANA, due_at=due),
              origin=ORIGIN)
    clock.advance(2_000)
    await note(store)
    result = await evaluate_watches(store, await watches(store), 0, clock.now_ms(), origin=ORIGIN)
    assert [f.watch_id for f in result.fired] == ["quiet"]
    await store.close()


async def test_two_concurrent_evaluators_fire_each_watch_exactly_once(tmp_path: Path) -> None:
    clock = ManualClock()
    stores = [await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
              for _ in range(3)]
    store = stores[0]
    due = clock.now_ms() + 1_000
    for i in range(5):
        await arm_watch(store, f"d{i}", WatchArmed(watch_class="delta", condition=ON_ANA),
                  origin=ORIGIN)
        await arm_watch(store, f"s{i}", WatchArmed(
            watch_class="silence", condition=WatchCondition(key_prefix="nowhere"),
            due_at=due), origin=ORIGIN)
    await note(store)
    clock.advance(2_000)
    state = await watches(store)
    results = await asyncio.gather(*(evaluate_watches(s, state, 0, clock.now_ms(), origin=ORIGIN)
                                     for s in stores for _ in range(2)))
    fired = sorted(f.watch_id for r in results for f in r.fired)
    assert fired == sorted([f"d{i}" for i in range(5)] + [f"s{i}" for i in range(5)])
    assert len(await store.read(kinds=["watch-fired"])) == 10
    assert len(await store.read(kinds=["sleep-task-created"])) == 10
    for s in stores:
        await s.close()


async def test_disarm_and_rearm(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    spec = WatchArmed(watch_class="delta", condition=ON_ANA)
    await arm_watch(store, "w1", spec, origin=ORIGIN)
    with pytest.raises(InvalidTransition, match="already armed"):
        await arm_watch(store, "w1", spec, origin=ORIGIN)
    await disarm_watch(store, "w1", origin=ORIGIN, reason="not needed")
    await note(store)
    assert (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired == ()
    await arm_watch(store, "w1", spec, origin=ORIGIN)
    seq = await note(store)
    fired = (await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)).fired
    assert [f.trigger_seq for f in fired] == [seq]
    with pytest.raises(InvalidTransition):
        await disarm_watch(store, "w1", origin=ORIGIN)
    await store.close()


async def test_decide_records_the_decision_once_per_fire(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(store, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    with pytest.raises(InvalidTransition, match="only a fired watch"):
        await decide_watch(store, "w1", "act", origin=ORIGIN)
    await note(store)
    await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)
    first = await decide_watch(store, "w1", "defer", "waiting for ana", inputs=("skill:s1",),
                         origin=ORIGIN)
    again = await decide_watch(store, "w1", "defer", "said again", origin="agent")
    assert first.ran and not again.ran and again.activity.report["decision"] == "defer"
    assert (await read_watch(store, "w1")).decision == "defer"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="decision"):
        await decide_watch(store, "w1", "maybe", origin=ORIGIN)
    await store.close()


def test_a_silence_watch_needs_a_due_time() -> None:
    with pytest.raises(ValueError, match="due_at"):
        WatchArmed(watch_class="silence")
    with pytest.raises(ValueError, match="delta or silence"):
        WatchArmed(watch_class="sometimes")


async def test_evaluators_with_different_cursors_still_fire_a_watch_once(tmp_path: Path
                                                                         ) -> None:
    """Each cursor sees another first match (another operation key): the watch's expected
    version, not only the activity key, keeps the second fire out."""
    one = await SqliteEventStore.open(tmp_path / "events.db")
    two = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(one, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    first = await note(one)
    await note(one)
    state = await watches(one)
    results = await asyncio.gather(evaluate_watches(one, state, 0, 0, origin=ORIGIN),
                                   evaluate_watches(two, state, first, 0, origin=ORIGIN))
    assert sum(len(r.fired) for r in results) == 1
    assert len(await one.read(kinds=["watch-fired"])) == 1
    assert len(await one.read(kinds=["sleep-task-created"])) == 1
    await one.close()
    await two.close()


async def test_a_different_decision_after_a_fire_raises_naming_the_stored_one(
        tmp_path: Path) -> None:
    """An agent's "act" after maintenance's "defer" is not silently dropped."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(store, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    await note(store)
    await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)
    await decide_watch(store, "w1", "defer", "surfaced for the agent", origin=ORIGIN)
    with pytest.raises(DecisionConflict, match=r"'defer'.*executor:maintenance") as caught:
        await decide_watch(store, "w1", "act", "page the on-call", origin="agent")
    assert isinstance(caught.value, InvalidTransition)  # callers catching that still do
    assert (caught.value.decision, caught.value.by) == ("defer", ORIGIN)
    watch = await read_watch(store, "w1")
    assert watch is not None and (watch.decision, watch.decided_by) == ("defer", ORIGIN)
    assert len(await store.read(kinds=["watch-decided"])) == 1
    await store.close()


async def test_a_decision_written_directly_still_conflicts_with_another(tmp_path: Path
                                                                        ) -> None:
    """A watch-decided appended without the gate activity: the same decision is recorded
    by the gate once, another decision raises."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(store, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    await note(store)
    await evaluate_watches(store, await watches(store), 0, 0, origin=ORIGIN)
    await store.append([EventDraft("watch-decided", "watch:w1", {"decision": "ask"},
                                   origin="human:ana")])
    with pytest.raises(DecisionConflict, match="human:ana"):
        await decide_watch(store, "w1", "act", origin="agent")
    same = await decide_watch(store, "w1", "ask", origin="agent")
    assert same.activity.report["decision"] == "ask"
    assert len(await store.read(kinds=["watch-decided"])) == 1
    await store.close()


async def test_the_budget_stops_at_a_page_boundary_and_the_cursor_resumes(tmp_path: Path
                                                                          ) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    await arm_watch(store, "late", WatchArmed(watch_class="delta", condition=WatchCondition(
        key_prefix="identity:late")), origin=ORIGIN)
    await arm_watch(store, "quiet", WatchArmed(
        watch_class="silence", condition=WatchCondition(key_prefix="identity:ana"),
        due_at=clock.now_ms() + 1_000), origin=ORIGIN)
    start = await store.last_seq()
    for i in range(25):
        await note(store, f"identity:bob{i}")
    seq = await note(store, "identity:late")
    clock.advance(5_000)
    state, cursor, rounds = await watches(store), start, 0
    while True:
        result = await evaluate_watches(store, state, cursor, clock.now_ms(), origin=ORIGIN,
                                        page=4, max_events=10)
        rounds += 1
        assert result.consumed_through - cursor <= 10  # never reads past the budget
        if not result.complete:
            assert result.fired == ()  # neither the delta's match nor the silence yet
        cursor = result.consumed_through
        if result.complete:
            break
    assert rounds == 3
    assert sorted((f.watch_id, f.trigger_seq) for f in result.fired) == [
        ("late", seq), ("quiet", None)]
    with pytest.raises(ValueError, match="max_events"):
        await evaluate_watches(store, state, cursor, 0, origin=ORIGIN, max_events=0)
    await store.close()


async def test_a_rearmed_watch_never_fires_on_a_change_before_its_arming(tmp_path: Path
                                                                         ) -> None:
    """A stale state's match belongs to the old arming: re-armed meanwhile, the watch waits
    for a change after its new arming."""
    one = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(one, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    stale = await watches(one)
    old = await note(one)
    second = await note(one)
    await evaluate_watches(one, await watches(one), old, 0, origin=ORIGIN)  # fires on `second`
    await arm_watch(one, "w1", WatchArmed(watch_class="delta", condition=ON_ANA), origin=ORIGIN)
    result = await evaluate_watches(one, stale, 0, 0, origin=ORIGIN)
    assert result.fired == ()
    fires = await one.read(kinds=["watch-fired"])
    assert [e.data["trigger_seq"] for e in fires] == [second]
    await one.close()


def test_hostile_watch_payloads_are_refused() -> None:
    for bad in ({"watch_class": "silence", "due_at": -1},
                {"watch_class": "silence", "due_at": 2**62},
                {"watch_class": "delta", "priority": 2**63},
                {"watch_class": "delta", "priority": -10**18}):
        with pytest.raises(ValueError):
            WatchArmed(**bad)  # type: ignore[arg-type]


async def test_hostile_watch_events_are_refused_at_append(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    for kind, data in [("watch-armed", {"watch_class": "silence", "due_at": -1}),
                       ("watch-armed", {"watch_class": "delta", "priority": 2**63}),
                       ("watch-fired", {"trigger_seq": -1, "due_at": None, "produced": "x"}),
                       ("watch-satisfied", {"trigger_seq": -5})]:
        with pytest.raises(InvalidEvent):
            await store.append([EventDraft(kind, "watch:w1", data, origin="agent")])
    await store.close()


def _event(seq: int, kind: str, key: str, origin: str = "agent", record: str = "") -> Event:
    data = {"record": record} if record else {}
    return Event(seq, f"e{seq}", kind, key, 1, seq, origin, None, "", None, data, None)


async def test_delta_fires_names_the_armed_delta_watches_new_events_fire(tmp_path: Path
                                                                         ) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await arm_watch(store, "ana", WatchArmed(watch_class="delta", condition=ON_ANA),
                    origin=ORIGIN)
    await arm_watch(store, "any", WatchArmed(watch_class="delta"), origin=ORIGIN)
    await arm_watch(store, "quiet", WatchArmed(watch_class="silence", condition=ON_ANA,
                                               due_at=10**12), origin=ORIGIN)
    state = await watches(store)
    bob, ana = _event(100, "watch-test-note", "identity:bob"), _event(
        101, "watch-test-note", "identity:ana")
    assert delta_fires(state, [bob]) == {"any": bob}
    assert delta_fires(state, [bob, ana]) == {"any": bob, "ana": ana}
    old = _event(1, "watch-test-note", "identity:ana")  # before the arming: no fire
    assert delta_fires(state, [old]) == {}
    assert delta_fires(state, [_event(102, "watch-armed", "watch:x")]) == {}
    await store.close()


_conditions = st.builds(
    WatchCondition, key_prefix=st.sampled_from(["", "identity:", "identity:ana", "notes",
                                                "identity:anabel"]),
    kinds=st.sampled_from([(), ("a",), ("a", "b"), ("c",)]),
    record=st.sampled_from(["", "r1"]), origin_prefix=st.sampled_from(["", "human", "agent"]))
_events = st.builds(
    _event, st.integers(1, 10**6), st.sampled_from(["a", "b", "c", "watch-armed"]),
    st.sampled_from(["identity:ana", "identity:anabel", "identity:bo", "notes", "n",
                     "activity:watch_fire:x", ""]),
    st.sampled_from(["agent", "human:ana", "engine"]), st.sampled_from(["", "r1", "r2"]))


@given(st.lists(_conditions, max_size=8), st.lists(_events, max_size=12))
def test_the_index_finds_exactly_the_watches_a_brute_force_scan_finds(
        conditions: list[WatchCondition], events: list[Event]) -> None:
    state: PersistentMap[str, Watch] = PersistentMap({
        f"w{i}": Watch(f"w{i}", WatchArmed(watch_class="delta", condition=c), "armed", 1, 0, 0)
        for i, c in enumerate(conditions)})
    events = sorted({e.seq: e for e in events}.values(), key=lambda e: e.seq)
    expected: dict[str, Event] = {}
    for event in events:
        for watch in state.values():
            if watch.id not in expected and matches(watch.spec.condition, event):
                expected[watch.id] = event
    assert delta_fires(state, events) == expected
