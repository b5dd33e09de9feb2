"""Transcript ingest: Hermes' session store (HERMES_HOME/state.db, SQLite) followed into pulse
memory, each message once.

The store's `messages` rows are numbered by an increasing integer id; the cursor (the last
id ingested) is an event in the log, appended with the exchanges it covers in one append at
the cursor's expected version, so a message is remembered once whatever restarts or races.
Sessions the pulse plugin records live (marked `hermes-session-followed`) are skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_adapters.hermes._memory import ROLES, identity_of, session_key
from pulse_core import EventDraft, EventStore, register_kind
from pulse_core.memory import exchange_draft

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.hermes")

CURSOR_KIND = "hermes-transcript-cursor"
ORIGIN = "agent:hermes"


class TranscriptCursor(msgspec.Struct, frozen=True):
    """Payload of hermes-transcript-cursor: the last message id ingested."""

    message_id: int


register_kind(CURSOR_KIND, "how far Hermes' session store was ingested into memory; key: "
              "hermes-transcripts:<hermes home>", TranscriptCursor)

_SELECT = (
    "SELECT m.id, m.session_id, m.role, m.content, s.source, s.user_id "
    "FROM messages m LEFT JOIN sessions s ON s.id = m.session_id "
    "WHERE m.id > ? ORDER BY m.id LIMIT ?")


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
    if not db.exists():
        return []
    conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        rows = conn.execute(_SELECT, (after, limit)).fetchall()
    finally:
        conn.close()
    return [StoredMessage(int(r[0]), str(r[1]), str(r[2]),
                          r[3] if isinstance(r[3], str) else "", str(r[4] or ""),
                          None if r[5] is None else str(r[5])) for r in rows]


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
        self._problem: str | None = None

    async def __call__(self, engine: Engine) -> None:
        while True:
            try:
                while await self.step(engine.events) == self.batch:
                    pass  # a full batch: more are waiting
                self._problem = None
            except sqlite3.Error as exc:
                problem = f"{self.db}: {type(exc).__name__}: {exc}"
                if problem != self._problem:
                    log.warning("pulse: hermes transcripts: cannot read %s — retrying every "
                                "%g s", problem, self.interval_s)
                self._problem = problem
            await asyncio.sleep(self.interval_s)

    async def step(self, events: EventStore) -> int:
        """Ingest the next batch; how many stored messages it moved the cursor over."""
        last = await events.read(key=self.key, newest_first=True, limit=1)
        after = last[0].payload(TranscriptCursor).message_id if last else 0
        version = last[0].version if last else 0
        found = await asyncio.to_thread(read_messages, self.db, after, self.batch)
        if not found:
            return 0
        live = {s for s in {m.session for m in found} if await events.head(session_key(s))}
        drafts = [
            exchange_draft(identity_of(m.platform, m.user, self.identity), m.text,
                           ROLES[m.role], record=f"x-hermes-{self._records}-{m.id}",
                           origin=ORIGIN)
            for m in found
            if m.session not in live and m.role in ROLES and m.text.strip()]
        drafts.append(EventDraft(CURSOR_KIND, self.key,
                                 msgspec.to_builtins(TranscriptCursor(found[-1].id)),
                                 origin=ORIGIN))
        await events.append(drafts, expect={self.key: version})
        return len(found)
