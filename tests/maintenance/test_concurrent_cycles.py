"""Two maintenance cycles at once on one home, in one store or in two stores over the same
log (a SQLite file, a PostgreSQL database): every sleep task is processed once, every watch
fires once, every element decays once."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pulse_adapters.maintenance import run_cycle
from pulse_adapters.maintenance._context import CycleRun
from pulse_adapters.maintenance._steps import STEPS
from pulse_core import EventDraft, ManualClock
from pulse_core.maintenance._sleep import SleepBoard
from pulse_core.maintenance._watches import WatchArmed, WatchCondition, arm_watch
from pulse_core.memory import identity_key
from pulse_core.store._base import EventStore
from tests.maintenance.conftest import OpenStore

HOUR = 3_600_000
TASKS = 12
DELTAS = 4
SILENCES = 3
PEOPLE = 6


async def build_home(store: EventStore, clock: ManualClock) -> list[str]:
    """Exchanges of several people, review tasks, delta watches a later change matches and
    silence watches past their due time; the ids of the review tasks."""
    await store.append([EventDraft("human-exchange", identity_key(f"p{i % PEOPLE}"),
                                   {"record": f"x-{i}", "text": "hi", "role": "human"},
                                   origin="human") for i in range(40)])
    board = SleepBoard(store, "agent")
    tasks = [(await board.create("review_derived", subject=f"p{i % PEOPLE}/x-{i}",
                                 priority=i % 3, assigned_to="maintenance")).id
             for i in range(TASKS)]
    for i in range(DELTAS):
        await arm_watch(store, f"d{i}", WatchArmed(watch_class="delta", condition=WatchCondition(
            key_prefix=f"identity:p{i}", kinds=("human-exchange",))), origin="agent")
    for i in range(SILENCES):
        await arm_watch(store, f"s{i}", WatchArmed(watch_class="silence", condition=WatchCondition(
            key_prefix="identity:nobody"), due_at=clock.now_ms() + HOUR), origin="agent")
    await store.append([EventDraft("human-exchange", identity_key(f"p{i}"),
                                   {"record": f"late-{i}", "text": "news", "role": "human"},
                                   origin="human") for i in range(DELTAS)])
    clock.advance(2 * HOUR)
    return tasks


async def check_once(store: EventStore, tasks: list[str]) -> None:
    finished = Counter(e.key for e in await store.read(
        kinds=["sleep-task-completed", "sleep-task-failed"]))
    assert {f"sleep:{t}": finished[f"sleep:{t}"] for t in tasks} == {
        f"sleep:{t}": 1 for t in tasks}
    assert all(n == 1 for n in finished.values())
    fired = Counter(e.key for e in await store.read(kinds=["watch-fired"]))
    assert fired == Counter({f"watch:d{i}": 1 for i in range(DELTAS)}
                            | {f"watch:s{i}": 1 for i in range(SILENCES)})
    decayed: Counter[str] = Counter()
    for event in await store.read(kinds=["memory-metabolized"]):
        decayed.update(f"{event.key}/{record}" for record in event.data["strengths"])
    assert len(decayed) == 44 and set(decayed.values()) == {1}


@pytest.mark.parametrize("stores", ["one store", "two stores on one log"])
async def test_two_concurrent_cycles_process_each_sleep_task_once_and_fire_each_watch_once(
    open_store: OpenStore, stores: str,
) -> None:
    clock = ManualClock()
    first = await open_store(clock)
    second = first if stores == "one store" else await open_store(clock)
    tasks = await build_home(first, clock)
    a, b = await asyncio.gather(run_cycle(first, clock=clock, cycle="a"),
                                run_cycle(second, clock=clock, cycle="b"))
    assert (a.status, b.status) == ("completed", "completed")
    # the 12 review tasks, and the watch-review tasks the fires create if the other cycle's
    # sleep step runs after them: each completed by one cycle, and each report says so
    completed = len(await first.read(kinds=["sleep-task-completed"]))
    assert a.changes.get("sleep_tasks_completed", 0) + b.changes.get(
        "sleep_tasks_completed", 0) == completed
    assert TASKS <= completed <= TASKS + DELTAS + SILENCES
    assert a.changes.get("watches_fired", 0) + b.changes.get("watches_fired", 0) == \
        DELTAS + SILENCES
    await check_once(first, tasks)
    await first.close()
    if second is not first:
        await second.close()


async def test_a_cycle_overlapping_an_earlier_one_leaves_the_sweep_to_it(
    open_store: OpenStore,
) -> None:
    clock = ManualClock()
    store = await open_store(clock)
    await build_home(store, clock)
    began, release = asyncio.Event(), asyncio.Event()

    async def held(run: CycleRun) -> None:
        began.set()
        await release.wait()

    first = asyncio.ensure_future(run_cycle(store, clock=clock, cycle="first",
                                            steps=[("held", held), *STEPS]))
    await began.wait()
    clock.advance(1_000)  # a later cycle_start: a sweep of its own would decay again
    second = await run_cycle(store, clock=clock, cycle="second")
    release.set()
    done = await first
    assert done.changes["decayed"] == 44 and "decayed" not in second.changes
    assert any("first" in d and d.startswith("metabolism:") for d in second.deferred)
    await store.close()
