"""The openclaw layer against what breaks it: transcript rows that crash a JSON reader or
are not UTF-8, a store that is corrupt or replaced, credentials in `env`, settings that cannot
work (notices against a failing gateway: test_notice_queue.py). Fast: SQLite files built in
OpenClaw's schema (agent schema 23, minus the CHECKs that need octet_length()), no gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.openclaw import (
    TRANSCRIPT_MALFORMED,
    AgentStore,
    TranscriptIngest,
    TranscriptRow,
    TranscriptSettings,
    build_openclaw,
    message_of,
    notice_text,
)
from pulse_adapters.openclaw._ingest import Malformed
from pulse_core import (
    Engine,
    EventStore,
    LayerContext,
    LayerError,
    ManualClock,
)
from pulse_core.memory import reveal_memory
from tests.adapters.openclaw.rig import eventually

SCHEMA = """
CREATE TABLE session_nodes (session_key TEXT NOT NULL PRIMARY KEY,
  current_session_id TEXT NOT NULL, entry_json TEXT NOT NULL, updated_at INTEGER NOT NULL
) STRICT;
CREATE TABLE session_windows (session_id TEXT NOT NULL PRIMARY KEY,
  session_key TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL) STRICT;
CREATE TABLE transcript_events (session_id TEXT NOT NULL, seq INTEGER NOT NULL,
  event_json TEXT, created_at INTEGER NOT NULL, event_zstd BLOB, event_utf8_bytes INTEGER,
  navigation_json TEXT, PRIMARY KEY (session_id, seq),
  CHECK ((event_json IS NOT NULL AND event_zstd IS NULL)
         OR (event_json IS NULL AND event_zstd IS NOT NULL))) STRICT;
"""


def agent_store(state: Path) -> AgentStore:
    store = AgentStore(state, "main")
    store.path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:
        db.execute("PRAGMA journal_mode = WAL")
        db.executescript(SCHEMA)
    return store


def said(message_id: str, text: str, role: str = "user") -> str:
    return json.dumps({"type": "message", "id": message_id,
                       "message": {"role": role, "content": text}})


def add(store: AgentStore, session: str, *rows: str, raw: bool = False) -> None:
    """Append rows to `session` (created under key agent:main:<session>); `raw`: each row is
    SQL for the event_json value."""
    with contextlib.closing(sqlite3.connect(store.path)) as db, db:
        db.execute("INSERT OR IGNORE INTO session_windows VALUES (?, ?, 0, 0)",
                   (session, f"agent:main:{session}"))
        (head,) = db.execute("SELECT COALESCE(MAX(seq), -1) FROM transcript_events "
                             "WHERE session_id = ?", (session,)).fetchone()
        for n, row in enumerate(rows, head + 1):
            value = row if raw else "?"
            db.execute(f"INSERT INTO transcript_events (session_id, seq, event_json, created_at)"
                       f" VALUES (?, ?, {value}, 0)", (session, n) if raw else (session, n, row))


@pytest.mark.parametrize(("text", "reason"), [
    ("[" * 100_000, "nested too deeply"),
    (json.dumps({"type": "message", "id": "m", "message": {"role": ["user"], "content": "x"}}),
     None),
    (json.dumps({"type": "message", "id": "m", "message": {"role": {"a": 1}, "content": "x"}}),
     None),
])
def test_rows_that_break_a_json_reader_are_refused_or_passed_over_not_raised(
    text: str, reason: str | None,
) -> None:
    row = TranscriptRow("s-1", 1, text)
    if reason is None:
        assert message_of(row) is None  # a role that is no role: not a message of the two
    else:
        with pytest.raises(Malformed, match=reason):
            message_of(row)


async def test_a_poison_row_is_recorded_and_every_session_reads_on(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "a", said("a-1", "before"), "[" * 100_000,
        json.dumps({"type": "message", "id": "a-2", "message": {"role": ["user"]}}),
        said("a-3", "after"))
    add(store, "b", said("b-1", "other session"))
    add(store, "a", "CAST(x'7b22ff' AS TEXT)", raw=True)  # bytes that are not UTF-8
    add(store, "a", said("a-4", "after the binary row"))
    async with Engine(tmp_path / "pulse") as engine:
        ingest = TranscriptIngest(TranscriptSettings(identity="ana", batch=2), store)
        assert await ingest.ingest(engine.events) == 4  # exchanges, not malformed records
        malformed = await engine.events.read(kinds=[TRANSCRIPT_MALFORMED])
        memory = reveal_memory((await engine.snapshot()).projection("memory")["ana"],
                               engine.events.keys)
    assert sorted(x.text for x in memory.exchanges) == sorted(
        ["before", "after", "other session", "after the binary row"])
    assert [(e.data["session_id"], e.data["seq"]) for e in malformed] == [("a", 1), ("a", 4)]
    assert "not JSON" in malformed[1].data["reason"]


async def test_a_row_the_log_cannot_store_is_recorded_once_and_the_rows_around_it_stored(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    # json.dumps escapes the half of an emoji as \ud83d: the row is ASCII, the message a str
    # UTF-8 cannot hold
    add(store, "a", said("a-1", "before"), said("a-2", "half an emoji \ud83d"),
        said("a-3", "after"))
    add(store, "b", said("b-1", "other session"))
    async with Engine(tmp_path / "pulse") as engine:
        ingest = TranscriptIngest(TranscriptSettings(identity="ana"), store)
        assert await ingest.ingest(engine.events) == 3
        add(store, "a", said("a-4", "later"))
        again = TranscriptIngest(TranscriptSettings(identity="ana"), store)  # a new engine
        assert await again.ingest(engine.events) == 1
        errors = await engine.events.read(key="service:openclaw-transcripts")
        memory = reveal_memory((await engine.snapshot()).projection("memory")["ana"],
                               engine.events.keys)
    assert [x.text for x in memory.exchanges] == ["before", "after", "other session", "later"]
    assert [(e.data["session_id"], e.data["seq"]) for e in errors] == [("a", 1)]
    assert "surrogate" in errors[0].data["message"]
    assert errors[0].data["store"] == str(store.path)


async def test_a_session_whose_cursor_no_key_can_hold_is_recorded_and_passed_over(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "a\0b", said("x-1", "in a session named with a NUL"))
    add(store, "c", said("c-1", "kept"))
    async with Engine(tmp_path / "pulse") as engine:
        ingest = TranscriptIngest(TranscriptSettings(identity="ana"), store)
        assert await ingest.ingest(engine.events) == 1
        add(store, "c", said("c-2", "and on"))
        assert await ingest.ingest(engine.events) == 1
        errors = await engine.events.read(key="service:openclaw-transcripts")
    assert [e.data["session_id"] for e in errors] == ["a\0b"]
    assert "NUL" in errors[0].data["message"]


class CountedIngest(TranscriptIngest):
    """Transcript ingest that counts its rounds."""

    rounds = 0

    async def ingest(self, events: EventStore, *, host: str = "") -> int:
        self.rounds += 1
        return await super().ingest(events, host=host)


async def test_a_corrupt_store_is_recorded_once_and_read_when_it_is_replaced(
    tmp_path: Path,
) -> None:
    store = AgentStore(tmp_path / "state", "main")
    store.path.parent.mkdir(parents=True)
    store.path.write_bytes(b"this is not a database\0" * 400)
    ingest = CountedIngest(TranscriptSettings(identity="ana", interval_s=0.02), store)
    async with Engine(tmp_path / "pulse") as engine:
        task = asyncio.create_task(ingest(engine))
        try:
            async def recorded() -> bool:
                return bool(await engine.events.read(key="service:openclaw-transcripts"))

            await eventually(recorded, limit_s=30)
            seen = ingest.rounds

            async def failed_again() -> bool:  # many more reads fail the same way
                return ingest.rounds >= seen + 5

            await eventually(failed_again, limit_s=30)
            errors = await engine.events.read(key="service:openclaw-transcripts")
            store.path.unlink()
            agent_store(tmp_path / "state")
            add(store, "s", said("m-1", "the store is back"))

            async def read() -> bool:
                memory = (await engine.snapshot()).projection("memory")
                return "ana" in memory and len(memory["ana"].exchanges) == 1

            await eventually(read, limit_s=30)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert len(errors) == 1, [e.data for e in errors]
    assert "not a database" in errors[0].data["message"]
    assert errors[0].data["store"] == str(store.path)


async def test_concurrent_followers_ingest_each_message_once(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    for session in ("a", "b", "c"):
        add(store, session, *(said(f"{session}-{n}", f"{session} {n}") for n in range(60)))
    async with Engine(tmp_path / "pulse") as engine:
        followers = [TranscriptIngest(TranscriptSettings(identity="ana", batch=7), store)
                     for _ in range(3)]
        counts = await asyncio.gather(*(f.ingest(engine.events) for f in followers))
        again = await followers[0].ingest(engine.events)
        exchanges = await engine.events.read(kinds=["human-exchange"])
    records = [e.data["record"] for e in exchanges]
    assert sum(counts) == len(records) == len(set(records)) == 180 and again == 0


def test_a_restart_effect_becomes_a_notice_without_its_environment() -> None:
    text = notice_text({"type": "restart-process", "name": "openclaw-gateway",
                        "argv": ["openclaw", "--url", "https://u:hunter2@example.org/x?t=s3"],
                        "env": {"OPENAI_API_KEY": "sk-live-123"}, "reason": "gone"})
    assert "sk-live-123" not in text and "OPENAI_API_KEY" not in text
    assert "hunter2" not in text and "t=s3" not in text
    assert "openclaw-gateway" in text and "gone" in text


@pytest.mark.parametrize(("settings", "field", "problem"), [
    ({"env": {"A=B": "1"}}, "layers.openclaw.env.A=B", "variable NAME"),
    ({"env": {"PATH": "/bin\0/usr/bin"}}, "layers.openclaw.env.PATH", "NUL"),
    ({"cli_timeout_s": float("nan")}, "layers.openclaw.cli_timeout_s", "finite"),
    ({"gateway": {"interval_s": float("inf")}}, "layers.openclaw.gateway.interval_s", "finite"),
    ({"transcripts": {"batch": 0}}, "layers.openclaw.transcripts.batch", "> 0 rows"),
    ({"notices": {"max_queued": 20}}, "layers.openclaw.notices.max_queued", "1 to 19"),
    ({"notices": {"poll_s": 0}}, "layers.openclaw.notices.poll_s", "> 0"),
])
def test_settings_that_cannot_work_or_would_leak_are_refused(
    tmp_path: Path, settings: Any, field: str, problem: str,
) -> None:
    with pytest.raises(LayerError) as refused:
        build_openclaw(settings, LayerContext(tmp_path, ManualClock()))
    assert field in str(refused.value) and problem in str(refused.value), refused.value
    assert "sk-live-123" not in str(refused.value)
