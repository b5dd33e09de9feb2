"""Vitals: watcher samples by key and time, kept for a while, then collected.

`VitalsStore` is what the engine, watchers and executors use; `SqliteVitalsStore` keeps the
samples in HOME/vitals.db, written and read from one worker thread with the stdlib driver.
"""

from __future__ import annotations

import abc
import sqlite3
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from pulse_core._clock import Clock, SystemClock
from pulse_core._events import decode_data, encode_data
from pulse_core.store._sqlite import (
    ReadOnlyConnection,
    SqliteWorkerStore,
)

T = TypeVar("T")

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS samples (
    key   TEXT NOT NULL,
    ts    INTEGER NOT NULL,
    data  BLOB,
    error TEXT
);
CREATE INDEX IF NOT EXISTS samples_key_ts ON samples(key, ts);
CREATE TABLE IF NOT EXISTS latest (
    key   TEXT PRIMARY KEY,
    ts    INTEGER NOT NULL,
    data  BLOB,
    error TEXT
) WITHOUT ROWID
"""


class Sample(msgspec.Struct, frozen=True, gc=False):
    """One reading of a watcher: its data, or the error that stopped it."""

    key: str
    ts: int
    data: Any
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the collect succeeded."""
        return self.error is None


class Retention(msgspec.Struct, frozen=True):
    """How long samples live: by age, and by count per key; gc deletes in bounded batches."""

    max_age_ms: int = 24 * 3600 * 1000
    max_per_key: int = 10_000
    batch: int = 5_000


class TickVitals(NamedTuple):
    """The samples recorded after a cursor (by key, oldest first), the new cursor, and the
    latest reading of every key."""

    cursor: int
    latest: dict[str, Sample]
    recent: dict[str, list[Sample]]


class VitalsStore(abc.ABC):
    """Samples per key. Unlike events, vitals are not history: gc removes them.

    Every sample gets an id larger than any before it; `cursor()` is the newest id and
    `since(cursor)` returns what was recorded after it, so a reader sees every sample once.
    """

    #: the clock that stamps samples recorded without a `ts`
    clock: Clock

    @classmethod
    async def open(
        cls, path: str | Path, *, synchronous: str = "NORMAL", clock: Clock | None = None,
        read_only: bool = False,
    ) -> VitalsStore:
        """The embedded vitals store at `path` (a SqliteVitalsStore)."""
        return await SqliteVitalsStore.open(path, synchronous=synchronous, clock=clock,
                                            read_only=read_only)

    @abc.abstractmethod
    async def record(
        self, key: str, data: Any = None, *, error: str | None = None, ts: int | None = None
    ) -> Sample:
        """Store one sample for `key` (now, unless `ts` is given)."""

    @abc.abstractmethod
    async def window(self, key: str, since_ms: int) -> list[Sample]:
        """Samples of `key` with ts >= since_ms, oldest first."""

    @abc.abstractmethod
    async def latest(self, keys: Iterable[str] | None = None) -> dict[str, Sample]:
        """The newest sample of each key (of every key when `keys` is None); gc never
        removes a key's latest reading."""

    @abc.abstractmethod
    async def since(self, cursor: int) -> tuple[int, dict[str, list[Sample]]]:
        """(new cursor, every sample recorded after `cursor` by key, oldest first)."""

    @abc.abstractmethod
    async def cursor(self) -> int:
        """The id of the newest sample (0 when there is none)."""

    async def for_tick(self, cursor: int) -> TickVitals:
        """What a tick reads, together: `since(cursor)` and `latest()` (a backend may answer
        both in one trip)."""
        new_cursor, recent = await self.since(cursor)
        return TickVitals(new_cursor, await self.latest(), recent)

    @abc.abstractmethod
    async def gc(self, retention: Retention | None = None) -> int:
        """Delete at most `retention.batch` expired samples; returns how many went."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the backend."""


def _sample(key: str, ts: int, data: bytes | None, error: str | None) -> Sample:
    return Sample(key, ts, decode_data(data), error)


class SqliteVitalsStore(SqliteWorkerStore, VitalsStore):
    """vitals.db: a `samples` table, and a one-row-per-key `latest` table beside it so that
    `latest` costs the number of keys, not the number of samples.

    gc never deletes the newest row, so ids (SQLite rowids) only grow. Read-only, the file is
    neither created nor written; an absent file reads as empty.
    """

    purpose = "vitals store"

    def __init__(self, path: Path, conn: sqlite3.Connection | ReadOnlyConnection,
                 pool: ThreadPoolExecutor, clock: Clock, read_only: bool) -> None:
        super().__init__(path, conn, pool, read_only)
        self.clock = clock

    @classmethod
    async def open(
        cls, path: str | Path, *, synchronous: str = "NORMAL", clock: Clock | None = None,
        read_only: bool = False,
    ) -> SqliteVitalsStore:
        """Open vitals.db at `path` (created unless `read_only`); raises a StoreError if it
        is not usable."""
        path = Path(path)
        conn, pool = await cls._connect(path, schema=SCHEMA, schema_version=SCHEMA_VERSION,
                                        synchronous=synchronous, read_only=read_only)
        return cls(path, conn, pool, clock or SystemClock(), read_only)

    async def record(
        self, key: str, data: Any = None, *, error: str | None = None, ts: int | None = None
    ) -> Sample:
        self._refuse_if_read_only("samples cannot be recorded or collected")
        raw = encode_data(data, f"vitals sample for {key!r}")
        sample = Sample(key, self.clock.now_ms() if ts is None else ts, decode_data(raw), error)
        row = (key, sample.ts, raw, error)

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO samples (key, ts, data, error) VALUES (?, ?, ?, ?)", row)
            conn.execute(
                "INSERT INTO latest (key, ts, data, error) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET ts = excluded.ts, data = excluded.data, "
                "error = excluded.error WHERE excluded.ts >= latest.ts", row)

        await self._run(self._write, insert)
        return sample

    async def window(self, key: str, since_ms: int) -> list[Sample]:
        rows = await self._run(
            self._read, "SELECT ts, data, error FROM samples WHERE key = ? AND ts >= ? "
            "ORDER BY ts", (key, since_ms))
        return [_sample(key, *r) for r in rows]

    async def latest(self, keys: Iterable[str] | None = None) -> dict[str, Sample]:
        rows = await self._run(self._read, "SELECT key, ts, data, error FROM latest")
        wanted = None if keys is None else set(keys)
        return {r[0]: _sample(*r) for r in rows if wanted is None or r[0] in wanted}

    def _since(self, cursor: int) -> tuple[int, dict[str, list[Sample]]]:
        rows = self._read("SELECT rowid, key, ts, data, error FROM samples WHERE rowid > ? "
                          "ORDER BY rowid", (cursor,))
        by_key: dict[str, list[Sample]] = {}
        for _, key, ts, data, error in rows:
            by_key.setdefault(key, []).append(_sample(key, ts, data, error))
        for samples in by_key.values():
            samples.sort(key=lambda s: s.ts)  # stable: equal times stay in recording order
        return (rows[-1][0] if rows else cursor), by_key

    async def since(self, cursor: int) -> tuple[int, dict[str, list[Sample]]]:
        return await self._run(self._since, cursor)

    def _for_tick(self, cursor: int) -> TickVitals:
        new_cursor, recent = self._since(cursor)
        latest = {r[0]: _sample(*r) for r in self._read("SELECT key, ts, data, error FROM latest")}
        return TickVitals(new_cursor, latest, recent)

    async def for_tick(self, cursor: int) -> TickVitals:
        return await self._run(self._for_tick, cursor)

    async def cursor(self) -> int:
        rows = await self._run(self._read, "SELECT coalesce(max(rowid), 0) FROM samples")
        return int(rows[0][0])

    async def gc(self, retention: Retention | None = None) -> int:
        self._refuse_if_read_only("samples cannot be recorded or collected")
        policy = retention or Retention()
        cutoff = self.clock.now_ms() - policy.max_age_ms

        def collect(conn: sqlite3.Connection) -> int:
            # The newest row stays, whatever its age: SQLite gives a new row max(rowid) + 1,
            # and deleting the newest would hand its id out again, under `since` cursors.
            newest = "(SELECT max(rowid) FROM samples)"
            removed = max(conn.execute(
                f"DELETE FROM samples WHERE rowid IN (SELECT rowid FROM samples WHERE ts < ? "
                f"AND rowid < {newest} LIMIT ?)", (cutoff, policy.batch)).rowcount, 0)
            for (key,) in conn.execute("SELECT key FROM latest").fetchall():
                if removed >= policy.batch:
                    break
                removed += max(conn.execute(
                    f"DELETE FROM samples WHERE rowid < {newest} AND rowid IN (SELECT rowid "
                    "FROM samples WHERE key = ? ORDER BY ts DESC LIMIT ? OFFSET ?)",
                    (key, policy.batch - removed, policy.max_per_key)).rowcount, 0)
            return removed

        return await self._run(self._write, collect)
