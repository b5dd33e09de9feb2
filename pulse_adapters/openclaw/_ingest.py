"""Transcript ingest: the agent's stored conversation, message by message, into memory.

Every `interval_s` the service reads the rows each transcript session gained since its
cursor (`openclaw-transcript-read` at key `openclaw-transcript:<agent>:<session id>`). A user
or assistant message becomes a `human-exchange` of the configured identity (role `human` or
`agent`, record `openclaw-<message id>`); a row that is not a readable entry is recorded as
`openclaw-transcript-malformed` and skipped. The exchanges, the malformed records and the
cursor's advance are one append with the cursor's expected version: each message once. A row
the log refuses to store (a JSON-escaped lone surrogate, say) is recorded as an `error` at key
`service:openclaw-transcripts` naming its session and seq, in the append that moves the cursor
past it (so once), and the rows around it are stored; a session no cursor key can name (a
NUL in its id) is recorded so and passed over while the service runs. A store that cannot be
read (locked, corrupt, replaced) is recorded as an `error` at that key too, once until the
problem changes, and read again next time.

A session's turn is foreground work on the agent's model route: a user message read after the
session's first read begins a hold (`foreground-began`, holder `openclaw:<agent>:<session
id>`, lapsing after `foreground_lapse_s`), and the next assistant message read ends it
(`foreground-ended`), each in the append that stores the message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from typing import TYPE_CHECKING, Any

from pulse_adapters.agents import StoreTrouble
from pulse_adapters.awareness import foreground_began, foreground_ended
from pulse_adapters.openclaw._kinds import (
    TRANSCRIPT_MALFORMED,
    TRANSCRIPT_READ,
    TranscriptMalformed,
    TranscriptRead,
    transcript_key,
)
from pulse_adapters.openclaw._settings import TranscriptSettings
from pulse_adapters.openclaw._store import AgentStore, TranscriptRow
from pulse_core import EventDraft, EventStore, InvalidEvent, VersionConflict, error_draft
from pulse_core.memory import exchange_draft

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.openclaw")

ORIGIN = "agent:openclaw-transcripts"
ROLES = {"user": "human", "assistant": "agent"}
MAX_TEXT = 20_000


class Malformed(ValueError):
    """A transcript row that is not a readable entry."""


def message_of(row: TranscriptRow) -> tuple[str, str, str] | None:
    """(message id, memory role, text) of a row holding a user or assistant message; None
    for every other entry (headers, model changes, tool results, heartbeat polls, pulse's
    own notices, messages without text); Malformed for a row that cannot be read."""
    if row.text is None:
        raise Malformed("stored compressed (event_zstd), which this version does not read")
    try:
        entry = json.loads(row.text)
    except ValueError as exc:
        raise Malformed(f"not JSON: {exc}") from None
    except RecursionError:
        raise Malformed("JSON nested too deeply to read") from None
    if not isinstance(entry, dict):
        raise Malformed(f"a JSON {type(entry).__name__}, not an entry object")
    if entry.get("type") != "message":
        return None
    message, entry_id = entry.get("message"), entry.get("id")
    if not isinstance(message, dict) or not isinstance(entry_id, str) or not entry_id:
        raise Malformed("a message entry without an id or a message object")
    given = message.get("role")
    role = ROLES.get(given) if isinstance(given, str) else None
    provenance = message.get("provenance")
    if role is None or (isinstance(provenance, dict)
                        and provenance.get("kind") == "internal_system"):
        return None
    text = _text(message.get("content"))
    if not text or text.startswith("[pulse:"):
        return None
    return entry_id, role, text[:MAX_TEXT]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(p for p in parts if isinstance(p, str)).strip()
    return ""


class TranscriptIngest:
    """The layer's service `openclaw-transcripts` (see the module docstring)."""

    name = "openclaw-transcripts"

    def __init__(self, settings: TranscriptSettings, store: AgentStore) -> None:
        self.settings = settings
        self.store = store
        self.cursors: dict[str, tuple[int, int]] = {}  # session id -> (seq, cursor version)
        self.keyless: set[str] = set()  # sessions whose cursor's key the log cannot store
        self.holding: set[str] = set()  # sessions whose turn holds the foreground
        self.backlog: set[str] = set()  # sessions being read for the first time

    async def __call__(self, engine: Engine) -> None:
        trouble = StoreTrouble(self.name, self.store.path, log, self.settings.interval_s)
        while True:
            try:
                await self.ingest(engine.events, host=engine.host or "")
                trouble.cleared()
            except sqlite3.Error as exc:  # locked, corrupt, replaced: the next read may do
                await trouble.report(engine.events, exc, engine.host or "")
            await asyncio.sleep(self.settings.interval_s)

    async def ingest(self, events: EventStore, *, host: str = "") -> int:
        """Ingest what every session gained since its cursor; the number of exchanges."""
        heads = await asyncio.to_thread(self.store.session_heads)
        written = 0
        for session_id, head in heads.items():
            if session_id in self.keyless:
                continue
            seq, version = await self._cursor(events, session_id)
            if seq < 0:
                self.backlog.add(session_id)
            while seq < head:
                rows = await asyncio.to_thread(self.store.rows_after, session_id, seq,
                                               self.settings.batch)
                if not rows:
                    break
                try:
                    version, messages = await self._store(events, session_id, rows, version,
                                                          host)
                except VersionConflict:  # another engine moved it: read it again
                    self.cursors.pop(session_id, None)
                    seq, version = await self._cursor(events, session_id)
                    continue
                except InvalidEvent as exc:  # no cursor can be stored (a NUL in its id)
                    await self._pass_over(events, session_id, exc, host)
                    break
                written += messages
                seq = rows[-1].seq
                self.cursors[session_id] = (seq, version)
            self.backlog.discard(session_id)
        return written

    async def _store(self, events: EventStore, session_id: str, rows: list[TranscriptRow],
                     version: int, host: str) -> tuple[int, int]:
        """Append `rows` and the cursor past them at the cursor's `version`: the cursor's new
        version and the exchanges stored. Rows the log refuses are halved down to the one
        row it refuses, which is recorded as an `error` instead."""
        drafts, messages = self._drafts(session_id, rows)
        key = transcript_key(self.store.agent, session_id)
        held = session_id in self.holding
        turn = self._turn(session_id, drafts)
        try:
            await events.append([*drafts, *turn,
                                 self._read(session_id, rows[-1].seq, messages)],
                                expect={key: version})
        except BaseException as exc:
            # not stored (or not known to be): the hold is as it was, so the retry begins or
            # ends it again (a second end after a lost reply is harmless)
            (self.holding.add if held else self.holding.discard)(session_id)
            if not isinstance(exc, InvalidEvent):
                raise
            if len(rows) > 1:
                half = len(rows) // 2
                version, before = await self._store(events, session_id, rows[:half], version,
                                                    host)
                version, after = await self._store(events, session_id, rows[half:], version,
                                                   host)
                return version, before + after
            log.warning("pulse: openclaw transcript %s row %d not stored: %s", session_id,
                        rows[0].seq, exc)
            refused = error_draft(f"service:{self.name}", exc, {
                "store": str(self.store.path), "session_id": session_id, "seq": rows[0].seq},
                host=host)
            await events.append([refused, self._read(session_id, rows[0].seq, 0)],
                                expect={key: version})
            messages = 0
        return version + 1, messages

    def _turn(self, session_id: str, drafts: list[EventDraft]) -> list[EventDraft]:
        """The foreground hold's begin or end the messages in `drafts` call for: a turn is
        under way when the last message is the user's (not in a session's first read, the
        backlog), over once the agent answered."""
        lapse_s = self.settings.foreground_lapse_s
        roles = [d.data["role"] for d in drafts
                 if d.kind == "human-exchange" and isinstance(d.data, dict)]
        if lapse_s <= 0 or not roles:
            return []
        holder = f"openclaw:{self.store.agent}:{session_id}"
        if roles[-1] == "human" and session_id not in self.backlog:
            self.holding.add(session_id)
            return [foreground_began(holder, lapse_s, origin=ORIGIN)]
        if roles[-1] == "agent" and session_id in self.holding:
            self.holding.discard(session_id)
            return [foreground_ended(holder, origin=ORIGIN)]
        return []

    async def _pass_over(self, events: EventStore, session_id: str, exc: InvalidEvent,
                         host: str) -> None:
        """Leave out, while this service runs, a session no cursor can be kept for."""
        self.keyless.add(session_id)
        log.warning("pulse: openclaw transcript %r passed over: %s", session_id, exc)
        await events.append([error_draft(f"service:{self.name}", exc, {
            "store": str(self.store.path), "session_id": session_id}, host=host)])

    async def _cursor(self, events: EventStore, session_id: str) -> tuple[int, int]:
        if session_id not in self.cursors:
            last = await events.read(key=transcript_key(self.store.agent, session_id),
                                     newest_first=True, limit=1)
            self.cursors[session_id] = (int(last[0].data["seq"]), last[0].version) if last \
                else (-1, 0)
        return self.cursors[session_id]

    def _drafts(self, session_id: str, rows: list[TranscriptRow]
                ) -> tuple[list[EventDraft], int]:
        agent = self.store.agent
        drafts: list[EventDraft] = []
        messages = 0
        for row in rows:
            try:
                found = message_of(row)
            except Malformed as exc:
                log.warning("pulse: openclaw transcript %s row %d skipped: %s", session_id,
                            row.seq, exc)
                drafts.append(EventDraft(TRANSCRIPT_MALFORMED, transcript_key(agent, session_id)
                                         + ":malformed", TranscriptMalformed(
                    agent=agent, session_id=session_id, seq=row.seq, reason=str(exc),
                    excerpt=(row.text or "")[:200]), origin=ORIGIN))
                continue
            if found is None:
                continue
            message_id, role, text = found
            messages += 1
            drafts.append(exchange_draft(self.settings.identity, text, role,
                                         record=f"openclaw-{message_id}", origin=ORIGIN))
        return drafts, messages

    def _read(self, session_id: str, seq: int, messages: int) -> EventDraft:
        """The cursor's advance to row `seq` over `messages` exchanges."""
        agent = self.store.agent
        return EventDraft(TRANSCRIPT_READ, transcript_key(agent, session_id),
                          TranscriptRead(agent=agent, session_id=session_id, seq=seq,
                                         messages=messages), origin=ORIGIN)
