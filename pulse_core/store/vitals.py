"""vitals.db: watcher samples by key and time, kept for a while, then collected."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec

from pulse_core.clock import Clock, SystemClock
from pulse_core.errors import StoreClosed
from pulse_core.events import decode_data, encode_data
from pulse_core.store.sqlite import open_database, sqlite_errors

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


class VitalsStore:
    """Samples per key in vitals.db. Unlike events, vitals are not history: gc removes them."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, clock: Clock) -> None:
        self._conn = conn
        self.path = path
        self.clock = clock
        self._lock = asyncio.Lock()
        self._closed = False

    @classmethod
    async def open(
        cls, path: str | Path, *, synchronous: str = "NORMAL", clock: Clock | None = None
    ) -> VitalsStore:
        """Open (or create) vitals.db at `path`; raises a StoreError if it is not usable."""
        path = Path(path)
        first = await asyncio.to_thread(
            open_database, path, schema=SCHEMA, schema_version=SCHEMA_VERSION,
            synchronous=synchronous, purpose="vitals store",
        )
        first.close()
        with sqlite_errors(path):
            conn = await aiosqlite.connect(path, timeout=10.0, isolation_level=None)
            await conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
        return cls(conn, path, clock or SystemClock())

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"{self.path}: used after close")

    async def record(
        self, key: str, data: Any = None, *, error: str | None = None, ts: int | None = None
    ) -> Sample:
        """Store one sample for `key` (now, unless `ts` is given)."""
        self._check_open()
        raw = encode_data(data, f"vitals sample for {key!r}")
        sample = Sample(key, self.clock.now_ms() if ts is None else ts, decode_data(raw), error)
        row = (key, sample.ts, raw, error)
        async with self._lock:
            with sqlite_errors(self.path):
                await self._conn.execute("BEGIN")
                try:
                    await self._conn.execute(
                        "INSERT INTO samples (key, ts, data, error) VALUES (?, ?, ?, ?)", row)
                    await self._conn.execute(
                        "INSERT INTO latest (key, ts, data, error) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET ts = excluded.ts, data = excluded.data, "
                        "error = excluded.error WHERE excluded.ts >= latest.ts", row)
                    await self._conn.execute("COMMIT")
                except BaseException:
                    await self._conn.execute("ROLLBACK")
                    raise
        return sample

    async def window(self, key: str, since_ms: int) -> list[Sample]:
        """Samples of `key` with ts >= since_ms, oldest first."""
        self._check_open()
        with sqlite_errors(self.path):
            cursor = await self._conn.execute(
                "SELECT ts, data, error FROM samples WHERE key = ? AND ts >= ? ORDER BY ts",
                (key, since_ms),
            )
            rows = await cursor.fetchall()
        return [Sample(key, r[0], decode_data(r[1]), r[2]) for r in rows]

    async def cursor(self) -> int:
        """The id of the newest sample (0 when there is none): `since` starts after it."""
        self._check_open()
        with sqlite_errors(self.path):
            cursor = await self._conn.execute("SELECT coalesce(max(rowid), 0) FROM samples")
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def since(self, cursor: int) -> tuple[int, dict[str, list[Sample]]]:
        """Every sample recorded after `cursor`, by key, oldest first, and the new cursor."""
        self._check_open()
        with sqlite_errors(self.path):
            rows = await (await self._conn.execute(
                "SELECT rowid, key, ts, data, error FROM samples WHERE rowid > ? ORDER BY rowid",
                (cursor,))).fetchall()
        found: dict[str, list[Sample]] = {}
        for rowid, key, ts, data, error in rows:
            found.setdefault(key, []).append(Sample(key, ts, decode_data(data), error))
            cursor = rowid
        return cursor, found

    async def latest(self, keys: Iterable[str] | None = None) -> dict[str, Sample]:
        """The newest sample of each key (of every key when `keys` is None).

        Read from a one-row-per-key table kept beside the samples, so the cost follows the
        number of keys, not the number of samples; gc never removes a key's latest reading.
        """
        self._check_open()
        with sqlite_errors(self.path):
            cursor = await self._conn.execute("SELECT key, ts, data, error FROM latest")
            rows = await cursor.fetchall()
        wanted = None if keys is None else set(keys)
        return {r[0]: Sample(r[0], r[1], decode_data(r[2]), r[3]) for r in rows
                if wanted is None or r[0] in wanted}

    async def gc(self, retention: Retention | None = None) -> int:
        """Delete at most `retention.batch` expired samples; returns how many went."""
        self._check_open()
        policy = retention or Retention()
        cutoff = self.clock.now_ms() - policy.max_age_ms
        removed = 0
        async with self._lock:
            with sqlite_errors(self.path):
                cursor = await self._conn.execute(
                    "DELETE FROM samples WHERE rowid IN "
                    "(SELECT rowid FROM samples WHERE ts < ? LIMIT ?)",
                    (cutoff, policy.batch),
                )
                removed += max(cursor.rowcount, 0)
                cursor = await self._conn.execute("SELECT key FROM latest")
                for (key,) in await cursor.fetchall():
                    if removed >= policy.batch:
                        break
                    cursor = await self._conn.execute(
                        "DELETE FROM samples WHERE rowid IN (SELECT rowid FROM samples "
                        "WHERE key = ? ORDER BY ts DESC LIMIT ? OFFSET ?)",
                        (key, policy.batch - removed, policy.max_per_key),
                    )
                    removed += max(cursor.rowcount, 0)
        return removed

    async def close(self) -> None:
        """Release the database."""
        if not self._closed:
            self._closed = True
            await self._conn.close()
