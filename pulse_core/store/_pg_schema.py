"""The event log's tables in PostgreSQL, checking them on open, a small connection pool, and
PostgreSQL's errors as pulse's typed StoreErrors. Imported only when a postgresql:// store
is opened (psycopg is an optional dependency)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import psycopg.errors

from pulse_core._errors import (
    NotAPulseDatabase,
    SchemaTooNew,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._redact import redact_urls
from pulse_core.store._pg_ddl import (
    APPLICATION,
    SCHEMA,
    SCHEMA_VERSION,
    UPGRADES,
    quoted,
)

Connection = psycopg.AsyncConnection[tuple[Any, ...]]

def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for `parts` (stable across processes and hosts)."""
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def first_line(exc: BaseException) -> str:
    """The first line of an error's text, URLs cut to their host."""
    text = str(exc).strip().splitlines()
    return redact_urls(text[0] if text else type(exc).__name__)


def is_cancelled(exc: BaseException) -> bool:
    """Whether the server cancelled the statement (a timeout set on the server, or
    pg_cancel_backend): the connection still works, nothing of the transaction is stored."""
    return isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable)


def is_out_of_resources(exc: BaseException) -> bool:
    """Whether the server refused the statement for want of resources (SQLSTATE class 53: a
    full disk, no memory, too many connections): it answered, so nothing of the transaction
    is stored."""
    return isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("53")


def is_disconnect(exc: BaseException) -> bool:
    """Whether `exc` means the connection (not the statement) failed."""
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, OSError)) and not (
        is_cancelled(exc) or is_out_of_resources(exc))


def store_error(exc: BaseException, location: str, doing: str) -> StoreError:
    """The typed pulse error for a driver error while `doing` something on `location`."""
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return StoreReadOnly(f"{location}: {doing} refused: the session is read-only — open "
                             "the store without read_only to write")
    if is_cancelled(exc):
        return StoreUnavailable(
            f"{location}: {doing} failed: the server cancelled the statement (a timeout set "
            f"on the server?): {first_line(exc)} — retry")
    if isinstance(exc, psycopg.errors.DiskFull):
        return StoreUnavailable(
            f"{location}: {doing} failed, nothing of it stored: the database server's disk "
            f"is full ({first_line(exc)}) — free space where the database (or its "
            "tablespace) lives, then retry")
    if isinstance(exc, psycopg.Error) and is_out_of_resources(exc):
        return StoreUnavailable(
            f"{location}: {doing} failed, nothing of it stored: the server is out of "
            f"resources (SQLSTATE {exc.sqlstate}: {first_line(exc)}) — "
            "see the server's log and limits, then retry")
    if is_disconnect(exc):
        return StoreUnavailable(
            f"{location}: {doing} failed: {first_line(exc)} — check that the PostgreSQL "
            "server is running and reachable from this host; pulse reconnects on the next "
            "call")
    return StoreError(f"{location}: {doing} failed: {first_line(exc)}")


@contextlib.contextmanager
def pg_errors(location: str, doing: str) -> Iterator[None]:
    """Re-raise driver errors inside the block as typed pulse errors naming `location`."""
    try:
        yield
    except (psycopg.Error, OSError) as exc:
        raise store_error(exc, location, doing) from exc


@contextlib.asynccontextmanager
async def pipeline(conn: Connection) -> AsyncIterator[None]:
    """`conn.pipeline()`, except that when the connection is lost inside the block (a server
    restart, a terminated backend), only the block's error is raised: psycopg would go on to
    end the pipeline on the lost connection and log that second failure as a warning ("error
    ignored terminating"), once per connection cut. Any other error is left to psycopg."""
    lost: BaseException | None = None
    try:
        async with conn.pipeline():
            try:
                yield
            except (psycopg.Error, OSError) as exc:
                if not is_disconnect(exc):
                    raise
                lost = exc  # leave the block without it: ending the pipeline raises, below
    except (psycopg.Error, OSError):
        if lost is None:
            raise
    if lost is not None:
        raise lost


async def prepare(conn: Connection, schema: str, *, read_only: bool, location: str) -> None:
    """Check that `schema` holds a pulse event log this pulse can use; create it when it is
    absent (never when `read_only`). Raises SchemaTooNew, NotAPulseDatabase or StoreError."""
    s = quoted(schema)
    with pg_errors(location, "opening the event log"):
        if not await _has_meta(conn, schema):
            if read_only:
                raise StoreError(
                    f"{location}: there is no pulse event log here (no schema {schema!r} "
                    "with pulse's tables) — check the URL, or open it once without read_only "
                    "(the engine creates the log)")
            async with conn.transaction():
                # Two processes opening a new database at once: one creates, one waits.
                await conn.execute("SELECT pg_advisory_xact_lock(%s)",
                                   (lock_key("pulse-schema", schema),))
                if not await _has_meta(conn, schema):
                    await _refuse_foreign(conn, schema, location)
                    await conn.execute(SCHEMA.format(s=s))
                    for _, sql in UPGRADES:
                        await conn.execute(sql(schema))
                    await conn.execute(
                        f"INSERT INTO {s}.meta VALUES ('application', %s), "
                        "('schema_version', %s)", (APPLICATION, str(SCHEMA_VERSION)))
        meta = await _meta(conn, s)
        for version, (adds, sql) in enumerate(UPGRADES, start=2):
            if meta.get("application") == APPLICATION and not read_only \
                    and meta.get("schema_version") == str(version - 1):
                await _upgrade(conn, schema, location, version=version, adds=adds,
                               sql=sql(schema))
                meta = await _meta(conn, s)
    if meta.get("application") != APPLICATION:
        raise NotAPulseDatabase(
            f"{location}: schema {schema!r} holds a 'meta' table of another program, not a "
            "pulse event log — give pulse a schema of its own (?schema=...)")
    version = int(meta.get("schema_version", "0"))
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{location}: the event log has schema version {version}; this pulse reads up to "
            f"version {SCHEMA_VERSION} — upgrade pulse on this host (every host sharing the "
            "database needs a pulse that reads the newest schema)")


async def _meta(conn: Connection, s: str) -> dict[str, str]:
    cur = await conn.execute(f"SELECT name, value FROM {s}.meta")
    return {str(name): str(value) for name, value in await cur.fetchall()}


async def _upgrade(conn: Connection, schema: str, location: str, *, version: int,
                   adds: str, sql: str) -> None:
    """Bring a log at `version - 1` to `version` by `sql`, in one transaction, as the
    schema's owner (a role that may not is told to let the owner open it once); nothing
    stored changes."""
    s = quoted(schema)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)",
                               (lock_key("pulse-schema", schema),))
            if (await _meta(conn, s)).get("schema_version") == str(version - 1):
                await conn.execute(sql)
                await conn.execute(f"UPDATE {s}.meta SET value = %s "
                                   "WHERE name = 'schema_version'", (str(version),))
    except psycopg.errors.InsufficientPrivilege:
        raise StoreError(
            f"{location}: the event log (schema {schema!r}) is at version {version - 1} and "
            f"this role may not add {adds} — open it once as the schema's owner (any pulse "
            "command that writes, such as `upulse daemon start`)") from None


async def _has_meta(conn: Connection, schema: str) -> bool:
    # Read pg_class with this statement's snapshot: to_regclass goes through the session's
    # catalog cache, which after waiting for the schema lock may not yet show a meta table
    # another process just committed (its open then took the new log for a foreign schema).
    cur = await conn.execute(
        "SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'meta')", (schema,))
    row = await cur.fetchone()
    return bool(row and row[0])


async def _refuse_foreign(conn: Connection, schema: str, location: str) -> None:
    cur = await conn.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s", (schema,))
    row = await cur.fetchone()
    if row and row[0]:
        raise NotAPulseDatabase(
            f"{location}: schema {schema!r} already holds tables of another program — give "
            "pulse a schema of its own (?schema=...)")
