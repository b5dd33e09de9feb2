"""One group commit of events.db: the appends it carries, checked and staged in order."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pulse_core._errors import IdempotencyConflict, StoreError, VersionConflict
from pulse_core._events import Event
from pulse_core.store._recorder import AppendResult, PreparedAppend, StoredRow, row_event

COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"
INSERT = f"INSERT INTO events ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
UPSERT_HEAD = (
    "INSERT INTO heads (key, version) VALUES (?, ?) "
    "ON CONFLICT(key) DO UPDATE SET version = excluded.version"
)
Row = tuple[
    int, str, str, str, int, int, str, "int | None", str, "str | None", bytes, "str | None"
]


class Batch:
    """The state of one group-commit transaction, shared by the appends it carries.

    `known` holds key versions read in earlier transactions of this connection and still
    current (the caller drops it when another connection may have written).
    """

    def __init__(self, conn: sqlite3.Connection, next_seq: int, known: Mapping[str, int]) -> None:
        self.conn = conn
        self.next_seq = next_seq
        self.known = known
        self.heads: dict[str, int] = {}
        self.idem: dict[str, Row] = {}
        self.rows: list[Row] = []

    def head(self, key: str) -> int:
        version = self.heads.get(key)
        if version is None:
            version = self.known.get(key)
        if version is None:
            found = self.conn.execute("SELECT version FROM heads WHERE key = ?", (key,)).fetchone()
            version = found[0] if found else 0
        self.heads[key] = version
        return version

    def stored_by_idem(self, idem: str) -> Sequence[Any] | None:
        row = self.idem.get(idem)
        if row is not None:
            return row
        found: Sequence[Any] | None = self.conn.execute(
            f"SELECT {COLUMNS} FROM events WHERE idem = ?", (idem,)
        ).fetchone()
        return found

    def apply(self, append: PreparedAppend, now: int) -> AppendResult:
        """Stage one append into this batch, or raise without staging anything."""
        stored: list[Event | None] = [None] * len(append.drafts)
        replays = 0
        for index, draft in enumerate(append.drafts):
            if draft.idem is None:
                continue
            prior = self.stored_by_idem(draft.idem)
            if prior is None:
                continue
            if (prior[2], prior[3], bytes(prior[10])) != (draft.kind, draft.key, draft.data):
                raise IdempotencyConflict(draft.idem, prior[0])
            stored[index] = row_event(prior)
            replays += 1
        if append.drafts and replays == len(append.drafts):
            return AppendResult(append.tx, tuple(e for e in stored if e is not None), True)
        for key, expected in append.expect.items():
            actual = self.head(key)
            if actual != expected:
                raise VersionConflict(key, expected, actual)
        versions: dict[str, int] = {}
        rows: list[Row] = []
        events: list[Event] = []
        seq = self.next_seq
        for draft, prior_event in zip(append.drafts, stored, strict=True):
            if prior_event is not None:
                events.append(prior_event)
                continue
            version = versions.get(draft.key) or self.head(draft.key)
            version += 1
            versions[draft.key] = version
            row: Row = (seq, draft.id, draft.kind, draft.key, version, now, draft.origin,
                        draft.cause, append.tx, draft.idem, draft.data, draft.hash)
            rows.append(row)
            events.append(row_event(row))
            seq += 1
        self.next_seq = seq
        self.heads.update(versions)
        self.rows.extend(rows)
        self.idem.update((r[9], r) for r in rows if r[9] is not None)
        return AppendResult(append.tx, tuple(events), False)

    def write(self) -> None:
        """Insert the staged rows and move the heads of the keys they touch."""
        if len(self.rows) == 1:  # a lone append's one row: execute costs less than executemany
            row = self.rows[0]
            self.conn.execute(INSERT, row)
            self.conn.execute(UPSERT_HEAD, (row[3], self.heads[row[3]]))
        elif self.rows:
            self.conn.executemany(INSERT, self.rows)
            written = {r[3] for r in self.rows}
            self.conn.executemany(UPSERT_HEAD, [(k, self.heads[k]) for k in written])


def copy_chunk(conn: sqlite3.Connection, chunk: Sequence[StoredRow], location: str) -> None:
    """Store already-stored rows exactly as given, and the versions they bring their keys to,
    in one transaction on the writer connection `conn`; StoreError (nothing stored) unless
    their seqs are consecutive and continue the log."""
    seqs = [row.seq for row in chunk]
    if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        gap = next(b for a, b in itertools.pairwise(seqs) if b != a + 1)
        raise StoreError(f"{location}: rows to copy jump to seq {gap} — copy a log whole, "
                         "its seqs consecutive")
    heads = {row.key: row.version for row in chunk}
    conn.execute("BEGIN IMMEDIATE")
    try:
        last = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
        if seqs[0] != last + 1:
            raise StoreError(
                f"{location}: the rows to copy start at seq {seqs[0]} but this log ends at "
                f"seq {last} — copy into an empty log (or continue from seq {last + 1})")
        conn.executemany(INSERT, [msgspec.structs.astuple(row) for row in chunk])
        conn.executemany(UPSERT_HEAD, heads.items())
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
