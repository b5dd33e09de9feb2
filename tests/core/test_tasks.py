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


async def test_a_requeued_task_waits_again_with_its_priority_and_counts_against_its_agent(
        tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    board = TaskBoard(store)
    await board.create("t1", "flaky", project="web", priority=5)
    await board.create("t2", "later", project="web", priority=5)
    await board.create("t3", "low", project="ops")
    projector = Projector(store, [Tasks(), PendingTasks(), AgentCapabilityStats()])
    await board.assign("t1", "cursor")
    await board.start("t1")
    requeued = await board.requeue("t1", "exited with 3")
    states = await projector.catch_up()
    task = states["tasks"]["t1"]
    assert (task.status, task.agent, task.assigned_at) == ("pending", None, None)
    assert (task.requeues, task.reason, task.version) == (1, "exited with 3", requeued.version)
    pending = states["pending-tasks"]
    assert pending.tasks == ("t2", "t1", "t3")  # its priority kept, waiting since the requeue
    assert pending.by_project == {"web": 2, "ops": 1} and pending.pending_count == 3
    stats = states["agent-capability-stats"]
    assert stats.agents["cursor"].requeued == 1
    assert stats.agents["cursor"].consecutive_failures == 1 and "t1" not in stats.open

    await board.assign("t1", "hermes")  # straight from assigned, too
    await board.requeue("t1", "stuck")
    await board.assign("t1", "hermes")
    await board.start("t1")
    await board.ack("t1", "done")
    await board.close("t1")
    states = await projector.catch_up()
    assert states["tasks"]["t1"].requeues == 2 and states["tasks"]["t1"].status == "closed"
    assert states["pending-tasks"].tasks == ("t2", "t3")
    assert "t1" not in states["pending-tasks"].held
    hermes = states["agent-capability-stats"].agents["hermes"]
    assert (hermes.requeued, hermes.closed, hermes.consecutive_failures) == (1, 1, 0)
    await store.close()


async def test_requeue_is_refused_unless_the_task_is_out_with_an_agent(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = TaskBoard(store)
    await board.create("t", "x")
    with pytest.raises(InvalidTransition, match="needs task 't' to be assigned or executing; "
                                                "it is pending"):
        await board.requeue("t", "never assigned")
    await board.assign("t", "a")
    await board.start("t")
    await board.ack("t", None)
    with pytest.raises(InvalidTransition, match="it is acked"):
        await board.requeue("t", "too late")
    await store.close()


async def test_expect_version_refuses_a_move_from_a_version_since_passed(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = TaskBoard(store)
    created = await board.create("t", "x")
    assigned = await board.assign("t", "a", expect_version=created.version)
    await board.requeue("t", "stuck", expect_version=assigned.version)
    with pytest.raises(VersionConflict, match=r"'t' is at version 3, expected 1"):
        await board.assign("t", "b", expect_version=created.version)  # pending again, but later
    with pytest.raises(VersionConflict):
        await board.give_up("t", "old news", expect_version=assigned.version)
    await board.assign("t", "b", expect_version=3)
    assert len(await store.read(kinds=["task-assigned"])) == 2
    await store.close()
