"""One group commit of events.db: the requests it carries, checked and staged in order."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pulse_core.errors import IdempotencyConflict, VersionConflict
from pulse_core.events import Event, EventDraft, decode_data, uuid7
from pulse_core.store.base import AppendResult

COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"
INSERT = f"INSERT INTO events ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
UPSERT_HEAD = (
    "INSERT INTO heads (key, version) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET version = excluded.version"
)
Row = tuple[
    int, str, str, str, int, int, str, "int | None", str, "str | None", bytes, "str | None"
]


def row_event(row: Sequence[Any]) -> Event:
    """The Event a stored (or staged) row stands for."""
    return Event(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], row[8],
                 row[9], decode_data(row[10]), row[11])


@dataclass
class Request:
    """One append call waiting for the writer: its checked drafts, expectations, future."""

    drafts: list[tuple[EventDraft, bytes, str | None]]
    expect: dict[str, int]
    future: asyncio.Future[AppendResult]
    tx: str = field(default_factory=uuid7)


class Batch:
    """The state of one group-commit transaction, shared by the requests it carries."""

    def __init__(self, conn: sqlite3.Connection, next_seq: int) -> None:
        self.conn = conn
        self.next_seq = next_seq
        self.heads: dict[str, int] = {}
        self.idem: dict[str, Row] = {}
        self.rows: list[Row] = []

    def head(self, key: str) -> int:
        version = self.heads.get(key)
        if version is None:
            found = self.conn.execute("SELECT version FROM heads WHERE key = ?", (key,)).fetchone()
            version = self.heads[key] = found[0] if found else 0
        return version

    def stored_by_idem(self, idem: str) -> Sequence[Any] | None:
        row = self.idem.get(idem)
        if row is not None:
            return row
        found: Sequence[Any] | None = self.conn.execute(
            f"SELECT {COLUMNS} FROM events WHERE idem = ?", (idem,)
        ).fetchone()
        return found

    def apply(self, req: Request, now: int) -> AppendResult:
        """Stage one request into this batch, or raise without staging anything."""
        stored: list[Event | None] = []
        for draft, raw, _ in req.drafts:
            prior = self.stored_by_idem(draft.idem) if draft.idem is not None else None
            if prior is None:
                stored.append(None)
            elif (prior[2], prior[3], bytes(prior[10])) == (draft.kind, draft.key, raw):
                stored.append(row_event(prior))
            else:
                raise IdempotencyConflict(str(draft.idem), prior[0])
        if req.drafts and all(e is not None for e in stored):
            return AppendResult(req.tx, tuple(e for e in stored if e is not None), True)
        for key, expected in req.expect.items():
            actual = self.head(key)
            if actual != expected:
                raise VersionConflict(key, expected, actual)
        heads: dict[str, int] = {}
        rows: list[Row] = []
        events: list[Event] = []
        seq = self.next_seq
        for (draft, raw, digest), prior_event in zip(req.drafts, stored, strict=True):
            if prior_event is not None:
                events.append(prior_event)
                continue
            version = heads.get(draft.key, self.head(draft.key)) + 1
            heads[draft.key] = version
            row: Row = (seq, uuid7(), draft.kind, draft.key, version, now, draft.origin,
                         draft.cause, req.tx, draft.idem, raw, digest)
            rows.append(row)
            events.append(row_event(row))
            seq += 1
        self.next_seq = seq
        self.heads.update(heads)
        self.rows.extend(rows)
        self.idem.update((r[9], r) for r in rows if r[9] is not None)
        return AppendResult(req.tx, tuple(events), False)
