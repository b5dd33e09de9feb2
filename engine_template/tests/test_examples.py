"""The example rule, watcher and executor, as specifications."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_core import (
    Decision,
    ExecutionContext,
    Sample,
    Snapshot,
    SqliteEventStore,
    SystemClock,
    VitalReading,
)

from ..executors.notes import Note, NoteExecutor
from ..rules.inbox import inbox_note
from ..watchers.inbox import InboxWatcher


def snapshot(inbox: int | None) -> Snapshot:
    """A snapshot whose inbox vital reads `inbox` messages (None: never read)."""
    vitals = {} if inbox is None else {
        "inbox": VitalReading(Sample("inbox", 0, {"count": inbox}), 0)}
    return Snapshot(seq=0, at=0, number=1, vitals=vitals, projections={})


async def nothing_inside(prev: Snapshot, curr: Snapshot) -> Decision:
    return Decision([], 1_000)


def test_inbox_note_adds_a_note_when_the_inbox_grows() -> None:
    decision = asyncio.run(inbox_note(snapshot(1), snapshot(3), nothing_inside))
    assert decision == Decision([Note(text="3 message(s) waiting in the inbox")], 1_000)


def test_inbox_note_passes_through_when_nothing_new_arrived() -> None:
    assert asyncio.run(inbox_note(snapshot(2), snapshot(2), nothing_inside)) == ([], 1_000)
    assert asyncio.run(inbox_note(snapshot(None), snapshot(None), nothing_inside)) == ([], 1_000)


def test_inbox_watcher_counts_message_files_and_wakes_when_more_arrive(tmp_path: Path) -> None:
    watcher = InboxWatcher(tmp_path)
    (tmp_path / "first.txt").write_text("hello")
    (tmp_path / ".hidden").write_text("")
    assert asyncio.run(watcher.collect()).count == 1
    before, after = Sample("inbox", 1, {"count": 1}), Sample("inbox", 2, {"count": 2})
    assert watcher.should_wake([before, after])
    assert not watcher.should_wake([after, before])


def test_note_executor_writes_a_retried_note_once(tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"

    async def run_twice() -> None:
        events = await SqliteEventStore.open(tmp_path / "events.db")
        try:
            ctx = ExecutionContext("effect-1", 1, 1, "executor:NoteExecutor", SystemClock(),
                                   events)
            for _ in range(2):
                await NoteExecutor(notes).execute(Note(text="hello"), ctx)
        finally:
            await events.close()

    asyncio.run(run_twice())
    assert notes.read_text(encoding="utf-8") == "effect-1 hello\n"
