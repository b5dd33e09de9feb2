"""The side store: small non-history state (the reviewer's quiet hold), by namespace and key.

Unlike events, side state is not history: it may be overwritten, expire, or be lost without
harm (a lost quiet hold means one more check, never a wrong write). SQLite locally (state.db);
a fleet puts it in Redis or Valkey behind the same protocol.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import StoreClosed, StoreReadOnly
from pulse_core.store._sqlite import ReadOnlyConnection, open_database, sqlite_errors

T = TypeVar("T")

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
    """The side store in one SQLite file, written from one worker thread. Expired values
    are removed on the next write. Read-only, the file is neither created nor written; an
    absent file reads as empty."""

    def __init__(self, path: Path, conn: sqlite3.Connection | ReadOnlyConnection,
                 pool: ThreadPoolExecutor, clock: Clock, read_only: bool = False) -> None:
        self.path = path
        self.clock = clock
        self.read_only = read_only
        self._conn: sqlite3.Connection | ReadOnlyConnection | None = conn
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
        return cls(path, conn, pool, clock or SystemClock(), read_only)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._conn is None:
            raise StoreClosed(f"{self.path}: used after close")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _get_all(self, namespace: str, now: int) -> dict[str, bytes]:
        def select(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(
                "SELECT key, value FROM side WHERE namespace = ? "
                "AND (expires_at IS NULL OR expires_at > ?)", (namespace, now)).fetchall()

        conn = self._conn
        assert conn is not None
        if isinstance(conn, ReadOnlyConnection):
            rows = conn.read(select)
        else:
            with sqlite_errors(self.path):
                rows = select(conn)
        return {key: bytes(value) for key, value in rows}

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        return await self._run(self._get_all, namespace, self.clock.now_ms())

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so side state cannot be "
                             "written — open the home without read_only")

    def _write(self, sql: str, rows: list[tuple[Any, ...]], now: int) -> None:
        conn = self._conn
        assert isinstance(conn, sqlite3.Connection)  # read-only stores refuse writes first
        with sqlite_errors(self.path):
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.executemany(sql, rows)
                conn.execute("DELETE FROM side WHERE expires_at <= ?", (now,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        self._refuse_if_read_only()
        now = self.clock.now_ms()
        expires = None if ttl_ms is None else now + ttl_ms
        rows = [(namespace, k, bytes(v), expires) for k, v in items.items()]
        if rows:
            await self._run(self._write, "INSERT OR REPLACE INTO side VALUES (?, ?, ?, ?)",
                            rows, now)

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        self._refuse_if_read_only()
        rows = [(namespace, k) for k in keys]
        if rows:
            await self._run(self._write, "DELETE FROM side WHERE namespace = ? AND key = ?",
                            rows, self.clock.now_ms())

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, conn.close)
        self._pool.shutdown(wait=True)


def _open_read_only(path: Path) -> sqlite3.Connection | ReadOnlyConnection:
    """A view of `path` that writes nothing; an empty in-memory one when there is no file."""
    if path.is_file():
        view = ReadOnlyConnection(path, schema_version=1, purpose="side store")
        if view.ready:
            return view
        view.close()
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    conn.executescript(SCHEMA)
    return conn
