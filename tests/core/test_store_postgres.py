"""The PostgreSQL recorder: the store contract on a real server, plus what only a database
server shared by many processes can show."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from pulse_core import (
    AppendResult,
    EventDraft,
    EventStore,
    LockLost,
    NotAPulseDatabase,
    ObjectStore,
    SchemaTooNew,
    SqliteEventStore,
    StoreClosed,
    StoreError,
    StoreReadOnly,
    StoreUnavailable,
)
from pulse_core.store import PostgresURL, Recorder, StoredRow, open_event_store, parse_store_url
from pulse_core.store._pg_ddl import SCHEMA_VERSION, channel_of
from pulse_core.store._postgres import PostgresRecorder
from tests.core.store_contract import RecorderContract, draft
from tests.servers import PostgresServer, free_port
from tests.timing import eventually, scaled


def pg(url: str) -> PostgresURL:
    parsed = parse_store_url(url)
    assert isinstance(parsed, PostgresURL)
    return parsed


def database(url: str) -> str:
    return pg(url).database


class TestPostgresRecorder(RecorderContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_url: str) -> None:
        self.url = pg_url

    async def open_recorder(self, name: str = "events", *, read_only: bool = False) -> Recorder:
        return await PostgresRecorder.open(pg(f"{self.url}?schema={name}"), read_only=read_only)


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[EventStore]:
    opened = await open_event_store(pg_url)
    yield opened
    await opened.close()


async def admin(url: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A plain connection to the test's database, beside the store's own."""
    return await psycopg.AsyncConnection.connect(pg(url).dsn, autocommit=True)


async def wait_for_sleeper(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> int:
    """The pid of the backend sleeping in the slow-commit trigger, once it is there."""
    for _ in range(1000):
        cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'"
                                 " AND datname = current_database()")
        row = await cur.fetchone()
        if row:
            return int(str(row[0]))
        await asyncio.sleep(0.01)
    raise AssertionError("no transaction reached the slow commit")


SLOW_COMMIT = """
CREATE FUNCTION pulse.slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.key = 'slow' THEN PERFORM pg_sleep({seconds}); END IF; RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON pulse.events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION pulse.slow_commit();
"""


# -- seq in commit order -------------------------------------------------------------------


async def test_a_reader_never_skips_an_event_committed_late_by_a_slower_transaction(
    pg_url: str,
) -> None:
    slow_store, fast_store, reader = [await open_event_store(pg_url) for _ in range(3)]
    conn = await admin(pg_url)
    try:
        await conn.execute(SLOW_COMMIT.format(seconds=0.5))
        seen: list[int] = []
        cursor = 0

        async def follow() -> None:  # reads as changes() does: to last_seq when short
            nonlocal cursor
            while len(seen) < 2:
                page = await reader.read_page(cursor, limit=100)
                seen.extend(e.seq for e in page.events)
                cursor = max([cursor, page.last_seq, *seen])
                await asyncio.sleep(0.005)

        following = asyncio.create_task(follow())
        slow = asyncio.create_task(slow_store.append([draft("slow")]))
        await wait_for_sleeper(conn)  # the slow append holds its seq, uncommitted
        fast = await fast_store.append([draft("fast")])
        await asyncio.wait_for(following, 10)
        assert (await slow).events[0].seq == 1 and fast.events[0].seq == 2
        assert seen == [1, 2]
    finally:
        await conn.close()
        for opened in (slow_store, fast_store, reader):
            await opened.close()


async def test_appends_from_four_stores_at_once_keep_seq_gap_free_and_versions_per_key(
    pg_url: str,
) -> None:
    stores = [await open_event_store(pg_url) for _ in range(4)]

    async def producer(store: EventStore, who: int) -> list[AppendResult]:
        results = []
        for n in range(12):
            keys = [f"k{(who + n + i) % 5}" for i in range(1 + n % 3)]
            results.append(await store.append([draft(k, who) for k in keys]))
        return results

    try:
        per_producer = await asyncio.gather(
            *(producer(stores[i % 4], i) for i in range(16)))
        events = await stores[0].read()
    finally:
        for opened in stores:
            await opened.close()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    versions: dict[str, int] = {}
    for event in events:
        versions[event.key] = versions.get(event.key, 0) + 1
        assert event.version == versions[event.key]
    for result in (r for results in per_producer for r in results):
        seqs = [e.seq for e in result.events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert {e.tx for e in events if e.seq in seqs} == {result.tx}


async def test_concurrent_appends_of_one_process_share_a_transaction(
    store: EventStore, pg_url: str
) -> None:
    results = await asyncio.gather(*[store.append([draft(f"k{i}")]) for i in range(30)])
    assert sorted(r.events[0].seq for r in results) == list(range(1, 31))
    conn = await admin(pg_url)
    try:
        cur = await conn.execute("SELECT count(DISTINCT xmin::text) FROM pulse.events")
        row = await cur.fetchone()
    finally:
        await conn.close()
    assert row is not None and int(str(row[0])) <= 3


# -- the database enforces the log ----------------------------------------------------------


@pytest.mark.parametrize("statement", [
    "UPDATE pulse.events SET data = '\\x00'::bytea",
    "DELETE FROM pulse.events",
    "TRUNCATE pulse.events",
])
async def test_update_delete_and_truncate_through_psql_are_refused_and_change_nothing(
    store: EventStore, pg_url: str, postgres_server: PostgresServer, statement: str
) -> None:
    await store.append([draft("a", 1), draft("b", 2)])
    before = await store.read()
    with pytest.raises(subprocess.CalledProcessError) as info:
        postgres_server.sql(statement, database(pg_url))
    assert "append-only" in info.value.stderr
    assert await store.read() == before


async def test_the_log_s_owner_holds_no_update_delete_or_truncate_privilege(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    db = database(pg_url)
    postgres_server.sql("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = "
                        "'pulse_owner') THEN CREATE ROLE pulse_owner LOGIN; END IF; END $$")
    postgres_server.sql(f"GRANT CREATE ON DATABASE {db} TO pulse_owner")
    owned = await open_event_store(pg_url.replace("pulse@", "pulse_owner@"))
    try:
        await owned.append([draft("a")])
    finally:
        await owned.close()
    for privilege in ("UPDATE", "DELETE", "TRUNCATE"):
        assert postgres_server.sql(f"SELECT has_table_privilege('pulse_owner', "
                                   f"'pulse.events', '{privilege}')", db) == "f"
        assert postgres_server.sql(f"SELECT has_table_privilege('public', 'pulse.events', "
                                   f"'{privilege}')", db) == "f"
    assert postgres_server.sql("SELECT has_table_privilege('pulse_owner', 'pulse.events', "
                               "'INSERT')", db) == "t"


async def test_four_processes_opening_a_new_database_at_once_all_open_one_log(
        pg_url: str) -> None:
    stores = await asyncio.gather(*(open_event_store(pg_url) for _ in range(4)))
    try:
        await asyncio.gather(*(s.append([draft(f"k{i}")]) for i, s in enumerate(stores)))
        assert [e.seq for e in await stores[0].read()] == [1, 2, 3, 4]
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_schema_from_a_newer_pulse_is_refused_naming_both_versions(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    postgres_server.sql("UPDATE pulse.meta SET value = '7' WHERE name = 'schema_version'",
                        database(pg_url))
    for read_only in (False, True):
        with pytest.raises(SchemaTooNew) as info:
            await open_event_store(pg_url, read_only=read_only)
        text = str(info.value)
        assert "schema version 7" in text and f"up to version {SCHEMA_VERSION}" in text
        assert "upgrade pulse" in text


async def test_a_schema_holding_another_program_s_tables_is_refused(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    postgres_server.sql("CREATE SCHEMA pulse; CREATE TABLE pulse.customers (id int)",
                        database(pg_url))
    with pytest.raises(NotAPulseDatabase, match="another program"):
        await open_event_store(pg_url)


# -- read-only ------------------------------------------------------------------------------


async def test_read_only_on_a_database_without_a_log_says_so_and_creates_nothing(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    with pytest.raises(StoreError, match="no pulse event log"):
        await open_event_store(pg_url, read_only=True)
    assert postgres_server.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'pulse'",
                               database(pg_url)) == "0"


async def test_a_read_only_store_runs_in_read_only_sessions(store: EventStore, pg_url: str
                                                            ) -> None:
    await store.append([draft("a")])
    reader = await PostgresRecorder.open(pg(pg_url), read_only=True)
    try:
        async with reader._pool.connection() as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                await conn.execute("INSERT INTO pulse.meta VALUES ('x', '1')")
        with pytest.raises(StoreReadOnly):
            await reader.copy_rows([])
        assert [e.key for e in (await reader.select()).events] == ["a"]
    finally:
        await reader.close()
    assert await store.head("x") == 0


# -- failures -------------------------------------------------------------------------------


async def test_an_unreachable_server_is_unavailable_named_without_its_password() -> None:
    port = free_port()
    with pytest.raises(StoreUnavailable) as info:
        await open_event_store(f"postgresql://pulse:s3cret@127.0.0.1:{port}/pulsedb"
                               "?connect_timeout=2")
    text = str(info.value)
    assert f"127.0.0.1:{port}/pulsedb" in text and "s3cret" not in text
    assert "server is running" in text


async def test_a_stopped_server_is_unavailable_and_the_store_works_once_it_is_back(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    await store.append([draft("a", 1)])
    postgres_server.stop()
    try:
        with pytest.raises(StoreUnavailable) as info:
            await store.append([draft("a", 2)])
        with pytest.raises(StoreUnavailable):
            await store.read()
    finally:
        postgres_server.start()
    parsed = pg(pg_url)
    assert f"{parsed.host}:{parsed.port}/{parsed.database}" in str(info.value)
    await store.append([draft("a", 3)])
    assert [e.data["n"] for e in await store.read()] == [1, 3]


async def test_an_append_the_database_refuses_fails_alone_in_its_group(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    postgres_server.sql(
        "CREATE FUNCTION pulse.no_refused() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.key = 'refused' THEN RAISE EXCEPTION 'key refused by policy'; END IF; "
        "RETURN NEW; END $$; CREATE TRIGGER no_refused BEFORE INSERT ON pulse.events "
        "FOR EACH ROW EXECUTE FUNCTION pulse.no_refused()", database(pg_url))
    outcomes = await asyncio.gather(
        store.append([draft("ok1")]), store.append([draft("refused")]),
        store.append([draft("ok2")]), return_exceptions=True)
    assert isinstance(outcomes[1], StoreError) and "refused by policy" in str(outcomes[1])
    assert not isinstance(outcomes[0], BaseException)
    assert not isinstance(outcomes[2], BaseException)
    assert sorted(e.key for e in await store.read()) == ["ok1", "ok2"]


async def hold_the_writer_lock(url: str) -> psycopg.AsyncConnection[tuple[object, ...]]:
    """A connection inside a transaction that holds the log's writer lock (no timeout of its
    own), as a slow writer of another process would."""
    conn = await admin(url)
    await conn.execute("SET statement_timeout = 0")
    await conn.execute("BEGIN")
    await conn.execute("SELECT FROM pulse.writer_lock FOR UPDATE")
    return conn


async def waiting_for_a_lock(conn: psycopg.AsyncConnection[tuple[object, ...]],
                             task: asyncio.Task[AppendResult]) -> int | None:
    """The pid of the backend waiting for a lock in this database, once there is one (None
    if `task` ended first)."""
    for _ in range(1000):
        cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE wait_event_type = "
                                 "'Lock' AND datname = current_database()")
        row = await cur.fetchone()
        if row:
            return int(str(row[0]))
        if task.done():
            return None
        await asyncio.sleep(0.01)
    raise AssertionError("no append came to wait for the writer lock")


async def test_appends_waiting_behind_a_lone_append_whose_caller_is_cancelled_are_committed(
    store: EventStore, pg_url: str
) -> None:
    await store.append([draft("first")])  # a lone writer: it commits its appends itself
    writer = await hold_the_writer_lock(pg_url)
    try:
        lone = asyncio.create_task(store.append([draft("lone")]))
        assert await waiting_for_a_lock(writer, lone) is not None
        behind = [asyncio.create_task(store.append([draft(f"behind{n}")])) for n in range(3)]
        await asyncio.sleep(0.05)
        assert not any(task.done() for task in behind)
        lone.cancel()
        await asyncio.gather(lone, return_exceptions=True)
        await writer.execute("COMMIT")
        stored = await asyncio.wait_for(asyncio.gather(*behind), 10)
    finally:
        await writer.close()
    events = await store.read()
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {e.key for e in events} - {"lone"} == {"first", "behind0", "behind1", "behind2"}
    assert [r.events[0].key for r in stored] == ["behind0", "behind1", "behind2"]


async def test_close_waits_for_a_lone_append_being_committed(pg_url: str) -> None:
    store = await open_event_store(pg_url)
    await store.append([draft("first")])
    writer = await hold_the_writer_lock(pg_url)
    try:
        lone = asyncio.create_task(store.append([draft("lone")]))
        assert await waiting_for_a_lock(writer, lone) is not None
        closing = asyncio.create_task(store.close())
        await asyncio.sleep(0.05)
        assert not closing.done()
        await writer.execute("COMMIT")
        assert (await asyncio.wait_for(lone, 10)).events[0].seq == 2
        await asyncio.wait_for(closing, 10)
    finally:
        await writer.close()
        await store.close()
    reader = await open_event_store(pg_url)
    try:
        assert [e.key for e in await reader.read()] == ["first", "lone"]
    finally:
        await reader.close()


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
async def test_a_timeout_the_dba_set_on_the_database_never_cuts_an_append_waiting_to_write(
    pg_url: str, postgres_server: PostgresServer, setting: str
) -> None:
    created = await open_event_store(pg_url)
    await created.append([draft("a", 1)])
    await created.close()
    postgres_server.sql(f"ALTER DATABASE {database(pg_url)} SET {setting} = '1ms'")
    store = await open_event_store(pg_url)
    writer = await hold_the_writer_lock(pg_url)
    try:
        append = asyncio.create_task(store.append([draft("a", 2)]))
        assert await waiting_for_a_lock(writer, append) is not None
        await asyncio.sleep(0.05)  # far past the database's 1 ms
        await writer.execute("COMMIT")
        assert (await asyncio.wait_for(append, 10)).events[0].seq == 2
        assert [e.data["n"] for e in await store.read()] == [1, 2]
    finally:
        await writer.close()
        await store.close()


async def test_a_statement_the_server_cancels_is_unavailable_so_the_caller_retries(
    store: EventStore, pg_url: str
) -> None:
    await store.append([draft("a", 1)])
    writer = await hold_the_writer_lock(pg_url)
    watch = await admin(pg_url)  # outside the writer's transaction: activity seen afresh
    try:
        appends = [asyncio.create_task(store.append([draft("a", n)])) for n in (2, 3)]
        for append in appends:  # in one group or two: each waits for the lock, is cancelled
            pid = await waiting_for_a_lock(watch, append)
            await watch.execute("SELECT pg_cancel_backend(%s)", (pid,))
            with pytest.raises(StoreUnavailable, match="the server cancelled the statement"):
                await asyncio.wait_for(append, 10)
    finally:
        await watch.close()
        await writer.close()
    await store.append([draft("a", 4)])
    assert [e.data["n"] for e in await store.read()] == [1, 4]


async def test_use_after_close_is_store_closed(pg_url: str) -> None:
    opened = await open_event_store(pg_url)
    await opened.close()
    with pytest.raises(StoreClosed):
        await opened.read()
    with pytest.raises(StoreClosed):
        opened.subscribe()


async def test_connections_cut_by_the_server_are_replaced_on_the_next_call(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    for round_ in range(2):
        await store.append([draft("a", round_)])
        await store.read()
        postgres_server.sql("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
                            database(pg_url))  # returns once they have ended
    await store.append([draft("a", 2)])
    assert [e.data["n"] for e in await store.read()] == [0, 1, 2]


async def test_the_commit_cursors_kept_are_those_of_connections_the_pool_still_holds(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    """Each pooled connection keeps a raw cursor for the one-round-trip commit; one the server
    cut is closed, and its cursor let go with it (else each reconnect would leak one)."""
    pool = store.recorder._pool  # type: ignore[attr-defined]
    for round_ in range(3):
        await asyncio.gather(*(store.append([draft(f"k{i}", round_)]) for i in range(8)))
        postgres_server.sql("SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
                            database(pg_url))
    await store.append([draft("a", 3)])
    assert pool._cursors  # the commit went through a kept cursor
    assert set(pool._cursors) <= set(pool._idle), "a cursor kept for a closed connection"
    assert all(not conn.closed for conn in pool._cursors)


async def test_an_append_whose_session_the_server_ends_mid_commit_is_stored_once(
    store: EventStore, pg_url: str
) -> None:
    conn = await admin(pg_url)
    try:  # the first COMMIT sleeps in its deferred trigger (a sequence is not rolled back)
        await conn.execute("CREATE SEQUENCE pulse.slow_once")
        await conn.execute(SLOW_COMMIT.format(seconds=30).replace(
            "NEW.key = 'slow'", "NEW.key = 'slow' AND nextval('pulse.slow_once') = 1"))
        append = asyncio.create_task(store.append([draft("slow")]))
        pid = await wait_for_sleeper(conn)  # inside COMMIT: the deferred trigger runs
        await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        stored = await append  # the server's FATAL rolled it back: sent once more
        await conn.execute("DROP TRIGGER slow_commit ON pulse.events")
    finally:
        await conn.close()
    assert [(e.key, e.seq) for e in await store.read()] == [("slow", stored.events[0].seq)]
    assert (await store.append([draft("after")])).events[0].seq == stored.events[0].seq + 1


async def test_a_row_whose_data_cannot_be_decoded_is_listed_apart(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    await store.append([draft("a", 1)])
    postgres_server.sql(
        "INSERT INTO pulse.events (seq, id, kind, key, version, ts, origin, tx, data) VALUES "
        "(2, 'bad-id', 'tick', 'a', 2, 0, 'agent', 'bad-tx', '\\xff00'::bytea)",
        database(pg_url))
    page = await store.recorder.select()
    assert [e.seq for e in page.events] == [1]
    assert [(u.seq, u.id, u.tx) for u in page.unreadable] == [(2, "bad-id", "bad-tx")]
    assert [e.seq for e in await store.read(kinds=["tick"])] == [1]
    quarantine = await store.read(kinds=["event-quarantined"])
    assert quarantine[0].data["seq"] == 2


# -- wakes across processes -----------------------------------------------------------------


async def test_a_commit_through_another_store_wakes_a_read_only_follower_without_a_poll(
    pg_url: str,
) -> None:
    writer = await open_event_store(pg_url)
    follower = await open_event_store(pg_url, read_only=True)
    try:
        signal = follower.subscribe()
        assert follower.wakes_across_processes
        await asyncio.wait_for(signal.wait(), 10)  # the listener's first wake: it listens
        signal.clear()
        await writer.append([draft("a")])
        await asyncio.wait_for(signal.wait(), 10)  # a poll would take SAFETY_POLL_S (30)
        assert [e.key for e in await follower.read()] == ["a"]
    finally:
        await follower.close()
        await writer.close()


async def test_after_a_server_restart_a_cursor_resumes_without_a_gap_or_a_duplicate(
    pg_url: str, postgres_server: PostgresServer
) -> None:
    follower, writer = await open_event_store(pg_url), await open_event_store(pg_url)
    seen: list[int] = []
    done = asyncio.Event()

    async def follow() -> None:
        async for event in follower.changes(poll_interval=30.0):
            seen.append(event.seq)
            if len(seen) == 20:
                done.set()

    task = asyncio.create_task(follow())
    listener = follower.recorder._listener  # type: ignore[attr-defined]
    try:
        # listening before the restart (a lone writer's ten appends can be done before the
        # listener's first connection is), so that the restart cuts a connection it holds
        await eventually(lambda: listener.connections >= 1, 10, "the follower listening")
        for n in range(10):
            await writer.append([draft("a", n)])
        await asyncio.to_thread(postgres_server.restart)
        for n in range(10, 20):
            await writer.append([draft("a", n)])
        await asyncio.wait_for(done.wait(), scaled(20))
        assert seen == list(range(1, 21))
        # the wake on the lost connection may have read them all first
        await eventually(lambda: listener.connections >= 2, 10, "the listener reconnected")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await follower.close()
        await writer.close()


async def test_a_cursor_that_cannot_read_waits_and_reads_on_once_the_server_lets_it(
    pg_url: str, postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    name = database(pg_url)
    follower, writer = await open_event_store(pg_url), await open_event_store(pg_url)
    seen: list[int] = []
    task = asyncio.create_task(_follow(follower, seen))
    listener = follower.recorder._listener  # type: ignore[attr-defined]
    try:
        await writer.append([draft("a", 0)])
        await eventually(lambda: seen == [1], 10, "the cursor reading the first event")
        await eventually(lambda: listener.connections >= 1, 10, "the follower listening")
        # the database takes no new connection, and every one but the follower's listening
        # one and `notifier` is cut: the listener hears a NOTIFY, and the read it wakes fails
        notifier = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        postgres_server.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        postgres_server.sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
            f"'{name}' AND query NOT LIKE 'LISTEN%' AND pid <> {notifier.info.backend_pid}")
        with caplog.at_level(logging.WARNING, logger="pulse.events"):
            await notifier.execute("SELECT pg_notify(%s, '1')", (channel_of("pulse"),))
            await notifier.close()
            await eventually(lambda: "a cursor cannot read the log" in caplog.text, 10,
                             "the cursor failing to read")
        assert not task.done() and seen == [1]
        postgres_server.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        await writer.append([draft("a", 1)])
        await eventually(lambda: seen == [1, 2], 10, "the cursor reading on")
    finally:
        postgres_server.sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await follower.close()
        await writer.close()


async def _follow(store: EventStore, seen: list[int]) -> None:
    async for event in store.changes(poll_interval=30.0):
        seen.append(event.seq)


async def test_a_server_restart_costs_no_driver_warning_for_the_pooled_connections_it_cut(
    store: EventStore, postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    await asyncio.gather(*(store.read() for _ in range(8)))  # the pool holds several now
    await asyncio.to_thread(postgres_server.restart)
    with caplog.at_level(logging.WARNING, logger="psycopg"):
        for n in range(3):
            await store.append([draft("a", n)])
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert [e.data["n"] for e in await store.read()] == [0, 1, 2]


# -- exclusive ------------------------------------------------------------------------------


async def test_two_recorders_are_never_inside_the_same_exclusive_name_at_once(
    pg_url: str,
) -> None:
    stores = [await open_event_store(pg_url) for _ in range(2)]
    inside: list[int] = []
    most = 0

    async def worker(store: EventStore, who: int) -> None:
        nonlocal most
        for _ in range(15):
            async with store.exclusive("identity:ana"):
                inside.append(who)
                most = max(most, len(inside))
                await asyncio.sleep(0.002)
                inside.remove(who)

    try:
        await asyncio.gather(*(worker(s, i) for i, s in enumerate(stores) for _ in range(2)))
    finally:
        for opened in stores:
            await opened.close()
    assert most == 1


async def test_different_exclusive_names_are_held_at_once_and_a_cancelled_wait_frees_all(
    pg_url: str,
) -> None:
    first, second = await open_event_store(pg_url), await open_event_store(pg_url)
    try:
        async with first.exclusive("a"):
            async with asyncio.timeout(10):
                async with second.exclusive("b"):
                    pass
            waiting = asyncio.create_task(second.exclusive("a").__aenter__())
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        async with asyncio.timeout(10):
            async with second.exclusive("a"):
                pass
    finally:
        await first.close()
        await second.close()


async def test_an_append_inside_an_exclusive_lock_that_was_lost_is_refused_and_leaving_says_so(
    store: EventStore, pg_url: str, postgres_server: PostgresServer
) -> None:
    refused: StoreUnavailable | None = None
    with pytest.raises(LockLost, match="'identity:ana' was lost while held") as left:
        async with store.exclusive("identity:ana"):
            await store.append([draft("a", 1)])
            postgres_server.sql("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE "
                                "locktype = 'advisory'", database(pg_url))
            try:
                await store.append([draft("a", 2)])
            except StoreUnavailable as exc:
                refused = exc
    assert isinstance(refused, LockLost) and "this append is refused" in str(refused)
    assert "overlapped" in str(left.value)
    async with asyncio.timeout(10), store.exclusive("identity:ana"):  # taken afresh
        await store.append([draft("a", 3)])
    assert [e.data["n"] for e in await store.read()] == [1, 3]


# -- rows and copying -----------------------------------------------------------------------


async def test_copy_rows_stores_sqlite_rows_exactly(pg_url: str, tmp_path: Path) -> None:
    source = await SqliteEventStore.open(tmp_path / "events.db",
                                         objects=ObjectStore(tmp_path / "objects"))
    await source.append([draft("a", 1), draft("b", 2, idem="once")])
    await source.append([EventDraft("tick", "a", {"t": "é\u2028"}, attachment=b"blob")])
    await source.append([EventDraft("error", "c", {"nested": [1, {"x": None}]})])
    rows = await source.recorder.rows(0, 100)
    await source.close()
    target = await PostgresRecorder.open(pg(pg_url))
    try:
        assert await target.copy_rows(rows[:2]) == 2
        assert await target.copy_rows(iter(rows[2:])) == 2
        assert await target.rows(0, 100) == rows
        assert all(isinstance(r, StoredRow) for r in rows)
        assert await target.head("a") == 2 and await target.head("c") == 1
        store = EventStore(target)
        after = await store.append([draft("a")], expect={"a": 2})
        assert (after.events[0].seq, after.events[0].version) == (5, 3)
    finally:
        await target.close()


# -- URLs -----------------------------------------------------------------------------------


def test_a_postgres_url_keeps_libpq_options_and_names_itself_without_its_password() -> None:
    parsed = pg("postgres://ana:pw@db.example:6543/fleet?sslmode=require&schema=team1"
                "&pool_size=8&connect_timeout=3&operation_timeout=12.5")
    assert (parsed.host, parsed.port, parsed.database, parsed.schema) == (
        "db.example", 6543, "fleet", "team1")
    assert (parsed.pool_size, parsed.connect_timeout, parsed.operation_timeout) == (8, 3.0, 12.5)
    assert "operation_timeout" not in parsed.dsn and pg("postgresql://h/db").operation_timeout == 30
    assert parsed.display() == "postgresql://db.example:6543/fleet?schema=team1"
    assert "sslmode=require" in parsed.dsn and "schema" not in parsed.dsn
    assert pg(parsed.url()) == parsed
    socket = pg("postgresql:///fleet?host=/run/postgresql")
    assert socket.display() == "postgresql://%2Frun%2Fpostgresql:5432/fleet"
    assert socket.dsn.startswith("postgresql:///fleet?") and pg(socket.url()) == socket


@pytest.mark.parametrize(("url", "says"), [
    ("postgresql://h/db?fsync=off", "unknown option(s) fsync"),
    ("postgresql://h/", "name the database"),
    ("postgresql://h/db?schema=Bad-Name", "schema='Bad-Name'"),
    ("postgresql://h/db?pool_size=0", "pool_size='0'"),
    ("postgresql://h/db?connect_timeout=never", "connect_timeout='never'"),
    ("postgresql://h/db?operation_timeout=0", "operation_timeout='0'"),
    ("postgresql://u:secret@h:port/db", "cannot read its port"),
])
def test_a_postgres_url_that_cannot_be_used_says_why_without_its_password(
    url: str, says: str
) -> None:
    with pytest.raises(StoreError) as info:
        parse_store_url(url)
    assert says in str(info.value) and "secret" not in str(info.value)


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql:///pulse", "postgresql://(local socket):5432/pulse"),
    ("postgresql://:5433/pulse", "postgresql://(local socket):5433/pulse"),
    ("postgresql:///pulse?port=6000", "postgresql://(local socket):6000/pulse"),
    ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db"),
    ("postgresql://u:pw@[fe80::1%25eth0]/db", "postgresql://[fe80::1%eth0]:5432/db"),
    ("postgresql:///db?host=::1", "postgresql://[::1]:5432/db"),
    ("postgresql://localhost/db", "postgresql://localhost:5432/db"),
    ("postgresql:///db?host=/run/postgresql", "postgresql://%2Frun%2Fpostgresql:5432/db"),
])
def test_a_postgres_url_displays_the_host_libpq_connects_to(url: str, shown: str) -> None:
    assert pg(url).display() == shown


@pytest.mark.parametrize("port", ["abc", "0", "70000", "5432,5433", ""])
def test_a_port_option_that_is_not_a_port_is_refused_when_the_url_is_read(port: str) -> None:
    with pytest.raises(StoreError) as info:
        parse_store_url(f"postgresql://u:secret@h/db?port={port}")
    assert f"port={port!r}" in str(info.value) and "1 to 65535" in str(info.value)
    assert "secret" not in str(info.value)


async def test_neither_the_url_nor_the_recorder_shows_the_password_when_printed(
    pg_url: str,
) -> None:
    url = pg(pg_url.replace("pulse@", "pulse:s3cret@") + "?sslmode=disable&password=s3cret2")
    assert "s3cret" in url.dsn  # the driver gets it
    recorder = await PostgresRecorder.open(url)
    try:
        for text in (repr(url), str(url), f"{url!r}", repr(recorder), str(recorder),
                     repr([url]), repr(url._replace(schema="other"))):
            assert "s3cret" not in text and url.host in text
    finally:
        await recorder.close()
