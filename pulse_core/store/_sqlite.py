"""Pulse's SQLite files: opening them (identity and schema checks, pragmas, typed errors),
reading them without writing."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pulse_core._errors import (
    NotAPulseDatabase,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._homelock import create_private

T = TypeVar("T")
log = logging.getLogger("pulse")

# 'puls' in ASCII: marks a file as pulse's, so a stray database is never mistaken for ours.
APPLICATION_ID = 0x70756C73

_UNAVAILABLE = {
    "locked": "another process holds the write lock: stop it, or raise busy_timeout",
    "busy": "another process holds the write lock: stop it, or raise busy_timeout",
    "full": "the disk is full: free space, then retry",
    "disk i/o": "the disk refused the write (full, over quota, or failing): check it, then retry",
    "readonly": "the file or folder is read-only: fix its permissions",
    "read-only": "the file or folder is read-only: fix its permissions",
    "unable to open": "the file cannot be opened: check the path and its permissions",
}


def classify(exc: sqlite3.Error, path: Path) -> Exception:
    """The typed pulse error for a SQLite error on `path`."""
    text = str(exc).lower()
    for word, advice in _UNAVAILABLE.items():
        if word in text:
            return StoreUnavailable(f"{path}: {exc} — {advice}")
    if isinstance(exc, sqlite3.DatabaseError) and (
        "not a database" in text or "malformed" in text or "corrupt" in text
    ):
        return NotAPulseDatabase(f"{path}: {exc} — the file is not an intact SQLite database")
    return StoreUnavailable(f"{path}: {exc}")


@contextmanager
def sqlite_errors(path: Path) -> Iterator[None]:
    """Re-raise SQLite errors inside the block as typed pulse errors naming `path`."""
    try:
        yield
    except sqlite3.Error as exc:
        raise classify(exc, path) from exc


def check_identity(conn: sqlite3.Connection, path: Path, *, schema_version: int,
                   purpose: str) -> bool:
    """Raise unless `conn` holds a pulse `purpose` this pulse can read; False when the file
    has no tables yet (new, or created empty by someone else)."""
    with sqlite_errors(path):
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    if app_id != APPLICATION_ID and not (app_id == 0 and tables == 0):
        raise NotAPulseDatabase(
            f"{path} is a SQLite database of another program (application_id {app_id:#x}), "
            f"not a pulse {purpose} — point pulse at its own home folder"
        )
    if version > schema_version:
        raise SchemaTooNew(
            f"{path} has {purpose} schema {version}; this pulse reads up to "
            f"{schema_version} — upgrade pulse"
        )
    return bool(tables)


class ReadOnlyConnection:
    """Reads one pulse database without writing or creating anything, beside a live writer,
    after a crashed one, and in a folder this user may only read.

    While no writer has the file open (no -wal file beside it), SQLite is told the file is
    immutable, so it needs no -wal or -shm of its own; a read that sees the file change under
    it (a writer came and went, or is here now) is read again on a new connection. Once a
    -wal exists, reads go through SQLite's read-only mode with the -shm opened read-only
    (`readonly_shm`), so neither file is ever written (a crashed writer's -shm is not
    recovered in place: SQLite rebuilds its index in memory). When that -shm cannot be
    opened (absent, or not readable by this user), the file is read as immutable without its
    -wal, and a warning (logger "pulse", once per file) says commits after its last
    checkpoint are not shown. `ready` is False for a file without tables (created empty).
    """

    def __init__(self, path: Path, *, schema_version: int, purpose: str,
                 timeout: float = 10.0) -> None:
        self.path = path
        self._schema_version = schema_version
        self._purpose = purpose
        self._timeout = timeout
        self._conn: sqlite3.Connection | None = None
        self._stamp: tuple[bool, int, int, int] | None = None
        self._immutable = False
        self.ready = False
        self.read(lambda conn: None)

    def _now(self) -> tuple[bool, int, int, int]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            raise StoreUnavailable(f"{self.path}: the file is gone — was the home moved?") from None
        wal = Path(f"{self.path}-wal").exists()
        return wal, st.st_ino, st.st_size, st.st_mtime_ns

    def _connect(self, stamp: tuple[bool, int, int, int]) -> sqlite3.Connection:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if stamp[0]:
            try:
                return self._open(stamp, "ro&readonly_shm=1", immutable=False)
            except sqlite3.OperationalError as exc:
                if not exc.sqlite_errorname.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")):
                    raise classify(exc, self.path) from exc
                _warn_without_wal(self.path)
        return self._open(stamp, "ro&immutable=1", immutable=True)

    def _open(self, stamp: tuple[bool, int, int, int], mode: str, *, immutable: bool
              ) -> sqlite3.Connection:
        """A connection in `mode`, checked to be pulse's; SQLite's own errors are raised as
        they are, so the caller can tell a -shm it cannot open from a foreign file."""
        conn = sqlite3.connect(f"{self.path.absolute().as_uri()}?mode={mode}", uri=True,
                               timeout=self._timeout, isolation_level=None,
                               check_same_thread=False)
        try:
            conn.execute("PRAGMA query_only=ON")
            conn.execute("PRAGMA application_id").fetchone()  # opens the -wal and -shm
            self.ready = check_identity(conn, self.path, schema_version=self._schema_version,
                                        purpose=self._purpose)
        except BaseException:
            conn.close()
            raise
        self._conn, self._stamp, self._immutable = conn, stamp, immutable
        return conn

    def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(connection)`, on a view of the file that did not change while it ran."""
        while True:
            stamp = self._now()
            conn = self._conn
            if conn is None or self._stamp is None or stamp[0] != self._stamp[0] or (
                    self._immutable and stamp != self._stamp):
                with sqlite_errors(self.path):
                    conn = self._connect(stamp)
            immutable = self._immutable
            try:
                result = fn(conn)
            except sqlite3.Error as exc:
                if immutable and self._now() != stamp:
                    continue  # the file changed under an immutable view: read again
                raise classify(exc, self.path) from exc
            if not immutable or self._now() == stamp:
                return result

    def close(self) -> None:
        """Release the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_WARNED_WITHOUT_WAL: set[Path] = set()


def _warn_without_wal(path: Path) -> None:
    """Say once per file that `path` is read without its -wal (its -shm cannot be opened)."""
    if path in _WARNED_WITHOUT_WAL:
        return
    _WARNED_WITHOUT_WAL.add(path)
    log.warning(f"{path}: read without {path.name}-wal, whose {path.name}-shm this user "
                "cannot open here (absent, or not readable), so what was committed since the "
                "last checkpoint is not shown — to see it, read the home with its -shm files, "
                "as a user who may read them")


def open_database(
    path: Path,
    *,
    schema: str,
    schema_version: int,
    synchronous: str,
    purpose: str,
    timeout: float = 10.0,
    upgrades: Mapping[int, Sequence[str]] | None = None,
) -> sqlite3.Connection:
    """A connection to `path`, created (0600) with `schema` if new, checked to be pulse's if
    not, and upgraded when it has an older schema: `upgrades[v]` are the statements that
    take a file from schema v to v + 1, run in one transaction with the new user_version (a
    file that another process upgraded meanwhile is left as it is; an older schema without
    its upgrades is refused with StoreError).

    Raises NotAPulseDatabase for a foreign or corrupted file and SchemaTooNew for a file
    written by a newer pulse. The connection is in autocommit mode; callers BEGIN themselves.
    """
    if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
    try:
        create_private(path)  # 0600: SQLite gives its -wal and -shm the mode of the file
    except FileNotFoundError:
        raise StoreUnavailable(f"{path}: its folder does not exist — create the folder, or "
                               "fix the path") from None
    with sqlite_errors(path):
        conn = sqlite3.connect(
            path, timeout=timeout, isolation_level=None, check_same_thread=False
        )
    try:
        ready = check_identity(conn, path, schema_version=schema_version, purpose=purpose)
        with sqlite_errors(path):
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            if not ready:
                # Schemas use IF NOT EXISTS: two processes may create the same new file.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {schema}; PRAGMA application_id={APPLICATION_ID}; "
                    f"PRAGMA user_version={schema_version}; COMMIT;"
                )
            else:
                _upgrade(conn, path, schema_version, upgrades or {}, purpose)
    except BaseException:
        conn.close()
        raise
    return conn


def _upgrade(conn: sqlite3.Connection, path: Path, schema_version: int,
             upgrades: Mapping[int, Sequence[str]], purpose: str) -> None:
    """Take the file behind `conn` to `schema_version` with `upgrades` (see open_database);
    nothing changes unless every step is there and every statement succeeds."""
    if conn.execute("PRAGMA user_version").fetchone()[0] >= schema_version:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = int(conn.execute("PRAGMA user_version").fetchone()[0])
        missing = [v for v in range(found, schema_version) if v not in upgrades]
        if missing:
            raise StoreError(
                f"{path} has {purpose} schema {found} and this pulse has no upgrade from "
                f"schema {missing[0]} to {schema_version} — open it with the pulse that wrote "
                "it, or restore a newer copy")
        started = time.monotonic()
        for version in range(found, schema_version):
            for statement in upgrades[version]:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version={schema_version}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if found < schema_version:
        log.info("pulse: %s: %s schema %d upgraded to %d in %.1f s", path, purpose, found,
                 schema_version, time.monotonic() - started)


class SqliteWorkerStore:
    """A small store in one SQLite file, used from one worker thread: opening (or, read-only,
    a view that writes and creates nothing), reads, one-transaction writes, closing."""

    purpose = "store"

    def __init__(self, path: Path, conn: sqlite3.Connection | ReadOnlyConnection,
                 pool: ThreadPoolExecutor, read_only: bool) -> None:
        self.path = path
        self.read_only = read_only
        self._conn: sqlite3.Connection | ReadOnlyConnection | None = conn
        self._pool = pool

    @classmethod
    async def _connect(cls, path: Path, *, schema: str, schema_version: int, synchronous: str,
                       read_only: bool
                       ) -> tuple[sqlite3.Connection | ReadOnlyConnection, ThreadPoolExecutor]:
        pool = ThreadPoolExecutor(1, thread_name_prefix=f"pulse-{cls.purpose.split()[0]}")
        loop = asyncio.get_running_loop()
        try:
            if read_only:
                conn = await loop.run_in_executor(
                    pool, _read_only_view, path, schema, schema_version, cls.purpose)
            else:
                conn = await loop.run_in_executor(pool, lambda: open_database(
                    path, schema=schema, schema_version=schema_version,
                    synchronous=synchronous, purpose=cls.purpose))
        except BaseException:
            pool.shutdown(wait=False)
            raise
        return conn, pool

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._conn is None:
            raise StoreClosed(f"{self.path}: used after close")
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _refuse_if_read_only(self, what: str) -> None:
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so {what} — open the home "
                                "without read_only")

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        conn = self._conn
        assert conn is not None
        if isinstance(conn, ReadOnlyConnection):
            return conn.read(lambda c: c.execute(sql, args).fetchall())
        with sqlite_errors(self.path):
            return conn.execute(sql, args).fetchall()

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        assert isinstance(conn, sqlite3.Connection)  # read-only stores refuse writes first
        with sqlite_errors(self.path):
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return result

    async def close(self) -> None:
        """Release the file and the worker thread."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._pool, conn.close)
        self._pool.shutdown(wait=True)


def _read_only_view(path: Path, schema: str, schema_version: int,
                    purpose: str) -> sqlite3.Connection | ReadOnlyConnection:
    """A view of `path` that writes nothing; an empty in-memory one when there is no file."""
    if path.is_file():
        view = ReadOnlyConnection(path, schema_version=schema_version, purpose=purpose)
        if view.ready:
            return view
        view.close()
    conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    conn.executescript(schema)
    return conn
