"""The quiet hold: per identity, unchanged checks skipped since the last review, in SQLite.

Skips are counted here, not written as events: a quiet world costs no log growth, and the next
real review reports the silent interval truthfully from this count.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import msgspec

from pulse_core.store.sqlite import open_database, sqlite_errors

SCHEMA = """
CREATE TABLE IF NOT EXISTS quiet (
    identity      TEXT PRIMARY KEY,
    skips         INTEGER NOT NULL,
    last_check_at INTEGER NOT NULL,
    hold_until    INTEGER NOT NULL
) WITHOUT ROWID
"""


class QuietState(msgspec.Struct, frozen=True):
    """Unchanged checks skipped since the last review, the last check, and the hold's end."""

    skips: int = 0
    last_check_at: int = 0
    hold_until: int = 0


class QuietStore:
    """Quiet state for every identity: read from memory, written behind in one transaction."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._states: dict[str, QuietState] = {}
        self._dirty: set[str] = set()
        if path is not None:
            self._conn = open_database(path, schema=SCHEMA, schema_version=1,
                                       synchronous="NORMAL", purpose="quiet-hold store")
            with sqlite_errors(path):
                for identity, skips, last, hold in self._conn.execute("SELECT * FROM quiet"):
                    self._states[identity] = QuietState(skips, last, hold)

    def get(self, identity: str) -> QuietState:
        """The identity's quiet state (empty if none)."""
        return self._states.get(identity) or QuietState()

    def put(self, identity: str, state: QuietState) -> None:
        """Change an identity's quiet state; `flush` makes it durable."""
        self._states[identity] = state
        self._dirty.add(identity)

    def _flush_sync(self, rows: list[tuple[str, int, int, int]]) -> None:
        assert self._conn is not None and self.path is not None
        with sqlite_errors(self.path):
            self._conn.execute("BEGIN")
            self._conn.executemany("INSERT OR REPLACE INTO quiet VALUES (?, ?, ?, ?)", rows)
            self._conn.execute("COMMIT")

    async def flush(self) -> None:
        """Write every changed state in one transaction, off the event loop."""
        if not self._dirty or self._conn is None:
            self._dirty.clear()
            return
        rows = [(i, s.skips, s.last_check_at, s.hold_until)
                for i in self._dirty for s in (self._states[i],)]
        self._dirty.clear()
        await asyncio.to_thread(self._flush_sync, rows)

    def close(self) -> None:
        """Release the database."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
