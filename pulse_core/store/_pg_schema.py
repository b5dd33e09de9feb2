"""The event log's tables in PostgreSQL, checking them on open, a small connection pool, and
PostgreSQL's errors as pulse's typed StoreErrors. Imported only when a postgresql:// store
is opened (psycopg is an optional dependency)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus

from pulse_core._errors import (
    NotAPulseDatabase,
    SchemaTooNew,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core._principals import PERSON_KINDS
from pulse_core._redact import redact_urls

Connection = psycopg.AsyncConnection[tuple[Any, ...]]

SCHEMA_VERSION = 4
APPLICATION = "pulse event log"
COLUMNS = "seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash"

# {s} is the quoted schema name. The writer_lock row serialises appends: each append
# transaction locks it first and holds it to its commit, so seq order is commit order and a
# reader following the log never passes over a seq that a slower transaction commits later.
# `data` is bytea: the JSON bytes exactly as encoded, so hashes and bytes round-trip.
SCHEMA = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE {s}.meta (name text PRIMARY KEY, value text NOT NULL);
CREATE TABLE {s}.writer_lock (one boolean PRIMARY KEY DEFAULT true CHECK (one));
INSERT INTO {s}.writer_lock VALUES (true);
CREATE TABLE {s}.events (
    seq     bigint PRIMARY KEY,
    id      text NOT NULL,
    kind    text NOT NULL,
    key     text NOT NULL,
    version bigint NOT NULL,
    ts      bigint NOT NULL,
    origin  text NOT NULL,
    cause   bigint,
    tx      text NOT NULL,
    idem    text,
    data    bytea,
    hash    text
);
CREATE UNIQUE INDEX events_idem ON {s}.events (idem) WHERE idem IS NOT NULL;
CREATE INDEX events_key ON {s}.events (key, seq);
CREATE TABLE {s}.heads (key text PRIMARY KEY, version bigint NOT NULL);
CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pulse events are append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER events_refuse_update_delete BEFORE UPDATE OR DELETE ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change();
CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON {s}.events
    FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change();
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events FROM PUBLIC;
REVOKE UPDATE, DELETE, TRUNCATE ON {s}.events FROM CURRENT_USER;
"""

# Version 2: principals the database enforces. Each role that writes the log is listed in
# {s}.principals as a person's (human), an engine's or an agent's (with its name); the
# schema's owner always counts as a person's. Every inserted row is checked against the
# inserting role, as pulse_core._principals checks drafts in the process.
PRINCIPALS = """
CREATE TABLE {s}.principals (
    role  text PRIMARY KEY,
    kind  text NOT NULL CHECK (kind IN ('human', 'engine', 'agent')),
    agent text NOT NULL DEFAULT '' CHECK (kind <> 'agent' OR agent <> '')
);
REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON {s}.principals FROM PUBLIC;
GRANT SELECT ON {s}.principals TO PUBLIC;
CREATE FUNCTION {s}.check_principal() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    who record;
    head text := split_part(NEW.origin, ':', 1);
BEGIN
    SELECT kind, agent INTO who FROM {s}.principals WHERE role = current_user::text;
    IF NOT FOUND THEN
        IF current_user::text = (SELECT nspowner::regrole::text FROM pg_namespace
                                 WHERE nspname = TG_TABLE_SCHEMA) THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'role % is not a pulse principal of schema %', current_user,
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege',
            HINT = 'the schema''s owner lists it in principals (docs/security.md)';
    END IF;
    IF who.kind = 'human' THEN
        RETURN NEW;
    END IF;
    IF NEW.kind IN ({person_kinds}) THEN
        RAISE EXCEPTION 'role % (%) may not write an event of kind %: only a person does',
            current_user, who.kind, NEW.kind USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'engine' AND head IN ('human', 'cli') THEN
        RAISE EXCEPTION 'role % (engine) may not write origin %: only a person does',
            current_user, NEW.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'agent' AND NOT (
            NEW.origin = 'agent' OR NEW.origin = 'agent:' || who.agent
            OR starts_with(NEW.origin, 'agent:' || who.agent || '-')
            OR starts_with(NEW.origin, 'agent:' || who.agent || ':')) THEN
        RAISE EXCEPTION 'role % (agent %) may not write origin %', current_user, who.agent,
            NEW.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER events_check_principal BEFORE INSERT ON {s}.events
    FOR EACH ROW EXECUTE FUNCTION {s}.check_principal();
"""


# Version 3: indexes for the events page's filters, so that reading the newest events of a
# rare kind, or of an origin (a prefix: text_pattern_ops matches `LIKE 'agent:%'` whatever
# the database's collation), reads only those rows instead of walking the log backwards.
INDEXES = """
CREATE INDEX IF NOT EXISTS events_kind ON {s}.events (kind, seq);
CREATE INDEX IF NOT EXISTS events_origin ON {s}.events (origin text_pattern_ops, seq);
"""

# Version 4: an append in one statement, and the principals checked once per statement.
# `commit_if_heads` is the one-round-trip commit of a writer that staged its group against
# the heads it assumes (`assumed`: {key: version} for every key the group reads or writes):
# under the writer lock, if a head differs from what was assumed, nothing is stored and
# `actual` holds the heads of those keys as they are; otherwise the rows go in after the
# newest seq (their seqs in `rows` count from 1), stamped with `stamp` or, if later, the
# newest row's ts (ts follows seq), the heads of their keys move, the channel is notified,
# and `base` is the seq before the first row, `stamped` their ts. The rows come as one JSON
# document (see `ROWS_OF_JSON`): one parameter, encoded and parsed in C. The statements are
# planned once per session and the call is one prepared statement: the round trip of a raw
# INSERT, the writer lock held only while the server works.
# The principals trigger reads a statement's new rows at once rather than once per row.
APPEND_IN_ONE = """
CREATE FUNCTION {s}.commit_if_heads(rows jsonb, assumed jsonb, stamp bigint,
    OUT base bigint, OUT stamped bigint, OUT actual jsonb) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM {s}.writer_lock FOR UPDATE;
    SELECT jsonb_object_agg(a.key, coalesce(h.version, 0)) INTO actual
        FROM jsonb_each(assumed) a LEFT JOIN {s}.heads h ON h.key = a.key;
    IF actual <> assumed THEN
        RETURN;
    END IF;
    actual := NULL;
    SELECT e.seq, e.ts INTO base, stamped FROM {s}.events e ORDER BY e.seq DESC LIMIT 1;
    base := coalesce(base, 0);
    stamped := greatest(stamp, stamped);
    WITH added AS (
        INSERT INTO {s}.events ({columns}) {rows_of_json} RETURNING key, version)
    INSERT INTO {s}.heads (key, version)
        SELECT DISTINCT ON (key) key, version FROM added ORDER BY key, version DESC
        ON CONFLICT (key) DO UPDATE SET version = excluded.version;
    PERFORM pg_notify({channel}, (base + jsonb_array_length(rows))::text);
END $$;
DROP TRIGGER events_check_principal ON {s}.events;
DROP FUNCTION {s}.check_principal();
CREATE FUNCTION {s}.check_principals() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    who record;
    bad record;
BEGIN
    IF NOT EXISTS (SELECT FROM added) THEN
        RETURN NULL;
    END IF;
    SELECT kind, agent INTO who FROM {s}.principals WHERE role = current_user::text;
    IF NOT FOUND THEN
        IF current_user::text = (SELECT nspowner::regrole::text FROM pg_namespace
                                 WHERE nspname = TG_TABLE_SCHEMA) THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'role % is not a pulse principal of schema %', current_user,
            TG_TABLE_SCHEMA USING ERRCODE = 'insufficient_privilege',
            HINT = 'the schema''s owner lists it in principals (docs/security.md)';
    END IF;
    IF who.kind = 'human' THEN
        RETURN NULL;
    END IF;
    SELECT a.kind, a.origin INTO bad FROM added a
    WHERE a.kind IN ({person_kinds})
       OR (who.kind = 'engine' AND split_part(a.origin, ':', 1) IN ('human', 'cli'))
       OR (who.kind = 'agent' AND NOT (
            a.origin = 'agent' OR a.origin = 'agent:' || who.agent
            OR starts_with(a.origin, 'agent:' || who.agent || '-')
            OR starts_with(a.origin, 'agent:' || who.agent || ':')))
    ORDER BY a.seq LIMIT 1;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF bad.kind IN ({person_kinds}) THEN
        RAISE EXCEPTION 'role % (%) may not write an event of kind %: only a person does',
            current_user, who.kind, bad.kind USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF who.kind = 'engine' THEN
        RAISE EXCEPTION 'role % (engine) may not write origin %: only a person does',
            current_user, bad.origin USING ERRCODE = 'insufficient_privilege';
    END IF;
    RAISE EXCEPTION 'role % (agent %) may not write origin %', current_user, who.agent,
        bad.origin USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER events_check_principals AFTER INSERT ON {s}.events
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION {s}.check_principals();
"""


def _person_kinds() -> str:
    return ", ".join(f"'{kind}'" for kind in sorted(PERSON_KINDS))


def channel_of(schema: str) -> str:
    """The channel every commit to the log in `schema` NOTIFYs."""
    return f"pulse:{schema}"


ROWS_OF_JSON = (
    "SELECT {seq}, r->>1, r->>2, r->>3, (r->>4)::bigint, {ts}, r->>6, (r->>7)::bigint, "
    "r->>8, r->>9, decode(r->>10, 'base64'), r->>11 FROM jsonb_array_elements({rows}) r")
"""A SELECT of log rows (COLUMNS order) from `rows`, a jsonb array holding each row as an
array of its values, data in base64 (as msgspec encodes bytes): the cheapest way found to
send many rows as one parameter (psycopg dumps arrays element by element in Python). `seq`
and `ts` are the expressions of those columns."""


def rows_of_json(rows: str, *, seq: str = "(r->>0)::bigint", ts: str = "(r->>5)::bigint"
                 ) -> str:
    """`ROWS_OF_JSON` for the jsonb expression `rows`."""
    return ROWS_OF_JSON.format(rows=rows, seq=seq, ts=ts)


def append_in_one_sql(schema: str) -> str:
    """The version-4 statements for `schema`."""
    s = quoted(schema)
    channel = "'" + channel_of(schema).replace("'", "''") + "'"
    return APPEND_IN_ONE.format(s=s, columns=COLUMNS, channel=channel,
                                rows_of_json=rows_of_json(
                                    "rows", seq="base + (r->>0)::bigint", ts="stamped"),
                                person_kinds=_person_kinds())


def principals_sql(s: str) -> str:
    """The version-2 statements for the quoted schema `s`."""
    return PRINCIPALS.format(s=s, person_kinds=_person_kinds())


def quoted(name: str) -> str:
    """`name` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


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


class NoAnswer(psycopg.OperationalError):
    """The server did not answer within the operation deadline (a storage stall, a paused
    machine, dropped packets), so its connection was dropped: a lost connection."""


def drop(conn: Connection) -> None:
    """Shut `conn`'s socket without a word to the server: whatever waits on it ends at once
    with a lost connection (closing it later sends nothing a stalled server must answer)."""
    with (contextlib.suppress(psycopg.Error, OSError),
          socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def deadline(conn: Connection, seconds: float | None) -> Iterator[None]:
    """Bound the block's work on `conn` to `seconds` (None: unbounded): past them `conn` is
    dropped, so the block fails as on a lost connection, with NoAnswer as the cause."""
    if seconds is None:
        yield
        return
    fired = False

    def cut() -> None:
        nonlocal fired
        fired = True
        drop(conn)

    handle = asyncio.get_running_loop().call_later(seconds, cut)
    try:
        yield
    except Exception as exc:
        if not fired:
            raise
        stalled = NoAnswer(f"no answer from the server within {seconds:g} s "
                           "(operation_timeout), so the connection was dropped")
        if isinstance(exc, psycopg.Error | OSError):
            raise stalled from exc
        exc.__cause__ = stalled  # CommitUnknown: it reports its cause
        raise
    finally:
        handle.cancel()


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
                    await conn.execute(principals_sql(s))
                    await conn.execute(INDEXES.format(s=s))
                    await conn.execute(append_in_one_sql(schema))
                    await conn.execute(
                        f"INSERT INTO {s}.meta VALUES ('application', %s), "
                        "('schema_version', %s)", (APPLICATION, str(SCHEMA_VERSION)))
        meta = await _meta(conn, s)
        for version, (adds, sql) in enumerate(_UPGRADES, start=2):
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


_UPGRADES: list[tuple[str, Callable[[str], str]]] = [
    ("version 2's principals table", lambda schema: principals_sql(quoted(schema))),
    # Building the indexes reads the whole table and holds back appends meanwhile (seconds
    # per million events).
    ("version 3's indexes", lambda schema: INDEXES.format(s=quoted(schema))),
    ("version 4's append function and principals trigger", append_in_one_sql),
]
"""What each version adds (from version 2 on, in order) and its statements for a schema."""


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


class ConnectionPool:
    """Up to `size` connections made by `connect`, reused while they work.

    A connection that broke, or is left inside a transaction, is closed instead of reused;
    after a failure `discard_idle` drops the others too (a restarted server cut them all),
    so the next call connects afresh rather than finding each dead one in turn. With
    `bound`, each block's work on its connection is bounded by `deadline`.
    """

    def __init__(self, connect: Callable[[], Awaitable[Connection]], size: int,
                 location: str, *, bound: float | None = None) -> None:
        self._connect = connect
        self._bound = bound
        self._slots = asyncio.Semaphore(size)
        self._idle: list[Connection] = []
        self._location = location
        self._closed = False

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A working connection for the duration of the block."""
        if self._closed:
            raise StoreClosed(f"{self._location}: used after close")
        async with self._slots:
            conn = self._idle.pop() if self._idle else await self._connect()
            reuse = False
            try:
                with deadline(conn, self._bound):
                    yield conn
                reuse = True
            except Exception as exc:  # a cancellation may leave the protocol mid-way: close
                reuse = not is_disconnect(exc)
                raise
            finally:
                if (reuse and not self._closed and not conn.broken and not conn.closed
                        and conn.info.transaction_status == TransactionStatus.IDLE):
                    self._idle.append(conn)
                else:
                    await close_quietly(conn)

    async def discard_idle(self) -> None:
        """Close every idle connection (after a failure that probably cut them all)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await close_quietly(conn)

    async def close(self) -> None:
        """Close the idle connections; connections in use are closed when handed back."""
        self._closed = True
        await self.discard_idle()


async def close_quietly(conn: Connection) -> None:
    """Close `conn`, ignoring that it may be broken already."""
    with contextlib.suppress(psycopg.Error, OSError):
        await conn.close()
