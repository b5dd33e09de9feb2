"""Fault 4: one corrupt byte in one event's JSON. A reader that may not write gets a typed
error naming the row, a writable store quarantines it, every fold leaves it out, and upulse
and the daemon carry on beside it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from pulse_core import (
    Event,
    EventDraft,
    EventUnreadable,
    InvalidEvent,
    LoopState,
    SqliteEventStore,
    StoreReadOnly,
    UnreadableEvent,
)
from pulse_core._effects import effect_draft
from pulse_survival import Notify
from tests.cli.runner import Upulse
from tests.faults.log_support import (
    Job,
    Jobs,
    corrupt_data_of,
    engine_at,
    note,
    notes_of,
)

# -- Fault 4: one corrupt byte in one event's JSON ------------------------------------------


async def test_a_corrupt_event_is_a_typed_error_naming_its_seq_and_a_listed_row(
    tmp_path: Path,
) -> None:
    """Fault 4: a reader that may not write gets EventUnreadable naming the row's seq (never
    a bare msgspec.DecodeError), and read_rows lists the row as unreadable in its place."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(n, text=f"row-{n}") for n in range(1, 6)])
    await store.close()
    corrupt_data_of(db, "row-3")

    reader = await SqliteEventStore.open(db, read_only=True)
    try:
        with pytest.raises(EventUnreadable) as info:
            await reader.read()
        assert info.value.seq == 3 and "#3" in str(info.value)
        assert [e.seq for e in await reader.read(3)] == [4, 5]
        rows = await reader.read_rows()
        assert [r.seq for r in rows] == [1, 2, 3, 4, 5]
        bad = rows[2]
        assert isinstance(bad, UnreadableEvent)
        assert (bad.kind, bad.key) == ("fault-note", "note-3") and "data" in bad.reason
        newest = await reader.read_rows(newest_first=True, limit=3)
        assert [r.seq for r in newest] == [5, 4, 3]
    finally:
        await reader.close()


async def test_a_writable_store_quarantines_a_corrupt_event_and_every_read_skips_it(
    tmp_path: Path,
) -> None:
    """Fault 4: the first read of a writable store that meets the row appends one
    event-quarantined naming it; from then on every read, page and change cursor (of any
    process, read-only ones included) leaves it out and pages still fill up to their limit."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(n, text=f"row-{n}") for n in range(1, 8)])
    await store.close()
    corrupt_data_of(db, "row-2")

    store = await SqliteEventStore.open(db)
    try:
        pages = [[e.seq for e in page.events]
                 async for page in store.pages(kinds=["fault-note"], limit=2)]
        assert pages == [[1, 3], [4, 5], [6, 7], []]
        (quarantine,) = await store.read(kinds=["event-quarantined"])
        assert quarantine.key == "note-2"  # the row's own key: its version moves past it
        assert quarantine.data["seq"] == 2 and quarantine.data["kind"] == "fault-note"
        assert [e.seq for e in await store.read(limit=3)] == [1, 3, 4]
        seen: list[int] = []
        async for event in store.changes(kinds=["fault-note"], batch=2):
            seen.append(event.seq)
            if event.seq == 7:
                break
        assert seen == [1, 3, 4, 5, 6, 7]
        assert len(await store.read(kinds=["event-quarantined"])) == 1
    finally:
        await store.close()
    reader = await SqliteEventStore.open(db, read_only=True)
    try:
        assert [e.seq for e in await reader.read(kinds=["fault-note"])] == [1, 3, 4, 5, 6, 7]
    finally:
        await reader.close()


async def test_an_engine_opens_ticks_and_runs_survival_beside_a_corrupt_event(
    tmp_path: Path,
) -> None:
    """Fault 4: Engine.open() no longer dies on the row: the fold quarantines it, ticks run
    with every survival rule reached, effects still run, and the loops keep running."""
    engine = engine_at(tmp_path)
    await engine.open()
    await engine.append([note(1, text="keep"), note(2, text="spoil"), note(3, text="keep-too")])
    await engine.close()
    shutil.rmtree(tmp_path / "checkpoints")  # the fold must read the row again
    corrupt_data_of(tmp_path / "events.db", "spoil")

    jobs = Jobs()
    engine = engine_at(tmp_path, jobs)
    await engine.open()
    try:
        assert await notes_of(engine) == (1, 3)
        (quarantine,) = await engine.events.read(kinds=["event-quarantined"])
        assert quarantine.data["key"] == "note-2"
        await engine.append([effect_draft(Job(n=5), origin="agent")])
        await engine.step()
        assert jobs.ran == [5]
        survival = [t for t in engine.trace if t.tier == "survival"]
        assert survival and all(t.reached and t.error is None for t in survival)
        await engine.start()
        await asyncio.sleep(0.2)
        assert all(s.state is LoopState.RUNNING and s.restarts == 0 for s in engine.loops())
        assert not await engine.events.read(kinds=["error"])
    finally:
        await engine.close()


async def test_quarantine_by_hand_names_only_an_unreadable_row(tmp_path: Path) -> None:
    """Fault 4: EventStore.quarantine marks an unreadable row once (again returns the same
    event) and refuses a readable row, a row that does not exist, and a read-only store."""
    db = tmp_path / "events.db"
    store = await SqliteEventStore.open(db)
    await store.append([note(1, text="fine"), note(2, text="spoil")])
    await store.close()
    corrupt_data_of(db, "spoil")

    reader = await SqliteEventStore.open(db, read_only=True)
    with pytest.raises(StoreReadOnly):
        await reader.quarantine(2, "bad disk")
    await reader.close()
    store = await SqliteEventStore.open(db)
    try:
        with pytest.raises(InvalidEvent, match="can be read"):
            await store.quarantine(1, "no reason")
        with pytest.raises(InvalidEvent, match="no event #9"):
            await store.quarantine(9, "no reason")
        first = await store.quarantine(2, "bad disk")
        assert isinstance(first, Event)
        assert (first.kind, first.data["reason"], first.origin) == (
            "event-quarantined", "bad disk", "human")
        again = await store.quarantine(2, "another reason")
        assert again.seq == first.seq
        assert [e.seq for e in await store.read(kinds=["fault-note"])] == [1]
    finally:
        await store.close()

    corrupt_data_of(db, "bad disk")  # now the quarantine record itself cannot be read
    store = await SqliteEventStore.open(db)
    try:
        assert [e.seq for e in await store.read()] == [1]  # and quarantines #3 by #4
        (record,) = await store.read(1)
        assert (record.seq, record.key, record.data["seq"]) == (4, "note-2", 3)
        assert isinstance(await store.quarantine(2, "again"), UnreadableEvent)
    finally:
        await store.close()


def test_upulse_lists_a_corrupt_row_and_a_daemon_quarantines_it_and_runs(
    tmp_path: Path,
) -> None:
    """Fault 4 (the CLI's share): `upulse events` and `daemon start` failed with a bare
    msgspec.DecodeError; now the listing shows the row as unreadable, and a daemon starts,
    quarantines it (its executor loop folds every effect) and runs."""
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    effect = effect_draft(Notify(topic="t", level="info", text="row-2"), origin="agent")
    asyncio.run(_append_notes(home, [note(1), effect, note(3)]))
    corrupt_data_of(home / "events.db", "row-2")
    try:
        listing = upulse("events", "--home", home)
        [row] = [line for line in listing.stdout.splitlines() if "UNREADABLE" in line]
        assert row.split()[0] == "2" and row.split()[3] == "effect", listing.stdout
        rows = upulse.json("events", "--home", home)
        assert isinstance(rows, list)
        assert [r["seq"] for r in rows if r.get("unreadable")] == [2]

        upulse("daemon", "start", "--home", home)
        quarantined = upulse.json("events", "--home", home, "--kind", "event-quarantined")
        assert isinstance(quarantined, list)
        assert [q["data"]["seq"] for q in quarantined] == [2]
        status = upulse("daemon", "status", "--home", home)
        assert "running" in status.stdout, status.stdout
    finally:
        upulse.stop_all()


async def _append_notes(home: Path, drafts: list[EventDraft]) -> None:
    store = await SqliteEventStore.open(home / "events.db")
    try:
        await store.append(drafts)
    finally:
        await store.close()
