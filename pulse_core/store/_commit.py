"""One group commit of events.db: the appends it carries, checked and staged in order."""

from __future__ import annotations

import functools
import itertools
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from pulse_core._errors import IdempotencyConflict, StoreError, VersionConflict
from pulse_core._events import Event, decode_data
from pulse_core.store._recorder import AppendResult, PreparedAppend, StoredRow, row_event

COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"


class _Insert(NamedTuple):
    """A one-row INSERT in three parts, so that it can be written for many rows at once."""

    into: str  # up to VALUES
    row: str  # one row's placeholders
    tail: str  # after the rows

    def sql(self, rows: int) -> str:
        return _many_rows_sql(self, rows)


_EVENTS = _Insert(f"INSERT INTO events ({COLUMNS}) VALUES ", "(?,?,?,?,?,?,?,?,?,?,?,?)", "")
HEAD = "SELECT version FROM events WHERE key = ? ORDER BY seq DESC LIMIT 1"
"""A key's version: its newest event's (the `(key, seq)` index finds it)."""
# Rows per multi-row statement, largest first: an INSERT of 64 rows costs about half of
# executemany's 64 steps, and these four sizes are the only statement texts (each prepared
# once, then taken from the connection's statement cache).
_ROWS_PER_STATEMENT = (64, 16, 4, 1)
Row = tuple[
    int, str, str, str, int, int, str, "int | None", str, "str | None", bytes, "str | None"
]


class Batch:
    """The state of one group-commit transaction, shared by the appends it carries.

    `known` holds key versions read in earlier transactions of this connection and still
    current (the caller drops it when another connection may have written); `complete` says
    it holds every key the log has, so a key it lacks has no events yet.
    """

    def __init__(self, conn: sqlite3.Connection, next_seq: int, known: Mapping[str, int],
                 complete: bool) -> None:
        self.conn = conn
        self.next_seq = next_seq
        self.known = known
        self.complete = complete
        self.heads: dict[str, int] = {}
        self.idem: dict[str, Row] = {}
        self.rows: list[Row] = []

    def head(self, key: str) -> int:
        version = self.heads.get(key)
        if version is None:
            version = self.known.get(key)
        if version is None:
            if self.complete:
                version = 0
            else:
                found = self.conn.execute(HEAD, (key,)).fetchone()
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
        drafts = append.drafts
        stored: list[Event | None] | None = None  # the events idempotency keys name
        replays = 0
        for index, draft in enumerate(drafts):
            if draft.idem is None:
                continue
            prior = self.stored_by_idem(draft.idem)
            if prior is None:
                continue
            if (prior[2], prior[3], bytes(prior[10])) != (draft.kind, draft.key, draft.data):
                raise IdempotencyConflict(draft.idem, prior[0])
            if stored is None:
                stored = [None] * len(drafts)
            stored[index] = row_event(prior)
            replays += 1
        if drafts and replays == len(drafts):
            assert stored is not None
            return AppendResult(append.tx, tuple(e for e in stored if e is not None), True)
        for key, expected in append.expect.items():
            actual = self.head(key)
            if actual != expected:
                raise VersionConflict(key, expected, actual)
        versions: dict[str, int] = {}
        rows: list[Row] = []
        events: list[Event] = []
        seq, tx = self.next_seq, append.tx
        for index, draft in enumerate(drafts):
            if stored is not None and (prior_event := stored[index]) is not None:
                events.append(prior_event)
                continue
            key = draft.key
            version = (versions.get(key) or self.head(key)) + 1
            versions[key] = version
            rows.append((seq, draft.id, draft.kind, key, version, now, draft.origin,
                         draft.cause, tx, draft.idem, draft.data, draft.hash))
            events.append(Event(seq, draft.id, draft.kind, key, version, now, draft.origin,
                                draft.cause, tx, draft.idem, decode_data(draft.data),
                                draft.hash))
            seq += 1
        self.next_seq = seq
        self.heads.update(versions)
        self.rows.extend(rows)
        self.idem.update((r[9], r) for r in rows if r[9] is not None)
        return AppendResult(tx, tuple(events), False)

    def write(self) -> None:
        """Insert the staged rows."""
        if self.rows:
            _insert_rows(self.conn, _EVENTS, self.rows)


def _insert_rows(conn: sqlite3.Connection, insert: _Insert,
                 rows: Sequence[Sequence[Any]]) -> None:
    """`insert` for every row, as a few statements of many rows each."""
    at = 0
    for size in _ROWS_PER_STATEMENT:
        while len(rows) - at >= size:
            if size == 1:
                conn.execute(insert.sql(1), rows[at])
            else:
                conn.execute(insert.sql(size),
                             list(itertools.chain.from_iterable(rows[at:at + size])))
            at += size


@functools.cache
def _many_rows_sql(insert: _Insert, rows: int) -> str:
    return f"{insert.into}{','.join([insert.row] * rows)}{insert.tail}"


def copy_chunk(conn: sqlite3.Connection, chunk: Sequence[StoredRow], location: str) -> None:
    """Store already-stored rows exactly as given in one transaction on the writer connection
    `conn`; StoreError (nothing stored) unless their seqs are consecutive and continue the
    log."""
    seqs = [row.seq for row in chunk]
    if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        gap = next(b for a, b in itertools.pairwise(seqs) if b != a + 1)
        raise StoreError(f"{location}: rows to copy jump to seq {gap} — copy a log whole, "
                         "its seqs consecutive")
    conn.execute("BEGIN IMMEDIATE")
    try:
        last = conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
        if seqs[0] != last + 1:
            raise StoreError(
                f"{location}: the rows to copy start at seq {seqs[0]} but this log ends at "
                f"seq {last} — copy into an empty log (or continue from seq {last + 1})")
        _insert_rows(conn, _EVENTS, [msgspec.structs.astuple(row) for row in chunk])
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
