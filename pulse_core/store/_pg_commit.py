"""One transaction of the PostgreSQL log: a group of appends checked and written in commit
order, or already-stored rows copied in (`upulse migrate`)."""

from __future__ import annotations

import contextlib
import itertools
import select
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import psycopg

from pulse_core._clock import Clock
from pulse_core._errors import IdempotencyConflict, InvalidEvent, StoreError, VersionConflict
from pulse_core.store._commit import Batch
from pulse_core.store._pg_schema import (
    COLUMNS,
    ROWS_OF_JSON,
    Connection,
    channel_of,
    is_disconnect,
    pipeline,
    quoted,
)
from pulse_core.store._recorder import AppendResult, PreparedAppend

Outcome = AppendResult | Exception

BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""Every write transaction reads what the writer before it committed: its statements see
the commit they waited for on the writer lock (a database whose default isolation is
REPEATABLE READ or SERIALIZABLE would give them the snapshot of before the wait)."""


class CommitUnknown(Exception):
    """The connection failed after the rows were sent: whether they committed is unknown.

    `outcomes` are the group's outcomes had it committed; `seq` and `event_id` name its
    first row, so that a look at the log can tell.
    """

    def __init__(self, outcomes: list[Outcome], seq: int, event_id: str) -> None:
        super().__init__(f"commit of seq {seq} unknown")
        self.outcomes = outcomes
        self.seq = seq
        self.event_id = event_id


class LogSQL:
    """The statements of the log in one schema, and the channel its commits NOTIFY."""

    def __init__(self, schema: str) -> None:
        s = quoted(schema)
        self.schema = schema
        self.s = s
        self.channel = channel_of(schema)
        # Waits for the writer before this one to commit, and keeps the next one waiting
        # until this transaction ends: seqs are taken in commit order.
        self.lock = f"SELECT FROM {s}.writer_lock FOR UPDATE"
        self.last = f"SELECT coalesce(max(seq), 0) FROM {s}.events"
        self.heads = f"SELECT key, version FROM {s}.heads WHERE key = ANY(%b)"
        self.idems = f"SELECT {COLUMNS} FROM {s}.events WHERE idem = ANY(%b)"
        self.copy = f"COPY {s}.events ({COLUMNS}) FROM STDIN"
        # The group's rows as one JSON parameter, in the commit's pipeline: no round trip
        # of their own (COPY takes two), one plan the server keeps prepared.
        self.insert = (f"INSERT INTO {s}.events ({COLUMNS}) "
                       + ROWS_OF_JSON.format(rows="%s::jsonb"))
        self.upsert_heads = (
            f"INSERT INTO {s}.heads (key, version) SELECT * FROM unnest(%b::text[], "
            "%b::bigint[]) ON CONFLICT (key) DO UPDATE SET version = excluded.version")
        # The one-round-trip commit (the schema's function): the rows, the heads, the NOTIFY
        # if the log still ends at the given seq; whether it did.
        self.commit_if_last = f"SELECT {s}.commit_if_last(%s, %s::jsonb)"


class _Staged(Batch):
    """One group commit's appends, checked against the heads and idempotency keys read at
    the start of the transaction (every key and idem the group names, in one round trip)."""

    def __init__(self, next_seq: int, heads: Mapping[str, int], stored: Mapping[str, Any]
                 ) -> None:
        self.next_seq = next_seq
        self.known = heads
        self.heads = {}
        self.idem = dict(stored)
        self.rows = []

    def head(self, key: str) -> int:
        version = self.heads.get(key)
        if version is None:
            version = self.known.get(key, 0)
        self.heads[key] = version
        return version

    def stored_by_idem(self, idem: str) -> Sequence[Any] | None:
        return self.idem.get(idem)


class Known:
    """What this recorder knows of the log as of its last transaction: the seq it ended at
    and the heads of the keys it read or wrote then. Valid only while no other writer has
    committed since, which the one-round-trip commit checks on the server under the writer
    lock; any doubt (a failure, another writer seen) forgets it all."""

    LIMIT = 100_000  # keys remembered at most; past it the cache starts over

    BACK_OFF = 64  # at most this many groups read the log between two tries after refusals

    def __init__(self) -> None:
        self.last: int | None = None
        self.heads: dict[str, int] = {}
        self.skip = 0  # groups still to send the two-trip way after a refused try
        self.wait = 0  # how many that was last time: doubled by each refusal in a row

    def refused(self) -> None:
        """Another writer committed before this one's one-trip try: forget, and try less
        often while other writers are busy (a refused try costs a round trip)."""
        self.forget()
        self.wait = min(self.BACK_OFF, self.wait * 2 or 1)
        self.skip = self.wait

    def forget(self) -> None:
        """Know nothing: the next transaction reads the log."""
        self.last = None
        self.heads.clear()

    def covers(self, keys: Sequence[str]) -> bool:
        """Whether to try the group in one trip: every one of `keys` has a remembered head
        and no recent refusal says to wait."""
        if self.skip:
            self.skip -= 1
            return False
        return self.last is not None and all(k in self.heads for k in keys)

    def learn(self, since: int, last: int, heads: Mapping[str, int]) -> None:
        """A transaction found the log ending at `since` and left it ending at `last`, with
        `heads` (read or written by it); what was known of an older log is forgotten."""
        if self.last != since or len(self.heads) > self.LIMIT:
            self.heads.clear()
        self.last = last
        self.heads.update(heads)


def quiet(conn: Connection) -> bool:
    """Whether `conn`'s socket has nothing to read: an idle session whose server closed it
    (a terminated backend, a restart) has sent its goodbye or end of stream by now, and
    the group then takes the path whose first round trip finds that out before any row is
    sent (so it can be sent again on a new connection)."""
    try:
        poll = select.poll()
        poll.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
        return not poll.poll(0)
    except (psycopg.Error, OSError, ValueError):
        return False


async def roll_back(conn: Connection) -> None:
    """After a failed write: close `conn`, so the pool connects afresh rather than reuse it.
    A statement refused inside a pipeline leaves the ones after it unparsed, which the
    driver may still count as prepared on that session; and the open transaction ends
    with the session."""
    if not conn.closed:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()


async def commit_group(conn: Connection, sql: LogSQL, appends: Sequence[PreparedAppend],
                       clock: Clock, known: Known) -> list[Outcome]:
    """Store `appends` in one transaction on `conn`: each one's outcome, in order (a
    VersionConflict, IdempotencyConflict or InvalidEvent fails that append alone).

    When `known` covers every key and no draft has an idempotency key, the group is staged
    against it and sent with a server-side check in one round trip; if another writer
    committed meanwhile, that transaction is rolled back and the group staged again from
    what the log holds (two round trips). Raises CommitUnknown when the connection fails
    once rows were sent, and the driver's error for any other failure (then nothing was
    stored).
    """
    keys = sorted({d.key for a in appends for d in a.drafts}
                  | {k for a in appends for k in a.expect})
    idems = [d.idem for a in appends for d in a.drafts if d.idem is not None]
    try:
        if not idems and known.covers(keys) and quiet(conn):
            done = await _commit_known(conn, sql, appends, clock, known)
            if done is not None:
                return done
        return await _commit_read(conn, sql, appends, clock, known, keys=keys, idems=idems)
    except BaseException:
        known.forget()
        raise


async def _commit_known(conn: Connection, sql: LogSQL, appends: Sequence[PreparedAppend],
                        clock: Clock, known: Known) -> list[Outcome] | None:
    """The group staged against `known` and committed in one round trip; None (nothing
    stored) when an append fails against it or another writer committed since."""
    assert known.last is not None
    last = known.last
    staged = _Staged(last + 1, known.heads, {})
    now = clock.now_ms()
    outcomes: list[Outcome] = []
    for append in appends:
        try:
            outcomes.append(staged.apply(append, now))
        except (VersionConflict, IdempotencyConflict, InvalidEvent):
            return None  # said only against what the log holds: read it
    rows = staged.rows
    if not rows:
        return None
    try:
        cur = await conn.execute(sql.commit_if_last, [last, json_of(rows)])
        found = await cur.fetchone()
        stored = bool(found and found[0] is True)
    except (psycopg.Error, OSError) as exc:
        await roll_back(conn)
        if is_disconnect(exc):
            raise CommitUnknown(outcomes, rows[0][0], rows[0][1]) from exc
        raise
    except BaseException:
        await roll_back(conn)
        raise
    if not stored:  # another writer committed first: nothing stored
        known.refused()
        return None
    known.wait = 0
    known.learn(last, rows[-1][0], staged.heads)
    return outcomes


async def _commit_read(conn: Connection, sql: LogSQL, appends: Sequence[PreparedAppend],
                       clock: Clock, known: Known, *, keys: Sequence[str],
                       idems: Sequence[str]) -> list[Outcome]:
    """The group staged against what the log holds, read under the writer lock."""
    outcomes: list[Outcome] = []
    rows: list[Any] = []
    try:
        async with pipeline(conn):
            # One round trip: the writer lock (waiting for the writer before), then what
            # that writer committed: the newest seq, the heads, the idempotency keys.
            await conn.execute(BEGIN)
            await conn.execute(sql.lock)
            last = await conn.execute(sql.last)
            heads = await conn.execute(sql.heads, (list(keys),))
            stored = await conn.execute(sql.idems, (list(idems),)) if idems else None
            row = await last.fetchone()
            read = {str(k): int(v) for k, v in await heads.fetchall()}
            staged = _Staged(
                int(row[0]) + 1 if row else 1, read,
                {str(r[9]): r for r in await stored.fetchall()} if stored else {})
        first = staged.next_seq
        now = clock.now_ms()  # read under the writer lock: ts follows seq on one clock
        for append in appends:
            try:
                outcomes.append(staged.apply(append, now))
            except (VersionConflict, IdempotencyConflict, InvalidEvent) as exc:
                outcomes.append(exc)
        rows = staged.rows
        await write_and_commit(conn, sql, rows, staged.heads)
    except (psycopg.Error, OSError) as exc:
        await roll_back(conn)
        if rows and is_disconnect(exc):
            raise CommitUnknown(outcomes, rows[0][0], rows[0][1]) from exc
        raise
    except BaseException:
        await roll_back(conn)
        raise
    known.learn(first - 1, rows[-1][0] if rows else first - 1,
                {k: read.get(k, 0) for k in keys} | staged.heads)
    return outcomes


COPY_FROM = 512
"""Groups of at least this many rows are sent by COPY (two round trips of their own, the
cheapest per row); smaller ones ride in the commit's pipeline as arrays."""


async def write_and_commit(conn: Connection, sql: LogSQL, rows: Sequence[Sequence[Any]],
                           heads: Mapping[str, int]) -> None:
    """Insert `rows`, move the heads of their keys, NOTIFY, and COMMIT the transaction open
    on `conn`: one round trip unless the group is large."""
    copied = len(rows) >= COPY_FROM
    if copied:
        async with conn.cursor() as cur, cur.copy(sql.copy) as copy:
            for row in rows:
                await copy.write_row(row)
    async with pipeline(conn):
        await _write(conn, sql, [] if copied else rows, heads, rows)
        await conn.execute("COMMIT")


async def _write(conn: Connection, sql: LogSQL, rows: Sequence[Sequence[Any]],
                 heads: Mapping[str, int], written: Sequence[Sequence[Any]] | None = None
                 ) -> None:
    """Inside a pipeline: insert `rows` as arrays, then move the heads of the keys of
    `written` (default `rows`) and NOTIFY its last seq."""
    written = rows if written is None else written
    if rows:
        await conn.execute(sql.insert, [json_of(rows)])
    if written:
        moved = sorted({r[3] for r in written})
        await conn.execute(sql.upsert_heads, (moved, [heads[k] for k in moved]))
        await conn.execute("SELECT pg_notify(%s, %s)", (sql.channel, str(written[-1][0])))


def json_of(rows: Sequence[Sequence[Any]]) -> str:
    """`rows` as `ROWS_OF_JSON` reads them."""
    return _JSON.encode(rows).decode()


_JSON = msgspec.json.Encoder()


async def copy_chunk(conn: Connection, sql: LogSQL, chunk: Sequence[Sequence[Any]],
                     location: str) -> None:
    """Store already-stored rows exactly as given, in one transaction; StoreError (nothing
    stored) unless their seqs are consecutive and continue the log."""
    seqs = [row[0] for row in chunk]
    if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
        gap = next(b for a, b in itertools.pairwise(seqs) if b != a + 1)
        raise StoreError(f"{location}: rows to copy jump to seq {gap} — copy a log whole, "
                         "its seqs consecutive")
    heads: dict[str, int] = {}
    for row in chunk:
        heads[row[3]] = max(heads.get(row[3], 0), row[4])
    try:
        await conn.execute(BEGIN)
        await conn.execute(sql.lock)
        cur = await conn.execute(sql.last)
        found = await cur.fetchone()
        last = int(found[0]) if found else 0
        if seqs[0] != last + 1:
            raise StoreError(
                f"{location}: the rows to copy start at seq {seqs[0]} but this log ends at "
                f"seq {last} — copy into an empty log (or continue from seq {last + 1})")
        await write_and_commit(conn, sql, chunk, heads)
    except BaseException:
        await roll_back(conn)
        raise
