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
from pulse_core.store._pg_ddl import COLUMNS, HEAD_OF_EVENTS, channel_of, quoted, rows_of_json
from pulse_core.store._pg_pool import RawCursor
from pulse_core.store._pg_schema import Connection, is_disconnect, pipeline
from pulse_core.store._recorder import AppendResult, PreparedAppend

Outcome = AppendResult | Exception

BEGIN = "BEGIN ISOLATION LEVEL READ COMMITTED"
"""Every write transaction reads what the writer before it committed: its statements see
the commit they waited for on the writer lock (a database whose default isolation is
REPEATABLE READ or SERIALIZABLE would give them the snapshot of before the wait)."""


class CommitUnknown(Exception):
    """The connection failed after the rows were sent: whether they committed is unknown.

    `outcomes` are the group's outcomes had it committed; `key` and `event_id` name its
    first row, so that a look at the log can tell (`settled` then gives the outcomes).
    """

    def __init__(self, outcomes: list[Outcome], key: str, event_id: str, *,
                 relative: bool) -> None:
        super().__init__(f"commit of event {event_id} unknown")
        self.outcomes = outcomes
        self.key = key
        self.event_id = event_id
        self.relative = relative  # seqs counted from 1 and ts to be given by the server

    def settled(self, seq: int, ts: int) -> list[Outcome]:
        """The outcomes, the first row found stored at `seq` with `ts`."""
        return rebased(self.outcomes, seq - 1, ts) if self.relative else self.outcomes


def rebased(outcomes: list[Outcome], base: int, ts: int) -> list[Outcome]:
    """`outcomes` of a group staged with seqs from 1, stored after seq `base` at `ts`."""
    return [AppendResult(o.tx, tuple(msgspec.structs.replace(e, seq=base + e.seq, ts=ts)
                                     for e in o.events), o.replayed)
            if isinstance(o, AppendResult) else o for o in outcomes]


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
        self.newest = f"SELECT seq, ts FROM {s}.events ORDER BY seq DESC LIMIT 1"
        # Each key's head (0 for a key without events), as the commit function reads it.
        self.heads = (f"SELECT u.key, {HEAD_OF_EVENTS.format(s=s, key='u.key')} "
                      "FROM unnest(%b::text[]) u(key)")
        self.head = f"SELECT {HEAD_OF_EVENTS.format(s=s, key='%s')}"
        self.idems = f"SELECT {COLUMNS} FROM {s}.events WHERE idem = ANY(%b)"
        self.copy = f"COPY {s}.events ({COLUMNS}) FROM STDIN"
        # The group's rows as one JSON parameter, in the commit's pipeline: no round trip
        # of their own (COPY takes two), one plan the server keeps prepared.
        self.insert = f"INSERT INTO {s}.events ({COLUMNS}) " + rows_of_json("%s::jsonb")
        # The one-round-trip commit (the schema's function): the rows and the NOTIFY if the
        # heads are as assumed; the seq before the rows and their ts, or the heads. Written
        # with the server's own placeholders, for a kept raw cursor (ConnectionPool).
        self.commit_if_heads = (
            f"SELECT * FROM {s}.commit_if_heads($1::jsonb, $2::jsonb, $3::bigint, $4::bigint)")


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


KEPT_ROWS = 64
"""Groups of at most this many rows are committed through the connection's kept cursor."""

UNSURE = -1
"""A `last` no log ends at: `commit_if_heads` checks every assumed head under the writer
lock, without reading them before it."""


class Known:
    """The heads of the keys this recorder read or wrote in its recent transactions: what a
    group is staged against to try it in one round trip. The server checks them under the
    writer lock, unless every key of the group is `vouched`: known as of `last`, the newest
    seq this recorder saw, and the log still ends there (no other writer since). A head
    another writer moved makes the try refused; any failure forgets everything.

    While this recorder is `alone` (its last transaction found the log where it had left
    it), a group naming a head it does not know is checked under the writer lock only: no
    other writer queues for that lock, so reading the heads before it too would only read
    them twice."""

    LIMIT = 100_000  # keys remembered at most; past it the cache starts over

    BACK_OFF = 64  # at most this many groups read the log between two tries after refusals

    def __init__(self) -> None:
        self.heads: dict[str, int] = {}
        self.last: int | None = None
        self.vouched: set[str] = set()
        self.alone = False
        self.skip = 0  # groups still to send the two-trip way after a try was refused twice
        self.wait = 0  # how many that was last time: doubled by each such try in a row

    def trying(self) -> bool:
        """Whether to try the next group in one round trip: not while other writers keep
        moving the heads this recorder's groups name (each refused try costs a round trip)."""
        if self.skip:
            self.skip -= 1
            return False
        return True

    def settled(self, by_one_trip: bool) -> None:
        """A try in one round trip settled its group, or was refused twice."""
        if by_one_trip:
            self.wait = 0
        else:
            self.wait = min(self.BACK_OFF, self.wait * 2 or 1)
            self.skip = self.wait

    def forget(self) -> None:
        """Know nothing: the next transaction checks or reads every head it names."""
        self.heads.clear()
        self.vouched.clear()
        self.last = None
        self.alone = False

    def assumed(self, keys: Sequence[str], appends: Sequence[PreparedAppend]
                ) -> dict[str, int]:
        """The head to assume for each of `keys`: the remembered one, else the version the
        first append expecting it expects, else 0 (a new key)."""
        heads = self.heads
        assumed: dict[str, int] = {}
        for key in keys:
            version = heads.get(key)
            if version is None:
                version = next((a.expect[key] for a in appends if key in a.expect), 0)
            assumed[key] = version
        return assumed

    def vouches(self, keys: Sequence[str]) -> int | None:
        """`last` if every one of `keys` is known as of it, else UNSURE while this recorder
        is alone, else None (the heads read before the writer lock too)."""
        vouched = self.vouched
        if self.last is not None and all(k in vouched for k in keys):
            return self.last
        return UNSURE if self.alone else None

    def saw(self, heads: Mapping[str, int]) -> None:
        """`heads` as the log held them a moment ago (not read under the writer lock)."""
        self.heads.update(heads)
        self.vouched.difference_update(heads)

    def learn(self, since: int, last: int, heads: Mapping[str, int]) -> None:
        """A transaction found the log ending at `since` and left it ending at `last`, with
        `heads` (read under the writer lock or written by it)."""
        self.alone = since == self.last
        if not self.alone or len(self.heads) > self.LIMIT:
            self.vouched.clear()  # another writer came between: the rest may have moved
        if len(self.heads) > self.LIMIT:
            self.heads.clear()
        self.heads.update(heads)
        self.vouched.update(heads)
        self.last = last


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


async def commit_group(cursor: RawCursor, sql: LogSQL, appends: Sequence[PreparedAppend],
                       clock: Clock, known: Known) -> list[Outcome]:
    """Store `appends` in one transaction on the connection of `cursor` (a raw cursor kept
    with it, for the one-round-trip commit): each one's outcome, in order (a
    VersionConflict, IdempotencyConflict or InvalidEvent fails that append alone).

    When no draft has an idempotency key, the group is staged against the heads `known`
    assumes and sent in one round trip, the server checking those heads (see
    `_commit_assumed`). Otherwise, or when that does not settle it, the group is staged
    against what the log holds, read under the writer lock (two round trips).
    Raises CommitUnknown when the connection fails once rows were sent, and the driver's
    error for any other failure (then nothing was stored).
    """
    keys = sorted({d.key for a in appends for d in a.drafts}
                  | {k for a in appends for k in a.expect})
    idems = [d.idem for a in appends for d in a.drafts if d.idem is not None]
    conn = cursor.connection
    try:
        if not idems and known.trying() and quiet(conn):
            done = await _commit_assumed(cursor, sql, appends, clock, known, keys=keys)
            known.settled(done is not None)
            if done is not None:
                return done
        return await _commit_read(conn, sql, appends, clock, known, keys=keys, idems=idems)
    except BaseException:
        known.forget()
        raise


async def _commit_assumed(cursor: RawCursor, sql: LogSQL, appends: Sequence[PreparedAppend],
                          clock: Clock, known: Known, *, keys: Sequence[str]
                          ) -> list[Outcome] | None:
    """The group staged against the heads `known` assumes and committed in one round trip.
    When the log's heads differ, the server says what they are, and the group is staged
    against those and tried once more: an append that then fails (VersionConflict) fails
    for good, as against any head read under the writer lock. None (nothing stored) when
    that try is refused too, or an append fails against heads not read so."""
    now = clock.now_ms()
    fresh = False  # whether every head the group names is as the server just said
    for _ in range(2):
        staged = _Staged(1, known.assumed(keys, appends), {})
        outcomes: list[Outcome] = []
        for append in appends:
            try:
                outcomes.append(staged.apply(append, now))
            except VersionConflict as exc:
                if not fresh:
                    return None  # said only against what the log holds: read it
                outcomes.append(exc)
            except (IdempotencyConflict, InvalidEvent):
                return None
        rows = staged.rows
        if not rows:
            return outcomes if fresh else None
        assumed = staged.known
        # The kept cursor holds its last parameters until its next call: not a large group's.
        call = cursor if len(rows) <= KEPT_ROWS else psycopg.AsyncRawCursor(cursor.connection)
        try:
            await call.execute(sql.commit_if_heads, [
                json_of(rows), json_of(assumed), now, known.vouches(keys)])
            found = await call.fetchone()
        except (psycopg.Error, OSError) as exc:
            await roll_back(cursor.connection)
            if is_disconnect(exc):
                raise CommitUnknown(outcomes, rows[0][3], rows[0][1], relative=True) from exc
            raise
        except BaseException:
            await roll_back(cursor.connection)
            raise
        assert found is not None
        base, ts, actual = found
        if actual is None:
            known.learn(base, base + len(rows), {**assumed, **staged.heads})
            return rebased(outcomes, base, ts)
        # Another writer moved a head: nothing stored.
        heads = {str(k): int(v) for k, v in actual.items()}
        if base is None:
            known.saw(heads)
        else:
            known.learn(base, base, heads)
        fresh = True
    return None


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
            newest = await conn.execute(sql.newest)
            heads = await conn.execute(sql.heads, (list(keys),))
            stored = await conn.execute(sql.idems, (list(idems),)) if idems else None
            row = await newest.fetchone()
            read = {str(k): int(v) for k, v in await heads.fetchall()}
            staged = _Staged(
                int(row[0]) + 1 if row else 1, read,
                {str(r[9]): r for r in await stored.fetchall()} if stored else {})
        staged_from = staged.next_seq
        # Read under the writer lock, and never before the newest row's: ts follows seq
        # (whatever the clocks of the hosts writing disagree by).
        now = max(clock.now_ms(), int(row[1]) if row else 0)
        for append in appends:
            try:
                outcomes.append(staged.apply(append, now))
            except (VersionConflict, IdempotencyConflict, InvalidEvent) as exc:
                outcomes.append(exc)
        rows = staged.rows
        await write_and_commit(conn, sql, rows)
    except (psycopg.Error, OSError) as exc:
        await roll_back(conn)
        if rows and is_disconnect(exc):
            raise CommitUnknown(outcomes, rows[0][3], rows[0][1], relative=False) from exc
        raise
    except BaseException:
        await roll_back(conn)
        raise
    since = staged_from - 1
    known.learn(since, rows[-1][0] if rows else since,
                {k: read.get(k, 0) for k in keys} | staged.heads)
    return outcomes


COPY_FROM = 512
"""Groups of at least this many rows are sent by COPY (two round trips of their own, the
cheapest per row); smaller ones ride in the commit's pipeline as arrays."""


async def write_and_commit(conn: Connection, sql: LogSQL, rows: Sequence[Sequence[Any]]
                           ) -> None:
    """Insert `rows`, NOTIFY, and COMMIT the transaction open on `conn`: one round trip
    unless the group is large."""
    copied = len(rows) >= COPY_FROM
    if copied:
        async with conn.cursor() as cur, cur.copy(sql.copy) as copy:
            for row in rows:
                await copy.write_row(row)
    async with pipeline(conn):
        if rows and not copied:
            await conn.execute(sql.insert, [json_of(rows)])
        if rows:
            await conn.execute("SELECT pg_notify(%s, %s)", (sql.channel, str(rows[-1][0])))
        await conn.execute("COMMIT")


def json_of(value: Sequence[Sequence[Any]] | Mapping[str, int]) -> str:
    """Rows (as `rows_of_json` reads them) or heads as JSON text."""
    return _JSON.encode(value).decode()


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
        await write_and_commit(conn, sql, chunk)
    except BaseException:
        await roll_back(conn)
        raise
