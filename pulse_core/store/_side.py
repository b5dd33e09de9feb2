"""The side store: small non-history state (the reviewer's quiet hold), by namespace and key.

Unlike events, side state is not history: it may be overwritten, expire, or be lost without
harm (a lost quiet hold means one more check, never a wrong write). SQLite locally (state.db);
a fleet puts it in Redis or Valkey (pulse_core.store._redis) behind the same protocol. Each is
named by a URL whose scheme's entry point (group `pulse.side_stores`) reads it::

    sqlite:///home/me/.upulse/state.db
    redis://user:password@cache.example:6379/0?timeout=1     (rediss://, valkey://, valkeys://)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from pulse_core._clock import Clock, SystemClock
from pulse_core._errors import StoreError
from pulse_core.store._sqlite import (
    ReadOnlyConnection,
    SqliteWorkerStore,
)

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


class SqliteSideStore(SqliteWorkerStore):
    """The side store in one SQLite file, written from one worker thread. Expired values
    are removed on the next write. Read-only, the file is neither created nor written; an
    absent file reads as empty."""

    purpose = "side store"

    def __init__(self, path: Path, conn: sqlite3.Connection | ReadOnlyConnection,
                 pool: ThreadPoolExecutor, clock: Clock, read_only: bool = False) -> None:
        super().__init__(path, conn, pool, read_only)
        self.clock = clock

    @classmethod
    async def open(cls, path: str | Path, *, clock: Clock | None = None,
                   read_only: bool = False) -> SqliteSideStore:
        """Open (or create, unless `read_only`) the side store at `path`."""
        path = Path(path)
        conn, pool = await cls._connect(path, schema=SCHEMA, schema_version=1,
                                        synchronous="NORMAL", read_only=read_only)
        return cls(path, conn, pool, clock or SystemClock(), read_only)

    def _get_all(self, namespace: str, now: int) -> dict[str, bytes]:
        rows = self._read("SELECT key, value FROM side WHERE namespace = ? "
                          "AND (expires_at IS NULL OR expires_at > ?)", (namespace, now))
        return {key: bytes(value) for key, value in rows}

    async def get_all(self, namespace: str) -> dict[str, bytes]:
        return await self._run(self._get_all, namespace, self.clock.now_ms())

    def _write_rows(self, sql: str, rows: list[tuple[Any, ...]], now: int) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.executemany(sql, rows)
            conn.execute("DELETE FROM side WHERE expires_at <= ?", (now,))

        self._write(work)

    async def put(self, namespace: str, items: Mapping[str, bytes],
                  ttl_ms: int | None = None) -> None:
        self._refuse_if_read_only("side state cannot be written")
        now = self.clock.now_ms()
        expires = None if ttl_ms is None else now + ttl_ms
        rows = [(namespace, k, bytes(v), expires) for k, v in items.items()]
        if rows:
            await self._run(self._write_rows, "INSERT OR REPLACE INTO side VALUES (?, ?, ?, ?)",
                            rows, now)

    async def delete(self, namespace: str, keys: Iterable[str]) -> None:
        self._refuse_if_read_only("side state cannot be written")
        rows = [(namespace, k) for k in keys]
        if rows:
            await self._run(self._write_rows, "DELETE FROM side WHERE namespace = ? AND key = ?",
                            rows, self.clock.now_ms())


class SqliteSideURL(NamedTuple):
    """A `sqlite://` side-store URL: the state.db file."""

    path: Path

    @property
    def file(self) -> Path:
        """The state.db file."""
        return self.path

    def display(self) -> str:
        """The URL for messages."""
        return f"sqlite://{self.path}"

    async def open(self, *, read_only: bool, clock: Clock | None) -> SqliteSideStore:
        """The SqliteSideStore of the file, on `clock` (created unless `read_only`)."""
        return await SqliteSideStore.open(self.path, clock=clock, read_only=read_only)


def parse_sqlite_side_url(url: str) -> SqliteSideURL:
    """The file a `sqlite:///absolute/path/state.db` side-store URL names (the
    `pulse.side_stores` entry point of scheme sqlite); StoreError naming the URL and the fix
    when it cannot be used."""
    parts = urlsplit(url)
    path = Path(unquote(parts.path))
    if parts.netloc not in ("", "localhost") or not path.is_absolute() or \
            path.name in ("", ".", ".."):
        raise StoreError(f"side-store URL {url!r}: give the absolute path of a file after "
                         "three slashes, as in sqlite:///home/me/.upulse/state.db")
    if parts.query:
        raise StoreError(f"side-store URL {url!r}: a sqlite side store takes no options — "
                         "remove ?" + parts.query)
    return SqliteSideURL(path)
