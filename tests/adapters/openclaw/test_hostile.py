"""The openclaw layer against what breaks it: transcript rows that crash a JSON reader or
are not UTF-8, a store that is corrupt or replaced, two engines delivering one notice,
credentials in `env`, settings that cannot work. Fast: SQLite files built in OpenClaw's
schema (agent schema 23, minus the CHECKs that need octet_length()), no gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.openclaw import (
    NOTICE_DELIVERED,
    NOTICE_FAILED,
    TRANSCRIPT_MALFORMED,
    AgentStore,
    NoticeDelivery,
    OpenClawCli,
    OpenClawCommandFailed,
    TranscriptIngest,
    TranscriptRow,
    TranscriptSettings,
    build_openclaw,
    load_settings,
    message_of,
    notice_label,
    notice_text,
)
from pulse_adapters.openclaw._ingest import Malformed
from pulse_core import (
    Engine,
    EventDraft,
    EventStore,
    Layer,
    LayerContext,
    LayerError,
    ManualClock,
    effect_draft,
)
from pulse_core.memory import reveal_memory
from pulse_survival.effects import Notify
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


class InjectingCli(OpenClawCli):
    """chat.inject as the gateway does it: the labelled message lands in the store's session,
    `delay_s` after the call, which returns then."""

    def __init__(self, store: AgentStore, delay_s: float = 0.3) -> None:
        super().__init__("openclaw", {}, port=1)
        self.store = store
        self.delay_s = delay_s
        self.calls: list[dict[str, Any]] = []

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        self.calls.append(dict(params))
        await asyncio.sleep(self.delay_s)
        text = f"[{params['label']}]\n\n{params['message']}"
        add(self.store, "main", said(f"n-{len(self.calls)}", text, role="assistant"))
        return {"ok": True, "messageId": f"n-{len(self.calls)}"}


class Present:
    async def require(self) -> None:
        return None


def delivery(tmp_path: Path, store: AgentStore, cli: OpenClawCli) -> NoticeDelivery:
    settings = load_settings({"state_dir": str(tmp_path / "state"),
                              "notices": {"session_key": "agent:main:main"}})
    return NoticeDelivery(settings, cli, store, Present())  # type: ignore[arg-type]


async def effect_of(events: EventStore, text: str) -> Any:
    (event,) = (await events.append([effect_draft(
        Notify(topic="disk", level="warning", text=text), "rule:test")])).events
    return event


async def test_two_engines_on_one_log_deliver_a_notice_once(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    add(store, "main", said("m-0", "hello"))
    cli = InjectingCli(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        first, second = delivery(tmp_path, store, cli), delivery(tmp_path, store, cli)
        async with asyncio.timeout(30):
            await asyncio.gather(first.settle(engine.events, event, event.data["effect"]),
                                 second.settle(engine.events, event, event.data["effect"]))
        records = await engine.events.read(kinds=[NOTICE_DELIVERED])
    assert len(cli.calls) == 1, cli.calls
    assert [r.key for r in records] == [f"openclaw-notice:{event.key}"]
    assert store.find_text("agent:main:main", f"[{notice_label(event.key)}]")


class RefusingCli(InjectingCli):
    """chat.inject refused with the gateway URL, credentials and all, in the error."""

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        self.calls.append(dict(params))
        raise OpenClawCommandFailed("`openclaw gateway call` exited with 1: cannot reach "
                                    "wss://operator:s3cret-token@gw.example:18789/rpc?key=k3y")


async def test_a_failed_delivery_is_recorded_without_the_urls_secrets(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        settling = asyncio.create_task(delivery(tmp_path, store, RefusingCli(store)).settle(
            engine.events, event, event.data["effect"]))
        try:
            async def recorded() -> bool:
                return bool(await engine.events.read(kinds=[NOTICE_FAILED]))

            await eventually(recorded)
            failed = await engine.events.read(kinds=[NOTICE_FAILED])
        finally:
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling
    error = failed[0].data["error"]
    assert "wss://gw.example:18789" in error
    for secret in ("s3cret-token", "operator", "k3y", "/rpc"):
        assert secret not in error, error


def claim_by(effect_id: str, *, host: str, pid: int, started: float) -> EventDraft:
    """A delivery claim another engine left: its lease runs a minute more."""
    return EventDraft("openclaw-notice-claimed", f"openclaw-notice-attempt:{effect_id}",
                      {"effect_id": effect_id, "owner": f"{host}:{pid}:0", "host": host,
                       "pid": pid, "started": started, "until_ms": int(time.time() * 1000)
                       + 60_000}, origin="executor:openclaw-notices")


async def test_a_live_claim_is_waited_out_and_a_dead_engines_claim_taken_over(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    cli = InjectingCli(store, delay_s=0)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "a process gave up")
        body = event.data["effect"]
        await engine.events.append([claim_by(event.key, host="elsewhere", pid=1, started=1.0)])
        with pytest.raises(TimeoutError):  # another host's engine is delivering it
            async with asyncio.timeout(1.2):
                await delivery(tmp_path, store, cli).settle(engine.events, event, body)
        # it delivered, then its process died on this host before the record
        await cli.call("chat.inject", {"label": notice_label(event.key), "message": "x"})
        await engine.events.append([claim_by(event.key, host=socket.gethostname(),
                                             pid=2 ** 22 + 7, started=1.0)])
        async with asyncio.timeout(30):
            await delivery(tmp_path, store, cli).settle(engine.events, event, body)
        (delivered,) = await engine.events.read(kinds=[NOTICE_DELIVERED])
    assert len(cli.calls) == 1
    assert delivered.data["recovered"] is True


class HeldCli(InjectingCli):
    """chat.inject that lands at once but answers only when `answer` is set: an engine stuck
    in its delivery while its claim runs out."""

    def __init__(self, store: AgentStore) -> None:
        super().__init__(store, delay_s=0)
        self.landed = asyncio.Event()
        self.answer = asyncio.Event()

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        result = await super().call(method, params, timeout_s=timeout_s)
        self.landed.set()
        await self.answer.wait()
        return result


async def test_a_delivery_taken_over_mid_call_is_recorded_once(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    held = HeldCli(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        body = event.data["effect"]
        slow = asyncio.create_task(delivery(tmp_path, store, held).settle(engine.events, event,
                                                                           body))
        async with asyncio.timeout(30):  # bounds a hang only
            await held.landed.wait()
        # its lease ran out; an engine that claimed after it died before delivering
        await engine.events.append([claim_by(event.key, host=socket.gethostname(),
                                             pid=2 ** 22 + 7, started=1.0)])
        takeover = InjectingCli(store, delay_s=0)
        async with asyncio.timeout(30):
            await delivery(tmp_path, store, takeover).settle(engine.events, event, body)
            held.answer.set()  # the first engine's call returns after the takeover recorded
            await slow
        records = await engine.events.read(kinds=[NOTICE_DELIVERED])
    assert takeover.calls == []  # found in the transcript: not delivered again
    assert [(r.key, r.data["recovered"]) for r in records] == [
        (f"openclaw-notice:{event.key}", True)]


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
])
def test_settings_that_cannot_work_or_would_leak_are_refused(
    tmp_path: Path, settings: Any, field: str, problem: str,
) -> None:
    with pytest.raises(LayerError) as refused:
        build_openclaw(settings, LayerContext(tmp_path, ManualClock()))
    assert field in str(refused.value) and problem in str(refused.value), refused.value
    assert "sk-live-123" not in str(refused.value)


async def test_an_effect_appended_as_the_engine_starts_gets_its_notice(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    cli = InjectingCli(store, delay_s=0)
    notices = delivery(tmp_path, store, cli)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        event = await effect_of(engine.events, "pulse is watching")  # before the service runs

        async def delivered() -> bool:
            return bool(await engine.events.read(kinds=[NOTICE_DELIVERED]))

        await eventually(delivered, limit_s=30)
    assert [c["label"] for c in cli.calls] == [notice_label(event.key)]
