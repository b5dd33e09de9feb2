"""Sleep tasks: created once, claimed by exactly one worker, final once completed or failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pulse_core._clock import ManualClock
from pulse_core._errors import IdempotencyConflict, InvalidEvent, InvalidTransition
from pulse_core._events import EventDraft
from pulse_core._projector import Projector
from pulse_core.maintenance._sleep import (
    MAX_PRIORITY,
    SleepBoard,
    SleepTasks,
    claimable,
    sleep_task_counts,
)
from pulse_core.store import SqliteEventStore


async def test_two_concurrent_claimers_on_one_store_exactly_one_wins(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    other = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    rival = SleepBoard(other, "executor:maintenance")
    for round_ in range(5):
        task = await board.create("consolidate", task_id=f"t{round_}")
        won = await asyncio.gather(board.claim(task.id, "a", 60_000),
                                   rival.claim(task.id, "b", 60_000))
        winners = [t for t in won if t is not None]
        assert len(winners) == 1
        assert (await board.state(task.id)).claimed_by == winners[0].claimed_by  # type: ignore[union-attr]
    await store.close()
    await other.close()


async def test_a_live_lease_blocks_others_and_an_expired_one_is_claimable(tmp_path: Path
                                                                          ) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    board = SleepBoard(store, "executor:maintenance", clock=clock)
    task = await board.create("consolidate", task_id="t1")
    assert (await board.claim("t1", "a", 1_000)) is not None
    assert await board.claim("t1", "b", 1_000) is None
    clock.advance(999)
    assert await board.claim("t1", "b", 1_000) is None
    clock.advance(1)
    taken = await board.claim("t1", "b", 1_000)
    assert taken is not None and taken.claimed_by == "b"
    with pytest.raises(InvalidTransition):  # a's claim is gone: it may no longer complete
        await board.complete("t1", "a", {"merged": 1})
    done = await board.complete(task.id, "b", {"merged": 2})
    assert (done.status, done.outcome) == ("completed", {"merged": 2})
    await store.close()


async def test_failed_tasks_stay_visible_with_their_reason_and_are_final(tmp_path: Path
                                                                          ) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    await board.create("review_watch", task_id="t1", subject="w1")
    await board.claim("t1", "a", 60_000)
    await board.fail("t1", "a", "the element was purged meanwhile")
    states = await Projector(store, [SleepTasks()]).catch_up()
    task = states["sleep-tasks"]["t1"]
    assert (task.status, task.failure, task.subject) == (
        "failed", "the element was purged meanwhile", "w1")
    assert claimable(states["sleep-tasks"], 10**15) == []
    assert await board.claim("t1", "b", 1_000) is None
    with pytest.raises(InvalidTransition):
        await board.complete("t1", "a")
    with pytest.raises(InvalidTransition):
        await board.fail("t1", "a", "again")
    await store.close()


async def test_claimable_orders_by_priority_then_age_and_includes_expired_leases(
        tmp_path: Path) -> None:
    clock = ManualClock()
    store = await SqliteEventStore.open(tmp_path / "events.db", clock=clock)
    board = SleepBoard(store, "executor:maintenance", clock=clock)
    for name, priority in [("old-low", 1), ("high", 5), ("new-low", 1), ("leased", 9)]:
        await board.create("c", task_id=name, priority=priority, assigned_to="maintenance")
    await board.claim("leased", "a", 500)
    tasks = (await Projector(store, [SleepTasks()]).catch_up())["sleep-tasks"]
    now = clock.now_ms()
    assert [t.id for t in claimable(tasks, now)] == ["high", "old-low", "new-low"]
    assert [t.id for t in claimable(tasks, now + 500)] == ["leased", "high", "old-low",
                                                           "new-low"]
    assert claimable(tasks, now, assigned_to="someone-else") == []
    await store.close()


async def test_create_with_idem_creates_the_logical_task_once(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    first = await board.create("review", subject="e1", idem="review:e1")
    await board.claim(first.id, "a", 60_000)
    again = await board.create("review", subject="e1", idem="review:e1")
    assert again.id == first.id and again.status == "running"
    assert len(await store.read(kinds=["sleep-task-created"])) == 1
    with pytest.raises(IdempotencyConflict):
        await board.create("review", subject="e2", idem="review:e1")
    await store.close()


async def test_assigned_to_is_a_label_any_worker_may_claim(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    await board.create("c", task_id="t1", assigned_to="maintenance")
    claimed = await board.claim("t1", "someone", 1_000)
    assert claimed is not None and claimed.assigned_to == "maintenance"
    with pytest.raises(InvalidTransition):
        await board.claim("absent", "a", 1_000)
    await store.close()


async def test_sleep_task_counts_by_status(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    for name in ("a", "b", "c"):
        await board.create("c", task_id=name)
    await board.claim("a", "w", 60_000)
    await board.claim("b", "w", 60_000)
    await board.fail("b", "w", "gone")
    tasks = (await Projector(store, [SleepTasks()]).catch_up())["sleep-tasks"]
    assert sleep_task_counts(tasks.values()) == {"running": 1, "failed": 1, "pending": 1}
    await store.close()


async def test_priorities_outside_the_sane_range_are_refused(tmp_path: Path) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    board = SleepBoard(store, "executor:maintenance")
    for priority in (2**63, -10**18, MAX_PRIORITY + 1, -MAX_PRIORITY - 1):
        with pytest.raises(ValueError, match="priority"):
            await board.create("c", priority=priority)
        with pytest.raises(InvalidEvent):
            await store.append([EventDraft("sleep-task-created", "sleep:t1", {
                "task_class": "c", "priority": priority}, origin="agent")])
    with pytest.raises(InvalidEvent):  # a bool is not a priority
        await store.append([EventDraft("sleep-task-created", "sleep:t1", {
            "task_class": "c", "priority": True}, origin="agent")])
    with pytest.raises(InvalidEvent):
        await store.append([EventDraft("sleep-task-claimed", "sleep:t1", {
            "by": "a", "until": -1}, origin="agent")])
    edge = await board.create("c", priority=MAX_PRIORITY)
    assert edge.priority == MAX_PRIORITY
    with pytest.raises(ValueError, match="lease_ms"):
        await board.claim(edge.id, "a", 10**15)
    await store.close()
