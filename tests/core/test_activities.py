"""Activities: provenance records immutable once ended, corrections as new activities, and
perform_once / retry_once for logical operations that must run at most once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from pulse_core import EventDraft, InvalidEvent, SqliteEventStore, VersionConflict
from pulse_core._errors import InvalidTransition
from pulse_core.maintenance._activities import (
    ACTIVITY_CLASSES,
    ActivityBody,
    activity_draft,
    activity_key,
    end_activity,
    perform_once,
    read_activity,
    register_activity_class,
    retry_once,
)

Work = tuple[Sequence[EventDraft], ActivityBody, dict[str, int]]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    opened = await SqliteEventStore.open(tmp_path / "events.db")
    yield opened
    await opened.close()


def note(text: str = "swept") -> EventDraft:
    """A memory event on ana's key: some other change that shares an append or a key."""
    return EventDraft("reflection-recorded", "identity:ana",
                      {"record": f"r-{text}", "text": text}, origin="agent")


async def test_a_recorded_activity_reads_back_whole(store: SqliteEventStore) -> None:
    body = ActivityBody(activity_class="mnemonic_metabolism", actors=("maintenance",),
                        inputs=("ana/x-1",), outputs=("ana/s-1",), started_at=10, ended_at=20,
                        report={"decayed": 3})
    await store.append([activity_draft("cycle-1", body, origin="executor:maintenance")])
    activity = await read_activity(store, "cycle-1")
    assert activity is not None
    assert (activity.id, activity.activity_class, activity.status) == (
        "cycle-1", "mnemonic_metabolism", "completed")
    assert (activity.actors, activity.inputs, activity.outputs) == (
        ("maintenance",), ("ana/x-1",), ("ana/s-1",))
    assert (activity.started_at, activity.ended_at, activity.report) == (10, 20, {"decayed": 3})
    assert await read_activity(store, "cycle-2") is None


async def test_a_started_activity_ends_once_and_then_never_changes(
    store: SqliteEventStore,
) -> None:
    body = ActivityBody(activity_class="sleep_task", status="running", started_at=1)
    (started,) = (await store.append([activity_draft("t-1", body, origin="engine")])).events
    assert started.kind == "activity-started"
    assert (await read_activity(store, "t-1")).status == "running"  # type: ignore[union-attr]
    ended = await end_activity(store, "t-1", "completed", ended_at=5, origin="engine",
                               outputs=("ana/i-1",), report="done",
                               extra=[note(text="with-the-end")])
    assert ended.kind == "activity-completed"
    extra = (await store.read(ended.seq - 2, limit=1))[0]
    assert extra.kind == "reflection-recorded" and extra.tx == ended.tx
    head = await store.last_seq()
    for status in ("completed", "failed", "cancelled"):
        with pytest.raises(InvalidTransition, match="is completed: only a running activity"):
            await end_activity(store, "t-1", status, ended_at=9, origin="engine",
                               extra=[note(text="never")])
    assert await store.last_seq() == head  # nothing of a refused end is written
    done = await read_activity(store, "t-1")
    assert done is not None
    assert (done.status, done.ended_at, done.outputs, done.report) == (
        "completed", 5, ("ana/i-1",), "done")


async def test_a_failed_activity_keeps_its_reason(store: SqliteEventStore) -> None:
    body = ActivityBody(activity_class="sleep_task", status="running")
    await store.append([activity_draft("t-2", body, origin="engine")])
    await end_activity(store, "t-2", "failed", ended_at=3, origin="engine",
                       reason="the model timed out")
    failed = await read_activity(store, "t-2")
    assert failed is not None and (failed.status, failed.reason) == (
        "failed", "the model timed out")
    with pytest.raises(InvalidTransition):
        await end_activity(store, "t-2", "completed", ended_at=4, origin="engine")


async def test_an_activity_recorded_whole_cannot_be_ended(store: SqliteEventStore) -> None:
    body = ActivityBody(activity_class="archive", status="completed")
    await store.append([activity_draft("a-1", body, origin="engine")])
    with pytest.raises(InvalidTransition, match="is completed"):
        await end_activity(store, "a-1", "cancelled", ended_at=1, origin="engine")
    with pytest.raises(InvalidTransition, match="is absent"):
        await end_activity(store, "nobody", "completed", ended_at=1, origin="engine")
    with pytest.raises(InvalidEvent, match="ends completed, failed or cancelled"):
        await end_activity(store, "a-1", "running", ended_at=1, origin="engine")


async def test_a_change_appended_around_end_activity_makes_the_read_refuse(
    store: SqliteEventStore,
) -> None:
    body = ActivityBody(activity_class="archive")
    await store.append([activity_draft("a-2", body, origin="engine")])
    await store.append([EventDraft("activity-cancelled", activity_key("a-2"),
                                   {"ended_at": 9}, origin="engine")])
    with pytest.raises(InvalidTransition, match="an ended activity never changes"):
        await read_activity(store, "a-2")
    await store.append([activity_draft("a-3", body, origin="engine")])
    await store.append([activity_draft("a-3", body, origin="engine")])
    with pytest.raises(InvalidTransition, match="already exists"):
        await read_activity(store, "a-3")


async def test_a_correction_is_a_new_activity_naming_the_one_it_corrects(
    store: SqliteEventStore,
) -> None:
    wrong = ActivityBody(activity_class="semantic_consolidation", outputs=("ana/i-1",),
                         report={"insights": 1})
    await store.append([activity_draft("c-1", wrong, origin="executor:maintenance")])
    fix = ActivityBody(activity_class="correction", corrects="c-1", inputs=("ana/i-1",),
                       report={"why": "the insight double-counted a summary"})
    await store.append([activity_draft("c-2", fix, origin="human:ana")])
    original, correction = await read_activity(store, "c-1"), await read_activity(store, "c-2")
    assert original is not None and correction is not None
    assert original.corrects is None and original.report == {"insights": 1}
    assert original.version == 1  # untouched
    assert correction.corrects == "c-1" and correction.activity_class == "correction"


def test_activity_classes_and_statuses_are_checked() -> None:
    with pytest.raises(ValueError, match="not registered"):
        ActivityBody(activity_class="daydream")
    with pytest.raises(ValueError, match="status 'paused'"):
        ActivityBody(activity_class="archive", status="paused")
    with pytest.raises(InvalidEvent, match="snake_case"):
        register_activity_class("Day-Dream")
    register_activity_class("deep_sleep_test")
    assert "deep_sleep_test" in ACTIVITY_CLASSES
    assert ActivityBody(activity_class="deep_sleep_test").status == "completed"


# -- perform_once ----------------------------------------------------------------------------


async def test_perform_once_does_the_work_once_and_then_returns_the_stored_outcome(
    store: SqliteEventStore,
) -> None:
    calls = 0

    async def work() -> Work:
        nonlocal calls
        calls += 1
        body = ActivityBody(activity_class="watch_fire", report={"fired": "w-1"})
        return [note(text="fired")], body, {"identity:ana": 0}

    first = await perform_once(store, "watch_fire:w-1:7", work, origin="engine")
    second = await perform_once(store, "watch_fire:w-1:7", work, origin="engine")
    assert (first.ran, second.ran, calls) == (True, False, 1)
    assert first.activity == second.activity and second.activity.report == {"fired": "w-1"}
    written = await store.read()
    assert [e.kind for e in written] == ["reflection-recorded", "activity-recorded"]
    assert written[0].tx == written[1].tx


async def test_a_no_effect_outcome_is_stored_and_seen_by_the_next_attempt(
    store: SqliteEventStore,
) -> None:
    calls = 0

    async def nothing() -> Work:
        nonlocal calls
        calls += 1
        return [], ActivityBody(activity_class="retention_review",
                                report={"outcome": "no effect"}), {}

    first = await perform_once(store, "sweep:2026-12-01", nothing, origin="engine")
    again = await perform_once(store, "sweep:2026-12-01", nothing, origin="engine")
    assert first.ran and not again.ran and calls == 1
    assert again.activity.report == {"outcome": "no effect"}
    assert [e.kind for e in await store.read()] == ["activity-recorded"]


async def test_concurrent_attempts_run_the_work_once_and_both_see_the_outcome(
    store: SqliteEventStore,
) -> None:
    calls = 0

    async def slow() -> Work:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.02)  # both attempts are in flight at once
        return [], ActivityBody(activity_class="watch_fire",
                                report={"outcome": "no effect"}), {}

    results = await asyncio.gather(*(perform_once(store, "watch_fire:w-2:silence:99", slow,
                                                  origin="engine") for _ in range(3)))
    assert calls == 1 and sorted(r.ran for r in results) == [False, False, True]
    assert len({r.activity.seq for r in results}) == 1
    assert all(r.activity.report == {"outcome": "no effect"} for r in results)
    assert len(await store.read()) == 1


async def test_two_handles_on_one_file_write_the_operation_once(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    one, two = await SqliteEventStore.open(path), await SqliteEventStore.open(path)
    try:
        async def work() -> Work:
            await asyncio.sleep(0.02)
            return [note(text="once")], ActivityBody(activity_class="purge"), {}

        results = await asyncio.gather(perform_once(one, "purge:ana/x-1", work, origin="cli"),
                                       perform_once(two, "purge:ana/x-1", work, origin="cli"))
        assert sorted(r.ran for r in results) == [False, True]
        assert results[0].activity.seq == results[1].activity.seq
        assert [e.kind for e in await one.read()] == ["reflection-recorded",
                                                      "activity-recorded"]
    finally:
        await one.close()
        await two.close()


async def test_a_moved_key_makes_the_work_re_read_once_then_the_conflict_is_raised(
    store: SqliteEventStore,
) -> None:
    seen: list[int] = []

    async def racing() -> Work:
        version = await store.head("identity:ana")
        seen.append(version)
        await store.append([note(text=f"meanwhile-{len(seen)}")])  # another writer
        return [note(text="mine")], ActivityBody(activity_class="mnemonic_metabolism"), {
            "identity:ana": version}

    with pytest.raises(VersionConflict, match="identity:ana"):
        await perform_once(store, "sweep:1", racing, origin="engine")
    assert seen == [0, 1]  # re-read, re-evaluated with the fresh version, once
    assert await read_activity(store, "sweep:1") is None
    assert [e.data["text"] for e in await store.read()] == ["meanwhile-1", "meanwhile-2"]

    calm = 0

    async def settles() -> Work:
        nonlocal calm
        calm += 1
        version = await store.head("identity:ana")
        if calm == 1:
            await store.append([note(text="once-more")])
        return [note(text="settled")], ActivityBody(activity_class="mnemonic_metabolism"), {
            "identity:ana": version}

    done = await perform_once(store, "sweep:2", settles, origin="engine")
    assert done.ran and calm == 2


async def test_work_that_raises_stores_nothing_and_may_run_again(
    store: SqliteEventStore,
) -> None:
    async def broken() -> Work:
        raise RuntimeError("the model is down")

    with pytest.raises(RuntimeError):
        await perform_once(store, "consolidate:1", broken, origin="engine")
    assert await store.last_seq() == 0

    async def fine() -> Work:
        return [], ActivityBody(activity_class="semantic_consolidation"), {}

    assert (await perform_once(store, "consolidate:1", fine, origin="engine")).ran


async def test_retry_once_retries_a_conflict_once_and_nothing_else() -> None:
    calls = 0

    async def conflicting() -> int:
        nonlocal calls
        calls += 1
        raise VersionConflict("identity:ana", 1, 2)

    with pytest.raises(VersionConflict):
        await retry_once(conflicting)
    assert calls == 2

    calls = 0

    async def then_fine() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise VersionConflict("identity:ana", 1, 2)
        return calls

    assert await retry_once(then_fine) == 2

    calls = 0

    async def other() -> int:
        nonlocal calls
        calls += 1
        raise InvalidEvent("bad")

    with pytest.raises(InvalidEvent):
        await retry_once(other)
    assert calls == 1
