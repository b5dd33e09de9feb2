"""Schema version 5 of the PostgreSQL log: no heads table, a key's head is its newest
event's version; an existing version-4 log loses the table and gains the append function
that does without it when its owner opens it."""

from __future__ import annotations

import pytest

from pulse_core import EventDraft, VersionConflict
from pulse_core.store import open_event_store
from tests.core.test_pg_principals import as_role, back_to_version_4, upgrade_refused
from tests.servers import PostgresServer

VERSION = "SELECT value FROM pulse.meta WHERE name = 'schema_version'"
HEADS_TABLE = "SELECT count(*) FROM pg_class WHERE oid = to_regclass('pulse.heads')"


def tick(key: str, n: int, origin: str = "engine", **kw: str) -> EventDraft:
    return EventDraft("tick", key, {"n": n}, origin=origin, **kw)


async def test_a_version_4_log_reads_its_heads_from_the_events_once_its_owner_opens_it(
        pg_url: str, postgres_server: PostgresServer) -> None:
    database = pg_url.rsplit("/", 1)[1]
    store = await open_event_store(pg_url)
    await store.append([tick(f"k{n % 3}", n) for n in range(9)])  # k0, k1, k2 at 3
    before = [(e.seq, e.id, e.key, e.version, e.hash) for e in await store.read()]
    await store.close()
    await back_to_version_4(pg_url)
    assert postgres_server.sql(VERSION, database) == "4"
    assert postgres_server.sql(HEADS_TABLE, database) == "1"
    role = await upgrade_refused(pg_url, "version 5's heads read from the events")
    assert postgres_server.sql(VERSION, database) == "4"

    a = await open_event_store(pg_url)
    b = await open_event_store(pg_url)
    try:
        assert postgres_server.sql(VERSION, database) == "5"
        assert postgres_server.sql(HEADS_TABLE, database) == "0"
        assert [(e.seq, e.id, e.key, e.version, e.hash) for e in await a.read()] == before
        assert [await a.head(k) for k in ("k0", "k1", "k2", "new")] == [3, 3, 3, 0]
        # a's heads, known from its commit, go stale when b commits: the function refuses
        # a's group and says the heads as the events hold them
        await a.append([tick("k0", 9)], expect={"k0": 3})
        await b.append([tick("k0", 10)], expect={"k0": 4})
        with pytest.raises(VersionConflict) as stale:
            await a.append([tick("k0", 11)], expect={"k0": 4})
        assert stale.value.actual == 5
        await a.append([tick("k0", 11), tick("k1", 12)], expect={"k0": 5, "k1": 3})
        # the two-trip path (an idempotency key) reads the heads from the events too
        with pytest.raises(VersionConflict) as stale:
            await b.append([tick("k1", 13, idem="i-1")], expect={"k1": 3})
        assert stale.value.actual == 4
        await b.append([tick("k1", 13, idem="i-1")], expect={"k1": 4})
        assert [await b.head(k) for k in ("k0", "k1", "k2")] == [6, 5, 3]
    finally:
        await a.close()
        await b.close()
    engine = await open_event_store(as_role(pg_url, role))  # at version 5: nothing to do
    try:
        await engine.append([tick("k2", 14)], expect={"k2": 3})
    finally:
        await engine.close()
    rows = postgres_server.sql(
        "SELECT string_agg(seq || ':' || key || version, ',' ORDER BY seq) FROM pulse.events "
        "WHERE seq > 9", database)
    assert rows == "10:k04,11:k05,12:k06,13:k14,14:k15,15:k24"


async def test_a_new_log_is_created_at_version_5_without_a_heads_table(
        pg_url: str, postgres_server: PostgresServer) -> None:
    store = await open_event_store(pg_url)
    await store.close()
    database = pg_url.rsplit("/", 1)[1]
    assert postgres_server.sql(VERSION, database) == "5"
    assert postgres_server.sql(HEADS_TABLE, database) == "0"
