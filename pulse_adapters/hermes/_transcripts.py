"""Transcript ingest: Hermes' session store (HERMES_HOME/state.db, SQLite) followed into pulse
memory, each message once.

The store's `messages` rows are numbered by an increasing integer id (AUTOINCREMENT: never
reused, whatever is deleted); the cursor (the last id ingested) is an event in the log,
appended with the exchanges it covers in one append at the cursor's expected version, so a
message is remembered once whatever restarts or races. A store whose ids end below the cursor
was made anew (state.db deleted): it is ingested from its start, as a new generation.
Delegated subagents' sessions (source `subagent`) are passed over. Sessions the pulse plugin
records live (marked `hermes-session-followed`) are skipped; a session seen unmarked is
marked `hermes-session-ingested` in the same append, at expected version 0 on its key, so a
session is recorded by the plugin or by ingest, never by both. Content Hermes stored as JSON
parts (a message with images) is remembered as its text parts; bytes that are not UTF-8 are
read as U+FFFD. A message the log refuses to store (a lone surrogate, a NUL in its user id)
is recorded as an `error` at key `service:hermes-transcripts` naming its session and id, in
the append that moves the cursor past it (so once), and the messages around it are stored.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_adapters.agents import StoreTrouble
from pulse_adapters.hermes._memory import (
    ROLES,
    SESSION_FOLLOWED,
    SESSION_INGESTED,
    SUBAGENT,
    identity_of,
    session_key,
    session_recorder,
)
from pulse_core import (
    EventDraft,
    EventStore,
    InvalidEvent,
    VersionConflict,
    error_draft,
    register_kind,
)
from pulse_core.memory import exchange_draft

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.hermes")

CURSOR_KIND = "hermes-transcript-cursor"
ORIGIN = "agent:hermes"


class TranscriptCursor(msgspec.Struct, frozen=True):
    """Payload of hermes-transcript-cursor: the last message id ingested, in the store's
    `generation` (one more each time the store is found made anew: its ids below the
    cursor)."""

    message_id: int
    generation: int = 0


register_kind(CURSOR_KIND, "how far Hermes' session store was ingested into memory; key: "
              "hermes-transcripts:<hermes home>", TranscriptCursor)

# text as bytes: sqlite3 refuses a whole fetch over one TEXT value that is not UTF-8
_SELECT = (
    "SELECT m.id, CAST(m.session_id AS BLOB), CAST(m.role AS BLOB), "
    "CASE WHEN typeof(m.content) = 'text' THEN CAST(m.content AS BLOB) END, "
    "CAST(s.source AS BLOB), CAST(s.user_id AS BLOB) "
    "FROM messages m LEFT JOIN sessions s ON s.id = m.session_id "
    "WHERE m.id > ? ORDER BY m.id LIMIT ?")
_GIVEN = ("SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
          "coalesce((SELECT max(id) FROM messages), 0))")
_GIVEN_PLAIN = "SELECT coalesce(max(id), 0) FROM messages"  # a store without AUTOINCREMENT
_HAS_SEQUENCE = "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'"
CONTENT_JSON = "\x00json:"
"""How Hermes' SessionDB marks a content it stored as JSON (a list of parts: text, images)."""


@dataclass(frozen=True)
class StoredMessage:
    """One row of Hermes' `messages` table, with its session's platform and user."""

    id: int
    session: str
    role: str
    text: str
    platform: str
    user: str | None


def read_messages(db: Path, after: int, limit: int) -> list[StoredMessage]:
    """Messages with id > `after`, oldest first, read-only (blocking); [] without a store."""
    return read_store(db, after, limit)[1]


def read_store(db: Path, after: int, limit: int) -> tuple[int | None, list[StoredMessage]]:
    """The highest message id the store ever gave (None without a store), and its messages
    with id > `after`, oldest first; read-only, blocking."""
    if not db.exists():
        return None, []
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        sequenced = conn.execute(_HAS_SEQUENCE).fetchone() is not None
        given = conn.execute(_GIVEN if sequenced else _GIVEN_PLAIN).fetchone()
        rows = conn.execute(_SELECT, (after, limit)).fetchall()
    finally:
        conn.close()
    return int(given[0] or 0), [StoredMessage(int(r[0]), _text(r[1]) or "", _text(r[2]) or "",
                                              message_text(_text(r[3]) or ""),
                                              _text(r[4]) or "", _text(r[5])) for r in rows]


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else bytes(raw).decode(errors="replace")


def message_text(content: str) -> str:
    """What a stored content says: itself, or the text parts of content stored as JSON."""
    if not content.startswith(CONTENT_JSON):
        return content
    try:
        parts = json.loads(content[len(CONTENT_JSON):])
    except (ValueError, RecursionError):
        return ""
    if isinstance(parts, str):
        return parts
    texts = [p.get("text") for p in (parts if isinstance(parts, list) else [parts])
             if isinstance(p, dict) and p.get("type") == "text"]
    return "\n".join(t for t in texts if isinstance(t, str))


class TranscriptIngest:
    """The layer's service: every `interval_s`, the messages Hermes stored since the cursor
    become `human-exchange` events (user: human, assistant: agent) about the session's
    platform user, or `identity` for sessions without one."""

    name = "hermes-transcripts"

    def __init__(self, hermes_home: Path, *, identity: str, interval_s: float = 5.0,
                 batch: int = 500) -> None:
        self.db = hermes_home / "state.db"
        self.identity = identity
        self.interval_s = interval_s
        self.batch = batch
        self.key = f"hermes-transcripts:{hermes_home}"
        self._records = hashlib.sha256(str(hermes_home).encode()).hexdigest()[:8]

    async def __call__(self, engine: Engine) -> None:
        trouble = StoreTrouble(self.name, self.db, log, self.interval_s)
        while True:
            try:
                while await self.step(engine.events, host=engine.host or "") == self.batch:
                    pass  # a full batch: more are waiting
                trouble.cleared()
            except sqlite3.Error as exc:  # locked, corrupt, replaced: the next read may do
                await trouble.report(engine.events, exc, engine.host or "")
            except VersionConflict as exc:  # the plugin marked a session just now: read again
                log.debug("pulse: hermes transcripts: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def step(self, events: EventStore, *, host: str = "") -> int:
        """Ingest the next batch; how many stored messages it moved the cursor over."""
        last = await events.read(key=self.key, newest_first=True, limit=1)
        cursor = last[0].payload(TranscriptCursor) if last else TranscriptCursor(0)
        version = last[0].version if last else 0
        given, found = await asyncio.to_thread(read_store, self.db, cursor.message_id,
                                               self.batch)
        if given is not None and given < cursor.message_id:  # a new store: ids from 1 again
            log.warning("pulse: hermes transcripts: %s is a new store (its ids end at %d, "
                        "below the %d ingested): ingesting it from its start", self.db,
                        given, cursor.message_id)
            cursor = TranscriptCursor(0, cursor.generation + 1)
            given, found = await asyncio.to_thread(read_store, self.db, 0, self.batch)
        if found:
            await self._store(events, found, cursor.generation, version, host)
        return len(found)

    async def _store(self, events: EventStore, found: list[StoredMessage], generation: int,
                     version: int, host: str) -> int:
        """Append the exchanges of `found` and the cursor past them at the cursor's
        `version`; the cursor's new version. Messages the log refuses are halved down to the
        one message it refuses, which is recorded as an `error` instead."""
        recorders = {s: await session_recorder(events, s) for s in {m.session for m in found}}
        live = {s for s, kind in recorders.items() if kind == SESSION_FOLLOWED}
        taken = sorted(s for s, kind in recorders.items() if kind is None)
        drafts = [
            exchange_draft(identity_of(m.platform, m.user, self.identity), m.text,
                           ROLES[m.role], record=self._record(generation, m.id),
                           origin=ORIGIN)
            for m in found
            if m.session not in live and m.platform != SUBAGENT and m.role in ROLES
            and m.text.strip()]
        drafts += [EventDraft(SESSION_INGESTED, session_key(s), {"home": self.key},
                              origin=ORIGIN) for s in taken]
        moved = EventDraft(CURSOR_KIND, self.key, msgspec.to_builtins(
            TranscriptCursor(found[-1].id, generation)), origin=ORIGIN)
        try:
            await events.append([*drafts, moved], expect={self.key: version,
                                                          **{session_key(s): 0 for s in taken}})
        except InvalidEvent as exc:
            if len(found) > 1:
                half = len(found) // 2
                version = await self._store(events, found[:half], generation, version, host)
                return await self._store(events, found[half:], generation, version, host)
            log.warning("pulse: hermes transcripts: message %d of session %s not stored: %s",
                        found[0].id, found[0].session, exc)
            refused = error_draft(f"service:{self.name}", exc, {
                "store": str(self.db), "session_id": found[0].session,
                "message_id": found[0].id}, host=host)
            await events.append([refused, moved], expect={self.key: version})
        return version + 1

    def _record(self, generation: int, message_id: int) -> str:
        """The exchange's record id: one per message of one store."""
        store = self._records if generation == 0 else f"{self._records}.{generation}"
        return f"x-hermes-{store}-{message_id}"
