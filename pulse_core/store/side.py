"""The side store: small non-history state (the reviewer's quiet hold), by namespace and key.

Unlike events, side state is not history: it may be overwritten, expire, or be lost without
harm (a lost quiet hold means one more check, never a wrong write). SQLite locally (state.db);
a fleet puts it in Redis or Valkey behind the same protocol.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from pulse_core.clock import Clock, SystemClock
from pulse_core.errors import StoreClosed, StoreUnavailable
from pulse_core.store.sqlite import open_database, sqlite_errors

SCHEMA = """
CREATE TABLE IF NOT EXISTS side (
    namespace  TEXT NOT NULL,
    key        TEXT NOT NULL,
    value      BLOB NOT NULL,
    expires_at INTEGER,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID
"""


class SideStore(Protocol):
    """Values (bytes) by namespace and key, each with an optional time to live."""

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        """Every live value in `namespace`, by key."""
        ...

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        """Set `items` in one write; with `ttl_ms` they vanish that long after now."""
        ...

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        """Remove `keys` (absent ones are ignored)."""
        ...

    async def close(self) -> None:
        """Release the backend."""
        ...


class SqliteSideStore:
    """The side store in one SQLite file, written from one worker thread."""

    def __init__(self, path: Path, conn: sqlite3.Connection, pool: ThreadPoolExecutor,
                 clock: Clock) -> None:
        self.path = path
        self.clock = clock
        self._conn: sqlite3.Connection | None = conn
        self._pool = pool

    @classmethod
    async def open(cls, path: str | Path, *, clock: Clock | None = None,
                   read_only: bool = False) -> SqliteSideStore:
        """Open (or create, unless `read_only`) the side store at `path`."""
        path = Path(path)
        pool = ThreadPoolExecutor(1, thread_name_prefix="pulse-side")
        loop = asyncio.get_running_loop()
        try:
            if read_only:
                conn = await loop.run_in_executor(pool, _open_read_only, path)
            else:
                conn = await loop.run_in_executor(pool, lambda: open_database(
                    path, schema=SCHEMA, schema_version=1, synchronous="NORMAL",
                    purpose="side store"))
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return cls(path, conn, pool, clock or SystemClock())

    async def _run(self, fn: object, *args: object) -> object:
        if self._conn is None:
            raise StoreClosed(f"{self.path}: used after close")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)  # type: ignore[arg-type]

    def _get_all(self, namespace: str, now: int) -> dict[str, bytes]:
        assert self._conn is not None
        with sqlite_errors(self.path):
            rows = self._conn.execute(
                "SELECT key, value FROM side WHERE namespace = ? "
                "AND (expires_at IS NULL OR expires_at > ?)", (namespace, now)).fetchall()
        return {key: bytes(value) for key, value in rows}

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        result = await self._run(self._get_all, namespace, self.clock.now_ms())
        assert isinstance(result, dict)
        return result

    def _write(self, sql: str, rows: list[tuple[object, ...]]) -> None:
        assert self._conn is not None
        with sqlite_errors(self.path):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(sql, rows)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        expires = None if ttl_ms is None else self.clock.now_ms() + ttl_ms
        rows: list[tuple[object, ...]] = [(namespace, k, v, expires) for k, v in items.items()]
        if rows:
            await self._run(self._write, "INSERT OR REPLACE INTO side VALUES (?, ?, ?, ?)", rows)

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        rows: list[tuple[object, ...]] = [(namespace, k) for k in keys]
        if rows:
            await self._run(self._write, "DELETE FROM side WHERE namespace = ? AND key = ?", rows)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, conn.close)
        self._pool.shutdown(wait=True)


def _open_read_only(path: Path) -> sqlite3.Connection:
    if not path.exists():
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        conn.executescript(SCHEMA)
        return conn
    try:
        conn = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True,
                               check_same_thread=False, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"{path}: {exc}") from exc
    return conn
