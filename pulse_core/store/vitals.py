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
CREATE INDEX IF NOT EXISTS samples_key_ts ON samples(key, ts)
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
        with sqlite_errors(self.path):
            await self._conn.execute(
                "INSERT INTO samples (key, ts, data, error) VALUES (?, ?, ?, ?)",
                (key, sample.ts, raw, error),
            )
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

    async def latest(self, keys: Iterable[str] | None = None) -> dict[str, Sample]:
        """The newest sample of each key (of every key when `keys` is None)."""
        self._check_open()
        with sqlite_errors(self.path):
            if keys is None:
                cursor = await self._conn.execute("SELECT DISTINCT key FROM samples")
                keys = [r[0] for r in await cursor.fetchall()]
            out: dict[str, Sample] = {}
            for key in keys:
                cursor = await self._conn.execute(
                    "SELECT ts, data, error FROM samples WHERE key = ? ORDER BY ts DESC LIMIT 1",
                    (key,),
                )
                row = await cursor.fetchone()
                if row is not None:
                    out[key] = Sample(key, row[0], decode_data(row[1]), row[2])
        return out

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
                cursor = await self._conn.execute("SELECT DISTINCT key FROM samples")
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
