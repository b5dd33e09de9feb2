"""The task lifecycle and its projections."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pulse_core import (
    AgentCapabilityStats,
    EventDraft,
    InvalidTransition,
    ManualClock,
    PendingTasks,
    Projector,
    SqliteEventStore,
    TaskBoard,
    Tasks,
    VersionConflict,
)
from pulse_core._events import encode_data


async def test_a_task_walks_its_lifecycle_and_projections_follow(tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    board = TaskBoard(store)
    await board.create("t1", "fix login", project="web", priority=1)
    await board.create("t2", "write docs", project="web", priority=5)
    await board.create("t3", "tune db", project="ops")
    projector = Projector(store, [Tasks(), PendingTasks(), AgentCapabilityStats()])
    states = await projector.catch_up()
    pending = states["pending-tasks"]
    assert (pending.pending_count, pending.tasks) == (3, ("t2", "t1", "t3"))
    assert pending.by_project == {"web": 2, "ops": 1}

    await board.assign("t1", "cursor")
    clock.advance(1_500)
    await board.start("t1")
    await board.ack("t1", {"pr": 12})
    await board.close("t1")
    await board.assign("t3", "cursor")
    await board.give_up("t3", "no access")
    states = await projector.catch_up()
    task = states["tasks"]["t1"]
    assert (task.status, task.agent, task.result) == ("closed", "cursor", {"pr": 12})
    assert states["tasks"]["t3"].reason == "no access"
    assert states["pending-tasks"].tasks == ("t2",)
    stats = states["agent-capability-stats"].agents["cursor"]
    assert (stats.assigned, stats.closed, stats.given_up) == (2, 1, 1)
    assert stats.consecutive_failures == 1 and stats.avg_duration_ms == 1_500
    encoded = encode_data(states["pending-tasks"]).decode()
    assert '"pendingCount":1' in encoded and '"byProject":{"web":1}' in encoded
    await store.close()


async def test_a_task_can_never_be_assigned_twice(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = TaskBoard(store)
    await board.create("t1", "only once")
    outcomes = await asyncio.gather(*[board.assign("t1", f"agent-{i}") for i in range(5)],
                                    return_exceptions=True)
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 1
    assert all(isinstance(o, VersionConflict | InvalidTransition)
               for o in outcomes if isinstance(o, BaseException))
    with pytest.raises(InvalidTransition, match="needs task 't1' to be pending; it is assigned"):
        await board.assign("t1", "late")
    assert len(await store.read(kinds=["task-assigned"])) == 1
    await store.close()


async def test_transitions_out_of_order_are_refused(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = TaskBoard(store)
    with pytest.raises(InvalidTransition, match="absent"):
        await board.assign("nope", "a")
    await board.create("t", "x")
    with pytest.raises(VersionConflict):
        await board.create("t", "again")
    with pytest.raises(InvalidTransition):
        await board.close("t")
    await board.give_up("t", "obsolete")
    with pytest.raises(InvalidTransition, match="given-up"):
        await board.give_up("t", "twice")
    await store.close()


async def test_projections_ignore_events_that_skipped_the_board(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    await store.append([EventDraft("task-closed", "ghost")])
    states = await Projector(store, [Tasks()]).catch_up()
    assert states["tasks"] == {}
    await store.close()
